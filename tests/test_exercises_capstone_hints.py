"""Issue 20 §6: the capstone's hint follows what the attempt did, measured by the grader.

Four different wrong attempts (bf16 alone, micro-batches that run out of memory at step 2,
too few micro-batches, one graph over all micro-batches) used to get the same hint and fix.
Each gets its own here, from what the grader saw: its forward and backward passes, its
autocast dtype, the step at which it ran out of memory.
"""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tutorial_utils import memory
from tutorial_utils.exercises import reset_attempts
from tutorial_utils.exercises.capstone import CapstoneTask, _advice, grade, solution_step
from tutorial_utils.models import MLP, TinyTransformer, mlp_batch, token_batch


def make_model():
    return MLP(d_in=64, d_hidden=128, d_out=5, depth=3, seed=0)


X = mlp_batch(512, 64, seed=1)
Y = torch.randint(0, 5, (512,), generator=torch.Generator().manual_seed(2))
CPU = torch.device("cpu")
BIG = CapstoneTask(make_model, X, Y, budget_bytes=2**30, device=CPU, lr=1e-3, steps=2)


def step(model, optimizer, x, y, k=4, bf16=False, one_graph=False):
    optimizer.zero_grad()
    total = 0.0
    for xc, yc in zip(x.chunk(k), y.chunk(k), strict=True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(xc)
        loss = nn.functional.cross_entropy(out.float(), yc) / k
        if one_graph:
            total = total + loss
        else:
            loss.backward()
            total += loss.item()
    if one_graph:
        total.backward()
        total = total.item()
    optimizer.step()
    return total


def _budgets() -> tuple[CapstoneTask, CapstoneTask]:
    """Two budgets from the grader's own peaks. They count every tensor alive in the process,
    so they are measured when this module's tests start, not at import: tensors that earlier
    test files in the same process left alive count too, and budgets measured at import drift.
    ROOMY: 4 micro-batches fit with 3% to spare, and every attempt below runs out at step 1
    (their peaks are at least 1.1x). TIGHT: step 1 of 4 micro-batches fits; step 2, which adds
    Adam's state (2 floats per parameter), not."""
    reset_attempts()
    with memory.measure("cpu") as m:  # what earlier tests in this process left alive
        pass
    base = m.start_bytes
    k4 = grade(step, BIG, exercise="budgets").peak_bytes - base
    others = [
        grade(fn, BIG, exercise="budgets").peak_bytes - base
        for fn in (lambda *a: step(*a, k=2), lambda *a: step(*a, k=1, bf16=True))
    ]
    assert min(others) > 1.1 * k4, (k4, others)
    adam = 2 * 4 * sum(p.numel() for p in make_model().parameters())
    roomy = CapstoneTask(make_model, X, Y, base + int(1.03 * k4), CPU, lr=1e-3, steps=2)
    tight = CapstoneTask(make_model, X, Y, base + k4 - adam // 4, CPU, lr=1e-3, steps=2)
    return roomy, tight


@pytest.fixture(autouse=True)
def _fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


@pytest.fixture(scope="module")
def budgets():
    import gc

    gc.collect()
    return _budgets()


def _first_and_second(fn, task):
    """The first answer (brief and hint) and the second (details and fix) for one attempt."""
    first = grade(fn, task, exercise="hint test")
    second = grade(fn, task, exercise="hint test")
    return repr(first.feedback), repr(second.feedback)


def test_four_micro_batches_fit_the_roomy_budget(budgets):
    ROOMY, TIGHT = budgets
    assert grade(step, ROOMY).feedback.passed  # the budgets below separate the attempts


def test_bf16_alone_is_told_that_autocast_is_not_enough(budgets):
    ROOMY, TIGHT = budgets
    first, second = _first_and_second(lambda *a: step(*a, k=1, bf16=True), ROOMY)
    assert "step 1 ran out of memory; your step: 1 forward pass, 1 backward call, bfloat16" in first
    assert "autocast halves what is saved for backward" in first, first
    assert "Fix: split the batch into k micro-batches" in second, second


def test_one_graph_over_all_micro_batches_is_told_about_the_single_backward(budgets):
    ROOMY, TIGHT = budgets
    first, second = _first_and_second(lambda *a: step(*a, k=4, one_graph=True), ROOMY)
    assert "4 forward passes, 1 backward call, fp32" in first, first
    assert "with 4 forward passes and one backward" in first, first
    assert "call backward() on each micro-batch's loss" in second, second
    assert "Adam's state" not in second


def test_too_few_micro_batches_are_told_to_shrink_each_one(budgets):
    ROOMY, TIGHT = budgets
    first, second = _first_and_second(lambda *a: step(*a, k=2), ROOMY)
    assert "step 1 ran out of memory; your step: 2 forward passes, 2 backward calls" in first
    assert "2 micro-batches, still keep too many activations alive" in first, first
    assert "Fix: more micro-batches" in second, second


def test_out_of_memory_at_step_2_is_told_about_the_optimizer_state(budgets):
    ROOMY, TIGHT = budgets
    first, second = _first_and_second(step, TIGHT)
    assert "step 2 ran out of memory (step 1 fit); your step: 4 forward passes" in first, first
    assert "with 4 micro-batches step 1 fit and step 2 did not" in first, first
    assert "Adam's state" in first and "notebook 04 §5" in first, "points to where it is taught"
    assert "Fix: more micro-batches" in second, second


def test_the_plain_step_keeps_the_general_hint(budgets):
    ROOMY, TIGHT = budgets
    first, _ = _first_and_second(lambda *a: step(*a, k=1), ROOMY)
    assert "1 forward pass, 1 backward call, fp32" in first, first
    assert "the activations of the whole batch are what does not fit" in first, first


def test_every_wrong_attempt_gets_its_own_hint(budgets):
    ROOMY, TIGHT = budgets
    attempts = {
        "bf16 alone": (lambda *a: step(*a, k=1, bf16=True), ROOMY),
        "one graph": (lambda *a: step(*a, k=4, one_graph=True), ROOMY),
        "2 micro-batches": (lambda *a: step(*a, k=2), ROOMY),
        "step 2 out of memory": (step, TIGHT),
        "plain": (lambda *a: step(*a, k=1), ROOMY),
    }
    hints = {}
    for name, (fn, task) in attempts.items():
        fb = grade(fn, task, exercise=name).feedback
        assert not fb.passed, name
        hints[name] = (tuple(fb.hints), tuple(fb.fixes))
    assert len(set(hints.values())) == len(attempts), hints


@pytest.mark.heavy
def test_solution_step_passes_on_the_capstone_model_and_refuses_another():
    tokens = token_batch(8, 16, vocab=100, seed=1)
    labels = torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(2))

    def tiny():
        return TinyTransformer(vocab=100, d_model=16, n_heads=2, n_layers=2, n_classes=5, seed=0)

    task = CapstoneTask(tiny, tokens, labels, budget_bytes=2**30, device=CPU)
    assert grade(solution_step, task, solution_allowed=True).feedback.passed
    with pytest.raises(ValueError, match="TinyTransformer"):
        model = make_model()
        solution_step(model, torch.optim.Adam(model.parameters()), X, Y)


def _profile(forwards, backwards, autocast=None, checkpointed=False):
    return SimpleNamespace(
        forwards=forwards, backwards=backwards, autocast=autocast, checkpointed=checkpointed
    )


def test_each_kind_of_attempt_gets_its_own_hint_and_fix():
    """The hint is chosen from what the attempt did; no two kinds share one (issue 20 §6: 06's
    4 micro-batches and its tight-budget exercise, both out of memory at step 2, shared one)."""
    kinds = {
        "plain": (_profile(1, 1), 1),
        "bf16 alone": (_profile(1, 1, autocast=torch.bfloat16), 1),
        "checkpointing alone": (_profile(1, 1, checkpointed=True), 1),
        "one graph over 8 micro-batches": (_profile(8, 1), 1),
        "4 micro-batches, out at step 2": (_profile(4, 4), 2),
        "4 checkpointed micro-batches, out at step 2": (_profile(4, 4, checkpointed=True), 2),
        "4 micro-batches, out at step 1": (_profile(4, 4), 1),
        "4 checkpointed micro-batches, out at step 1": (_profile(4, 4, checkpointed=True), 1),
    }
    advice = {name: _advice(profile, step) for name, (profile, step) in kinds.items()}
    assert len({hint for hint, _ in advice.values()}) == len(kinds), advice
    assert "checkpointing is on already" in advice["4 checkpointed micro-batches, out at step 2"][1]
    assert "or checkpointing on top" in advice["4 micro-batches, out at step 2"][1]
    assert _advice(None, 1) == advice["plain"]  # nothing measured: the general hint
