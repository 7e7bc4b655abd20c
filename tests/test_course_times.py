"""tools/course_times.py: the formula, and every stated time agreeing with it."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tutorial_utils import course

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import course_times as ct  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def notebook(tmp_path: Path, cells: list[tuple[str, str, dict]]) -> Path:
    path = tmp_path / "99_test.ipynb"
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {"cell_type": kind, "metadata": meta, "source": src}
                    for kind, src, meta in cells
                ],
                "metadata": {},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    return path


def test_formula_on_a_notebook_with_known_counts(tmp_path):
    words = " ".join(["word"] * 300)  # 300 words: 2 minutes
    code = "\n".join(f"x{i} = {i}" for i in range(20))  # 20 lines: 1 minute, + 0.25 to run
    path = notebook(
        tmp_path,
        [
            ("markdown", "# Title\n\n**Time:** about 5 minutes.", {}),
            ("code", "# Colab only: not counted\nimport os", {}),
            ("markdown", f"## 1. A section\n\n{words}", {}),
            ("code", code, {}),
            ("code", "\n\n", {}),  # empty: not a cell to run
            ("markdown", "## Summary\n\ntext\n\n## Exercises\n\n**Exercise 1: a**", {}),
            ("markdown", "**Exercise 2: b**, unlike Exercise 1, ...", {}),
            ("code", "hidden = 1\n" * 50, {"jupyter": {"source_hidden": True}}),
            ("markdown", "## 4. Your turn\n\nDo it.", {}),
        ],
    )
    est = ct.estimate(path)
    assert [s.heading for s in est.sections] == [
        "Intro",
        "1. A section",
        "Summary",
        "Exercises",
        "4. Your turn",
    ]
    section = est.section("1.")
    assert (section.words, section.code_lines, section.cells) == (303, 20, 1)  # + "1. A section"
    assert section.minutes == pytest.approx(303 / 150 + 1 + 0.25)
    assert est.section("Exercises").exercises == 2  # Exercise 1 mentioned twice counts once
    assert est.section("Exercises").code_lines == 0  # the collapsed solution is in the 5 minutes
    assert est.section("4.").tasks == 1
    assert est.total("cells") == 1  # neither the setup cell nor the empty one
    expected = sum(s.minutes for s in est.sections)
    assert est.minutes == ct.round_up(expected) and est.minutes % ct.ROUND_TO == 0
    assert est.minutes - expected < ct.ROUND_TO


def test_round_up():
    assert [ct.round_up(m) for m in (0.1, 5, 5.01, 44.9)] == [5, 5, 10, 45]


def test_section_lookup_says_what_exists(tmp_path):
    est = ct.estimate(notebook(tmp_path, [("markdown", "## 1. Only", {})]))
    with pytest.raises(KeyError, match="its sections are 'Intro', '1. Only'"):
        est.section("2.")


def test_a_file_that_is_not_a_notebook_is_one_sentence(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("not json")
    with pytest.raises(ValueError, match="is not a readable notebook"):
        ct.estimate(bad)


def test_a_syllabus_that_overflows_its_slot_is_reported():
    ests = ct.estimates()
    whole_course = ct.Syllabus(
        "too short",
        60,
        10,
        tuple(ct.Part(p.name, None) for p in NOTEBOOKS),
        "nothing",
    )
    (problem,) = ct.check_syllabus(whole_course, ests)
    assert "needs" in problem and "has 50 min" in problem


def test_a_syllabus_needs_its_slack_and_one_exercise_per_notebook_taught():
    ests = ct.estimates()
    name = "00_start_here.ipynb"
    est = ests[name]
    no_exercise = ct.Syllabus("short", 600, 0, (ct.Part(name, None, exercises=False),), "-")
    (problem,) = ct.check_syllabus(no_exercise, ests)
    assert f"teaches {name} without any of its exercises" in problem
    one = ct.Part(name, None, exercises=1)
    minutes, kept = ct.part_minutes_and_exercises(one, est)
    (exercises,) = [s for s in est.sections if s.heading.startswith("Exercises")]
    whole = sum(s.minutes for s in est.sections)
    assert kept == 1 < exercises.exercises
    assert minutes == pytest.approx(whole - exercises.minutes * (1 - 1 / exercises.exercises))
    assert ct.check_syllabus(ct.Syllabus("ok", 600, 0, (one,), "-"), ests) == []
    # the slack is not teaching time: a plan that fits without it does not fit with it
    room = ct.round_up(minutes)
    assert ct.check_syllabus(ct.Syllabus("tight", room, 0, (one,), "-"), ests) == []
    (problem,) = ct.check_syllabus(ct.Syllabus("tight", room, 0, (one,), "-", slack_min=5), ests)
    assert "and 5 min of slack" in problem


def test_every_syllabus_plans_slack_and_breaks():
    for syllabus in ct.SYLLABI:
        assert syllabus.slack_min >= 10, syllabus.name
        assert syllabus.slot_min <= 90 or syllabus.break_min >= 15, syllabus.name


def test_stated_times_elsewhere_agree_with_the_estimate():
    """course.py, the README table, docs/times.md and the instructor guide's syllabi."""
    problems = ct.other_problems(ct.estimates())
    assert not problems, "\n".join(problems) + "\nrun: python tools/course_times.py --write"


