"""Give every notebook the Colab badge, setup cell and metadata of ``tutorial_utils.course``.

    python tools/sync_colab.py                    # rewrite notebooks/*.ipynb in place
    python tools/sync_colab.py --check            # exit 1 if any notebook is out of date
    python tools/sync_colab.py --only 00_start_here.ipynb   # rewrite just that one (repeatable)

The badge is the first line of the first markdown cell; the setup cell is the first code
cell. In the notebook's metadata: a ``kernelspec`` on every notebook (``course.KERNELSPEC``),
and on the notebooks in ``NEEDS_GPU`` Colab's ``accelerator: GPU`` with
``colab: {gpuType: course.COLAB_GPU}``, so the badge opens a GPU runtime. Outputs are left
untouched (jupytext round trips drop this metadata: run this tool after one).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from tutorial_utils.course import (  # noqa: E402
    COLAB_GPU,
    KERNELSPEC,
    colab_badge,
    colab_setup_source,
)

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
BADGE_RE = re.compile(r"^\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)\n*")
SETUP_MARK = "# Colab only:"

#: Notebooks whose GPU cells show something a CPU cannot, on the one GPU Colab gives: the
#: one-device track. 07-11 are left out on purpose: with one GPU they do what they do on a CPU
#: (their GPU paths need two or more), so a GPU runtime would spend the learner's Colab quota
#: for nothing.
NEEDS_GPU = frozenset(
    {
        "00_start_here.ipynb",
        "01_moving_tensors.ipynb",
        "02_creating_tensors_on_the_right_device.ipynb",
        "03_where_memory_goes.ipynb",
        "04_out_of_memory.ipynb",
        "05_mixed_precision_and_cudnn.ipynb",
        "06_capstone_make_it_fit.ipynb",
    }
)


def wanted_metadata(metadata: dict, filename: str) -> dict:
    """``metadata`` with the kernelspec and Colab's runtime settings this notebook should have."""
    new = dict(metadata)
    new["kernelspec"] = dict(KERNELSPEC)
    colab = {k: v for k, v in dict(new.get("colab", {})).items() if k != "gpuType"}
    if filename in NEEDS_GPU:
        new["accelerator"] = "GPU"
        colab["gpuType"] = COLAB_GPU
    else:
        new.pop("accelerator", None)
    if colab:
        new["colab"] = colab
    else:
        new.pop("colab", None)
    return new


def sync(nb, filename: str) -> bool:
    """Update ``nb`` in place; return True when something changed."""
    import nbformat  # deferred: its schema checks take seconds to import, and the test suite
    # imports this module in every worker for NEEDS_GPU alone

    changed = False
    metadata = wanted_metadata(dict(nb.metadata), filename)
    if metadata != dict(nb.metadata):
        nb.metadata = nbformat.from_dict(metadata)
        changed = True
    badge = colab_badge(filename)
    md = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if md is None:
        md = nbformat.v4.new_markdown_cell("")
        nb.cells.insert(0, md)
    body = BADGE_RE.sub("", md.source)
    new_source = f"{badge}\n\n{body}".rstrip() if body else badge
    if md.source != new_source:
        md.source, changed = new_source, True
    setup = colab_setup_source()
    code = next((c for c in nb.cells if c.cell_type == "code"), None)
    if code is not None and code.source.startswith(SETUP_MARK):
        if code.source != setup:
            code.source, changed = setup, True
    else:
        cell = nbformat.v4.new_code_cell(setup)
        cell.execution_count = None
        index = nb.cells.index(md) + 1
        nb.cells.insert(index, cell)
        changed = True
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument(
        "--only", action="append", metavar="NOTEBOOK", help="just this notebook file (repeatable)"
    )
    args = parser.parse_args(argv)
    import nbformat  # deferred, see sync()

    paths = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    if args.only:
        unknown = sorted(set(args.only) - {p.name for p in paths})
        if unknown:
            parser.error(f"no such notebook in notebooks/: {', '.join(unknown)}")
        paths = [p for p in paths if p.name in args.only]
    stale = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if sync(nb, path.name):
            stale.append(path.name)
            if not args.check:
                nbformat.write(nb, path)
    if args.check and stale:
        print("out of date (run python tools/sync_colab.py):", ", ".join(stale))
        return 1
    for name in stale:
        print("updated", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
