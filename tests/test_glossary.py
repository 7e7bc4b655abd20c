"""docs/glossary.md: every term the course needs is there; every link lands on a real heading."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "docs" / "glossary.md"
LINK_RE = re.compile(r"\]\((\.\./notebooks/[^)#]+\.ipynb)(?:#([^)]*))?\)")

TERMS = (
    "allocated",
    "reserved",
    "used",
    "peak",
    "caching allocator",
    "pinned memory",
    "stream",
    "rank",
    "world size",
    "all-reduce",
    "bubble",
    "autocast",
    "loss scaling",
    "TF32",
    "cuDNN benchmark",
    "activation checkpointing",
)


def jupyter_anchor(heading: str) -> str:
    """The anchor JupyterLab gives a markdown heading: its rendered text, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.lstrip("#")).strip()
    text = re.sub(r"\$([^$]*)\$", r"\1", text)
    return text.replace(" ", "-")


def headings(notebook: Path) -> set[str]:
    found = set()
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        in_code = False
        for line in "".join(cell["source"]).splitlines():
            if line.startswith("```"):
                in_code = not in_code
            elif not in_code and re.match(r"#{1,6} ", line):
                found.add(jupyter_anchor(line))
    return found


def rows() -> dict[str, str]:
    """term -> the rest of its table row."""
    found = {}
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| (?:<a id=\"[\w-]+\"></a>)?\*\*(.+?)\*\* \|(.*)", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def test_jupyter_anchor_follows_the_rendered_heading():
    assert jupyter_anchor("## 6. Pinned memory and `non_blocking=True`") == (
        "6.-Pinned-memory-and-non_blocking=True"
    )
    assert jupyter_anchor("### Activation checkpointing") == "Activation-checkpointing"


def test_every_term_is_defined_once():
    defined = list(rows())
    for term in TERMS:
        assert defined.count(term) == 1, f"docs/glossary.md should define {term!r} once"


@pytest.mark.parametrize("term", TERMS)
def test_each_term_links_to_a_notebook_heading_that_exists(term):
    row = rows()[term]
    links = LINK_RE.findall(row)
    assert links, f"{term!r} links to no notebook"
    for target, anchor in links:
        notebook = (GLOSSARY.parent / target).resolve()
        assert notebook.is_file(), f"{term!r} links to {target}, which does not exist"
        assert anchor, f"{term!r} links to {target} without a heading"
        assert unquote(anchor) in headings(notebook), (
            f"{term!r} links to #{anchor} in {notebook.name}, which has no such heading; "
            f"its headings: {sorted(headings(notebook))}"
        )


def test_heading_finder_sees_a_missing_heading():
    nb00 = ROOT / "notebooks" / "00_start_here.ipynb"
    assert "3.-What-the-memory-numbers-mean" in headings(nb00)
    assert "No-such-heading" not in headings(nb00)
