"""The plain mistakes a learner makes in every graded exercise: every checker refuses them.

This file holds 139 wrong answers: 121 plain mistakes in ``PLAIN`` (8 of them marked ``slow``:
they launch real ranks) and 18 tricks in ``TRICKS``. ``test_the_docstring_states_the_counts``
keeps these numbers equal to the lists.

``PLAIN``: the wrong answers a learner really writes, at least two for every checker (every
``def check_`` in ``src/tutorial_utils/exercises`` and ``notebooks/scripts``, and capstone 1's
``grade``; ``test_every_checker_has_two_plain_mistakes`` derives that list from the sources and
the notebooks' exercise cells): a wrong formula, a missing ``zero_grad``, an off-by-one, a wrong
dtype, a loss added up instead of averaged, a forgotten ``.detach()``, a graph cut by one. Each
is refused, is counted as an answer (not as the exercise's placeholder), and its first feedback
is a hint, not the fix: the brief of the first problem and the hints, with the words (``says``)
that point at the mistake itself.

``TRICKS``: values and steps made to look right (an ``int`` whose ``__eq__`` says yes, a
number whose ``__float__`` ends the check with a verdict of its own, a step that calls
``scaler.scale`` only to be counted): the checkers judge plain values and what each call
carried, so these are refused too.

Capstone 2 (notebook 11) and notebook 07's DDP script launch ranks with torchrun (15-20 s each
on 2 cores): those cases are ``slow``, the rest take a few seconds in all.

The second half: Run All is not an attempt. The code every exercise cell ships (read from the
notebooks) is "Not answered yet" for any checker, and ``shipped.json`` matches the notebooks.
"""

from __future__ import annotations

import functools
import linecache
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from test_exercises_capstone import budgeted_task
from test_exercises_capstone_ranks import (
    averaged_step_without_zero_grad as averaged_without_zero_grad,
)
from test_exercises_capstone_ranks import step_without_zero_grad
from test_exercises_capstone_ranks import train_step as micro_batch_step
from test_exercises_hangs import ANSWER as HANG_ANSWER
from test_exercises_hangs import broken_job_reports
from test_exercises_parallel import _reference_params
from test_exercises_predict import LLAMA_LIKE
from torch import nn

from tutorial_utils import accounting, memory
from tutorial_utils.decoder import DecoderConfig
from tutorial_utils.exercises import (
    Feedback,
    _Stop,
    at_scale,
    capstone,
    checker,
    creating,
    fewer_bytes,
    hangs,
    moving,
    oom,
    parallel,
    precision,
    predict,
    reset_attempts,
    sharding,
    shipped,
    start,
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "notebooks" / "scripts"
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


class Mistake(NamedTuple):
    """One plain wrong answer to one checker."""

    checker: str  # "module.function": start.check_matmul_peak, capstone_grader.check_plan
    mistake: str  # what the learner got wrong, in words
    answer: Callable[[], Feedback]  # runs the checker on the wrong answer
    says: tuple[str, ...]  # words the first feedback must show: it points at the mistake
    slow: bool = False  # launches ranks


# --- 00 start here ----------------------------------------------------------------------------


def _matmul_peak_end_minus_start():
    with memory.measure("cpu") as m:
        torch.randn(512, 256) @ torch.randn(256, 128)
    return m.delta_bytes  # what is still alive at the end, not the highest point


def _matmul_peak_forgets_the_start():
    with memory.measure("cpu") as m:
        torch.randn(512, 256) @ torch.randn(256, 128)
    return m.peak_bytes  # counts what was alive before the block


def _matmul_peak_inputs_made_outside():
    a, b = torch.randn(512, 256), torch.randn(256, 128)
    with memory.measure("cpu") as m:
        a @ b  # only the output is new inside the block
    return m.peak_bytes - m.start_bytes


def _peak_of_forgets_the_start(fn, device):
    with memory.measure(device) as m:
        fn()
    return m.peak_bytes


def _peak_of_end_minus_start(fn, device):
    with memory.measure(device) as m:
        fn()
    return m.delta_bytes


def _peak_of_measures_after_the_block(fn, device):
    fn()
    with memory.measure(device) as m:
        pass
    return m.peak_above_start_bytes


# --- 01 moving tensors ------------------------------------------------------------------------


def _move_forgets_lists_and_tuples(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: _move_forgets_lists_and_tuples(v, device) for key, v in batch.items()}
    return batch


def _move_tuples_become_lists(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: _move_tuples_become_lists(v, device) for key, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_move_tuples_become_lists(v, device) for v in batch]
    return batch


def _move_drops_what_is_not_a_tensor(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: _move_drops_what_is_not_a_tensor(v, device) for key, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_move_drops_what_is_not_a_tensor(v, device) for v in batch)
    return None


def _accuracy_x_not_kept(model, batches, device):
    model.to(device)
    correct = torch.zeros((), device=device)
    total = 0
    for x, y in batches:
        x.to(device)  # the moved copy is thrown away
        y = y.to(device)
        correct += (model(x).argmax(dim=1) == y).sum()
        total += len(y)
    return correct / total


def _accuracy_counter_on_the_cpu(model, batches, device):
    model.to(device)
    correct = torch.zeros(())  # made on the CPU
    total = 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(dim=1) == y).sum()
        total += len(y)
    return correct / total


def _accuracy_over_batches_not_samples(model, batches, device):
    model.to(device)
    correct = torch.zeros((), device=device)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(dim=1) == y).float().mean()
    return correct / len(batches)  # the short last batch weighs as much as a full one


# --- 02 creating tensors on the right device --------------------------------------------------


def _build_then_move(device):
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)


def _build_device_on_one_layer(device):
    return nn.Sequential(nn.Linear(16, 32, device=device), nn.ReLU(), nn.Linear(32, 1))