def test_course_minutes_come_from_the_estimate():
    ests = ct.estimates()
    assert {nb.filename: nb.minutes for nb in course.NOTEBOOKS} == {
        name: est.minutes for name, est in ests.items()
    }


@pytest.mark.parametrize(
    "path",
    NOTEBOOKS,
    ids=lambda p: p.name,
)
def test_each_notebook_states_its_estimated_time(path):
    est = ct.estimate(path)
    assert ct.notebook_problems(path.name, est) == []


def test_every_syllabus_fits_its_slot():
    ests = ct.estimates()
    for syllabus in ct.SYLLABI:
        assert ct.check_syllabus(syllabus, ests) == []
        assert ct.syllabus_rows(syllabus, ests)


def test_write_then_check_on_a_copy(tmp_path, monkeypatch):
    """--write makes --check pass, and a second --write changes nothing."""
    for rel in ("README.md", "docs/instructor-guide.md", "src/tutorial_utils/course.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    (tmp_path / "notebooks").mkdir()
    for path in NOTEBOOKS:
        shutil.copy(path, tmp_path / "notebooks" / path.name)
    shutil.copytree(ROOT / "notebooks" / "scripts", tmp_path / "notebooks" / "scripts")
    first = json.loads((tmp_path / "notebooks" / NOTEBOOKS[0].name).read_text())
    first["cells"][0]["source"] = [
        re.sub(r"(\*\*Time:\*\* about )\d+", r"\g<1>1", line)
        for line in first["cells"][0]["source"]
    ]
    (tmp_path / "notebooks" / NOTEBOOKS[0].name).write_text(json.dumps(first))
    monkeypatch.setattr(ct, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(ct, "README", tmp_path / "README.md")
    monkeypatch.setattr(ct, "TIMES_MD", tmp_path / "docs" / "times.md")
    monkeypatch.setattr(ct, "GUIDE_MD", tmp_path / "docs" / "instructor-guide.md")
    monkeypatch.setattr(ct, "COURSE_PY", tmp_path / "src" / "tutorial_utils" / "course.py")
    ests = ct.estimates()
    assert ct.notebook_problems(NOTEBOOKS[0].name, ests[NOTEBOOKS[0].name])
    changed = ct.write(ests)
    assert NOTEBOOKS[0].name in changed
    for name, est in ests.items():
        assert ct.notebook_problems(name, est) == []
    assert ct.write(ct.estimates()) == [], "a second --write should change nothing"
    minutes = (tmp_path / "src" / "tutorial_utils" / "course.py").read_text()
    assert ct.minutes_block(ests) in minutes


def test_check_exits_1_and_says_how_to_fix(capsys, monkeypatch):
    monkeypatch.setattr(ct, "problems", lambda ests: ["x states 1 minutes"])
    assert ct.main(["--check"]) == 1
    assert "course_times.py --write" in capsys.readouterr().out


def test_the_course_fits_its_time_budget():
    """Issue 32: at most MAX_NOTEBOOK_MIN per notebook, MAX_COURSE_MIN for the whole course."""
    problems = ct.budget_problems(ct.estimates())
    assert not problems, "\n".join(problems)


def test_the_budget_check_sees_an_overlong_notebook_and_course(monkeypatch):
    est = ct.estimates()
    monkeypatch.setattr(ct, "MAX_NOTEBOOK_MIN", 5)
    monkeypatch.setattr(ct, "MAX_COURSE_MIN", 60)
    monkeypatch.setattr(ct, "MAX_AT_SCALE_MIN", 5)
    problems = ct.budget_problems(est)
    assert sum("over the 5 a notebook may take" in p for p in problems) == len(est)
    assert any("tracks 1 and 2" in p and "over their 60" in p for p in problems)
    assert any("at-scale track" in p and "over its 5" in p for p in problems)


def test_the_at_scale_track_counts_apart_from_tracks_1_and_2(monkeypatch):
    """Issue 40: track 3's minutes are outside the 480 of tracks 1 and 2, with 180 of their own."""
    est = ct.estimates()
    assert ct.AT_SCALE and all(name >= "12" for name in ct.AT_SCALE)
    core = sum(e.minutes for name, e in est.items() if name not in ct.AT_SCALE)
    monkeypatch.setattr(ct, "MAX_COURSE_MIN", core)  # tracks 1 and 2 exactly at their limit
    assert not any("tracks 1 and 2" in p for p in ct.budget_problems(est))
    monkeypatch.setattr(ct, "MAX_COURSE_MIN", core - 1)
    assert any("tracks 1 and 2" in p for p in ct.budget_problems(est))
