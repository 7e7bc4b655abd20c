"""Checkers of notebooks 09 and 10: they pass the reference answers and fail the usual mistakes."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from conftest import EqFloat, EqInt, EqualToAll
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from tutorial_utils.exercises import Feedback, reset_attempts
from tutorial_utils.exercises.sharding import (
    _GRID,
    LINEARS,
    check_batch_for,
    check_fsdp_bytes,
    check_tp_plan,
    check_zero_bytes,
    tp_plan_cost,
)


@pytest.fixture(autouse=True)
def _fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


def zero_bytes(stage, psi, n, k, width=4, sharded=(1, 2, 3)):
    """The parts on one rank; ``sharded``: the stage from which state, grads, params are split."""
    state_from, grads_from, params_from = sharded
    return {
        "params": width * psi / (n if stage >= params_from else 1),
        "grads": width * psi / (n if stage >= grads_from else 1),
        "state": k * psi / (n if stage >= state_from else 1),
    }


def test_zero_bytes_passes_the_formulas():
    assert check_zero_bytes(zero_bytes).passed


def test_zero_bytes_fails_the_playbooks_bf16_form_with_a_hint_about_dtypes():
    def bf16(stage, psi, n, k):
        return zero_bytes(stage, psi, n, k, width=2)

    fb = check_zero_bytes(bf16)
    assert not fb.passed and fb.answered and fb.attempt == 1
    assert any("4 bytes each, not 2" in h for h in fb.hints)


@pytest.mark.parametrize(
    "wrong",
    [
        # ZeRO-2 written as ZeRO-3 (parameters sharded too)
        lambda s, psi, n, k: zero_bytes(3 if s == 2 else s, psi, n, k),
        # ZeRO-2 shards the parameters instead of the gradients: the same totals in fp32
        lambda s, psi, n, k: zero_bytes(s, psi, n, k, sharded=(1, 3, 2)),
        # every stage shards everything
        lambda s, psi, n, k: zero_bytes(s, psi, n, k, sharded=(0, 0, 0)),
        # stages shifted by one
        lambda s, psi, n, k: zero_bytes(min(s + 1, 3), psi, n, k),
        # the total, not the parts; NaN and non-numbers
        lambda s, psi, n, k: sum(zero_bytes(s, psi, n, k).values()),
        lambda s, psi, n, k: {**zero_bytes(s, psi, n, k), "state": float("nan")},
        lambda s, psi, n, k: {**zero_bytes(s, psi, n, k), "grads": "many"},
        lambda s, psi, n, k: {**zero_bytes(s, psi, n, k), "params": torch.tensor(1.0)},
    ],
)
def test_zero_bytes_fails_wrong_answers(wrong):
    assert not check_zero_bytes(wrong).passed


def test_zero_bytes_placeholder_is_not_an_attempt():
    fb = check_zero_bytes(lambda stage, psi, n, k: None)
    assert not fb.passed and not fb.answered and fb.attempt == 0
    assert "Not answered yet" in repr(fb)


def test_zero_bytes_reports_what_the_function_raised():
    fb = check_zero_bytes(lambda stage, psi, n, k: {}[stage])
    assert not fb.passed and "KeyError" in fb.report()


def fsdp_bytes(psi, k, sync, param_bytes, reduce_bytes):
    """Notebook 09 exercise 2's solution: ZeRO-3 gathers twice per micro-batch, and reduces in
    every micro-batch or in the last only."""
    reduces = k if sync == "every" else 1
    return {"all_gather": 2 * k * param_bytes * psi, "reduce_scatter": reduces * reduce_bytes * psi}


def test_fsdp_bytes_passes_the_formulas_as_floats_too():
    assert check_fsdp_bytes(fsdp_bytes).passed
    as_floats = lambda *a: {c: float(b) for c, b in fsdp_bytes(*a).items()}  # noqa: E731
    assert check_fsdp_bytes(as_floats).passed


def test_fsdp_bytes_gives_the_hint_of_the_one_mistake_then_the_fix():
    reduced_k_times = lambda psi, k, sync, pb, rb: fsdp_bytes(psi, k, "every", pb, rb)  # noqa: E731
    first = check_fsdp_bytes(reduced_k_times)
    assert not first.passed and first.attempt == 1
    assert any("only the last micro-batch" in h for h in first.hints), first.hints
    assert "reduce_scatter = (k if sync" not in repr(first), "the first answer gets no fix"
    second = check_fsdp_bytes(reduced_k_times)
    assert "reduce_scatter = (k if sync" in repr(second), "a second one does"


def test_fsdp_bytes_placeholder_is_not_an_attempt_and_wrong_keys_are_named():
    fb = check_fsdp_bytes(lambda psi, k, sync, pb, rb: None)
    assert not fb.passed and not fb.answered and fb.attempt == 0
    keys = check_fsdp_bytes(lambda psi, k, sync, pb, rb: {"all_reduce": 1})
    assert "returned a dict with keys" in keys.report()


MEGATRON = {
    "attn.q": "colwise",
    "attn.k": "colwise",
    "attn.v": "colwise",
    "attn.o": "rowwise",
    "mlp.fc1": "colwise",
    "mlp.fc2": "rowwise",
}


def test_tp_plan_costs_follow_megatron():
    assert tp_plan_cost(MEGATRON) == 2  # one all-reduce per sub-block (notebook 10 measured it)
    assert tp_plan_cost(dict.fromkeys(LINEARS, "colwise")) == 4
    assert tp_plan_cost(dict.fromkeys(LINEARS, "rowwise")) == 6
    assert tp_plan_cost(dict.fromkeys(LINEARS)) == 0  # nothing split: nothing to communicate


def test_tp_plan_passes_megatron_as_strings_and_as_torch_styles():
    assert check_tp_plan(MEGATRON).passed
    objects = {
        n: ColwiseParallel() if s == "colwise" else RowwiseParallel() for n, s in MEGATRON.items()
    }
    assert check_tp_plan(objects).passed


@pytest.mark.parametrize(
    "change",
    [
        {"mlp.fc1": "rowwise", "mlp.fc2": "colwise"},  # swapped
        {"attn.o": "colwise"},
        {"attn.k": "rowwise"},  # one head projection split the other way
        {"mlp.fc2": None},  # a Linear left whole: cheap, but not split
        {"attn.q": "diagonal"},
    ],
)
def test_tp_plan_fails_costlier_or_incomplete_plans(change):
    fb = check_tp_plan({**MEGATRON, **change})
    assert not fb.passed and fb.answered


def test_tp_plan_fails_a_plan_for_another_model_and_counts_placeholders_apart():
    assert not check_tp_plan({"fc1": "colwise", "fc2": "rowwise"}).passed
    assert not check_tp_plan(["colwise"] * 6).passed
    untouched = check_tp_plan(dict.fromkeys(LINEARS, ...))
    assert not untouched.answered and untouched.attempt == 0


def buggy(x, dp, tp, dp_size, tp_size):  # the notebook's bug: split by the tp coordinate
    rows = len(x) // tp_size
    return x[tp * rows : (tp + 1) * rows]


def fixed(x, dp, tp, dp_size, tp_size):
    rows = len(x) // dp_size
    return x[dp * rows : (dp + 1) * rows]


def still_buggy(x, dp, tp, dp_size, tp_size):  # changed, yet still split by tp
    start = tp * (len(x) // tp_size)
    return x[start : start + len(x) // tp_size]


def test_batch_for_passes_the_fix_and_fails_a_changed_bug_with_a_hint_first():
    assert check_batch_for(fixed).passed
    first = check_batch_for(still_buggy)
    assert not first.passed and first.attempt == 1 and not first.detailed
    assert "tensor-parallel group see different data" in repr(first)
    second = check_batch_for(still_buggy)
    assert second.detailed and "Fix:" in repr(second)


def test_batch_for_as_shipped_is_not_an_attempt_and_names_no_bug():
    """Notebook 10 saves the output of its exercise cell run on the colleague's code: that
    output must not say what is wrong (issue 20, spoilers), and it is not attempt 1."""
    for _ in range(2):
        fb = check_batch_for(buggy)
        assert not fb.passed and not fb.answered and fb.attempt == 0, repr(fb)
        assert repr(fb).startswith("Not answered yet") and "starting code" in repr(fb)
        assert "different data" not in repr(fb) and "Fix:" not in fb.report()

    def commented(x, dp, tp, dp_size, tp_size):  # a comment changes nothing
        rows = len(x) // tp_size  # hmm
        return x[tp * rows : (tp + 1) * rows]

    assert not check_batch_for(commented).answered


@pytest.mark.parametrize(
    "wrong",
    [
        lambda x, dp, tp, dp_size, tp_size: x,  # every rank the whole batch
        lambda x, dp, tp, dp_size, tp_size: x[: len(x) // dp_size],  # the same rows everywhere
        lambda x, dp, tp, dp_size, tp_size: x[dp :: dp_size * 2],  # misses rows
        lambda x, dp, tp, dp_size, tp_size: x[0],  # one row, not rows
        lambda x, dp, tp, dp_size, tp_size: x[:4] if dp_size == 2 else x[dp * 8 : dp * 8 + 8],
    ],
)
def test_batch_for_fails_wrong_splits(wrong):
    assert not check_batch_for(wrong).passed


def test_batch_for_fails_when_the_learner_changes_the_batch():
    def mutates(x, dp, tp, dp_size, tp_size):
        x.zero_()
        return fixed(x, dp, tp, dp_size, tp_size)

    fb = check_batch_for(mutates)
    assert not fb.passed and "changed" in fb.report()


# --- properties: random wrong answers never pass (as tests/test_exercises_properties.py does) ----

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NAN, INF = float("nan"), float("inf")
garbage = st.one_of(
    st.sampled_from(
        [None, NAN, INF, -INF, mock.ANY, EqualToAll(), "", "colwise", [], {}, (), True, False]
    ),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.builds(EqInt, st.integers(-(10**6), 10**6)),
    st.builds(EqFloat, st.floats(allow_nan=True)),
    st.builds(torch.zeros, st.integers(0, 3)),
)


def rejected(fb: Feedback) -> bool:
    assert isinstance(fb, Feedback) and not fb.passed and fb.problems
    repr(fb), fb._repr_html_(), fb.report()
    return True


@PROPERTY
@given(value=garbage, at=st.sampled_from(_GRID), everywhere=st.booleans())
def test_zero_bytes_rejects_garbage(value, at, everywhere):
    def answer(stage, psi, n, k):
        right = zero_bytes(stage, psi, n, k)
        return {**right, "grads": value} if everywhere or (stage, psi, n, k) == at else right

    want = zero_bytes(*at)["grads"]
    plain = type(value) in (int, float, EqInt, EqFloat) and not isinstance(value, bool)
    assume(not (plain and abs(float(value) - want) <= 1e-9 * want + 0.5 and not everywhere))
    assert rejected(check_zero_bytes(answer))


@PROPERTY
@given(value=garbage, where=st.sampled_from(LINEARS))
def test_tp_plan_rejects_garbage_styles(value, where):
    assume(value != "colwise" or MEGATRON[where] != "colwise")
    assert rejected(check_tp_plan({**MEGATRON, where: value}))


@PROPERTY
@given(value=garbage)
def test_batch_for_rejects_garbage(value):
    assert rejected(check_batch_for(lambda x, dp, tp, dp_size, tp_size: value))
