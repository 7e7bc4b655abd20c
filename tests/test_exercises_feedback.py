"""Feedback: the first wrong answer gets a hint, asking again gets every problem and the fix."""

from __future__ import annotations

import pytest

from tutorial_utils.exercises import (
    ExerciseNotPassed,
    Feedback,
    checker,
    reset_attempts,
    start,
)


@pytest.fixture(autouse=True)
def fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


@checker
def check_double(double) -> Feedback:
    fb = Feedback("double(x) returns 2 * x")
    fb.hint("what does multiplying by a number do?")
    fb.fix("return x * 2")
    got = fb.run("double(3)", double, 3, returns=int)
    fb.expect(got == 6, f"double(3) is {got}, not 6", brief="the value is wrong")
    fb.expect(got % 2 == 0, f"{got} is odd", brief="the result is odd")
    return fb


def test_first_wrong_answer_shows_the_general_problem_and_the_hint_only():
    fb = check_double(lambda x: x + 2)
    shown = repr(fb)
    assert fb.attempt == 1 and not fb.detailed
    assert "the value is wrong (and 1 more problem)" in shown
    assert "Hint: what does multiplying" in shown
    assert "double(3) is 5" not in shown and "return x * 2" not in shown  # no details, no fix
    assert ".explain()" in shown
    html = fb._repr_html_()
    assert "the value is wrong" in html and "return x * 2" not in html


def test_asking_again_shows_every_problem_and_the_fix():
    check_double(lambda x: x + 2)
    second = check_double(lambda x: x + 2)
    assert second.attempt == 2 and second.detailed
    shown = repr(second)
    assert "double(3) is 5, not 6" in shown and "5 is odd" in shown
    assert "Fix: return x * 2" in shown and "return x * 2" in second._repr_html_()


def test_explain_shows_everything_at_once():
    fb = check_double(lambda x: x + 2)
    assert fb.explain() is fb
    assert "double(3) is 5, not 6" in repr(fb) and "Fix: return x * 2" in repr(fb)


def test_print_shows_what_the_display_shows_a_hint_first(capsys):
    """Issue 38 §4: ``print(feedback)`` used ``__str__``, the whole report, so it gave the fix
    on the first attempt while the notebook's display gave a hint. The two agree now."""
    fb = check_double(lambda x: x + 2)
    print(fb)
    printed = capsys.readouterr().out
    assert printed == repr(fb) + "\n" == str(fb) + "\n"
    assert "Hint: what does multiplying" in printed and "the value is wrong" in printed
    assert "return x * 2" not in printed and "double(3) is 5" not in printed
    second = check_double(lambda x: x + 2)  # asking again: printed as displayed, fix and all
    assert str(second) == repr(second) and "Fix: return x * 2" in str(second)


def test_explain_makes_print_show_everything(capsys):
    fb = check_double(lambda x: x + 2)
    print(fb.explain())
    printed = capsys.readouterr().out
    assert "double(3) is 5, not 6" in printed and "5 is odd" in printed
    assert "Fix: return x * 2" in printed


def test_report_is_the_whole_report_when_asked_for():
    fb = check_double(lambda x: x + 2)
    assert not fb.detailed
    full = fb.report()
    assert "double(3) is 5, not 6" in full and "5 is odd" in full and "Fix: return x * 2" in full
    assert not fb.detailed, "reading the report does not change what the notebook shows"


def test_assert_passed_lists_every_problem_and_the_fix_only_when_asked():
    fb = check_double(lambda x: x + 2)
    with pytest.raises(ExerciseNotPassed) as err:
        fb.assert_passed()
    first = str(err.value)
    assert "double(3) is 5, not 6" in first and "5 is odd" in first, "every problem, in detail"
    assert "return x * 2" not in first and ".explain()" in first, "a first attempt: no fix"
    with pytest.raises(ExerciseNotPassed) as err:
        fb.explain().assert_passed()
    assert "Fix: return x * 2" in str(err.value)
    with pytest.raises(ExerciseNotPassed) as err:
        check_double(lambda x: x + 2).assert_passed()  # a second attempt shows the fix too
    assert "Fix: return x * 2" in str(err.value)


def test_attempts_are_counted_per_exercise_and_reset():
    check_double(lambda x: x + 2)
    assert start.check_matmul_peak(lambda: 1).attempt == 1  # another exercise starts at one
    assert check_double(lambda x: x).attempt == 2
    reset_attempts()
    assert check_double(lambda x: x).attempt == 1


def test_one_checker_grading_several_exercises_counts_each_apart():
    check_double(lambda x: x + 2)  # an earlier exercise graded by the same checker
    first = check_double(lambda x: x + 2, attempt_key="exercise 2")
    assert first.attempt == 1 and not first.detailed, "a new exercise starts with a hint"
    assert check_double(lambda x: x + 2, attempt_key="exercise 2").detailed
    assert check_double(lambda x: x + 2, attempt_key="exercise 3").attempt == 1
    assert check_double(lambda x: x + 2).attempt == 2  # the unnamed one kept its own count
    with pytest.raises(ValueError, match="string"):
        check_double(lambda x: x, attempt_key=3)


