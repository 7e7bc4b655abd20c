"""Every reference to a notebook or a section names one that exists (issue 32: after the course
was renumbered, "notebook 05a" or "section 9" must not survive anywhere).

Checked in the notebooks' markdown and in README.md, CONTRIBUTING.md and docs/*.md:

* ``notebook NN`` (and ``notebooks NN and MM``, ``NN-MM``) names a notebook file ``NN_*.ipynb``;
* ``notebook NN §K``, ``NN §K``, ``notebook NN, section K`` and ``notebook NN's section K`` name
  a section ``## K.`` of that notebook;
* inside a notebook, a bare ``section K`` or ``§K`` names a section of that notebook.

Links with anchors are checked by tests/test_docs_links.py and tests/test_glossary.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = {p.name[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

# "notebook 07", "notebooks 03 and 09", "Notebook 10's", "notebooks 07-11"
NOTEBOOK_REF = re.compile(
    r"\b[Nn]otebooks? (\d\d[a-z]?)((?:(?:, | and | or |-|–)\d\d[a-z]?)*)", re.UNICODE
)
# "notebook 09 §2", "09 §2", "notebook 09, section 2", "notebook 09's section 2"
SECTION_REF = re.compile(r"(?:\b[Nn]otebook )?\b(\d\d[a-z]?)(?: §|(?:,|'s) section )(\d+)(?![\d.])")
# "section 4", "§4", "sections 2 and 3" with no notebook before it
LOCAL_REF = re.compile(r"(?<![\d\w] )(?<!\d)(?:\b[Ss]ections? |(?<![\d ])§)(\d+)(?![\d.])")


def markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return path.read_text(encoding="utf-8")


def sections(path: Path) -> set[str]:
    """The numbers of the ``## K.`` sections of a notebook."""
    return set(re.findall(r"^## (\d+)\.", markdown_of(path), re.MULTILINE))


def problems(path: Path) -> list[str]:
    text = markdown_of(path)
    own = path.name[:2] if path.suffix == ".ipynb" else None
    out = []
    for m in NOTEBOOK_REF.finditer(text):
        numbers = [m.group(1), *re.findall(r"\d\d[a-z]?", m.group(2))]
        out += [
            f"{path.name}: {m.group(0)!r} names no notebook {n}"
            for n in numbers
            if n not in NOTEBOOKS
        ]
    for m in SECTION_REF.finditer(text):
        n, k = m.groups()
        if n not in NOTEBOOKS:
            out.append(f"{path.name}: {m.group(0)!r} names no notebook {n}")
        elif k not in sections(NOTEBOOKS[n]):
            out.append(f"{path.name}: {m.group(0)!r}: {NOTEBOOKS[n].name} has no section {k}")
    if own is not None:
        mine = sections(path)
        for m in LOCAL_REF.finditer(text):
            before = text[max(0, m.start() - 16) : m.start()]
            if re.search(
                r"\d\d(?:,|'s)? ?$|[Nn]otebook \d\d\S* ?$|[Pp]laybook|paper|[Gg]uide", before
            ):
                continue  # another notebook's section, or a cited document's
            if m.group(1) not in mine:
                out.append(
                    f"{path.name}: {m.group(0)!r}: this notebook has no section {m.group(1)}"
                )
    return out


PAGES = [*NOTEBOOKS.values(), *DOCS]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_references_to_notebooks_and_sections_exist(page):
    found = problems(page)
    assert not found, "\n".join(found)


def test_the_finder_sees_a_stale_reference(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See notebook 05a, notebook 03 §99 and notebook 42.\n")
    found = problems(page)
    assert len(found) == 3, found
