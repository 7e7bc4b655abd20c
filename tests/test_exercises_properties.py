"""A property test per checker: random wrong answers never pass.

Wrong answers are drawn from what learners (and hostile testers) hand in: None (a missing
``return``), NaN and infinities, objects that compare equal to everything (``mock.ANY``, an
``int`` or ``float`` subclass whose ``__eq__`` says yes), strings, containers, and tensors of
the wrong shape, dtype, device or values. Every checker must answer each of them with a
``Feedback`` that did not pass, and never crash. The runs are derandomised (the same examples
on every run) so CI is stable; raise ``max_examples`` locally to search harder.
"""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from conftest import EqFloat, EqInt, EqualToAll, move_ref
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_exercises_hangs import broken_job_reports
from torch import nn
from torch.nn import functional as F

from tutorial_utils import models
from tutorial_utils.exercises import (
    Feedback,
    capstone,
    creating,
    hangs,
    moving,
    oom,
    parallel,
    precision,
    reset_attempts,
)

NAN, INF = float("nan"), float("inf")

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FEW = settings(PROPERTY, max_examples=8)  # for checkers that run a model


@pytest.fixture(autouse=True)
def fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


def rejected(fb: Feedback) -> bool:
    """A wrong answer must come back as feedback that did not pass, with a reason."""
    assert isinstance(fb, Feedback), f"a checker returned {type(fb).__name__}"
    assert not fb.passed, "a wrong answer passed"
    assert fb.problems and all(isinstance(p, str) and p for p in fb.problems)
    repr(fb), fb._repr_html_(), str(fb)  # every view renders
    return True


# --- wrong values ---------------------------------------------------------------------------


def _tensor(shape, dtype, device, fill):
    if not (dtype.is_floating_point or fill in (0.0, 1.0)):
        fill = 1.0
    return torch.full(shape, fill, dtype=dtype, device=device)


tensors = st.builds(
    _tensor,
    shape=st.lists(st.integers(0, 3), max_size=3).map(tuple),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64, torch.bool]),
    device=st.sampled_from(["cpu", "meta"]),
    fill=st.sampled_from([0.0, 1.0, NAN, INF]),
)

garbage = st.one_of(
    st.sampled_from(
        [None, NAN, INF, -INF, mock.ANY, EqualToAll(), "", "ok", "22", [], {}, (), True, False]
    ),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.builds(EqInt, st.integers(-(10**6), 10**6)),
    st.builds(EqFloat, st.floats(allow_nan=True)),
    tensors,
)


def _plain_int(value, expected) -> bool:
    return type(value) in (int, EqInt) and int(value) == expected


def _plain_number(value, expected: float) -> bool:
    """Is ``value`` a number worth ``expected``? (An EqInt worth the right value is right.)"""
    return type(value) in (int, float, EqInt, EqFloat) and math.isclose(
        float(value), expected, abs_tol=1e-12
    )


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# --- notebook 01 ----------------------------------------------------------------------------


def _leaves(tree, path=()):
    """Paths to every leaf and container of a moved batch."""
    yield path
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _leaves(v, (*path, i))


def _replace(tree, path, fn):
    if not path:
        return fn(tree)
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {k: (_replace(v, rest, fn) if k == head else v) for k, v in tree.items()}
    items = [(_replace(v, rest, fn) if i == head else v) for i, v in enumerate(tree)]
    return type(tree)(items)


def _corrupt(value, how, replacement, device):
    if how == "replace":
        return replacement
    if isinstance(value, torch.Tensor):
        if how == "dtype":
            return value.to(torch.float16 if value.dtype != torch.float16 else torch.float32)
        if how == "device":
            if device.type == "meta":
                return torch.zeros(value.shape, dtype=value.dtype)  # left on the CPU
            return value.to("meta")
        if how == "shape":
            return value.reshape(-1)[:1] if value.numel() > 1 else value.reshape(1, -1)
        if how == "values" and value.device.type != "meta":
            return value + 1
        return replacement
    if isinstance(value, dict):
        return {**value, "extra": 1} if how == "values" else list(value.values())
    if isinstance(value, tuple):
        return list(value) if how != "shape" else value[:-1]
    if isinstance(value, list):
        return tuple(value) if how != "shape" else value + [0]
    return replacement


@PROPERTY
@given(
    pick=st.integers(0, 20),
    how=st.sampled_from(["replace", "dtype", "device", "shape", "values"]),
    replacement=garbage,
)
def test_move_batch_rejects_corrupted_batches(pick, how, replacement):
    def move(batch, device):
        out = move_ref(batch, device)
        paths = [p for p in _leaves(out) if p]  # the top dict itself is covered by "replace"
        path = paths[pick % len(paths)]
        return _replace(out, path, lambda v: _corrupt(v, how, replacement, torch.device(device)))

    def same(a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and a.device == b.device
                and a.dtype == b.dtype
                and a.shape == b.shape
                and (a.device.type == "meta" or torch.equal(a, b))
            )
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return a == b

    probe = {"x": torch.arange(3), "pair": (torch.ones(2), "label"), "items": [7]}
    for target in ("cpu", "meta"):
        corrupted = move(probe, target)
        assume(not same(corrupted, move_ref(probe, target)))  # a no-op corruption is no test
    assert rejected(moving.check_move_batch(move))


