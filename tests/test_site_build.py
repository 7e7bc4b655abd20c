"""``make site``: the whole course builds with no warning, and what should fail the build does.

Sphinx runs with ``-W --keep-going -n``: any warning (a link to a page or heading that does not
exist, a notebook that cannot be read, a formula that cannot be written) fails it. Slow (a full
build is 10-30 s on 2 cores) and needs the docs extra: ``make site`` or ``make test-all``
installs it. Without it the tests skip, unless ``CI`` is set: then they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "course_site.py"


def docs_extra_or_skip() -> None:
    """Skip when Sphinx and myst-nb are missing (fail instead when CI is set)."""
    try:
        import myst_nb  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as exc:
        reason = f"the docs extra is not installed ({exc.name}): `make site` installs it"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the site cannot be built: {reason}")
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _docs_extra():
    docs_extra_or_skip()


def build_site(out: Path, work: Path) -> subprocess.CompletedProcess:
    """``tools/course_site.py build`` into ``out`` (staging in ``work``), output captured."""
    return subprocess.run(
        [sys.executable, str(TOOL), "build", "--out", str(out), "--work", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # a hang, not a time: the build takes 10-30 s
    )


def test_the_whole_course_builds_without_a_warning(tmp_path):
    out = tmp_path / "site"
    done = build_site(out, tmp_path / "work")
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "WARNING" not in said and "ERROR" not in said, said[-5000:]
    pages = {p.relative_to(out).as_posix() for p in out.rglob("*.html")}
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert {f"notebooks/{name}.html" for name in notebooks} <= pages
    docs = [*(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "results").glob("*.md")]
    assert {p.relative_to(ROOT).with_suffix(".html").as_posix() for p in docs} <= pages
    assert {"index.html", "search.html", "README.html"} <= pages
    downloads = {p.name for p in (out / "_downloads").rglob("*.ipynb")}
    assert downloads == {f"{name}.ipynb" for name in notebooks}


def _tiny_build(tmp_path: Path, files: dict[str, str]) -> tuple[int, str]:
    """Build a site of ``files`` (path -> text) with the course's configuration."""
    source = tmp_path / "src"
    pages = [name.rsplit(".", 1)[0] for name in files]
    index = "# Tiny\n\n```{toctree}\n" + "\n".join(pages) + "\n```\n"
    for name, text in {"index.md": index, **files}.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(TOOL.parent)!r})
        import course_site
        from pathlib import Path
        sys.exit(course_site.sphinx_build(
            Path({str(source)!r}), Path({str(tmp_path / "out")!r}), Path({str(tmp_path / "dt")!r})
        ))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout + done.stderr


def _notebook(markdown: str) -> str:
    cell = {"cell_type": "markdown", "metadata": {}, "source": markdown}
    return json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


PAGE = "# Page\n\n## A heading\n\nSee [the heading](#a-heading) and $x^2$.\n"


def test_a_small_good_site_builds(tmp_path):
    # the control for the failures below: the same build passes when nothing is broken
    rc, said = _tiny_build(
        tmp_path, {"page.md": PAGE, "notebooks/00_x.ipynb": _notebook("# N\n\n[p](../page.md)")}
    )
    assert rc == 0, said[-3000:]


BROKEN = {
    "page.md": PAGE + "\n[gone](missing.md)\n\n[gone](#no-such-heading)\n\n$$\\frac{1}{$$\n",
    "notebooks/00_x.ipynb": '{"cells": [ not json',
    "notebooks/01_y.ipynb": _notebook("# N\n\n[g](../nope.md#a)"),
}


def test_each_broken_reference_or_notebook_fails_the_build(tmp_path):
    # one build for all of them (it keeps going): each is named in a warning, and -W makes any
    # warning fail the build
    rc, said = _tiny_build(tmp_path, BROKEN)
    assert rc != 0, f"the build passed:\n{said[-3000:]}"
    warnings = [line for line in said.splitlines() if "WARNING" in line]
    for broken in (
        "missing",  # a page that does not exist
        "no-such-heading",  # a heading that does not exist
        "nope",  # a notebook's link to a page that does not exist
        "00_x.ipynb: WARNING: this notebook cannot be read",
        "this formula cannot be written as MathML",
    ):
        assert any(broken in line for line in warnings), f"{broken!r} not in {warnings}"
