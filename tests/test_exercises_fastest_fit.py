"""06's first exercise: the fastest combination that fits, from the notebook's own measurements."""

from __future__ import annotations

import pytest

from tutorial_utils.exercises import reset_attempts
from tutorial_utils.exercises.capstone import check_fastest_fit

MiB = 2**20
PEAKS = {"plain": 100 * MiB, "micro": 40 * MiB, "ckpt": 60 * MiB, "both": 20 * MiB}
SECONDS = {"plain": 0.010, "micro": 0.030, "ckpt": 0.015, "both": 0.045}
BUDGET = 50 * MiB  # micro and both fit; micro is the faster of the two


@pytest.fixture(autouse=True)
def fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


def test_the_fastest_that_fits_passes() -> None:
    fb = check_fastest_fit("micro", PEAKS, SECONDS, BUDGET)
    assert fb.passed, fb.problems


def test_a_slower_one_that_fits_names_the_faster() -> None:
    fb = check_fastest_fit("both", PEAKS, SECONDS, BUDGET)
    assert not fb.passed
    assert "'micro' also fits" in fb.problems[0] and "30.0 ms" in fb.problems[0]


@pytest.mark.parametrize("choice", ["plain", "ckpt"])
def test_the_fastest_overall_does_not_fit(choice: str) -> None:
    fb = check_fastest_fit(choice, PEAKS, SECONDS, BUDGET)
    assert not fb.passed
    assert "over the budget" in fb.problems[0]


@pytest.mark.parametrize("choice", [None, "TODO"])
def test_the_placeholder_is_not_answered_yet(choice: object) -> None:
    fb = check_fastest_fit(choice, PEAKS, SECONDS, BUDGET)
    assert not fb.passed and not fb.answered and fb.attempt == 0
    assert "still a placeholder" in fb.problems[0]


@pytest.mark.parametrize("choice", [3, ["micro"], float("nan"), "micro-batches"])
def test_anything_but_a_name_from_the_table_fails(choice: object) -> None:
    fb = check_fastest_fit(choice, PEAKS, SECONDS, BUDGET)
    assert not fb.passed
    assert "one of the table's names" in fb.problems[0]


def test_first_failure_hints_second_explains() -> None:
    first = check_fastest_fit("both", PEAKS, SECONDS, BUDGET)
    assert not first.detailed and first.hints and "faster" in first.briefs[0]
    assert "'micro'" not in first.briefs[0], "the brief must not give the answer away"
    second = check_fastest_fit("both", PEAKS, SECONDS, BUDGET)
    assert second.detailed and any("'micro'" in fix for fix in second.fixes)


def test_nothing_fits_is_said() -> None:
    fb = check_fastest_fit("both", PEAKS, SECONDS, 1)
    assert not fb.passed and "nothing in the table fits" in fb.problems[0]


@pytest.mark.parametrize(
    ("peaks", "seconds", "budget"),
    [
        (PEAKS, {**SECONDS, "extra": 1.0}, BUDGET),  # the two tables disagree
        ({**PEAKS, "micro": -1}, SECONDS, BUDGET),  # a negative peak
        (PEAKS, {**SECONDS, "micro": float("nan")}, BUDGET),  # a time that is not a number
        (PEAKS, SECONDS, 0),  # no budget
        ({}, {}, BUDGET),  # nothing measured
        ("peaks", SECONDS, BUDGET),  # not a dict
    ],
)
def test_bad_tables_from_the_notebook_raise_one_sentence(peaks, seconds, budget) -> None:
    with pytest.raises(ValueError, match=r"^[^\n]+$"):
        check_fastest_fit("micro", peaks, seconds, budget)


# Samples of interleaved rounds (seconds per step): 'micro' and 'both' overlap, so neither is
# slower where it counts; 'slow' fits too, but every sample of it is slower than every one of
# 'micro'.
SAMPLES = {
    "plain": [0.010, 0.011, 0.012],
    "micro": [0.030, 0.034, 0.041],
    "both": [0.033, 0.036, 0.039],
    "slow": [0.050, 0.052, 0.060],
}
SAMPLE_PEAKS = {"plain": 100 * MiB, "micro": 40 * MiB, "both": 20 * MiB, "slow": 10 * MiB}