@PROPERTY
@given(result=garbage)
def test_move_batch_rejects_garbage(result):
    assert rejected(moving.check_move_batch(lambda batch, device: result))


# --- notebook 02 ----------------------------------------------------------------------------


@pytest.mark.slow  # 30 examples, each measured twice by memory.measure: 10-40 s on 2 busy cores
@PROPERTY
@given(
    result=st.one_of(
        garbage, st.sampled_from(["cpu only", "leaks default", "no parameters", "meta only"])
    )
)
def test_build_on_rejects_wrong_answers(result):
    def build(device):
        if result == "cpu only":
            return nn.Linear(2, 2)
        if result == "meta only":
            return nn.Linear(2, 2, device="meta")
        if result == "leaks default":
            torch.set_default_device(device)
            return nn.Linear(2, 2)
        if result == "no parameters":
            return nn.ReLU()
        return result

    before = torch.get_default_device()
    assert rejected(creating.check_build_on(build, "cpu"))
    assert torch.get_default_device() == before


class _Follower(nn.Module):
    def __init__(self, features, out):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.register_buffer("shift", torch.zeros(features))
        self.out = out

    def forward(self, x):
        right = x * self.weight + self.shift
        out = self.out
        if out == "dtype":
            return right.float() if right.dtype != torch.float32 else right.double()
        if out == "cpu":
            return right.cpu() + torch.ones(x.shape)
        if out == "shape":
            return right[:1]
        if out == "nan":
            return right * NAN
        return out


@PROPERTY
@given(out=st.one_of(garbage, st.sampled_from(["dtype", "cpu", "shape", "nan"])))
def test_following_module_rejects_wrong_forwards(out):
    assert rejected(creating.check_following_module(lambda f: _Follower(f, out)))


@PROPERTY
@given(made=garbage)
def test_following_module_rejects_garbage_modules(made):
    assert rejected(creating.check_following_module(lambda f: made))


# --- notebooks 07 and 08 --------------------------------------------------------------------


@PROPERTY
@given(
    per_rank=st.one_of(garbage, st.integers(0, 30)), repeated=st.one_of(garbage, st.integers(0, 5))
)
def test_sampler_padding_rejects_wrong_answers(per_rank, repeated):
    assume(not (_plain_int(per_rank, 22) and _plain_int(repeated, 2)))
    assert rejected(parallel.check_sampler_padding(per_rank, repeated))


@PROPERTY
@given(
    value=garbage,
    at=st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 16, 64])),
    everywhere=st.booleans(),
)
def test_bubble_rejects_wrong_answers(value, at, everywhere):
    def bubble(p, m):
        right = (p - 1) / (m + p - 1)
        return value if everywhere or (p, m) == at else right

    assume(
        not all(
            _plain_number(value, (p - 1) / (m + p - 1))
            for p in (1, 2, 4, 8)
            for m in (1, 2, 4, 16, 64)
            if everywhere or (p, m) == at
        )
    )
    assert rejected(parallel.check_bubble(bubble))


def _mb_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _mb_model():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _right_microbatch(model, x, y, m):
    for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
        (F.mse_loss(model(xm), ym) / m).backward()


@PROPERTY
@given(
    which=st.integers(0, 3),
    how=st.sampled_from(["nan", "inf", "scale", "zero", "noise", "none", "weights", "nothing"]),
    factor=st.floats(0.5, 8).filter(lambda f: abs(f - 1) > 1e-3),
)
def test_microbatch_step_rejects_wrong_gradients(which, how, factor):
    def step(model, x, y, m):
        if how == "nothing":
            return None
        _right_microbatch(model, x, y, m)
        p = list(model.parameters())[which]
        if how == "nan":
            p.grad.view(-1)[0] = NAN
        elif how == "inf":
            p.grad.view(-1)[-1] = INF
        elif how == "scale":
            p.grad.mul_(factor)
        elif how == "zero":
            p.grad.zero_()
        elif how == "noise":
            p.grad.add_(1e-3 * factor)
        elif how == "none":
            p.grad = None
        elif how == "weights":
            with torch.no_grad():
                p.add_(1e-3 * factor)

    assert rejected(parallel.check_microbatch_step(step, _mb_model(), *_mb_data()))


REF = [0.5, -0.25, 1.0]


