"""Every notebook carries the course's Colab badge and setup cell, and is committed ready for
strict nbval."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tutorial_utils import course

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def cells(path):
    return json.loads(path.read_text())["cells"]


def source(cell):
    return "".join(cell["source"])


def test_course_lists_exactly_the_notebooks_present():
    assert [n.filename for n in course.NOTEBOOKS] == [p.name for p in NOTEBOOKS]


def test_readme_lists_every_notebook_with_its_time():
    readme = (ROOT / "README.md").read_text()
    for nb in course.NOTEBOOKS:
        assert nb.filename in readme, f"README.md does not mention {nb.filename}"
        assert re.search(rf"{re.escape(nb.filename)}.*\b{nb.minutes} min", readme), (
            f"README.md should give {nb.filename} its time estimate ({nb.minutes} min)"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badge_and_setup_cell(path):
    all_cells = cells(path)
    first_md = next(c for c in all_cells if c["cell_type"] == "markdown")
    assert source(first_md).startswith(course.colab_badge(path.name)), (
        "badge missing or stale: run tools/sync_colab.py"
    )
    first_code = next(c for c in all_cells if c["cell_type"] == "code")
    assert source(first_code) == course.colab_setup_source(), (
        "setup cell missing or stale: run tools/sync_colab.py"
    )
    assert course.REPOSITORY in source(first_code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_with_cpu_outputs(path):
    """Strict nbval only compares cells that have stored outputs; a stripped notebook would pass
    silently."""
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] != "code" or not source(cell).strip():
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        assert cell["execution_count"] is not None, (
            f"cell {i} was saved without being run: make execute"
        )
        for out in cell.get("outputs", []):
            if out["output_type"] == "error":
                assert "raises-exception" in tags or "NBVAL_RAISES_EXCEPTION" in source(cell), (
                    f"cell {i} was saved with an unexpected {out['ename']}"
                )
            text = json.dumps(out)
            assert not re.search(r"/(root|work|home)/[\w.-]+", text), (
                f"cell {i} output holds a path of this machine"
            )
            assert not re.search(r"cuda:\d", text) or "NBVAL_IGNORE_OUTPUT" in source(cell), (
                f"cell {i} output names a CUDA device: the references must come from a CPU run"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_shape(path):
    intro = source(next(c for c in cells(path) if c["cell_type"] == "markdown"))
    for heading in ("What you will learn", "Time", "Where it runs"):
        assert heading in intro, f"{path.name}: the first cell should say {heading!r}"
    text = "\n".join(source(c) for c in cells(path) if c["cell_type"] == "markdown")
    assert "Summary" in text, f"{path.name}: no Summary section"


@pytest.mark.slow  # a Python process that reads every notebook: a few seconds
def test_sync_colab_check_passes():
    proc = subprocess.run(
        [sys.executable, "tools/sync_colab.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_colab_setup_does_nothing_off_colab():
    src = course.colab_setup_source()
    body = src.split('if "COLAB_RELEASE_TAG" in os.environ:', 1)
    assert len(body) == 2, "the setup cell must be guarded by COLAB_RELEASE_TAG"
    assert all(line.startswith("    ") for line in body[1].strip("\n").splitlines())


def test_other_files_use_the_same_repository_address():
    """The README's Binder link and pyproject's Source URL must follow course.REPOSITORY."""
    path = course.REPOSITORY.removeprefix("https://github.com/")
    readme = (ROOT / "README.md").read_text()
    for found in re.findall(r"(?:github\.com|mybinder\.org/v2/gh)/([\w.-]+/[\w.-]+)", readme):
        assert found == path, f"README.md links to {found}, but course.REPOSITORY is {path}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'Source = "{course.REPOSITORY}"' in pyproject