@pytest.mark.parametrize("choice", ["micro", "both"])
def test_a_difference_that_does_not_hold_accepts_either(choice: str) -> None:
    fb = check_fastest_fit(choice, SAMPLE_PEAKS, SAMPLES, BUDGET)
    assert fb.passed, fb.problems


def test_a_difference_that_holds_in_every_sample_is_graded() -> None:
    fb = check_fastest_fit("slow", SAMPLE_PEAKS, SAMPLES, BUDGET)
    assert not fb.passed
    assert "'micro' also fits" in fb.problems[0] and "34.0 ms" in fb.problems[0]


def test_samples_that_are_not_times_raise_one_sentence() -> None:
    with pytest.raises(ValueError, match=r"^[^\n]+$"):
        check_fastest_fit("micro", SAMPLE_PEAKS, {**SAMPLES, "micro": []}, BUDGET)
    with pytest.raises(ValueError, match=r"^[^\n]+$"):
        check_fastest_fit("micro", SAMPLE_PEAKS, {**SAMPLES, "micro": [0.1, -1.0]}, BUDGET)


def test_section_5s_sentences_follow_the_samples() -> None:
    """06 §5 prints ``capstone_timing.verdict``: a direction only where every sample agrees, a
    reason derived from the counts and times it is given (no fixed table), and nothing that says
    which combination fits."""
    import collections
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "notebooks" / "scripts"))
    from capstone_timing import verdict

    seconds = {
        "plain": [0.010, 0.011, 0.012],
        "checkpointing": [0.020, 0.021, 0.030],  # every sample slower
        "4 micro-batches": [0.005, 0.006, 0.009],  # every sample faster
        "bf16 autocast": [0.009, 0.013, 0.020],  # overlaps plain's
    }
    ops = {"plain": 1000, "checkpointing": 1300, "4 micro-batches": 2600, "bf16 autocast": 1100}
    operators = {name: collections.Counter(mm=n) for name, n in ops.items()}
    operators["bf16 autocast"] = collections.Counter(mm=1004, _to_copy=96)  # 1,100 in all
    said = {name: verdict(name, MiB, seconds, operators) for name in seconds}
    # checkpointing: 1.3x the operators, each 21/11/1.3 = 1.47x as long: the mean time moved more
    assert said["checkpointing"].endswith(
        "slower in every round, mostly from each operator's mean time (1.47x plain's)"
    ), said["checkpointing"]
    # micro-batches: 0.55x the time with 2.6x the operators: each took 0.21x as long
    assert said["4 micro-batches"].endswith(
        "faster in every round, mostly from each operator's mean time (0.21x plain's)"
    ), said["4 micro-batches"]
    assert (
        "1,100 operators" in said["bf16 autocast"] and "(96 of them casts)" in said["bf16 autocast"]
    )
    assert said["bf16 autocast"].endswith("no difference that holds")
    assert "every round" not in said["bf16 autocast"] and "every round" not in said["plain"]
    assert not any("fit" in line for line in said.values())


def test_more_operators_are_named_when_they_moved_more() -> None:
    """Twice the operators at the same mean time: the count is the factor named."""
    import collections
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "notebooks" / "scripts"))
    from capstone_timing import count_operators, verdict

    seconds = {"plain": [0.010, 0.010], "twice": [0.020, 0.020]}
    operators = {"plain": collections.Counter(mm=500), "twice": collections.Counter(mm=1000)}
    assert verdict("twice", MiB, seconds, operators).endswith(
        "slower in every round, mostly from the number of operators (2.00x plain's)"
    )
    import torch

    counted = count_operators(lambda: torch.ones(2).add(1).sum())
    assert counted["ones"] == 1 and counted["add"] == 1 and counted["sum"] == 1, counted
