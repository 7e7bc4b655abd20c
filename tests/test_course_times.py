"""tools/course_times.py: the formula, and every stated time agreeing with it."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import types
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
    model = ct.MODEL  # 303 words at its reading rate, 20 lines at its code rate, one cell run
    assert section.minutes == pytest.approx(
        303 / model.words_per_min + 20 / model.code_lines_per_min + model.min_per_cell
    )
    assert ct.STATED.words_per_min == 150 and section.minutes_under(ct.STATED) == pytest.approx(
        303 / 150 + 1 + 0.25
    )
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
    # the first exercise's own minutes, and the section's other time pro rata
    each = exercises.exercise_minutes()
    rest = exercises.minutes - sum(each)
    assert minutes == pytest.approx(
        whole - exercises.minutes + rest / exercises.exercises + each[0]
    )
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


@pytest.mark.heavy
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


# --------------------------------------------------------------------------- the calibrated model


def _exercise_notebook(tmp_path: Path) -> Path:
    """Two exercises: one whose solution adds 4 lines (and repeats 1 it was given), one that
    hands over a 10-line script to edit."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "buggy.py").write_text("\n".join(f"a{i} = {i}" for i in range(10)))
    hidden = {"jupyter": {"source_hidden": True}}
    return notebook(
        tmp_path,
        [
            ("markdown", "## Exercises\n\n**Exercise 1: write it.** Write `f`.", {}),
            ("code", "def f(x):\n    ...  # TODO\n\n\ncheck_f(f)", {}),
            ("markdown", "### 2. Find the bug: a script\nFix it.", {}),
            ("code", 'check_script("scripts/buggy.py")', {}),
            ("markdown", "### Solutions", {}),
            (
                "code",
                "# Solution to exercise 1 (expand to read)\n# why, in words\ndef f(x):\n"
                "    y = x + 1\n    z = y * 2\n    w = z - 3\n    return w\n\n\n"
                "check_f(f).assert_passed()\n\n# held against the notebook's runs\n"
                "for x in range(3):\n    assert f(x) == 2 * x - 1\n",
                hidden,
            ),
            ("code", "# Solution to exercise 2 (expand to read)\n# the script's fix", hidden),
        ],
    )


def test_each_exercise_is_read_from_its_cells(tmp_path):
    est = ct.estimate(_exercise_notebook(tmp_path))
    work = est.section("Exercises").exercise_work
    assert work["1"].title == "Exercise 1: write it."
    # def f(x): was given; the comments, the checker's call and the demonstration after it are
    # not written by the learner
    assert (work["1"].written_lines, work["1"].script_lines) == (4, 0)
    assert work["2"].title == "2. Find the bug: a script"
    assert (work["2"].written_lines, work["2"].script_lines) == (0, 10)


def test_the_calibrated_model_weighs_each_exercise_by_what_it_asks(tmp_path):
    section = ct.estimate(_exercise_notebook(tmp_path)).section("Exercises")
    cal = ct.CALIBRATED
    assert section.exercise_minutes(ct.STATED) == [5, 5]  # the stated model: flat
    assert section.exercise_minutes(cal) == pytest.approx(
        [cal.min_per_exercise + 4 * cal.min_per_written_line, cal.min_per_exercise + 10 / 20]
    )
    words = section.words
    assert section.minutes_under(cal) == pytest.approx(
        words / 175 + section.code_lines / 20 + 2 * 0.25 + sum(section.exercise_minutes(cal))
    )
    assert ct.MODEL is ct.CALIBRATED and section.minutes == section.minutes_under(cal)


def test_a_stated_weight_overrides_the_derivation_and_a_stale_one_is_reported(tmp_path):
    est = ct.estimate(_exercise_notebook(tmp_path))
    weight = ct.ExerciseWeight("99_test.ipynb", "find the bug: a script", 12, "a reason")
    stale = ct.ExerciseWeight("99_test.ipynb", "no such title", 12, "a reason")
    model = ct.TimeModel("t", 175, 20, 0.25, 5, 20, 0.5, True, (weight, stale))
    assert est.section("Exercises").exercise_minutes(model)[1] == 12
    (problem,) = ct.unmatched_weights({"99_test.ipynb": est}, model)
    assert "'...no such title...'" in problem