class _ZerosWithoutDtype(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.register_buffer("shift", torch.linspace(0, 1, features))

    def forward(self, x):
        return x * self.weight + self.shift + torch.zeros(x.shape, device=x.device)


class _ShiftAsAttribute(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.shift = torch.linspace(0, 1, features)  # a plain attribute: it stays behind

    def forward(self, x):
        return x * self.weight + self.shift.to(x.device) + x.new_zeros(x.shape)


class _ZerosOnTheCpu(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.register_buffer("shift", torch.linspace(0, 1, features))

    def forward(self, x):
        return x * self.weight + self.shift + torch.zeros(x.shape)


# --- 03 where memory goes ---------------------------------------------------------------------

# notebook 03's Llama-like decoder, counted by hand as its solution does, with one slip each
_H, _KV, _FF, _VOCAB = 64, 2 * (64 // 8), 160, 500
_PER_LAYER = _H * (_H + 2 * _KV) + _H * _H + 3 * _H * _FF + 2 * _H
_TIED_HEAD = _VOCAB * _H + 2 * _PER_LAYER + _H  # the output head left out
_KV_AS_WIDE_AS_Q = _VOCAB * _H + 2 * (_PER_LAYER + 2 * _H * (_H - _KV)) + _H + _VOCAB * _H
_TWO_MLP_MATRICES = _VOCAB * _H + 2 * (_PER_LAYER - _H * _FF) + _H + _VOCAB * _H

# notebook 03's block (d_model 48, 6 heads, SwiGLU 128) at batch 3, seq 20, per token as its
# solution counts it
_BLOCK = DecoderConfig(d_model=48, n_heads=6, norm="rms", mlp="swiglu", bias=False, d_ff=128)
_h, _a, _f, _b, _s = 48, 6, 128, 3, 20
_PER_TOKEN = 2 * (3 * _h * 4 + 4) + 3 * _h * 4 + _h * 4 + 4 * _a + 4 * _f * 4
_PER_TOKEN_BF16 = 2 * (3 * _h * 2 + 2) + 3 * _h * 2 + _h * 2 + 2 * _a + 4 * _f * 2
_PER_TOKEN_ELEMENTS = 2 * (3 * _h + 1) + 3 * _h + _h + _a + 4 * _f


def _saved_counts_the_weights(module, x):
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        seen.setdefault(st._cdata, st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def _saved_keyed_by_id(module, x):
    weights = {id(p) for p in module.parameters()}
    seen = {}

    def pack(t):
        if id(t) not in weights:  # a new tensor object for each view of one storage
            seen.setdefault(id(t), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def _saved_view_sizes_once_per_storage(module, x):
    weights = {p.untyped_storage()._cdata for p in module.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st._cdata not in weights:
            seen.setdefault(st._cdata, t.numel() * t.element_size())  # the view, not the storage
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


# --- 04 out of memory -------------------------------------------------------------------------


def _evaluate_item_once_at_the_end(model, batches):
    total = 0
    for x, y in batches:
        total += nn.functional.cross_entropy(model(x), y)
    return (total / len(batches)).item()  # a float, but every batch's graph lived until here


def _evaluate_returns_a_tensor(model, batches):
    total = 0
    with torch.no_grad():
        for x, y in batches:
            total += nn.functional.cross_entropy(model(x), y)
    return total / len(batches)


def _evaluate_detached_tensor_sum(model, batches):
    total = 0
    for x, y in batches:
        total += nn.functional.cross_entropy(model(x), y).detach()
    return total / len(batches)


def _evaluate_over_samples(model, batches):
    total = 0.0
    with torch.no_grad():
        for x, y in batches:
            total += nn.functional.cross_entropy(model(x), y).item()
    return total / sum(len(y) for _, y in batches)  # mean losses divided by samples


def _evaluate_sum_not_mean(model, batches):
    total = 0.0
    with torch.no_grad():
        for x, y in batches:
            total += nn.functional.cross_entropy(model(x), y).item()
    return total  # the batches' losses added up, never averaged


def _largest_retries_inside_except(try_step, batch_size):
    try:
        try_step(batch_size)
        return batch_size
    except torch.OutOfMemoryError:
        while batch_size > 1:  # still inside except: the failed attempt stays alive
            batch_size //= 2
            try:
                try_step(batch_size)
                return batch_size
            except torch.OutOfMemoryError:
                pass
        raise


def _largest_halves_before_trying(try_step, batch_size):
    while True:
        batch_size //= 2  # the first size tried is already half the start
        try:
            try_step(batch_size)
            return batch_size
        except torch.OutOfMemoryError:
            if batch_size == 1:
                raise


def _largest_keeps_the_errors(try_step, batch_size):
    errors = []  # kept to print later: each one holds its attempt's frames and tensors
    while True:
        try:
            try_step(batch_size)
            return batch_size
        except torch.OutOfMemoryError as err:
            errors.append(err)
            if batch_size == 1:
                raise
        batch_size //= 2


_STATE_WEIGHTS = 64 * 32 + 32  # nn.Linear(64, 32)

# --- 05 mixed precision -----------------------------------------------------------------------

_FP16_RIGHT = {70000.0: "inf", 60000.0: "ok", 1e-4: "ok", 1e-9: "0"}


def _accumulated_step(*, zero_grad=True, average=True, unscale=True, ret="total"):
    """Notebook 05's solution of exercise 2 with one of its lines changed."""

    def step(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for inputs, targets in micro_batches:
            with torch.autocast(device_type, dtype=dtype):
                loss = nn.functional.cross_entropy(model(inputs), targets)
                if average:
                    loss = loss / len(micro_batches)
            scaler.scale(loss).backward()
            total += loss.item() if average else loss.item() / len(micro_batches)
        if unscale:
            scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        return loss.item() if ret == "last" else total

    return step


def _one_backward_over_the_sum(
    model, optimizer, scaler, micro_batches, device_type, dtype, max_norm
):
    optimizer.zero_grad(set_to_none=True)
    total = 0
    for inputs, targets in micro_batches:
        with torch.autocast(device_type, dtype=dtype):
            total = total + F.cross_entropy(model(inputs), targets) / len(micro_batches)
    scaler.scale(total).backward()  # every micro-batch's graph alive at once
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total.item()


def _right_step_in(autocast_dtype):
    def step(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for inputs, targets in micro_batches:
            with torch.autocast(
                device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss = F.cross_entropy(model(inputs), targets) / len(micro_batches)
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        return total

    return step


# --- 06 capstone 1 ----------------------------------------------------------------------------


@functools.cache
def _capstone_task() -> capstone.CapstoneTask:
    return budgeted_task()


def _capstone_step(*, zero_grad=True, k=4, average=True, backward_each=True, ret="total"):
    """The capstone's micro-batch step (``tests/test_exercises_capstone.py``'s task: an MLP whose
    plain step does not fit), with one line changed."""

    def train_step(model, optimizer, x, y):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        total = 0.0
        pieces = list(zip(x.chunk(k), y.chunk(k), strict=True))
        if ret == "drops the last":
            pieces = pieces[:-1]
        for xc, yc in pieces:
            loss = nn.functional.cross_entropy(model(xc), yc) / (k if average else 1)
            if backward_each:
                loss.backward()
                total += loss.item()
            else:
                total = total + loss
        if not backward_each:
            total.backward()
            total = total.item()
        optimizer.step()
        return loss.item() if ret == "last" else total

    return train_step


def _bf16_step(model, optimizer, x, y, k=4):
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for xc, yc in zip(x.chunk(k), y.chunk(k), strict=True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(xc)
        loss = nn.functional.cross_entropy(logits.float(), yc) / k
        loss.backward()
        total += loss.item()
    optimizer.step()
    return total


def _grade(step, exercise=None, **options):
    return capstone.grade(step, _capstone_task(), exercise=exercise, **options).feedback


_PEAKS = {"plain": 100, "micro": 40, "checkpointed": 60, "micro + checkpointed": 30}
_SECONDS = {
    "plain": [1.0, 1.1],
    "micro": [1.5, 1.6],
    "checkpointed": [1.3, 1.35],
    "micro + checkpointed": [2.0, 2.1],
}
_BUDGET = 65  # micro, checkpointed and both fit; checkpointed is the fastest of them


# --- 07 data parallelism ----------------------------------------------------------------------


def _acc_every_backward_in_no_sync(model, x, y, k):
    with model.no_sync():
        for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
            (F.mse_loss(model(xm), ym) / k).backward()


def _acc_not_divided_by_k(model, x, y, k):
    pieces = list(zip(x.chunk(k), y.chunk(k), strict=True))
    with model.no_sync():
        for xm, ym in pieces[:-1]:
            F.mse_loss(model(xm), ym).backward()
    xm, ym = pieces[-1]
    F.mse_loss(model(xm), ym).backward()


def _acc_without_no_sync(model, x, y, k):
    for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
        (F.mse_loss(model(xm), ym) / k).backward()


def _ddp_script(*, set_epoch: bool, divide: bool, lr: str = "0.1"):
    """Notebook 07's bug hunt, ``ddp_exercise.py``, with each bug fixed or kept; returns the
    checker's feedback on it, run from a temporary folder."""
    text = (SCRIPTS / "ddp_exercise.py").read_text()
    text = text.replace("EPOCHS, BATCH, LR = 3, 8, 0.1", f"EPOCHS, BATCH, LR = 3, 8, {lr}")
    if set_epoch:
        text = text.replace(
            "    for epoch in range(EPOCHS):\n",
            "    for epoch in range(EPOCHS):\n        sampler.set_epoch(epoch)\n",
        )
    if not divide:
        text = text.replace("                p.grad /= world\n", "                pass\n")
    assert text != (SCRIPTS / "ddp_exercise.py").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("common.py", "ddp_train.py"):
            shutil.copy(SCRIPTS / name, Path(tmp) / name)
        script = Path(tmp) / "ddp_exercise.py"
        script.write_text(text)
        return parallel.check_ddp_script(script, _reference_params(), timeout=180)


# --- 08 model parallelism ---------------------------------------------------------------------


def _microbatch_notebook_setup():
    """Notebook 08's exercise 1: 10 rows in 4 micro-batches (3, 3, 3, 1)."""
    x = torch.randn(10, 16, generator=torch.Generator().manual_seed(5))
    y = torch.randn(10, 4, generator=torch.Generator().manual_seed(6))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4))
    return model, x, y


def _micro_divided_by_its_size(model, x, y, m):
    for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
        (F.mse_loss(model(xm), ym) / len(xm)).backward()


def _micro_not_scaled(model, x, y, m):
    for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
        F.mse_loss(model(xm), ym).backward()


def _micro_one_backward_over_the_sum(model, x, y, m):
    total = 0
    for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
        total = total + F.mse_loss(model(xm), ym) * len(xm) / len(x)
    total.backward()


def _microbatch(step):
    model, x, y = _microbatch_notebook_setup()
    return parallel.check_microbatch_step(step, model, x, y, m=4)


def _split_through_data(stage0, stage1, x, d0, d1):
    h = stage0(x.to(d0))
    return stage1(h.data.to(d1))


def _split_stage0_without_grad(stage0, stage1, x, d0, d1):
    with torch.no_grad():  # "stage 0 is only the features"
        h = stage0(x.to(d0))
    return stage1(h.to(d1))


def _split_on_first_device(stage0, stage1, x, d0, d1):
    return stage1.to(d0)(stage0(x.to(d0)))


# --- 09 ZeRO ----------------------------------------------------------------------------------


def _zero(first_state=1, first_grads=2, first_params=3, width=4):
    """``zero_bytes`` as notebook 09's solution writes it, with the stage that shards each part
    (or the bytes per parameter) changed."""

    def zero_bytes(stage, psi, n, k):
        params, grads, state = width * psi, width * psi, k * psi
        if stage >= first_state:
            state /= n
        if stage >= first_grads:
            grads /= n
        if stage >= first_params:
            params /= n
        return {"params": params, "grads": grads, "state": state}

    return zero_bytes


def _fsdp(gathers_per_micro_batch=2, reduce_once=True, reduce_in_param_dtype=False):
    """``fsdp_bytes`` as notebook 09's solution writes it, with one of its counts changed."""

    def fsdp_bytes(psi, k, sync, param_bytes, reduce_bytes):
        reduces = k if sync == "every" or not reduce_once else 1
        width = param_bytes if reduce_in_param_dtype else reduce_bytes
        return {
            "all_gather": gathers_per_micro_batch * k * param_bytes * psi,
            "reduce_scatter": reduces * width * psi,
        }

    return fsdp_bytes


# --- 10 tensor parallelism --------------------------------------------------------------------


def _tp(**styles):
    plan = {name: "colwise" for name in sharding.LINEARS}
    plan.update({k.replace("_", "."): v for k, v in styles.items()})
    return plan


def _batch_by_rank(x, dp, tp, dp_size, tp_size):
    rows = len(x) // (dp_size * tp_size)  # as for plain DDP: every rank its own rows
    rank = dp * tp_size + tp
    return x[rank * rows : (rank + 1) * rows]


def _batch_rows_by_tp_size(x, dp, tp, dp_size, tp_size):
    rows = len(x) // tp_size  # the right coordinate, the wrong size
    return x[dp * rows : (dp + 1) * rows]


def _one_group_gets_everything(x, dp, tp, dp_size, tp_size):
    return x if dp == 0 else x[:0]


# --- 13 fewer bytes ---------------------------------------------------------------------------


def _powersgd(**mistake):
    """powersgd_bytes with one plain mistake (``fewer_bytes.powersgd_reference``'s keywords)."""
    return lambda shapes, rank: fewer_bytes.powersgd_reference(shapes, rank, **mistake)


def _powersgd_rank_times_matrix(shapes, rank):
    return 4 * sum(rank * s[0] * s[-1] if len(s) > 1 else s[0] for s in shapes)  # n m r


_F8 = torch.float8_e4m3fn


def _float8_unscaled(x):
    return x.to(_F8), torch.tensor(1.0)  # no scale: small values flush to zero


def _float8_scale_not_inverted(x):
    scale = torch.finfo(_F8).max / x.abs().max()
    return (x * scale).to(_F8), scale.float()  # hands back the scale, not its inverse


def _float8_amax_without_abs(x):
    scale = torch.finfo(_F8).max / x.max()  # the largest value, not the largest magnitude
    return (x * scale).to(_F8), (1 / scale).float()


def _stages_side_by_side(rank, world, style):
    return [2 * rank, 2 * rank + 1]  # each rank two neighbouring stages, whatever the style


def _stages_v_off_by_one(rank, world, style):
    return [rank, rank + world] if style == "loop" else [rank, 2 * world - rank]


# --- 11 capstone 2 ----------------------------------------------------------------------------


@functools.cache
def _grader():
    """notebooks/scripts/capstone_grader.py, imported when a case first needs it."""
    sys.path.insert(0, str(SCRIPTS))
    import capstone_grader

    return capstone_grader


def _psi() -> int:
    return _grader().PSI


def average_of_a_temporary(model, optimizer, x, y, micro_batches):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad / dist.get_world_size())  # reduces a new tensor, then drops it
    optimizer.step()
    return loss.item()


_ZERO3_K4 = {"shard": "zero3", "micro_batches": 4, "checkpointing": False}


def _zero3_k4_bytes() -> dict:
    return {"all_gather": 4 * 2 * 4 * _psi(), "reduce_scatter": 4 * 4 * _psi()}


def _check_plan(plan, step, predicted, **options):
    return _grader().check_plan(plan, step, predicted, **options)


def _hang(**answer) -> Feedback:
    """Notebook 14 exercise 1 on the broken job's reports: rank 1 never reaches #21."""
    return hangs.check_hang({**HANG_ANSWER, **answer}, broken_job_reports())


def _metrics_without_summing(rank, world, loss, correct, dist):
    dist.all_reduce(loss)
    return loss / world, correct


def _metrics_in_rank_order(rank, world, loss, correct, dist):
    if rank == 0:
        dist.all_reduce(correct)
        dist.all_reduce(loss)
    else:
        dist.all_reduce(loss)
        dist.all_reduce(correct)
    return loss / world, correct


def _metrics_summed_loss(rank, world, loss, correct, dist):
    dist.all_reduce(loss)
    dist.all_reduce(correct)
    return loss, correct


# ----------------------------------------------------------------------------------------------

_SLOW = True

# --- 12 long context and experts ---------------------------------------------------------------


def _ring(keys_only=False, hops=None, backward_like_forward=False):
    """A ring_bytes with one plain mistake."""

    def ring_bytes(world, batch, heads, seq, head_dim, elem):
        block = batch * heads * (seq // world) * head_dim * elem
        steps = world - 1 if hops is None else hops(world)
        forward = steps * (1 if keys_only else 2) * block
        backward = forward if backward_like_forward else ((world - 1) * 4 + 2) * block
        return forward, backward

    return ring_bytes


def _splits_per_expert(expert_of_token, experts, world):
    return torch.bincount(expert_of_token, minlength=experts).tolist()


def _splits_round_robin(expert_of_token, experts, world):
    return torch.bincount(expert_of_token % world, minlength=world).tolist()


def _splits_even(expert_of_token, experts, world):
    return [len(expert_of_token) // world] * world


def _merge_average(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def _merge_unscaled(out_a, lse_a, out_b, lse_b):
    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))
    return (torch.exp(lse_a) * out_a + torch.exp(lse_b) * out_b) / torch.exp(lse), lse


def _merge_keeps_the_larger_lse(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b
    return out, torch.maximum(lse_a, lse_b)


PLAIN = [
    # 00 exercise 1: the peak of a matmul, measured
    Mistake(
        "start.check_matmul_peak",
        "m.delta_bytes",
        lambda: start.check_matmul_peak(_matmul_peak_end_minus_start),
        ("change from start to end",),
    ),
    Mistake(
        "start.check_matmul_peak",
        "m.peak_bytes, the start not subtracted",
        lambda: start.check_matmul_peak(_matmul_peak_forgets_the_start),
        ("alive before the block",),
    ),
    Mistake(
        "start.check_matmul_peak",
        "the inputs made before the block",
        lambda: start.check_matmul_peak(_matmul_peak_inputs_made_outside),
        ("something else is alive at the peak",),
    ),
    Mistake(
        "start.check_matmul_peak",
        "a typed number",
        lambda: start.check_matmul_peak(lambda: 917504),
        ("does not measure",),
    ),
    # 00 exercise 2: peak_of(fn, device)
    Mistake(
        "start.check_peak_of",
        "m.peak_bytes, the start not subtracted",
        lambda: start.check_peak_of(_peak_of_forgets_the_start, "cpu"),
        ("more than the block's own peak",),
    ),
    Mistake(
        "start.check_peak_of",
        "m.delta_bytes",
        lambda: start.check_peak_of(_peak_of_end_minus_start, "cpu"),
        ("what the block left behind",),
    ),
    Mistake(
        "start.check_peak_of",
        "measured after the block ran",
        lambda: start.check_peak_of(_peak_of_measures_after_the_block, "cpu"),
        ("reports 0 bytes",),
    ),
    Mistake(
        "start.check_peak_of",
        "a typed number",
        lambda: start.check_peak_of(lambda fn, device: 8 << 20, "cpu"),
        ("does not run the block",),
    ),
    # 01 exercise 1: move a nested batch
    Mistake(
        "moving.check_move_batch",
        "lists and tuples left as they are",
        lambda: moving.check_move_batch(_move_forgets_lists_and_tuples, CPU),
        ("not on the device",),
    ),
    Mistake(
        "moving.check_move_batch",
        "tuples come back as lists",
        lambda: moving.check_move_batch(_move_tuples_become_lists, CPU),
        ("changed its type",),
    ),
    Mistake(
        "moving.check_move_batch",
        "strings and ints become None",
        lambda: moving.check_move_batch(_move_drops_what_is_not_a_tensor, CPU),
        ("non-tensor values changed",),
    ),
    # 01 exercise 2: accuracy on the device
    Mistake(
        "moving.check_accuracy_on_device",
        "x.to(device) without keeping the result",
        lambda: moving.check_accuracy_on_device(_accuracy_x_not_kept, CPU),
        ("every tensor the loop uses",),
    ),
    Mistake(
        "moving.check_accuracy_on_device",
        "the counter made on the CPU",
        lambda: moving.check_accuracy_on_device(_accuracy_counter_on_the_cpu, CPU),
        ("not on the device",),
    ),
    Mistake(
        "moving.check_accuracy_on_device",
        "the mean over batches, not samples",
        lambda: moving.check_accuracy_on_device(_accuracy_over_batches_not_samples, CPU),
        ("the value is wrong",),
    ),
    # 02 exercise 1: build on the device
    Mistake(
        "creating.check_build_on",
        "built on the CPU, then .to(device)",
        lambda: creating.check_build_on(_build_then_move, "cpu"),
        ("start on the CPU",),
    ),
    Mistake(
        "creating.check_build_on",
        "device= on the first Linear only",
        lambda: creating.check_build_on(_build_device_on_one_layer, "cpu"),
        ("not created on the device",),
    ),
    # 02 exercise 2: a module whose tensors follow it
    Mistake(
        "creating.check_following_module",
        "torch.zeros(..., device=x.device) without dtype=",
        lambda: creating.check_following_module(_ZerosWithoutDtype, "cpu"),
        ("dtype",),
    ),
    Mistake(
        "creating.check_following_module",
        "the shift kept as a plain attribute",
        lambda: creating.check_following_module(_ShiftAsAttribute, "cpu"),
        ("no buffer",),
    ),
    Mistake(
        "creating.check_following_module",
        "torch.zeros(x.shape) on the CPU",
        lambda: creating.check_following_module(_ZerosOnTheCpu, "cpu"),
        ("dtype",),
    ),
    # 03 exercise 1: the parameter count by hand
    Mistake(
        "predict.check_parameter_count",
        "the untied output head left out",
        lambda: predict.check_parameter_count(LLAMA_LIKE, _TIED_HEAD),
        ("one part of the model is missing",),
    ),
    Mistake(
        "predict.check_parameter_count",
        "k and v as wide as q (no grouped-query attention)",
        lambda: predict.check_parameter_count(LLAMA_LIKE, _KV_AS_WIDE_AS_Q),
        ("counted too big",),
    ),
    Mistake(
        "predict.check_parameter_count",
        "two MLP matrices (GELU's), not SwiGLU's three",
        lambda: predict.check_parameter_count(LLAMA_LIKE, _TWO_MLP_MATRICES),
        ("one part of the model is missing",),
    ),
    # 03 exercise 2: one block's saved activations
    Mistake(
        "predict.check_activation_bytes",
        "2 bytes per value (bf16), in an fp32 block",
        lambda: predict.check_activation_bytes(_BLOCK, _b, _s, _s * _b * _PER_TOKEN_BF16),
        ("that is half",),
    ),
    Mistake(
        "predict.check_activation_bytes",
        "elements, not bytes",
        lambda: predict.check_activation_bytes(_BLOCK, _b, _s, _s * _b * _PER_TOKEN_ELEMENTS),
        ("counts elements",),
    ),
    Mistake(
        "predict.check_activation_bytes",
        "one sequence, not the batch",
        lambda: predict.check_activation_bytes(_BLOCK, _b, _s, _s * _PER_TOKEN),
        ("one sequence, not the batch",),
    ),
    # 03 exercise 3: a saved-tensor counter
    Mistake(
        "predict.check_saved_bytes",
        "the weights counted too",
        lambda: predict.check_saved_bytes(_saved_counts_the_weights),
        ("includes the weights",),
    ),
    Mistake(
        "predict.check_saved_bytes",
        "keyed by id(t), not by storage",
        lambda: predict.check_saved_bytes(_saved_keyed_by_id),
        ("the count is wrong",),
    ),
    Mistake(
        "predict.check_saved_bytes",
        "the first view's size for each storage",
        lambda: predict.check_saved_bytes(_saved_view_sizes_once_per_storage),
        ("the count is wrong",),
    ),
    # 04 (no notebook asks it since issue 20): training state bytes
    Mistake(
        "oom.check_training_state_bytes",
        "Adam's state left out",
        lambda: oom.check_training_state_bytes(nn.Linear(64, 32), 2 * 4 * _STATE_WEIGHTS),
        ("part of the training state is missing",),
    ),
    Mistake(
        "oom.check_training_state_bytes",
        "the number of weights",
        lambda: oom.check_training_state_bytes(nn.Linear(64, 32), _STATE_WEIGHTS),
        ("counts weights, not bytes",),
    ),
    # 04 exercise 1: an evaluation loop that keeps no memory
    Mistake(
        "oom.check_evaluate",
        "loss tensors added up, .item() once at the end",
        lambda: oom.check_evaluate(_evaluate_item_once_at_the_end),
        ("every batch's graph",),
    ),
    Mistake(
        "oom.check_evaluate",
        "no_grad, but a tensor returned",
        lambda: oom.check_evaluate(_evaluate_returns_a_tensor),
        ("returns a tensor, not a number",),
    ),
    Mistake(
        "oom.check_evaluate",
        ".detach() per batch, a tensor returned",
        lambda: oom.check_evaluate(_evaluate_detached_tensor_sum),
        ("returns a tensor, not a number",),
    ),
    Mistake(
        "oom.check_evaluate",
        "divided by the samples, not the batches",
        lambda: oom.check_evaluate(_evaluate_over_samples),
        ("divided by the samples", "divide the sum"),
    ),
    Mistake(
        "oom.check_evaluate",
        "the batches' losses added up, not averaged",
        lambda: oom.check_evaluate(_evaluate_sum_not_mean),
        ("the mean loss is not right", "each batch's mean loss", "divide the sum"),
    ),
    # 04 exercise 2: retry with a smaller batch
    Mistake(
        "oom.check_largest_batch",
        "the retries inside the except block",
        lambda: oom.check_largest_batch(_largest_retries_inside_except),
        ("gives up below",),
    ),
    Mistake(
        "oom.check_largest_batch",
        "halved before the first try",
        lambda: oom.check_largest_batch(_largest_halves_before_trying),
        ("does not halve the batch until an attempt succeeds",),
    ),
    Mistake(
        "oom.check_largest_batch",
        "every error kept in a list",
        lambda: oom.check_largest_batch(_largest_keeps_the_errors),
        ("gives up below",),
    ),
    # 05 exercise 1: what fp16 makes of each number
    Mistake(
        "precision.check_fp16_survival",
        "60000 overflows",
        lambda: precision.check_fp16_survival({**_FP16_RIGHT, 60000.0: "inf"}),
        ("some predictions are wrong", "torch.finfo"),
    ),
    Mistake(
        "precision.check_fp16_survival",
        "1e-4 underflows",
        lambda: precision.check_fp16_survival({**_FP16_RIGHT, 1e-4: "0"}),
        ("some predictions are wrong",),
    ),
    Mistake(
        "precision.check_fp16_survival",
        "1e-9 survives",
        lambda: precision.check_fp16_survival({**_FP16_RIGHT, 1e-9: "ok"}),
        ("some predictions are wrong",),
    ),
    # 05 exercise 2: accumulate, unscale, clip (issue 37 item 3: the missing zero_grad)
    Mistake(
        "precision.check_accumulated_clipped_step",
        "no optimizer.zero_grad()",
        lambda: precision.check_accumulated_clipped_step(_accumulated_step(zero_grad=False)),
        ("previous step's", "zero_grad()"),
    ),
    Mistake(
        "precision.check_accumulated_clipped_step",
        "micro-batch losses added up, not averaged",
        lambda: precision.check_accumulated_clipped_step(_accumulated_step(average=False)),
        ("larger than they should be",),
    ),
    Mistake(
        "precision.check_accumulated_clipped_step",
        "clipped before scaler.unscale_",
        lambda: precision.check_accumulated_clipped_step(_accumulated_step(unscale=False)),
        ("far smaller than they should be",),
    ),
    Mistake(
        "precision.check_accumulated_clipped_step",
        "the last micro-batch's loss returned",
        lambda: precision.check_accumulated_clipped_step(_accumulated_step(ret="last")),
        ("not the batch's loss",),
    ),
    Mistake(
        "precision.check_accumulated_clipped_step",
        "one backward over the summed losses",
        lambda: precision.check_accumulated_clipped_step(_one_backward_over_the_sum),
        ("every backward",),
    ),
    Mistake(
        "precision.check_accumulated_clipped_step",
        "bf16 instead of the dtype given",
        lambda: precision.check_accumulated_clipped_step(_right_step_in(torch.bfloat16)),
        ("autocast dtype it is given",),
    ),
    Mistake(
        "precision.check_accumulated_clipped_step",
        "no autocast",
        lambda: precision.check_accumulated_clipped_step(_right_step_in(None)),
        ("autocast dtype it is given",),
    ),
    # 06 exercise 1: the fastest combination that fits
    Mistake(
        "capstone.check_fastest_fit",
        "the fastest, whether it fits or not",
        lambda: capstone.check_fastest_fit("plain", _PEAKS, _SECONDS, _BUDGET),
        ("does not fit the budget",),
    ),
    Mistake(
        "capstone.check_fastest_fit",
        "the smallest peak",
        lambda: capstone.check_fastest_fit("micro + checkpointed", _PEAKS, _SECONDS, _BUDGET),
        ("something that fits is faster",),
    ),
    # 06 the capstone (issue 37 item 3: the missing zero_grad), exercise 2 (tight budget, fp32),
    # exercise 3 (find the bug)
    Mistake(
        "capstone.grade",
        "task: no optimizer.zero_grad()",
        lambda: _grade(_capstone_step(zero_grad=False)),
        ("previous step's", "zero_grad()"),
    ),
    Mistake(
        "capstone.grade",
        "task: micro-batch losses not divided by k",
        lambda: _grade(_capstone_step(average=False)),
        ("wrong size", "same weight"),
    ),
    Mistake(
        "capstone.grade",
        "task: the last micro-batch dropped",
        lambda: _grade(_capstone_step(ret="drops the last")),
        ("not the full batch's",),
    ),
    Mistake(
        "capstone.grade",
        "tight budget: bf16 autocast where fp32 gradients are asked",
        lambda: _grade(
            _bf16_step, exercise="tight budget", fp32_gradients=True, solution_allowed=True
        ),
        ("fp32 gradients", "lower precision"),
    ),
    Mistake(
        "capstone.grade",
        "find the bug: more micro-batches, still one backward over their sum",
        lambda: _grade(_capstone_step(k=16, backward_each=False), exercise="find the bug"),
        ("one backward",),
    ),
    Mistake(
        "capstone.grade",
        "find the bug: the last micro-batch's loss returned",
        lambda: _grade(_capstone_step(ret="last"), exercise="find the bug"),
        ("not the batch's loss",),
    ),
    # 07 exercise 1: DistributedSampler's padding
    Mistake(
        "parallel.check_sampler_padding",
        "64 // 3 per rank, nothing repeated",
        lambda: parallel.check_sampler_padding(21, 0),
        ("per_rank is not",),
    ),
    Mistake(
        "parallel.check_sampler_padding",
        "64 % 3 repeated",
        lambda: parallel.check_sampler_padding(22, 64 % 3),
        ("repeated is not",),
    ),
    # 07 (no notebook asks it): all-reduces with and without no_sync
    Mistake(
        "parallel.check_allreduce_counts",
        "one all-reduce per step either way",
        lambda: parallel.check_allreduce_counts(1, 1),
        ("plain is not",),
    ),
    Mistake(
        "parallel.check_allreduce_counts",
        "no all-reduce at all under no_sync",
        lambda: parallel.check_allreduce_counts(8, 0),
        ("with_no_sync is not",),
    ),
    # 07 exercise 2: accumulation under DDP with no_sync
    Mistake(
        "parallel.check_no_sync_step",
        "every backward inside no_sync",
        lambda: parallel.check_no_sync_step(_acc_every_backward_in_no_sync, k=4),
        ("never all-reduced",),
    ),
    Mistake(
        "parallel.check_no_sync_step",
        "losses not divided by k",
        lambda: parallel.check_no_sync_step(_acc_not_divided_by_k, k=4),
        ("differ from the full batch's",),
    ),
    Mistake(
        "parallel.check_no_sync_step",
        "no no_sync: every backward all-reduces",
        lambda: parallel.check_no_sync_step(_acc_without_no_sync, k=4),
        ("more all-reduces than one per bucket",),
    ),
    # 07 exercise 3: the DDP script's two bugs
    Mistake(
        "parallel.check_ddp_script",
        "the halved gradients made up for by a doubled learning rate",
        lambda: _ddp_script(set_epoch=True, divide=True, lr="0.2"),
        ("the learning rate was changed",),
    ),
    Mistake(
        "parallel.check_ddp_script",
        "set_epoch added, the gradients still divided by the world size",
        lambda: _ddp_script(set_epoch=True, divide=True),
        ("differ from single-process training",),
        _SLOW,
    ),
    Mistake(
        "parallel.check_ddp_script",
        "the division removed, set_epoch still missing",
        lambda: _ddp_script(set_epoch=False, divide=False),
        ("same order every epoch",),
        _SLOW,
    ),
    # 08 (no notebook asks it): the bubble of GPipe
    Mistake(
        "parallel.check_bubble",
        "(p - 1) / m",
        lambda: parallel.check_bubble(lambda p, m: (p - 1) / m),
        ("values are wrong",),
    ),
    Mistake(
        "parallel.check_bubble",
        "(p - 1) / (m + p)",
        lambda: parallel.check_bubble(lambda p, m: (p - 1) / (m + p)),
        ("values are wrong",),
    ),
    # 08 exercise 1: uneven micro-batches
    Mistake(
        "parallel.check_microbatch_step",
        "each loss divided by its micro-batch's size",
        lambda: _microbatch(_micro_divided_by_its_size),
        ("differ from the full batch's",),
    ),
    Mistake(
        "parallel.check_microbatch_step",
        "losses not scaled",
        lambda: _microbatch(_micro_not_scaled),
        ("differ from the full batch's",),
    ),
    Mistake(
        "parallel.check_microbatch_step",
        "one backward over the weighted sum",
        lambda: _microbatch(_micro_one_backward_over_the_sum),
        ("one backward pass per micro-batch",),
    ),
    # 08 exercise 2: a forward split over two devices
    Mistake(
        "parallel.check_split_forward",
        "h.data.to(d1)",
        lambda: parallel.check_split_forward(_split_through_data, [CPU, CPU]),
        ("stage 0 gets no gradient",),
    ),
    Mistake(
        "parallel.check_split_forward",
        "stage 0 under no_grad",
        lambda: parallel.check_split_forward(_split_stage0_without_grad, [CPU, CPU]),
        ("stage 0 gets no gradient",),
    ),
    Mistake(
        "parallel.check_split_forward",
        "both stages on the first device",
        lambda: parallel.check_split_forward(_split_on_first_device, [CPU, CPU]),
        ("with d1='meta'",),
    ),
    # 09 exercise 1: bytes per rank under ZeRO
    Mistake(
        "sharding.check_zero_bytes",
        "ZeRO-2 shards the parameters, not the gradients",
        lambda: sharding.check_zero_bytes(_zero(first_grads=3, first_params=2)),
        ("wrong at some stages",),
    ),
    Mistake(
        "sharding.check_zero_bytes",
        "2 bytes per parameter and gradient (the Playbook's bf16)",
        lambda: sharding.check_zero_bytes(_zero(width=2)),
        ("4 bytes each, not 2",),
    ),
    Mistake(
        "sharding.check_zero_bytes",
        "every stage one later (ZeRO-1 shards nothing)",
        lambda: sharding.check_zero_bytes(_zero(first_state=2, first_grads=3, first_params=4)),
        ("wrong at some stages",),
    ),
    # 09 exercise 2: FSDP2's bytes per collective over micro-batches, with a reduce dtype
    Mistake(
        "sharding.check_fsdp_bytes",
        "k reduce-scatters even with sync='last' (the old 'micro-batches multiply everything')",
        lambda: sharding.check_fsdp_bytes(_fsdp(reduce_once=False)),
        ("only the last micro-batch's backward reduce-scatters",),
    ),
    Mistake(
        "sharding.check_fsdp_bytes",
        "the reduce-scatter in param_dtype (3 Psi x 2 for bf16)",
        lambda: sharding.check_fsdp_bytes(_fsdp(reduce_in_param_dtype=True)),
        ("reduce_dtype",),
    ),
    Mistake(
        "sharding.check_fsdp_bytes",
        "one all-gather per micro-batch (ZeRO-3's backward gathers again)",
        lambda: sharding.check_fsdp_bytes(_fsdp(gathers_per_micro_batch=1)),
        ("what must its backward",),
    ),
    # 10 exercise 1: a tensor-parallel plan
    Mistake(
        "sharding.check_tp_plan",
        "every Linear column-split",
        lambda: sharding.check_tp_plan(_tp()),
        ("more collectives than necessary",),
    ),
    Mistake(
        "sharding.check_tp_plan",
        "rows and columns swapped",
        lambda: sharding.check_tp_plan(
            _tp(attn_q="rowwise", attn_k="rowwise", attn_v="rowwise", mlp_fc1="rowwise")
            | {"attn.o": "colwise", "mlp.fc2": "colwise"}
        ),
        ("more collectives than necessary",),
    ),
    Mistake(
        "sharding.check_tp_plan",
        "the output projection left whole",
        lambda: sharding.check_tp_plan(_tp(mlp_fc2="rowwise") | {"attn.o": None}),
        ("not every Linear is split",),
    ),
    # 10 exercise 2: the batch on a 2-D mesh
    Mistake(
        "sharding.check_batch_for",
        "every rank its own rows, as in plain DDP",
        lambda: sharding.check_batch_for(_batch_by_rank),
        ("tensor-parallel group see different data",),
    ),
    Mistake(
        "sharding.check_batch_for",
        "cut by dp, sized by tp_size",
        lambda: sharding.check_batch_for(_batch_rows_by_tp_size),
        ("equal shares",),
    ),
    Mistake(
        "sharding.check_batch_for",
        "one dp group gets the whole batch",
        lambda: sharding.check_batch_for(_one_group_gets_everything),
        ("equal shares",),
    ),
    # 13 exercise 1: PowerSGD's bytes per step
    Mistake(
        "fewer_bytes.check_powersgd_bytes",
        "the biases forgotten",
        lambda: fewer_bytes.check_powersgd_bytes(_powersgd(vectors=False)),
        ("the biases (tensors of one dimension) are not compressed",),
    ),
    Mistake(
        "fewer_bytes.check_powersgd_bytes",
        "P counted, Q forgotten",
        lambda: fewer_bytes.check_powersgd_bytes(_powersgd(factors=1)),
        ("two factors",),
    ),
    Mistake(
        "fewer_bytes.check_powersgd_bytes",
        "every matrix compressed, however small",
        lambda: fewer_bytes.check_powersgd_bytes(_powersgd(compress_all=True)),
        ("sent whole",),
    ),
    Mistake(
        "fewer_bytes.check_powersgd_bytes",
        "n x m x r for a matrix",
        lambda: fewer_bytes.check_powersgd_bytes(_powersgd_rank_times_matrix),
        ("models and ranks are wrong",),
    ),
    # 13 exercise 2: a scaled cast to float8
    Mistake(
        "fewer_bytes.check_to_float8",
        "no scale at all",
        lambda: fewer_bytes.check_to_float8(_float8_unscaled),
        ("flushed to zero",),
    ),
    Mistake(
        "fewer_bytes.check_to_float8",
        "the scale handed back instead of its inverse",
        lambda: fewer_bytes.check_to_float8(_float8_scale_not_inverted),
        ("does not give x back",),
    ),
    Mistake(
        "fewer_bytes.check_to_float8",
        "amax without abs()",
        lambda: fewer_bytes.check_to_float8(_float8_amax_without_abs),
        ("clamped",),
    ),
    # 13 exercise 3: two stages per rank
    Mistake(
        "fewer_bytes.check_stage_ids",
        "two neighbouring stages per rank",
        lambda: fewer_bytes.check_stage_ids(_stages_side_by_side),
        ("looped placement",),
    ),
    Mistake(
        "fewer_bytes.check_stage_ids",
        "the V's second stage off by one",
        lambda: fewer_bytes.check_stage_ids(_stages_v_off_by_one),
        ("V-shaped placement",),
    ),
    # 12 exercise 1: the bytes of ring attention
    Mistake(
        "at_scale.check_ring_bytes",
        "the keys counted, the values forgotten",
        lambda: at_scale.check_ring_bytes(_ring(keys_only=True)),
        ("the forward bytes are wrong",),
    ),
    Mistake(
        "at_scale.check_ring_bytes",
        "world hops instead of world - 1",
        lambda: at_scale.check_ring_bytes(_ring(hops=lambda world: world)),
        ("the forward bytes are wrong",),
    ),
    Mistake(
        "at_scale.check_ring_bytes",
        "backward sends what forward sends (the gradients forgotten)",
        lambda: at_scale.check_ring_bytes(_ring(backward_like_forward=True)),
        ("the backward bytes are wrong",),
    ),
    # 12 exercise 2: the dispatch's split sizes
    Mistake(
        "at_scale.check_send_splits",
        "one split per expert",
        lambda: at_scale.check_send_splits(_splits_per_expert),
        ("per expert, not per rank",),
    ),
    Mistake(
        "at_scale.check_send_splits",
        "experts placed round robin",
        lambda: at_scale.check_send_splits(_splits_round_robin),
        ("round robin",),
    ),
    Mistake(
        "at_scale.check_send_splits",
        "the tokens split evenly, whatever the router said",
        lambda: at_scale.check_send_splits(_splits_even),
        ("wrong rank",),
    ),
    # 12 exercise 3: the merge of two partial attentions
    Mistake(
        "at_scale.check_merge",
        "the two halves averaged",
        lambda: at_scale.check_merge(_merge_average),
        ("not the attention over all keys",),
    ),
    Mistake(
        "at_scale.check_merge",
        "weighed by exp(lse) itself, which overflows",
        lambda: at_scale.check_merge(_merge_unscaled),
        ("overflows",),
    ),
    Mistake(
        "at_scale.check_merge",
        "the right output, the larger log-sum-exp passed on",
        lambda: at_scale.check_merge(_merge_keeps_the_larger_lse),
        ("log-sum-exp is wrong",),
    ),
    # 11 capstone 2: the plan, exercise 1 (fewest bytes), exercise 2 (the colleague's step)
    Mistake(
        "capstone_grader.check_plan",
        "'ZeRO-3', the name in the prose",
        lambda: _check_plan({**_ZERO3_K4, "shard": "ZeRO-3"}, micro_batch_step, _zero3_k4_bytes()),
        ("plan['shard'] is not one of the choices",),
    ),
    Mistake(
        "capstone_grader.check_plan",
        "6 micro-batches, which do not divide a rank's samples",
        lambda: _check_plan({**_ZERO3_K4, "micro_batches": 6}, micro_batch_step, _zero3_k4_bytes()),
        ("plan['micro_batches'] is not a usable number",),
    ),
    Mistake(  # issue 37 item 1: passes until capstone_grader checks every step's gradients
        "capstone_grader.check_plan",
        "zero3, 4 micro-batches, no optimizer.zero_grad()",
        lambda: _check_plan(_ZERO3_K4, step_without_zero_grad, _zero3_k4_bytes()),
        ("zero_grad",),
        _SLOW,
    ),
    Mistake(  # issue 37 item 1: passes until capstone_grader checks every step's gradients
        "capstone_grader.check_plan",
        "exercise 2: the fix, without optimizer.zero_grad()",
        lambda: _check_plan(
            {"shard": "replicate", "micro_batches": 1, "checkpointing": False},
            averaged_without_zero_grad,
            {"all_reduce": 4 * _psi()},
            budget_bytes=64 << 20,
        ),
        ("zero_grad",),
        _SLOW,
    ),
    Mistake(  # issue 37 item 2: passes until each collective is held to its own bound
        "capstone_grader.check_plan",
        "the right zero3 prediction plus an all_reduce that never runs",
        lambda: _check_plan(
            _ZERO3_K4, micro_batch_step, {**_zero3_k4_bytes(), "all_reduce": 4 * _psi()}
        ),
        ("all_reduce",),
        _SLOW,
    ),
    Mistake(  # issue 38: the gradient_sync lever, predicted as if it changed nothing
        "capstone_grader.check_plan",
        "gradient_sync='last' with the default's k reduce-scatters predicted",
        lambda: _check_plan(
            {**_ZERO3_K4, "checkpointing": True, "gradient_sync": "last"},
            micro_batch_step,
            _zero3_k4_bytes(),
        ),
        ("gradient_sync='last'",),
        _SLOW,
    ),
    Mistake(
        "capstone_grader.check_plan",
        "exercise 1: the task's 4 micro-batches, which gather 4 times",
        lambda: _check_plan(
            _ZERO3_K4, micro_batch_step, _zero3_k4_bytes(), most_bytes=3 * 4 * _psi()
        ),
        ("more bytes than the exercise allows",),
        _SLOW,
    ),
    Mistake(
        "capstone_grader.check_plan",
        "exercise 2: the average all-reduced as a temporary, then dropped",
        lambda: _check_plan(
            {"shard": "replicate", "micro_batches": 1, "checkpointing": False},
            average_of_a_temporary,
            {"all_reduce": 4 * _psi()},
            budget_bytes=64 << 20,
        ),
        ("not one process's",),
        _SLOW,
    ),
    # 14 exercise 1: a timeout twice the longest legitimate wait
    Mistake(
        "hangs.check_timeout",
        "the longest wait itself, without the margin",
        lambda: hangs.check_timeout(max(hangs.WAITS.values())),
        ("no margin",),
    ),
    Mistake(
        "hangs.check_timeout",
        "every wait added up, then doubled",
        lambda: hangs.check_timeout(2 * sum(hangs.WAITS.values())),
        ("added up",),
    ),
    Mistake(
        "hangs.check_timeout",
        "twice a normal step",
        lambda: hangs.check_timeout(2 * min(hangs.WAITS.values())),
        ("kills a healthy job",),
    ),
    # 14 exercise 2: the rank and the collective that hang the broken job
    Mistake(
        "hangs.check_hang",
        "rank 0, whose error the launch shows",
        lambda: _hang(rank=0),
        ("waited for the other",),
    ),
    Mistake(
        "hangs.check_hang",
        "the last collective both ranks finished",
        lambda: _hang(op="all_reduce", seq=20),
        ("every rank finished that collective",),
    ),
    Mistake(
        "hangs.check_hang",
        "the right number, named after the gradients' all_reduce",
        lambda: _hang(op="all_reduce"),
        ("another operation",),
    ),
    # 14 exercise 3: the same collectives on every rank
    Mistake(
        "hangs.check_same_collectives",
        "the count's all_reduce deleted instead of moved",
        lambda: hangs.check_same_collectives(_metrics_without_summing),
        ("not summed",),
    ),
    Mistake(
        "hangs.check_same_collectives",
        "both all_reduces on every rank, in another order on rank 0",
        lambda: hangs.check_same_collectives(_metrics_in_rank_order),
        ("different collectives",),
    ),
    Mistake(
        "hangs.check_same_collectives",
        "the loss summed, not averaged",
        lambda: hangs.check_same_collectives(_metrics_summed_loss),
        ("not the mean",),
    ),
]


# --- tricks: values and steps made to look right ----------------------------------------------


class LyingInt(int):
    """An int whose ``__eq__`` says yes to everything."""

    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class StopsTheCheck(float):
    """A number whose ``__float__`` ends the check with a verdict of its own (a learner's
    ``Feedback``, not the checker's)."""

    def __float__(self):
        raise _Stop(Feedback("a passing verdict"))


class EqualToEverything(torch.Tensor):
    """A tensor subclass that answers True to ``torch.equal``."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.equal:
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


def _stops_in_buffers(features):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(features))

        def buffers(self, recurse=True):
            raise _Stop(Feedback("a passing verdict"))

        def forward(self, x):
            return x * self.weight

    return M()


def _move_to_liars(batch, device):
    if isinstance(batch, torch.Tensor):
        return torch.zeros_like(batch).to(device).as_subclass(EqualToEverything)
    if isinstance(batch, dict):
        return {k: _move_to_liars(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_move_to_liars(v, device) for v in batch)
    return batch


def _one_full_backward_and_empty_ones(model, x, y, k):
    with model.no_sync():
        for _ in range(k - 1):
            (model(x[:0]).sum() * 0).backward()  # empty backward passes
    F.mse_loss(model(x), y).backward()


def _whole_batch_and_detached_scales(
    model, optimizer, scaler, micro_batches, device_type, dtype, max_norm
):
    optimizer.zero_grad(set_to_none=True)
    inputs = torch.cat([i for i, _ in micro_batches])
    targets = torch.cat([t for _, t in micro_batches])
    with torch.autocast(device_type, dtype=dtype):
        loss = F.cross_entropy(model(inputs), targets)
    for _ in range(len(micro_batches) - 1):
        scaler.scale(loss.detach())  # only to be counted
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


class NoThenYes(int):
    """An int that is unequal to the first thing it is compared with, and equal to the rest (so
    it dodges a checker's first diagnostic and matches its answer)."""

    seen = 0

    def __eq__(self, other):
        NoThenYes.seen += 1
        return NoThenYes.seen > 1

    __hash__ = int.__hash__


def _counter_that_lies(module, x):
    NoThenYes.seen = 0
    return NoThenYes(1)


def _every_row_twice(x, dp, tp, dp_size, tp_size):
    rows = len(x) // dp_size
    part = x[dp * rows : (dp + 1) * rows]
    return torch.cat([part, part])


def _zero_stops_the_check(stage, psi, n, k):
    return {"params": StopsTheCheck(1.0), "grads": 1.0, "state": 1.0}


class LyingStr(str):
    """A string equal to every other (and hashed like the right name)."""

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class LyingFloat(float):
    def __eq__(self, other):
        return True

    def __lt__(self, other):
        return False

    def __gt__(self, other):
        return False

    __hash__ = float.__hash__


def _fp16_guess_that_lies():
    return {v: LyingStr("ok") for v in precision.FP16_VALUES}


CFG = DecoderConfig(d_model=48, n_heads=6, norm="rms", mlp="swiglu", bias=False, d_ff=128)

TRICKS = {
    # only the checker's own verdict counts
    "00 matmul_peak: a returned number whose __float__ stops the check": lambda: (
        start.check_matmul_peak(lambda: StopsTheCheck(1.0))
    ),
    "02 following_module: buffers() stops the check": lambda: creating.check_following_module(
        _stops_in_buffers
    ),
    "09 zero_bytes: a returned number stops the check": lambda: sharding.check_zero_bytes(
        _zero_stops_the_check
    ),
    "08 bubble: a returned number stops the check": lambda: parallel.check_bubble(
        lambda p, m: StopsTheCheck(0.5)
    ),
    # values compared as plain values
    "03 saved_bytes: an int whose __eq__ says yes": lambda: predict.check_saved_bytes(
        _counter_that_lies
    ),
    "03 parameter_count: an int whose __eq__ says yes": lambda: predict.check_parameter_count(
        CFG, LyingInt(1)
    ),
    "01 move_batch: tensor subclasses equal to everything": lambda: moving.check_move_batch(
        _move_to_liars, CPU
    ),
    "08 bubble: a float whose comparisons lie": lambda: parallel.check_bubble(
        lambda p, m: LyingFloat(0.5)
    ),
    "07 sampler_padding: ints whose __eq__ says yes": lambda: parallel.check_sampler_padding(
        LyingInt(1), LyingInt(1)
    ),
    "07 allreduce_counts: ints whose __eq__ says yes": lambda: parallel.check_allreduce_counts(
        LyingInt(1), LyingInt(1)
    ),
    "04 training_state_bytes: an int whose __eq__ says yes": lambda: oom.check_training_state_bytes(
        nn.Linear(4, 4), LyingInt(1)
    ),
    "05 fp16_survival: strings equal to every fate": lambda: precision.check_fp16_survival(
        _fp16_guess_that_lies()
    ),
    "06 fastest_fit: a name equal to every name": lambda: capstone.check_fastest_fit(
        LyingStr("slow"),
        {"slow": 10, "fast": 5, "big": 99},
        {"slow": 2.0, "fast": 1.0, "big": 0.5},
        50,
    ),
    # what each call carried, not only the end state
    "07 no_sync: one full backward and k-1 empty ones": lambda: parallel.check_no_sync_step(
        _one_full_backward_and_empty_ones, k=4
    ),
    "05 accumulated step: whole batch, scale(loss.detach()) to be counted": lambda: (
        precision.check_accumulated_clipped_step(_whole_batch_and_detached_scales)
    ),
    "10 batch_for: every row twice": lambda: sharding.check_batch_for(_every_row_twice),
    "14 timeout: an int whose __eq__ says yes": lambda: hangs.check_timeout(LyingInt(75)),
    "14 hang: a rank and a number whose __eq__ says yes": lambda: hangs.check_hang(
        {"rank": LyingInt(0), "op": "all_gather", "seq": LyingInt(20)}, broken_job_reports()
    ),
}


def _case_id(case: Mistake) -> str:
    return f"{case.checker}: {case.mistake}"


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c.slow else c for c in PLAIN],
    ids=_case_id,
)
def test_every_plain_mistake_is_refused_with_a_hint_at_it(case):
    fb = case.answer()
    assert not fb.passed, f"{_case_id(case)} passed: {fb}"
    assert fb.answered, f"{_case_id(case)} was taken for the exercise's placeholder: {fb}"
    shown = repr(fb)  # what the notebook shows after a first wrong answer
    assert fb.attempt == 1 and not fb.detailed, shown
    assert "Fix:" not in shown and not any(fix in shown for fix in fb.fixes), (
        f"the first feedback gives the fix away: {shown}"
    )
    missing = [word for word in case.says if word not in shown]
    assert not missing, f"the first feedback does not point at the mistake ({missing}): {shown}"


def test_04_a_loss_not_averaged_gets_a_hint_at_the_averaging_not_the_graph():
    """Issue 38 §6: a float that is the sum of the batches' losses keeps no graph, so the first
    hint is about averaging; a tensor that keeps the graph still gets the graph's hint."""
    summed = repr(oom.check_evaluate(_evaluate_sum_not_mean))
    assert "divide the sum" in summed and "keep alive" not in summed, summed
    reset_attempts()
    kept = repr(oom.check_evaluate(_evaluate_item_once_at_the_end))
    assert "keep alive" in kept and "divide the sum" not in kept, kept


@pytest.mark.parametrize("name", list(TRICKS))
def test_every_trick_is_refused(name):
    fb = TRICKS[name]()
    assert not fb.passed, f"{name} passed: {fb}"
    assert fb.answered, f"{name} was taken for the exercise's placeholder: {fb}"


# --- the file holds what it says --------------------------------------------------------------


def _checkers_in_the_sources() -> set[str]:
    """``module.check_...`` for every ``def check_`` of the exercises and the notebooks' scripts
    (``grep -rn "def check_" src/tutorial_utils/exercises notebooks/scripts``), and capstone 1's
    ``grade``."""
    found = {"capstone.grade"}
    folders = (ROOT / "src" / "tutorial_utils" / "exercises", SCRIPTS)
    for path in sorted(p for folder in folders for p in folder.glob("*.py")):
        for name in re.findall(r"^def (check_\w+)\(", path.read_text(), flags=re.M):
            found.add(f"{path.stem}.{name}")
    return found


def _checkers_the_notebooks_call() -> set[str]:
    """The name of every checker an exercise cell of a notebook calls."""
    called = set()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for source in shipped.exercise_cells(notebook):
            called |= set(shipped._CHECKS.findall(source))
    return called


def test_every_checker_has_two_plain_mistakes():
    cases: dict[str, int] = {}
    for case in PLAIN:
        cases[case.checker] = cases.get(case.checker, 0) + 1
    known = _checkers_in_the_sources()
    assert set(cases) <= known, f"cases for checkers that do not exist: {set(cases) - known}"
    few = {name: cases.get(name, 0) for name in known if cases.get(name, 0) < 2}
    assert not few, f"checkers with fewer than two plain mistakes here: {few}"
    called = _checkers_the_notebooks_call()
    assert called and called <= {name.split(".")[1] for name in known}, called


def test_the_docstring_states_the_counts():
    doc = " ".join(__doc__.split())
    slow = sum(c.slow for c in PLAIN)
    stated = (
        f"This file holds {len(PLAIN) + len(TRICKS)} wrong answers: {len(PLAIN)} plain "
        f"mistakes in ``PLAIN`` ({slow} of them marked ``slow``: they launch real ranks) and "
        f"{len(TRICKS)} tricks in ``TRICKS``."
    )
    assert stated in doc, f"update the docstring's first paragraph to: {stated}"


# --- refused before launching, and reported as the answer's doing ------------------------------


def test_a_doubled_learning_rate_is_refused_before_launching(monkeypatch):
    """07: the second division by the world size, compensated by a doubled learning rate."""

    def no_launch(*args, **kwargs):
        raise AssertionError("the checker launched a script it should have refused first")

    monkeypatch.setattr(parallel, "launch", no_launch)
    fb = _ddp_script(set_epoch=True, divide=True, lr="0.2")
    assert not fb.passed and "the learning rate was changed" in fb.briefs[0], fb.report()


def test_a_foreign_verdict_is_reported_as_the_answers_doing():
    fb = sharding.check_zero_bytes(_zero_stops_the_check)
    assert "_Stop" in fb.report() and fb.title.startswith("zero_bytes(stage"), fb.report()


# --- hints that match the mistake ------------------------------------------------------------


def test_zero_bytes_visible_hint_is_not_the_method():
    fb = sharding.check_zero_bytes(lambda stage, psi, n, k: 1.0)
    shown = repr(fb)  # the first attempt: the hints, not the fix
    assert "grads /= n" not in shown and "first the optimizer state" not in shown


def test_zero_bytes_bf16_hint_only_for_that_mistake():
    def bf16_except_stage_3(stage, psi, n, k):  # bf16 widths, and stage 3 wrong another way
        if stage == 3:
            return 1.0
        return sharding._zero_parts(stage, psi, n, k, width=2)

    fb = sharding.check_zero_bytes(bf16_except_stage_3)
    assert not any("not 2" in h for h in fb.hints), fb.hints


def test_parameter_count_over_count_is_not_called_missing():
    from tutorial_utils.formulas import decoder_parameters

    cfg = LLAMA_LIKE
    h, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    over = decoder_parameters(cfg) + cfg.n_layers * 2 * h * (h - kv)  # k, v counted h wide
    fb = predict.check_parameter_count(cfg, over)
    assert not fb.passed and fb.briefs == ["one part is counted too big"], fb.briefs


def test_a_step_that_zeroes_its_gradients_passes_from_leftover_gradients():
    """The leftover gradients (issue 37 item 3) refuse only the missing zero_grad: the same steps
    with it, ``set_to_none`` or not, pass."""
    assert precision.check_accumulated_clipped_step(_accumulated_step()).passed

    def zeroes_in_place(model, optimizer, *args):
        optimizer.zero_grad(set_to_none=False)
        return _accumulated_step(zero_grad=False)(model, optimizer, *args)

    assert precision.check_accumulated_clipped_step(zeroes_in_place).passed
    assert _grade(_capstone_step()).passed


# --- side effects -----------------------------------------------------------------------------


def test_checkers_leave_the_learners_rng_alone():
    def right(try_step, batch_size):
        while True:
            try:
                try_step(batch_size)
                return batch_size
            except torch.OutOfMemoryError:
                pass
            batch_size //= 2

    for run in (
        lambda: oom.check_largest_batch(right),
        lambda: predict.check_activation_bytes(CFG, 3, 20, 1),
        lambda: predict.check_saved_bytes(lambda m, x: 1),
    ):
        torch.manual_seed(123)
        expected = torch.rand(3)
        torch.manual_seed(123)
        run()
        assert torch.equal(torch.rand(3), expected)


def test_an_interrupt_inside_largest_batch_leaves_no_accountant():
    def interrupted(try_step, batch_size):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        oom.check_largest_batch(interrupted)
    assert getattr(accounting._local, "shared", None) is None
    assert not torch._C._len_torch_dispatch_stack()


@pytest.mark.parametrize("batch", ["3", 0, -1, 2.5, None])
def test_activation_bytes_bad_batch_is_one_sentence(batch):
    with pytest.raises(ValueError, match="batch must be a whole number"):
        predict.check_activation_bytes(CFG, batch, 20, 1)


# --- Run All is not an attempt ----------------------------------------------------------------


def test_shipped_json_matches_the_notebooks():
    import json

    assert json.loads(shipped.SHIPPED_FILE.read_text()) == shipped.derive(ROOT / "notebooks"), (
        "run python tools/shipped_exercises.py after changing an exercise cell"
    )


@checker
def _always_wrong(answer) -> Feedback:
    fb = Feedback("any exercise")
    fb.fail("wrong")
    return fb


def _definitions(source: str, filename: str) -> dict:
    """Run a cell's ``def`` and ``class`` statements as IPython does (its source kept in
    linecache, so ``inspect.getsource`` reads it)."""
    import ast

    lines = [
        line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip()[:1] in ("%", "!") else line
        for line in source.splitlines()
    ]
    tree = ast.parse("\n".join(lines))
    kept = (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    tree.body = [n for n in tree.body if isinstance(n, kept)]
    code = ast.unparse(tree)
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace = {"__name__": "__main__", "torch": torch, "nn": nn, "F": F}
    exec(compile(code, filename, "exec"), namespace)
    return {
        k: v
        for k, v in namespace.items()
        if callable(v) and getattr(v, "__module__", "") == "__main__"
    }


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:3])
def test_every_exercise_cell_as_shipped_is_not_answered_yet(notebook):
    for i, source in enumerate(shipped.exercise_cells(notebook)):
        defined = _definitions(source, f"<{notebook.name} exercise {i}>")
        for name, value in defined.items():
            fb = _always_wrong(value)
            assert not fb.answered and "Not answered yet" in repr(fb), (notebook.name, name)
            assert fb.attempt == 0


def test_a_changed_exercise_is_an_answer():
    source = "def move(batch, device):\n    return batch.to(device)  # changed\n"
    (move,) = _definitions(source, "<changed>").values()
    fb = _always_wrong(move)
    assert fb.answered and fb.attempt == 1
