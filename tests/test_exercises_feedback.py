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


def test_str_and_assert_passed_always_list_every_problem():
    fb = check_double(lambda x: x + 2)
    assert not fb.detailed
    assert "double(3) is 5, not 6" in str(fb) and "5 is odd" in str(fb)
    with pytest.raises(ExerciseNotPassed) as err:
        fb.assert_passed()
    assert "double(3) is 5, not 6" in str(err.value) and "5 is odd" in str(err.value)


def test_attempts_are_counted_per_exercise_and_reset():
    check_double(lambda x: x + 2)
    assert start.check_tensor_bytes(1).attempt == 1  # another exercise starts at one
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

    fb = start.check_tensor_bytes(Hostile())
    assert "a Hostile" in str(fb)
