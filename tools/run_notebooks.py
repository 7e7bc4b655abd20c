"""Run notebooks top to bottom and report each one's wall time.

    python tools/run_notebooks.py --cpu --inplace      # refresh the CPU outputs (make execute)
    python tools/run_notebooks.py                      # run on whatever device is here
    python tools/run_notebooks.py --output-dir D --report R.json NB...   # what gpu_check runs

Each notebook saved records what made its outputs in its metadata (``executed_with``: the
date, the device, torch, the machine's CPU count and, for a run that completed, the seconds it
took), which the course's site shows on the notebook's page and the instructor guide's syllabi
add up as compute time (tools/course_times.py).

Cells tagged ``raises-exception`` (or marked ``# NBVAL_RAISES_EXCEPTION``) may raise; any
other error stops that notebook and is reported with the cell that failed. Nothing is compared
with the committed outputs: on a GPU they differ, and the check cells assert what must hold.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _mark_expected_errors(nb) -> None:
    """nbclient honours the ``raises-exception`` tag; turn nbval's comment marker into that tag."""
    for cell in nb.cells:
        if cell.cell_type == "code" and "NBVAL_RAISES_EXCEPTION" in cell.source:
            tags = cell.metadata.setdefault("tags", [])
            if "raises-exception" not in tags:
                tags.append("raises-exception")


@functools.cache
def executed_with() -> dict:
    """The date (UTC), the device the kernel computes on and torch's version: what made the
    outputs. The kernel inherits this process's environment (``--cpu`` hides the GPUs from both).
    """
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    try:
        import torch  # only when a notebook is saved

        from tutorial_utils import devices
    except ImportError as exc:  # the notebooks would have failed first; say what is missing
        return {"date": date, "device": f"unknown ({exc})", "torch": "unknown"}
    infos = devices.list_devices()
    gpus = [d.name for d in infos if d.device.type == "cuda"]
    if gpus:
        device = f"{len(gpus)} x {gpus[0]}" if len(gpus) > 1 else gpus[0]
    else:
        device = f"CPU ({infos[-1].name})"
    return {"date": date, "device": device, "torch": torch.__version__}


def record_run(nb, seconds: float | None = None) -> None:
    """Write ``executed_with()`` into the notebook's metadata (key ``tutorial_utils``), with
    ``seconds``, the wall time of a run that completed, and the CPUs it had beside it (a run
    that failed records none: its time is not the notebook's)."""
    made = dict(executed_with())
    if seconds is not None:
        made["seconds"] = round(seconds, 1)
        made["cpu_count"] = os.cpu_count()
    nb.metadata.setdefault("tutorial_utils", {})["executed_with"] = made


def _failed_cell(nb) -> dict:
    """The first code cell with an error output that was not expected to raise."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return {
                    "cell": index,
                    "error": f"{out.get('ename', '')}: {out.get('evalue', '')}"[:500],
                    "source": cell.source[:300],
                }
    return {}


def run(path: Path, inplace: bool, timeout: int, output: Path | None = None) -> float:
    """Execute ``path``; save it in place or to ``output``. Raises as nbclient does."""
    import nbformat  # here, not above: importing nbformat costs a second of CPU (its schemas),
    from nbclient import NotebookClient  # which the tests that only read this file need not pay

    nb = nbformat.read(path, as_version=4)
    _mark_expected_errors(nb)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    elapsed = None
    try:
        client.execute()
        elapsed = time.perf_counter() - start
    finally:
        record_run(nb, elapsed)
        if output is not None:  # keep what ran, failed or not: it shows where it stopped
            output.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, output)
    if inplace:
        nbformat.write(nb, path)
    return elapsed


def run_and_report(path: Path, timeout: int, output: Path | None) -> dict:
    """Run one notebook and return ``{"name", "passed", "seconds", "error"?, "cell"?}``."""
    import nbformat
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    start = time.perf_counter()
    entry: dict = {"name": path.name}
    try:
        run(path, False, timeout, output)
        entry["passed"] = True
    except CellExecutionError as exc:
        entry["passed"] = False
        failed = _failed_cell(nbformat.read(output, as_version=4)) if output else {}
        entry.update(failed or {"error": str(exc).strip().splitlines()[-1][:500]})
    except (CellTimeoutError, DeadKernelError, TimeoutError) as exc:
        entry["passed"] = False
        entry["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    entry["seconds"] = round(time.perf_counter() - start, 1)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument(
        "--inplace", action="store_true", help="save the outputs into the notebooks"
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="hide every GPU (CUDA_VISIBLE_DEVICES='') so outputs are the CPU references",
    )
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--output-dir", type=Path, help="save each executed notebook there")
    parser.add_argument("--report", type=Path, help="write each notebook's result as JSON")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout is a number of seconds per cell, 1 or more, not {args.timeout}")
    if args.inplace and args.output_dir:
        parser.error("--inplace and --output-dir both say where to save: choose one")
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("PYTHONHASHSEED", "0")
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    from nbclient.exceptions import CellExecutionError

    results = []
    for path in paths:
        if args.inplace:
            try:
                seconds = run(path, True, args.timeout)
                entry = {"name": path.name, "passed": True, "seconds": round(seconds, 1)}
            except CellExecutionError as exc:
                entry = {"name": path.name, "passed": False, "error": str(exc)}
        else:
            output = args.output_dir / path.name if args.output_dir else None
            entry = run_and_report(path, args.timeout, output)
        results.append(entry)
        if entry["passed"]:
            print(f"{path.name:50} {entry['seconds']:6.1f} s", flush=True)
        else:
            where = f" (cell {entry['cell']})" if "cell" in entry else ""
            print(f"{path.name:50} FAILED{where}\n{entry.get('error', '')}", flush=True)
    if args.report:
        args.report.write_text(json.dumps(results, indent=1) + "\n")
    failed = [r["name"] for r in results if not r["passed"]]
    if failed:
        print(f"\n{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