def test_a_pass_shows_passed_and_does_not_count():
    fb = check_double(lambda x: 2 * x)
    assert fb.passed and fb.attempt == 0
    assert repr(fb) == str(fb) == "Passed: double(x) returns 2 * x."
    assert fb.assert_passed() is fb
    assert check_double(lambda x: x).attempt == 1


@pytest.mark.parametrize(
    ("double", "problem"),
    [
        (lambda x: None, "double(3) returned None: is the `return` statement missing?"),
        (lambda x: "6", "double(3) returned '6' (a str); expected an int"),
        (lambda x: 1 / 0, "double(3) raised ZeroDivisionError: division by zero"),
        (42, "pass a function: 42 is an int"),
    ],
)
def test_run_reports_the_learners_code_and_stops(double, problem):
    fb = check_double(double)
    assert fb.problems == [problem]  # it stopped: the value checks after run() never ran


def test_require_and_run_outside_a_checker_say_how_to_use_them():
    fb = Feedback("no decorator")
    with pytest.raises(Exception, match="decorate the checker with @exercises.checker"):
        fb.require(False, "wrong")


def test_brief_defaults_to_the_problem():
    fb = Feedback("t")
    fb.expect(False, "the detailed problem")
    assert fb.briefs == ["the detailed problem"]
    assert "the detailed problem" in repr(fb)


def test_a_learner_value_with_a_broken_repr_is_described_safely():
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no")

    fb = start.check_matmul_peak(Hostile)  # returns a Hostile
    assert "a Hostile" in fb.report()


# --- issue 25: an untouched exercise cell is not an attempt --------------------------------


def _untouched_cells():
    """Each exercise cell of notebooks 00-07 whose answer is a placeholder, as it ships."""
    from tutorial_utils import models
    from tutorial_utils.exercises import capstone, oom, parallel, precision

    def bubble_fraction(p, m):
        return None  # TODO

    table = ({"plain": 2, "micro": 1}, {"plain": 0.1, "micro": 0.2}, 1)
    return {
        "00 ex 1": lambda: start.check_matmul_peak(...),
        "07 ex 1": lambda: parallel.check_sampler_padding(None, None),
        "07 ex 2": lambda: parallel.check_allreduce_counts(None, None, k=8, buckets=1),
        "08 ex 1": lambda: parallel.check_bubble(bubble_fraction),
        "04 ex 1": lambda: oom.check_training_state_bytes(models.MLP(d_in=3, d_out=2), 0),
        "05 ex 1": lambda: precision.check_fp16_survival(
            {70000.0: "TODO", 60000.0: "TODO", 1e-4: "TODO", 1e-9: "TODO"}
        ),
        "06 ex 1": lambda: capstone.check_fastest_fit("TODO", *table),
    }


@pytest.mark.parametrize("cell", list(_untouched_cells()))
def test_an_untouched_exercise_cell_is_not_an_attempt(cell):
    """Run All ran every TODO cell as shipped and counted it as attempt 1, so the first real
    wrong answer got the full fix. A placeholder is "not answered yet", and not counted."""
    run = _untouched_cells()[cell]
    first, again = run(), run()
    for fb in (first, again):
        assert not fb.passed and not fb.answered and fb.attempt == 0, repr(fb)
        assert repr(fb).startswith("Not answered yet") and "fill in the TODO" in repr(fb)
        assert "Fix:" not in repr(fb) and "Fix:" not in str(fb)
    with pytest.raises(ExerciseNotPassed):
        first.assert_passed()


@pytest.mark.parametrize(
    "wrong",
    [
        lambda: start.check_matmul_peak(lambda: 0),  # torch.cuda's counters on the CPU: an answer
        lambda: start.check_matmul_peak(lambda: "602112"),  # text, not a number: an answer
        lambda: _precision().check_fp16_survival({70000.0: "inf", 60000.0: "TODO"}),
        lambda: _parallel().check_bubble(lambda p, m: p / m),
    ],
)
def test_a_real_wrong_answer_is_an_attempt(wrong):
    fb = wrong()
    assert not fb.passed and fb.answered and fb.attempt == 1, repr(fb)
    assert "Not yet" in repr(fb)


def _parallel():
    from tutorial_utils.exercises import parallel

    return parallel


def _precision():
    from tutorial_utils.exercises import precision

    return precision


def test_a_half_answered_cell_names_what_is_still_to_fill_in():
    fb = _parallel().check_sampler_padding(22, None)
    assert not fb.answered and fb.problems == [
        "`repeated` is still a placeholder (None): fill in the TODO in the exercise cell, then "
        "run it again (this run did not count as an attempt)"
    ]


def test_the_first_real_answer_after_an_untouched_cell_gets_the_hint():
    start.check_matmul_peak(...)  # Run All
    first = start.check_matmul_peak(lambda: 512 * 128 * 4)  # only the output
    assert first.attempt == 1 and not first.detailed and "Fix:" not in repr(first)


def test_answers_must_name_the_checkers_arguments():
    with pytest.raises(ValueError, match="names no argument"):

        @checker(answers=("nope",))
        def check_something(answer) -> Feedback:
            return Feedback("x")