def test_the_weight_table_matches_the_notebooks_exercises():
    """A renamed exercise must take its stated minutes along (or lose them here)."""
    assert ct.unmatched_weights(ct.estimates(), ct.CALIBRATED) == []
    for weight in ct.EXERCISE_WEIGHTS:
        assert weight.reason and weight.minutes > ct.CALIBRATED.min_per_exercise


def test_a_syllabus_keeping_the_first_exercise_counts_its_own_minutes(tmp_path, monkeypatch):
    est = ct.estimate(_exercise_notebook(tmp_path))
    monkeypatch.setattr(ct, "MODEL", ct.CALIBRATED)
    section = est.section("Exercises")
    each = section.exercise_minutes()
    minutes, kept = ct.part_minutes_and_exercises(
        ct.Part("99_test.ipynb", ("Exercises",), exercises=1), est
    )
    reading = section.minutes - sum(each)
    assert kept == 1 and minutes == pytest.approx(reading / 2 + each[0])


def test_model_switch_prints_the_other_models_table_and_leaves_the_switch(capsys):
    assert ct.main(["--model", "stated"]) == 0
    out = capsys.readouterr().out
    assert "| notebook | stated | this model | reviewer (issue 38) |" in out
    assert ct.MODEL is ct.CALIBRATED
    total = re.search(r"\| \*\*all\*\* \| (\d+) \| (\d+) \| (\d+) \|", out)
    ests = ct.estimates()
    assert int(total.group(1)) == sum(e.minutes for e in ests.values())
    assert int(total.group(2)) == sum(
        ct.round_up(sum(s.minutes_under(ct.STATED) for s in e.sections)) for e in ests.values()
    )


def test_the_formula_in_times_md_follows_the_model():
    stated = "\n".join(ct.formula_lines(ct.STATED))
    calibrated = "\n".join(ct.formula_lines(ct.CALIBRATED))
    assert "150 words a minute" in stated and "Brysbaert" not in stated
    assert "175 words a minute" in calibrated and "Brysbaert 2019" in calibrated
    assert "per line its solution adds" in calibrated
    assert all(w.title_phrase in calibrated for w in ct.EXERCISE_WEIGHTS)


# --------------------------------------------------------------------------- compute time


def _run_notebooks():
    from conftest import load_file

    return load_file(ROOT / "tools" / "run_notebooks.py", "run_notebooks")


def test_a_completed_run_records_its_seconds_and_a_failed_one_none(monkeypatch):
    rn = _run_notebooks()
    made = {"date": "2026-12-24", "device": "CPU (test)", "torch": "2.13.0"}
    monkeypatch.setattr(rn, "executed_with", lambda: made)
    done, failed = types.SimpleNamespace(metadata={}), types.SimpleNamespace(metadata={})
    rn.record_run(done, 12.345)
    rn.record_run(failed)
    recorded = done.metadata["tutorial_utils"]["executed_with"]
    assert recorded == {**made, "seconds": 12.3, "cpu_count": os.cpu_count()}
    assert failed.metadata["tutorial_utils"]["executed_with"] == made  # no seconds: not invented
    assert "seconds" not in made  # the cached record is not changed


@pytest.mark.slow
def test_run_notebooks_saves_the_seconds_of_a_synthetic_notebook(tmp_path):
    """A real kernel runs a synthetic notebook in place; its metadata gets the seconds."""
    rn = _run_notebooks()
    path = notebook(tmp_path, [("code", "x = 1 + 1", {})])
    nb = json.loads(path.read_text())
    nb["cells"][0].update(id="c0", outputs=[], execution_count=None)
    path.write_text(json.dumps(nb))
    seconds = rn.run(path, True, timeout=120)
    made = json.loads(path.read_text())["metadata"]["tutorial_utils"]["executed_with"]
    # what run() timed is what it saved (to the tenth); the timing itself is not asserted
    assert made["seconds"] == round(seconds, 1)
    assert json.loads(path.read_text())["cells"][0]["execution_count"] == 1, "the cell ran"
    assert made["cpu_count"] == os.cpu_count() and made["device"] and made["date"]


def _recorded(tmp_path: Path, name: str, executed_with) -> None:
    meta = {"tutorial_utils": {"executed_with": executed_with}} if executed_with else {}
    (tmp_path / name).write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4}))


