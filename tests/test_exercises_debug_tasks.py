"""The checkers of the debugging exercises (notebooks 00, 01, 04) and 02's build-on-device check.

Each reference answer passes; the bug the exercise ships with fails with a message that names
it; and answers that try to get around a check (wrong types, objects that compare equal to
everything, infinite loops) fail with one sentence.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

from tutorial_utils import memory
from tutorial_utils.exercises import ExerciseNotPassed, reset_attempts
from tutorial_utils.exercises.creating import check_build_on
from tutorial_utils.exercises.moving import check_accuracy_on_device
from tutorial_utils.exercises.oom import check_largest_batch
from tutorial_utils.exercises.start import check_peak_of

MiB = 2**20


@pytest.fixture(autouse=True)
def fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


# -----------------------------------------------------------------------------
# 00, exercise 3: peak_of(fn, device)


def peak_of_reference(fn, device):
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with memory.measure(device) as m:
        fn()
    return m.peak_above_start_bytes


def peak_of_shipped(fn, device):  # the notebook's buggy version
    before = torch.cuda.memory_allocated(device)
    fn()
    return torch.cuda.max_memory_allocated(device) - before


def test_peak_of_reference_passes():
    check_peak_of(peak_of_reference, "cpu").assert_passed()


def test_peak_of_shipped_bug_reads_zero_on_the_cpu():
    fb = check_peak_of(peak_of_shipped, "cpu")
    assert not fb.passed and "returned 0" in fb.report() and "CPU tensors" in fb.report()


def test_peak_of_first_attempt_hints_second_attempt_tells():
    first = repr(check_peak_of(peak_of_shipped, "cpu"))
    assert "reports 0 bytes" in first and "memory.measure" not in first, first
    second = repr(check_peak_of(peak_of_shipped, "cpu"))
    assert "use memory.measure(device) there" in second and "Fix:" in second, second


def _measured(attribute):
    def peak_of(fn, device):
        with memory.measure(device) as m:
            fn()
        return getattr(m, attribute)

    return peak_of


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (_measured("delta_bytes"), "left behind"),
        (_measured("peak_bytes"), "subtract the bytes alive at the start"),
        (lambda fn, device: (fn(), 16 * MiB)[1], "peak of an earlier block"),
        (lambda fn, device: None, "still a placeholder"),
        (lambda fn, device: (fn(), None)[1], "whole number of bytes"),
        (lambda fn, device: (fn(), float("nan"))[1], "whole number of bytes"),
        (lambda fn, device: (fn(), True)[1], "whole number of bytes"),
        (lambda fn, device: (fn(), mock.ANY)[1], "whole number of bytes"),
        (lambda fn, device: 1 / 0, "ZeroDivisionError"),
        ("not a function", "pass a function"),
    ],
)
def test_peak_of_wrong_answers_fail(answer, says):
    fb = check_peak_of(answer, "cpu")
    assert not fb.passed and says in fb.report(), fb.report()
    with pytest.raises(ExerciseNotPassed):
        fb.assert_passed()


def test_peak_of_an_int_that_equals_everything_does_not_pass():
    class Sneaky(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    fb = check_peak_of(lambda fn, device: Sneaky(3), "cpu")
    assert not fb.passed, fb.report()


def test_peak_of_a_constant_that_never_measures_fails():
    """Issue 25: ``lambda fn, d: 8 * 2**20`` passed: the checker read only the returned number."""
    never_runs = check_peak_of(lambda fn, device: 8 * MiB, "cpu")
    assert not never_runs.passed and "called fn() 0 times" in never_runs.report(), (
        never_runs.report()
    )
    runs_then_guesses = check_peak_of(lambda fn, device: (fn(), 8 * MiB)[1], "cpu")
    assert not runs_then_guesses.passed and "6,291,456" in runs_then_guesses.report()


# -----------------------------------------------------------------------------
# 01, exercise 3: accuracy(model, batches, device)


def accuracy_reference(model, batches, device):
    model.to(device)
    correct = torch.zeros((), device=device)
    total = 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(dim=1) == y).sum()
        total += len(y)
    return correct / total


def accuracy_shipped(model, batches, device):  # the notebook's buggy version
    model.to(device)
    correct = torch.zeros(())
    total = 0
    for x, y in batches:
        x.to(device)
        y = y.to(device)
        correct += (model(x).argmax(dim=1) == y).sum()
        total += len(y)
    return correct / total


def accuracy_counter_on_cpu(model, batches, device):  # the first bug fixed, not the second
    model.to(device)
    correct = torch.zeros(())
    total = 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(dim=1) == y).sum()
        total += len(y)
    return correct / total


def accuracy_item_per_batch(model, batches, device):
    model.to(device)
    hits = sum((model(x.to(device)).argmax(dim=1) == y.to(device)).sum().item() for x, y in batches)
    return hits / sum(len(y) for _, y in batches)


def accuracy_mean_of_batch_means(model, batches, device):
    model.to(device)
    means = [(model(x.to(device)).argmax(dim=1) == y.to(device)).float().mean() for x, y in batches]
    return torch.stack(means).mean()


@pytest.mark.slow  # the first sum on 'meta' loads PyTorch's decompositions
def test_accuracy_reference_passes():
    check_accuracy_on_device(accuracy_reference, "cpu").assert_passed()


@pytest.mark.slow  # the first sum on 'meta' loads PyTorch's decompositions
def test_accuracy_shipped_bug_raises_on_meta():
    fb = check_accuracy_on_device(accuracy_shipped, "cpu")
    assert not fb.passed and "accuracy(model, batches, 'meta') raised RuntimeError" in fb.report()


@pytest.mark.slow  # the first sum on 'meta' loads PyTorch's decompositions
def test_accuracy_counter_left_on_the_cpu_is_caught():
    fb = check_accuracy_on_device(accuracy_counter_on_cpu, "cpu")
    assert not fb.passed and "the result is on cpu" in fb.report(), fb.report()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (accuracy_item_per_batch, "return a 0-dim tensor on the device"),
        (accuracy_mean_of_batch_means, "the right value is"),
        (lambda model, batches, device: None, "still a placeholder"),
        (lambda model, batches, device: torch.zeros(2, device=device), "not () (0-dim)"),
        (lambda model, batches, device: torch.zeros((), dtype=torch.long), "divide"),
        (lambda model, batches, device: mock.ANY, "return a 0-dim tensor"),
        (42, "pass a function"),
    ],
)
def test_accuracy_wrong_answers_fail(answer, says):
    fb = check_accuracy_on_device(answer, "cpu")
    assert not fb.passed and says in fb.report(), fb.report()


@pytest.mark.slow  # the first sum on 'meta' loads PyTorch's decompositions
def test_accuracy_nan_fails():
    fb = check_accuracy_on_device(
        lambda model, batches, device: torch.tensor(float("nan"), device=device), "cpu"
    )
    assert not fb.passed, fb.report()


# -----------------------------------------------------------------------------
# 02, exercise 2: build(device) must create the parameters on the device


def _layers():
    return [nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)]


def build_reference(device):
    with torch.device(device):
        return nn.Sequential(*_layers())


def build_then_move(device):
    return nn.Sequential(*_layers()).to(device)


def test_build_reference_passes_on_meta():
    check_build_on(build_reference, "meta").assert_passed()


def test_build_on_the_cpu_then_moved_is_caught():
    fb = check_build_on(build_then_move, "meta")
    assert not fb.passed and "created on the CPU first" in fb.report(), fb.report()
    assert "start on the CPU" in repr(fb) and "with torch.device" not in repr(fb), "a hint first"
    assert torch.get_default_device() == torch.device("cpu")


def test_build_that_leaks_the_default_device_is_caught_and_repaired():
    def leaky(device):
        torch.set_default_device(device)
        return nn.Sequential(*_layers())

    fb = check_build_on(leaky, "meta")
    assert not fb.passed and "the default device is meta" in fb.report()
    assert torch.get_default_device() == torch.device("cpu"), "the checker puts the default back"


# -----------------------------------------------------------------------------
# 05, exercise 2: largest_fitting_batch(try_step, batch_size)


def largest_reference(try_step, batch_size):
    while True:
        try:
            try_step(batch_size)
            return batch_size
        except torch.OutOfMemoryError:
            if batch_size == 1:
                raise
        batch_size //= 2


def largest_shipped(try_step, batch_size):  # the notebook's buggy version
    try:
        try_step(batch_size)
        return batch_size
    except torch.OutOfMemoryError:
        if batch_size == 1:
            raise
        return largest_shipped(try_step, batch_size // 2)


def largest_keeps_errors(try_step, batch_size):
    kept = []
    while True:
        try:
            try_step(batch_size)
            return batch_size
        except torch.OutOfMemoryError as err:
            kept.append(err)  # a log of failures that pins every failed attempt
        batch_size //= 2


@pytest.mark.slow
def test_largest_reference_passes():
    check_largest_batch(largest_reference).assert_passed()


@pytest.mark.slow
def test_largest_first_attempt_hints_without_the_fix():
    first = repr(check_largest_batch(largest_shipped))
    assert "Hint:" in first and "Fix:" not in first and "outside" not in first, first
    # the notebook is saved with this response: it must not say where the bug is (issue 20 §5)
    assert "except" not in first, first


@pytest.mark.slow
@pytest.mark.parametrize("answer", [largest_shipped, largest_keeps_errors])
def test_largest_holding_failed_attempts_is_caught(answer):
    fb = check_largest_batch(answer)
    assert not fb.passed and "earlier failed attempts were still holding memory" in fb.report()
    assert "1024, 512, 256, 128, 64" in fb.report(), "it says which sizes were tried"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (lambda try_step, n: 64, "halve from 1024"),  # never tried anything
        (lambda try_step, n: (try_step(64), 64)[1], "halve from 1024"),  # jumped to the answer
        (lambda try_step, n: None, "still a placeholder"),
        (lambda try_step, n: mock.ANY, "as an int"),
        (lambda try_step, n: try_step(0), "1 or more"),
    ],
)
def test_largest_wrong_answers_fail(answer, says):
    fb = check_largest_batch(answer)
    assert not fb.passed and says in fb.report(), fb.report()


@pytest.mark.slow
def test_largest_an_endless_loop_is_stopped_with_a_sentence():
    def forever(try_step, n):
        while True:
            try:
                try_step(n)
                return n
            except torch.OutOfMemoryError:
                pass

    fb = check_largest_batch(forever)
    assert not fb.passed and "does the loop stop?" in fb.report()


# -----------------------------------------------------------------------------
# Properties: random wrong answers never pass (the strategy mirrors test_exercises_properties)


class _EqualToAll:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


class _EqInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


_garbage = st.one_of(
    st.sampled_from([None, float("nan"), float("inf"), mock.ANY, _EqualToAll(), "8 MiB", [], True]),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.builds(_EqInt, st.integers(-(10**6), 10**6)),
    st.builds(
        lambda fill, shape: torch.full(shape, fill),
        st.sampled_from([0.0, 1.0, float("nan")]),
        st.sampled_from([(), (1,), (2, 2)]),
    ),
)
_PROPERTY = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@_PROPERTY
@given(answer=_garbage)
def test_peak_of_rejects_garbage(answer):
    assume(not (type(answer) is int and answer == 8 * MiB))
    fb = check_peak_of(lambda fn, device: answer, "cpu")
    assert not fb.passed and fb.problems, repr(fb)


@pytest.mark.slow
@settings(_PROPERTY, max_examples=10)
@given(answer=_garbage)
def test_accuracy_rejects_garbage(answer):
    fb = check_accuracy_on_device(lambda model, batches, device: answer, "cpu")
    assert not fb.passed and fb.problems, repr(fb)


@pytest.mark.slow
@settings(_PROPERTY, max_examples=4)
@given(answer=_garbage)
def test_largest_batch_rejects_garbage(answer):
    fb = check_largest_batch(lambda try_step, n: answer)
    assert not fb.passed and fb.problems, repr(fb)