@PROPERTY
@given(
    reports=st.one_of(
        garbage,
        st.dictionaries(st.sampled_from([0, 1, 2]), garbage, max_size=3),
        st.builds(
            lambda params, orders: {
                0: {"params": params, "orders": orders},
                1: {"params": params, "orders": orders},
            },
            st.one_of(
                garbage, st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4)
            ),
            st.one_of(garbage, st.just([[0, 1], [0, 1]]), st.just([[0, 1], [1, 0]])),
        ),
    )
)
def test_ddp_script_rejects_wrong_reports(reports):
    right = {"params": REF, "orders": [[0, 1], [1, 0]]}
    assume(not (isinstance(reports, dict) and reports == {0: right, 1: right}))
    fake = SimpleNamespace(reports=reports if isinstance(reports, dict) else {0: reports})
    with mock.patch.object(parallel, "launch", lambda *a, **k: fake):
        assert rejected(parallel.check_ddp_script("ddp.py", REF))


def test_ddp_script_checker_passes_a_right_report():
    """The fake launch above is a fair test: a right report passes through it."""
    right = {"params": REF, "orders": [[0, 1], [1, 0]]}
    fake = SimpleNamespace(reports={0: right, 1: right})
    with mock.patch.object(parallel, "launch", lambda *a, **k: fake):
        parallel.check_ddp_script("ddp.py", REF).assert_passed()


# --- notebook 04 ----------------------------------------------------------------------------

STATE_MODEL = models.MLP(d_in=30, d_hidden=70, d_out=5, depth=2)
STATE_BYTES = oom.training_state_bytes(STATE_MODEL)


@PROPERTY
@given(answer=st.one_of(garbage, st.integers(1, 4 * STATE_BYTES)))
def test_training_state_bytes_rejects_wrong_answers(answer):
    assume(
        not (
            isinstance(answer, (int, float))
            and not isinstance(answer, bool)
            and not isinstance(answer, (EqInt, EqFloat))
            and answer == STATE_BYTES
        )
    )
    assert rejected(oom.check_training_state_bytes(STATE_MODEL, answer))


@FEW
@given(result=st.one_of(garbage, st.sampled_from(["graph", "off", "nan-tensor"])))
def test_evaluate_rejects_wrong_answers(result):
    def evaluate(model, batches):
        with torch.no_grad():
            right = sum(F.cross_entropy(model(x), y).item() for x, y in batches) / len(batches)
        if result == "graph":
            return sum(F.cross_entropy(model(x), y) for x, y in batches) / len(batches)
        if result == "off":
            return right * 1.01
        if result == "nan-tensor":
            return torch.tensor(NAN)
        return result

    assert rejected(oom.check_evaluate(evaluate))


# --- notebook 05 ----------------------------------------------------------------------------

RIGHT_FP16 = {70000.0: "inf", 60000.0: "ok", 1e-4: "ok", 1e-9: "0"}


@PROPERTY
@given(
    guess=st.one_of(
        garbage,
        st.dictionaries(st.sampled_from(list(RIGHT_FP16)), garbage, max_size=4),
        st.dictionaries(st.sampled_from(list(RIGHT_FP16)), st.sampled_from(["inf", "0", "ok"])),
        st.builds(
            lambda drop: {k: v for k, v in RIGHT_FP16.items() if k != drop},
            st.sampled_from(list(RIGHT_FP16)),
        ),
        st.builds(
            lambda extra, said: RIGHT_FP16 | {extra: said}, garbage.filter(_hashable), garbage
        ),
    )
)
def test_fp16_survival_rejects_wrong_answers(guess):
    assume(guess != RIGHT_FP16 or type(guess) is not dict)
    if (
        isinstance(guess, dict)
        and all(type(k) is float for k in guess)
        and set(guess) >= set(RIGHT_FP16)
    ):
        assume(any(not isinstance(v, str) or v != precision.fp16_fate(k) for k, v in guess.items()))
    assert rejected(precision.check_fp16_survival(guess))


