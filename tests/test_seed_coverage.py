"""docs/seed-coverage.md is current, and each row's status is derived from a cell that proves it.

The synthetic notebooks below pin the derivation: a check under a GPU guard is never "run here",
a code cell without a check is not "run here", prose with a linked source is "cited".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_file

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    return load_file(ROOT / "tools" / "seed_coverage.py")


def _code(source: str, printed: str = "", tags=(), count: int | None = 1, error=None) -> dict:
    outputs = [{"output_type": "stream", "name": "stdout", "text": printed}] if printed else []
    if error:
        outputs.append({"output_type": "error", "ename": error, "evalue": "", "traceback": []})
    meta = {"tags": list(tags)} if tags else {}
    return {"cell_type": "code", "execution_count": count, "metadata": meta,
            "outputs": outputs, "source": source}  # fmt: skip


def _prose(source: str, tags=()) -> dict:
    return {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": source}


def _notebook(folder: Path, *cells: dict) -> Path:
    cells = (_prose("## 1. The section"), *cells)
    doc = {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / "90_synthetic.ipynb").write_text(json.dumps(doc), encoding="utf-8")
    return folder


def _row(tool, *evidence, on_gpu: str = ""):
    return tool.Row(1, "a claim", "wrong", tuple(evidence), "how", on_gpu)


def test_every_seed_row_points_at_a_cell_that_still_proves_it_and_the_page_is_current():
    tool = _tool()
    assert tool.problems() == []
    assert tool.main(["--check"]) == 0, "python tools/seed_coverage.py --write"


def test_the_page_states_the_derived_counts():
    tool = _tool()
    statuses = [tool.derive(row).status for row in tool.ROWS]
    page = tool.render()
    for status in (tool.RUN, tool.CITED):
        assert f"**{statuses.count(status)} {status}**" in page
    assert f"**{statuses.count(tool.GPU)} run on a GPU only**" in page
    assert len(statuses) == 33 and set(statuses) <= {tool.RUN, tool.GPU, tool.CITED}


GUARDED = [  # (the guard, the skip message's branch, GPUs it needs)
    ("if caps.cuda:\n    assert x == 1\nelse:\n    print('skipped')\n", 1),
    ("if torch.cuda.is_available():\n    assert x == 1\nelse:\n    print('skipped')\n", 1),
    ("if devices.has_gpu(2):\n    assert x == 1\nelse:\n    print('skipped')\n", 2),
    ("if torch.cuda.device_count() >= 2:\n    assert x == 1\nelse:\n    print('skipped')\n", 2),
    ("if caps.multi_gpu:\n    assert x == 1\nelse:\n    print('skipped')\n", 2),
    ("if devs.stand_ins:\n    print('skipped')\nelse:\n    assert x == 1\n", 2),
    ("if not caps.cuda:\n    print('skipped')\nelse:\n    assert x == 1\n", 1),
    ("assert y == 2\nif caps.cuda and y:\n    assert x == 1\nelse:\n    print('skipped')\n", 1),
    ("for _ in range(3):\n    if devices.has_gpu(1) and not devices.has_gpu(2):\n"
     "        print('skipped')\n    elif devices.has_gpu(2):\n        assert x == 1\n", 2),
]  # fmt: skip


@pytest.mark.parametrize(("source", "gpus"), GUARDED)
def test_a_check_under_a_gpu_guard_is_never_run_here(tmp_path, source, gpus):
    tool = _tool()
    nbs = _notebook(tmp_path, _code(source, printed="skipped"))
    verdict = tool.derive(_row(tool, tool.code("90", r"assert x == 1")), nbs)
    assert (verdict.status, verdict.gpus) == (tool.GPU, gpus)
    assert verdict.proofs[0].where == "`90_synthetic.ipynb` 1. The section (c1)"


def test_a_guarded_cell_that_says_nothing_on_a_cpu_is_reported(tmp_path):
    tool = _tool()
    nbs = _notebook(tmp_path, _code("if caps.cuda:\n    assert x == 1\n"))
    row = _row(tool, tool.code("90", r"assert x == 1"), on_gpu="x is 1")
    assert any("says nothing of what it skipped" in p for p in tool.problems((row,), nbs))


def test_a_guarded_cell_whose_output_is_not_its_cpu_branchs_is_reported(tmp_path):
    tool = _tool()
    source = "if caps.cuda:\n    assert x == 1\n    print('x is 1')\nelse:\n    print('skipped')\n"
    nbs = _notebook(tmp_path, _code(source, printed="x is 1"))  # the GPU branch's output
    row = _row(tool, tool.code("90", r"assert x == 1"), on_gpu="x is 1")
    assert tool.derive(row, nbs).status != tool.GPU
    assert any("lacks what the guard's CPU branch prints" in p for p in tool.problems((row,), nbs))


def test_a_gpu_only_row_says_what_a_gpu_run_shows(tmp_path):
    tool = _tool()
    nbs = _notebook(tmp_path, _code("if caps.cuda:\n    assert x == 1\n", printed="skipped"))
    assert (
        tool.problems((_row(tool, tool.code("90", r"assert x == 1"), on_gpu="x is 1"),), nbs) == []
    )
    (problem,) = tool.problems((_row(tool, tool.code("90", r"assert x == 1")),), nbs)
    assert "on_gpu must say what a GPU run shows" in problem


def test_a_guard_the_tool_does_not_know_is_reported_not_counted(tmp_path):
    tool = _tool()
    nbs = _notebook(tmp_path, _code("if fast_machine:\n    assert x == 1\n", printed="x"))
    row = _row(tool, tool.code("90", r"assert x == 1"))
    assert tool.derive(row, nbs).status != tool.RUN
    assert "not in GUARDS" in tool.problems((row,), nbs)[0]


@pytest.mark.parametrize(
    "source",
    [
        "print(torch.zeros(2).device)\n",  # shows it, checks nothing
        "x = torch.zeros(2)\nprint(x.device)  # assert x.device.type == 'cpu'\n",  # a comment
        "def f():\n    assert x == 1\n",  # a check nobody calls here
    ],
)
def test_a_code_cell_without_a_check_is_not_run_here(tmp_path, source):
    tool = _tool()
    nbs = _notebook(tmp_path, _code(source, printed="cpu"))
    row = _row(tool, tool.code("90", r"print\(.*device\)|assert x == 1"))
    assert tool.derive(row, nbs).status != tool.RUN
    assert tool.problems((row,), nbs)


def test_an_unguarded_assert_that_ran_is_run_here(tmp_path):
    tool = _tool()
    nbs = _notebook(tmp_path, _code("x = 1\nassert x == 1, 'one'\n"))
    assert tool.derive(_row(tool, tool.code("90", r"assert x == 1")), nbs).status == tool.RUN


def test_a_checker_call_counts_only_with_assert_passed(tmp_path):
    tool = _tool()
    nbs = _notebook(
        tmp_path,
        _code("check_move(move)\n", printed="Not answered yet: move(batch, device)"),
        _code("check_move(solution).assert_passed()\n", printed="Passed: move(batch, device)"),
    )
    shipped = _row(tool, tool.code("90", r"check_move\(move\)"))
    solved = _row(tool, tool.code("90", r"check_move\(solution\)"))
    assert tool.derive(shipped, nbs).status != tool.RUN
    assert tool.derive(solved, nbs).status == tool.RUN


def test_the_committed_output_must_show_the_cell_ran(tmp_path):
    tool = _tool()
    nbs = _notebook(
        tmp_path,
        _code("assert x == 1\n", count=None),  # never executed
        _code("assert y == 2\n", error="AssertionError"),  # ran and failed
        _code("b = torch.tensor(a.shape)\n", tags=["raises-exception"]),  # no error committed
        _code("c = torch.tensor(a.shape)\n", tags=["raises-exception"], error="AttributeError"),
    )
    for pattern in (r"assert x == 1", r"assert y == 2", r"b = torch"):
        assert tool.derive(_row(tool, tool.code("90", pattern)), nbs).status != tool.RUN, pattern
    assert tool.derive(_row(tool, tool.code("90", r"c = torch")), nbs).status == tool.RUN


def test_a_caught_error_counts_only_where_nbval_compares_what_it_printed(tmp_path):
    tool = _tool()
    source = (
        "try:\n    compile('x = \u201cy\u201d', '<g>', 'exec')\n"
        "except SyntaxError as e:\n    print(e.msg)\n"
    )
    nbs = _notebook(
        tmp_path,
        _code(source, printed="invalid character"),
        _code(source.replace("<g>", "<h>"), printed="invalid", tags=["nbval-ignore-output"]),
    )
    compared = _row(tool, tool.code("90", r"except SyntaxError"))
    assert tool.derive(compared, nbs).status == tool.RUN
    ignored = _row(tool, tool.code("90", r"<h>[\s\S]*except SyntaxError"))
    assert tool.derive(ignored, nbs).status != tool.RUN


def test_a_markdown_only_row_is_cited_when_it_links_its_source(tmp_path):
    tool = _tool()
    nbs = _notebook(
        tmp_path,
        _prose("Not 1.0: the [0.4.0 migration guide](https://pytorch.org/blog/x/), April 2018."),
        _prose("DataParallel returns one loss per GPU, says a friend."),
    )
    cited = tool.derive(_row(tool, tool.prose("90", r"0\.4\.0")), nbs)
    assert (cited.status, cited.proofs[0].where) == (
        tool.CITED,
        "`90_synthetic.ipynb` 1. The section (c1)",
    )
    unsourced = _row(tool, tool.prose("90", r"one loss per GPU"))
    assert tool.derive(unsourced, nbs).status != tool.CITED
    assert tool.problems((unsourced,), nbs)


def test_one_gpu_only_piece_makes_the_row_gpu_only(tmp_path):
    tool = _tool()
    nbs = _notebook(
        tmp_path,
        _code("assert cudnn.enabled\n"),
        _code("if caps.cuda:\n    assert faster\nelse:\n    print('skipped')\n", printed="skipped"),
    )
    row = _row(tool, tool.code("90", r"assert cudnn"), tool.code("90", r"assert faster"))
    verdict = tool.derive(row, nbs)
    assert [p.status for p in verdict.proofs] == [tool.RUN, tool.GPU]
    assert (verdict.status, verdict.gpus) == (tool.GPU, 1)


def test_a_tag_seed_n_picks_the_cell_over_the_pattern(tmp_path):
    tool = _tool()
    nbs = _notebook(
        tmp_path,
        _code("assert x == 1\n"),  # the pattern's first match, unguarded
        _code("if caps.multi_gpu:\n    assert x == 1\nelse:\n    print('needs two GPUs')\n",
              printed="needs two GPUs", tags=["seed-1"]),
        _code("if caps.cuda:\n    assert z\nelse:\n    print('no GPU')\n", printed="no GPU",
              tags=["seed-2"]),
    )  # fmt: skip
    by_tag = tool.derive(_row(tool, tool.code("90", r"assert x == 1")), nbs)
    assert (by_tag.status, by_tag.gpus, by_tag.proofs[0].where[-4:]) == (tool.GPU, 2, "(c2)")
    two = tool.Row(2, "b", "wrong", (tool.code("90", r"no pattern matches \d{40}"),), "how", "z")
    whole_cell = tool.derive(two, nbs)  # the tag wins; the pattern matches nothing there
    assert (whole_cell.status, whole_cell.gpus) == (tool.GPU, 1)


def test_a_test_skipped_without_two_gpus_needs_two(tmp_path):
    tool = _tool()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pytest, torch\n"
        "two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason='2 GPUs')\n\n"
        "@two\ndef test_a():\n    assert len(losses) == 2\n\n"
        "def test_b():\n    assert 1 + 1 == 2\n",
        encoding="utf-8",
    )
    gpu = tool.derive(_row(tool, tool.Evidence("tests/test_x.py", r"len\(losses\)")), root=tmp_path)
    assert (gpu.status, gpu.gpus, gpu.proofs[0].where) == (tool.GPU, 2, "`tests/test_x.py::test_a`")
    cpu = tool.derive(_row(tool, tool.Evidence("tests/test_x.py", r"1 \+ 1")), root=tmp_path)
    assert cpu.status == tool.RUN


def test_a_row_whose_answer_was_cut_is_reported(monkeypatch):
    tool = _tool()
    gone = tool.Row(1, "x", "wrong", (tool.code("01", r"no cell says this \d{40}"),), "how")
    monkeypatch.setattr(tool, "ROWS", (gone, *tool.ROWS[1:]))
    problem = tool.problems()[0]
    assert problem.startswith("row 1: ") and "no code cell of 01_moving_tensors.ipynb" in problem
    assert tool.main(["--check"]) == 1
