"""Every relative link in README.md, CONTRIBUTING.md, docs/*.md and the notebooks' markdown cells
reaches a file, and a heading."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES += sorted((ROOT / "notebooks").glob("*.ipynb"))
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    found = {github_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}
    found |= set(re.findall(r'<a id="([\w-]+)"></a>', text))
    return found


def test_github_slug():
    assert github_slug("6. A busy port") == "6-a-busy-port"
    assert github_slug("8. GPUtil says there is no GPU (no `nvidia-smi`)") == (
        "8-gputil-says-there-is-no-gpu-no-nvidia-smi"
    )


def _text(page: Path) -> str:
    """A page's markdown: the file, or a notebook's markdown cells."""
    text = page.read_text(encoding="utf-8")
    if page.suffix != ".ipynb":
        return text
    cells = json.loads(text)["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = _text(page)
    for target in LINK_RE.findall(text):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        assert path.exists(), f"{page.name} links to {target}: no such file"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{page.name} links to {target}: no such heading"