def _amp_right(model, optimizer, scaler, inputs, targets, device_type, dtype):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = F.cross_entropy(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


@FEW
@given(
    returned=st.one_of(garbage, st.sampled_from(["two losses", "doubled"])),
    skip=st.sampled_from([None, "autocast", "scale", "step", "update", "average", "unscale"]),
)
def test_accumulated_clipped_step_rejects_wrong_answers(returned, skip):
    """Each of the step's parts left out, or a wrong value returned, is rejected (this replaced
    issue 11's property for check_amp_step, whose exercise issue 20 dropped)."""

    def step(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
        optimizer.zero_grad(set_to_none=True)
        for inputs, targets in micro_batches:
            with torch.autocast(device_type, dtype=dtype, enabled=skip != "autocast"):
                loss = F.cross_entropy(model(inputs), targets)
            if skip != "average":
                loss = loss / len(micro_batches)
            (loss if skip == "scale" else scaler.scale(loss)).backward()
        if skip != "unscale":
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step() if skip == "step" else scaler.step(optimizer)
        if skip != "update":
            scaler.update()
        if returned == "two losses":
            return torch.stack([loss, loss])
        if returned == "doubled":
            return loss * 2 * len(micro_batches)
        return returned

    assert rejected(precision.check_accumulated_clipped_step(step))


# --- notebook 06 ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_task():
    def make_model():
        return models.MLP(d_in=16, d_hidden=32, d_out=3, depth=2, seed=0)

    x = models.mlp_batch(64, 16, seed=1)
    y = torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(2))
    return capstone.CapstoneTask(
        make_model, x, y, budget_bytes=64 * 2**20, device=torch.device("cpu"), lr=1e-2, steps=2
    )


def _train(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


@pytest.mark.slow
@FEW
@given(returned=garbage, where=st.sampled_from(["here", "thread", "popped", "disabled"]))
def test_grade_rejects_wrong_answers(small_task, returned, where):
    from torch.utils._python_dispatch import _disable_current_modes

    def train_step(model, optimizer, x, y):
        if where == "thread":
            worker = threading.Thread(target=_train, args=(model, optimizer, x, y))
            worker.start()
            worker.join()
        elif where == "popped":
            with _disable_current_modes():
                _train(model, optimizer, x, y)
        elif where == "disabled":
            with torch._C._DisableTorchDispatch():
                _train(model, optimizer, x, y)
        else:
            _train(model, optimizer, x, y)
        return returned

    assert rejected(capstone.grade(train_step, small_task).feedback)


@pytest.mark.slow
def test_grade_passes_the_right_step_on_the_small_task(small_task):
    """The property above is a fair test: with a right return value the same step passes."""
    capstone.grade(_train, small_task).feedback.assert_passed()


# --- checkers added with issue 14 -----------------------------------------------------------


@PROPERTY
@given(
    plain=st.one_of(garbage, st.integers(0, 20)),
    with_no_sync=st.one_of(garbage, st.integers(0, 20)),
)
def test_allreduce_counts_rejects_wrong_answers(plain, with_no_sync):
    assume(not (_plain_int(plain, 8) and _plain_int(with_no_sync, 1)))
    assert rejected(parallel.check_allreduce_counts(plain, with_no_sync, k=8, buckets=1))


@PROPERTY
@given(out=st.one_of(garbage, tensors))
def test_split_forward_rejects_wrong_outputs(out):
    def forward(stage0, stage1, x, d0, d1):
        return out

    assert rejected(parallel.check_split_forward(forward, [torch.device("cpu")] * 2))


FIT_PEAKS = {"plain": 100, "micro": 40, "both": 20}
FIT_SECONDS = {"plain": 0.01, "micro": 0.03, "both": 0.05}


@PROPERTY
@given(choice=st.one_of(garbage, st.sampled_from(["plain", "both", "MICRO", "micro "])))
def test_fastest_fit_rejects_wrong_answers(choice):
    assert rejected(capstone.check_fastest_fit(choice, FIT_PEAKS, FIT_SECONDS, 50))


@FEW
@given(returned=garbage)
def test_accumulated_clipped_step_rejects_steps_without_the_scaler(returned):
    def step(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
        return returned

    assert rejected(precision.check_accumulated_clipped_step(step))


# --- notebook 14 ----------------------------------------------------------------------------


@PROPERTY
@given(answer=st.one_of(garbage, st.floats(0, 1000), st.sampled_from([75, 75.0, 230.6, 0.6])))
def test_timeout_rejects_wrong_answers(answer):
    assume(not _plain_number(answer, 150.0))
    assert rejected(hangs.check_timeout(answer))


@PROPERTY
@given(
    answer=st.one_of(
        garbage,
        st.fixed_dictionaries(
            {
                "rank": st.one_of(garbage, st.integers(-2, 3)),
                "op": st.one_of(garbage, st.sampled_from(["all_reduce", "barrier", "all_gather"])),
                "seq": st.one_of(garbage, st.integers(0, 25)),
            }
        ),
    )
)
def test_hang_rejects_wrong_answers(answer):
    right = (
        isinstance(answer, dict)
        and _plain_int(answer["rank"], 1)
        and _plain_int(answer["seq"], 21)
        and answer["op"] == "all_gather"
    )
    assume(not right)
    assert rejected(hangs.check_hang(answer, broken_job_reports()))


@PROPERTY
@given(returned=st.one_of(garbage, st.tuples(garbage, garbage), st.tuples(tensors, tensors)))
def test_same_collectives_rejects_wrong_results(returned):
    def log_metrics(rank, world, loss, correct, dist):
        dist.all_reduce(loss)
        dist.all_reduce(correct)
        return returned

    assert rejected(hangs.check_same_collectives(log_metrics))