def test_the_syllabi_show_recorded_compute_and_never_invent_it(tmp_path, monkeypatch):
    machine = {"date": "2026-12-07", "device": "CPU (Xeon)", "torch": "2.13.0", "cpu_count": 2}
    _recorded(tmp_path, "00_a.ipynb", {**machine, "seconds": 120.0})
    _recorded(tmp_path, "01_b.ipynb", {**machine, "seconds": 336.0})
    _recorded(tmp_path, "02_c.ipynb", {"date": "2026-12-07", "device": "CPU (Xeon)"})  # no seconds
    _recorded(tmp_path, "03_d.ipynb", {**machine, "seconds": "fast"})  # not a number
    _recorded(tmp_path, "04_e.ipynb", None)  # never recorded
    laptop = {**machine, "device": "CPU (x86_64, 8 logical cores)", "cpu_count": 8}
    _recorded(tmp_path, "05_f.ipynb", {**laptop, "seconds": 12.3})
    monkeypatch.setattr(ct, "NOTEBOOKS", tmp_path)
    names = ["00_a.ipynb", "00_a.ipynb", "01_b.ipynb", "02_c.ipynb", "03_d.ipynb", "04_e.ipynb"]
    cells, sentence = ct.compute_cells(names)
    assert cells == [
        "2.0 min",
        "(row above)",
        "5.6 min",
        "not recorded",
        "not recorded",
        "not recorded",
    ]
    # 00 counted once: 120 + 336 s
    assert "7.6 min for 00, 01 on CPU (Xeon) with 2 CPUs, torch 2.13.0, 2026-12-07" in sentence
    assert "not recorded for 02, 03, 04" in sentence
    cells, sentence = ct.compute_cells(["05_f.ipynb"])  # under a minute: seconds
    assert cells == ["12 s"] and "12 s for 05 on CPU (x86_64, 8 logical cores), torch" in sentence
    _, none = ct.compute_cells(["04_e.ipynb"])
    assert "not recorded for any of them yet" in none and "min for" not in none


def test_each_syllabus_row_shows_what_its_notebook_recorded():
    block = ct.render_syllabi(ct.estimates())
    rows = re.findall(r"^\| `(\d\d\w*\.ipynb)` \| .* \| \d+ \| ([^|]+) \|$", block, re.M)
    assert len(rows) == sum(len(s.parts) for s in ct.SYLLABI)
    for name, cell in rows:
        made = ct.recorded_run(name)
        if made is None:
            assert cell.strip() in ("not recorded", "(row above)")
        else:
            assert cell.strip() in (ct._duration(made["seconds"]), "(row above)")


def test_the_check_ignores_a_new_compute_record_but_not_a_changed_plan(tmp_path, monkeypatch):
    """Re-executing a notebook changes its recorded seconds: no --write needed for that."""
    guide = tmp_path / "instructor-guide.md"
    text = ct.GUIDE_MD.read_text()
    ests = ct.estimates()
    assert not [p for p in ct.other_problems(ests) if "syllabi" in p]
    monkeypatch.setattr(ct, "GUIDE_MD", guide)
    rows = re.compile(r"^(\| `\d\d\w*\.ipynb` \| .* \| \d+ \|) [^|]+ \|$", re.M)
    guide.write_text(rows.sub(r"\1 9.9 min |", text))  # every compute cell different
    guide.write_text(guide.read_text().replace("not recorded for any of them yet", "3 min"))
    assert not [p for p in ct.other_problems(ests) if "syllabi" in p]
    first = rows.search(text)
    changed = first.group(1).rsplit("|", 2)[0] + "| 999 |"  # the minutes of one row
    guide.write_text(text.replace(first.group(1), changed, 1))
    assert [p for p in ct.other_problems(ests) if "syllabi" in p]
    # and the stripped form is the plan alone: no compute word left
    assert "compute" not in ct.without_compute(ct.render_syllabi(ests)).lower()


def test_the_at_scale_track_counts_apart_from_tracks_1_and_2(monkeypatch):
    """Issue 40: track 3's minutes are outside the 480 of tracks 1 and 2, with 180 of their own."""
    est = ct.estimates()
    assert ct.AT_SCALE and all(name >= "12" for name in ct.AT_SCALE)
    core = sum(e.minutes for name, e in est.items() if name not in ct.AT_SCALE)
    monkeypatch.setattr(ct, "MAX_COURSE_MIN", core)  # tracks 1 and 2 exactly at their limit
    assert not any("tracks 1 and 2" in p for p in ct.budget_problems(est))
    monkeypatch.setattr(ct, "MAX_COURSE_MIN", core - 1)
    assert any("tracks 1 and 2" in p for p in ct.budget_problems(est))
