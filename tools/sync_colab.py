"""Give every notebook the Colab badge and setup cell that match ``tutorial_utils.course``.

    python tools/sync_colab.py          # rewrite notebooks/*.ipynb in place
    python tools/sync_colab.py --check  # exit 1 if any notebook is out of date

The badge is the first line of the first markdown cell; the setup cell is the first code
cell. Outputs of other cells are left untouched.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from tutorial_utils.course import colab_badge, colab_setup_source  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
BADGE_RE = re.compile(r"^\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)\n*")
SETUP_MARK = "# Colab only:"


def sync(nb, filename: str) -> bool:
    """Update ``nb`` in place; return True when something changed."""
    changed = False
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for path in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
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
