"""listing.show displays the named parts of a script, and course_times counts what it shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_file

from tutorial_utils.listing import excerpt, show

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = '''"""Doc."""
import os


def helper(x):
    return x + 1


# The step every rank takes.
@staticmethod
def step(model):
    loss = model()

    return loss


class Runner:
    pass
'''


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "demo.py"
    p.write_text(SCRIPT)
    return p


def test_excerpt_keeps_decorators_and_the_comment_above_in_file_order(script: Path) -> None:
    text = excerpt(script.name, "Runner", "step", root=script.parent)
    head, *body = text.splitlines()
    assert head == ("# demo.py: step (lines 9-14), Runner (lines 17-18); the file has 18 lines")
    assert body[:3] == ["# The step every rank takes.", "@staticmethod", "def step(model):"]
    assert "def helper" not in text and "import os" not in text
    assert body[-2:] == ["class Runner:", "    pass"]


def test_excerpt_without_names_is_the_whole_file(script: Path) -> None:
    assert excerpt(script, root=None) == SCRIPT


@pytest.mark.parametrize(
    ("args", "error", "says"),
    [
        (("nope.py",), FileNotFoundError, "there is no file"),
        (("demo.py", "missing"), ValueError, "has no top-level function or class named 'missing'"),
        (("demo.py", "two words"), TypeError, "must be identifiers"),
        (("run.sbatch", "x"), ValueError, "is not a Python file"),
    ],
)
def test_bad_input_gets_one_sentence(script: Path, args, error, says) -> None:
    (script.parent / "run.sbatch").write_text("#!/bin/bash\necho hi\n")
    with pytest.raises(error, match=says) as info:
        excerpt(*args, root=script.parent)
    assert info.value.__cause__ is None and "\n" not in str(info.value)


def test_show_returns_highlighted_code(script: Path, monkeypatch) -> None:
    monkeypatch.chdir(script.parent)
    shown = show("demo.py", "helper")
    assert shown.data == excerpt("demo.py", "helper")
    assert "python" in shown._repr_html_() or shown._repr_html_()  # IPython renders it


def _course_times():
    return load_file(ROOT / "tools" / "course_times.py")


def test_course_times_counts_the_script_lines_a_cell_shows(script: Path) -> None:
    ct = _course_times()
    where = script.parent
    whole = sum(1 for line in SCRIPT.splitlines() if line.strip())
    assert ct.shown_lines('Code(filename="demo.py", language="python")', where) == whole
    part = excerpt("demo.py", "helper", root=where)
    assert (
        ct.shown_lines('listing.show("demo.py", "helper")', where)
        == 3
        == len([line for line in part.splitlines() if line.strip()])
    )
    # published.show("key") and recorded.show("key") show no script
    assert ct.shown_lines('published.show("tf32_matmul")', where) == 0
    assert ct.shown_lines("%%time\nx = 1", where) == 0


def test_the_module_example_runs() -> None:
    import doctest

    from tutorial_utils import listing

    result = doctest.testmod(listing, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 2 and result.failed == 0
