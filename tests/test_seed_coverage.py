"""docs/seed-coverage.md is current, and every row's evidence is still in its notebook."""

from __future__ import annotations

from pathlib import Path

from conftest import load_file

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    return load_file(ROOT / "tools" / "seed_coverage.py")


def test_every_seed_row_points_at_a_cell_that_still_answers_it():
    tool = _tool()
    assert tool.problems() == []
    assert tool.main(["--check"]) == 0, "python tools/seed_coverage.py --write"


def test_a_row_whose_answer_was_cut_is_reported(monkeypatch):
    tool = _tool()
    gone = tool.Row(1, "x", "wrong", "fully", "01", "code", r"no cell says this \d{40}", "how")
    monkeypatch.setattr(tool, "ROWS", (gone, *tool.ROWS[1:]))
    (problem,) = tool.problems()
    assert problem.startswith("row 1: no code cell of 01_moving_tensors.ipynb matches")


def test_partly_rows_say_what_is_missing():
    tool = _tool()
    for row in tool.ROWS:
        assert row.status in ("fully", "partly"), row
        assert (row.status == "partly") == bool(row.missing), row
