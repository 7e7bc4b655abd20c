"""Run notebooks top to bottom and report each one's wall time.

    python tools/run_notebooks.py --cpu --inplace      # refresh the committed CPU outputs (make execute)
    python tools/run_notebooks.py                      # run on whatever device is here (make gpu-check)

Cells tagged ``raises-exception`` (or marked ``# NBVAL_RAISES_EXCEPTION``) may raise; any
other error stops with the notebook and cell that failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent


def _mark_expected_errors(nb) -> None:
    """nbclient honours the ``raises-exception`` tag; turn nbval's comment marker into that tag."""
    for cell in nb.cells:
        if cell.cell_type == "code" and "NBVAL_RAISES_EXCEPTION" in cell.source:
            tags = cell.metadata.setdefault("tags", [])
            if "raises-exception" not in tags:
                tags.append("raises-exception")


def run(path: Path, inplace: bool, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    _mark_expected_errors(nb)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    if inplace:
        nbformat.write(nb, path)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--inplace", action="store_true", help="save the outputs into the notebooks")
    parser.add_argument("--cpu", action="store_true", help="hide every GPU (CUDA_VISIBLE_DEVICES='') so outputs are the CPU references")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args()
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("PYTHONHASHSEED", "0")
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    failed = []
    for path in paths:
        try:
            seconds = run(path, args.inplace, args.timeout)
            print(f"{path.name:50} {seconds:6.1f} s", flush=True)
        except CellExecutionError as exc:
            failed.append(path.name)
            print(f"{path.name:50} FAILED\n{exc}", flush=True)
    if failed:
        print(f"\n{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
