import pytest
import torch

from tutorial_utils import memory
from tutorial_utils.exercises import hangs, reset_attempts, start


def _measured(field):
    """A matmul_peak() that returns one of the measurement's numbers (``field``)."""

    def matmul_peak():
        with memory.measure("cpu") as m:
            torch.randn(512, 256) @ torch.randn(256, 128)
        return field(m)

    return matmul_peak


def test_matmul_peak():
    assert start.check_matmul_peak(_measured(lambda m: m.peak_bytes - m.start_bytes)).passed
    assert start.check_matmul_peak(_measured(lambda m: m.peak_above_start_bytes)).passed
    assert "only the output" in start.check_matmul_peak(lambda: 512 * 128 * 4).report()
    assert (
        "only the inputs" in start.check_matmul_peak(lambda: 512 * 256 * 4 + 256 * 128 * 4).report()
    )
    assert "alive before" in start.check_matmul_peak(_measured(lambda m: m.peak_bytes)).report()
    assert not start.check_matmul_peak(lambda: True)
    html = start.check_matmul_peak(lambda: 1)._repr_html_()
    assert "Not yet" in html


KEPT = []  # what a notebook keeps alive between two runs of a cell


@pytest.mark.parametrize(
    "field",
    [lambda m: m.peak_bytes, lambda m: m.delta_bytes, lambda m: m.end_bytes, lambda m: 5],
    ids=["peak without the start", "delta", "end", "a constant"],
)
def test_rerunning_the_same_wrong_answer_gives_the_same_diagnosis(field):
    """Issue 20 §6: with the answer a number, the last run's output stayed alive and changed
    the next run's numbers, so the same wrong cell got another diagnosis (or passed by luck).
    The checker now runs the learner's function itself, with its own tensors alive."""
    reset_attempts()
    runs = []
    for _ in range(3):
        fb = start.check_matmul_peak(_measured(field))
        runs.append((fb.passed, fb.briefs[:1], [p.split(" bytes")[-1] for p in fb.problems]))
        KEPT.append(torch.ones(64 * 1024))  # the notebook holds more on every run
    KEPT.clear()
    assert not runs[0][0] and runs[0] == runs[1] == runs[2], runs
    reset_attempts()


def test_a_matmul_peak_that_keeps_state_is_told_so():
    calls = []

    def matmul_peak():
        calls.append(1)
        return 917504 * len(calls)

    fb = start.check_matmul_peak(matmul_peak)
    assert not fb and "then" in fb.report() and "different number each time" in fb.briefs[0]


@pytest.mark.parametrize(
    ("check", "wrong"),
    [
        (start.check_matmul_peak, lambda: 512 * 128 * 4),  # only the output
        (start.check_matmul_peak, lambda: 5),
    ],
)
def test_a_second_wrong_attempt_shows_the_fix(check, wrong):
    """Issue 25: the fix was declared after the first failed requirement, so never shown."""
    reset_attempts()
    check(wrong)
    second = check(wrong)
    assert second.detailed and "Fix:" in repr(second), repr(second)
    reset_attempts()


def _untouched_function():
    """Bytes above the start at the peak of the matmul."""
    ...  # TODO: measure it


@pytest.mark.parametrize(
    ("check", "untouched"),
    [(hangs.check_timeout, v) for v in (..., None, "TODO", "...", " ... ", "\u2026", "")]
    + [(start.check_matmul_peak, v) for v in (..., None, _untouched_function)],
)
def test_an_untouched_answer_is_told_to_fill_in_the_todo(check, untouched):
    """Issue 20 §6: an untouched answer got "not a whole number of bytes" (for "..." typed as
    text); every form of the placeholder gets "fill in the TODO", shown every way, and does not
    count as an attempt."""
    reset_attempts()
    fb = check(untouched)
    assert not fb.passed and not fb.answered and fb.attempt == 0
    for text in (repr(fb), str(fb), repr(fb.explain()), fb._repr_html_()):
        assert "fill in the TODO" in text and "whole number" not in text, text
    reset_attempts()


def test_the_first_hint_of_exercise_2_does_not_give_the_answer():
    """Issue 20 §6: the saved output of 00's exercise 2 (the placeholder's response) showed the
    whole answer as its hint: the measure block and the subtraction."""
    shown = repr(start.check_matmul_peak(_untouched_function))
    assert "m.peak_bytes - m.start_bytes" not in shown and "peak_above_start" not in shown
    assert "memory.measure" in shown  # the tool to use, not how to use it
