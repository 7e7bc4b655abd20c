"""The fault table of issue 11: wrong answers that checkers let through, and bad checker arguments.

Each row names a wrong answer, what the checker did with it before the fix (on main at commit
2329792, the code before this work: "passed", "rejected", or the exception it crashed with)
and what it must do now: every
wrong answer is rejected with a ``Feedback`` that did not pass, and every bad argument from the
notebook raises one sentence (``ValueError`` or ``DeviceUnavailableError``).

The random search for wrong answers that pass lives in ``test_exercises_properties.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import EqInt, EqualToAll, move_ref
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import _disable_current_modes

from tutorial_utils import models
from tutorial_utils.devices import DeviceUnavailableError
from tutorial_utils.exercises import capstone, creating, moving, oom, parallel, precision, start

NAN = float("nan")
SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"


# --- answers built from the right ones -----------------------------------------------------


def move_non_tensors_to_any(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: move_non_tensors_to_any(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_non_tensors_to_any(v, device) for v in batch)
    return mock.ANY  # drops the learner's strings and numbers


def move_flattened(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device).flatten()[:1]  # right device and dtype, wrong shape
    if isinstance(batch, dict):
        return {k: move_flattened(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_flattened(v, device) for v in batch)
    return batch


def _mb_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _mb_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def microbatch_right(model, x, y, m):
    for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
        (F.mse_loss(model(xm), ym) / m).backward()


def microbatch_nan_last(model, x, y, m):
    microbatch_right(model, x, y, m)
    list(model.parameters())[-1].grad.fill_(NAN)


def amp_right(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
    """Notebook 05's mixed-precision step. Issue 11 found its faults in ``check_amp_step``;
    issue 20 replaced that exercise (a copy of the notebook's recipe cell) by
    ``check_accumulated_clipped_step``, and the same faults are checked there."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for inputs, targets in micro_batches:
        with torch.autocast(device_type, dtype=dtype):
            loss = nn.functional.cross_entropy(model(inputs), targets) / len(micro_batches)
        scaler.scale(loss).backward()
        total += loss.item()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total


def amp_nan_loss(*args):
    amp_right(*args)
    return torch.tensor(NAN)


@pytest.fixture(scope="module")
def task():
    def make_model():
        return models.MLP(d_in=64, d_hidden=256, d_out=5, depth=3, seed=0)

    x = models.mlp_batch(512, 64, seed=1)
    y = torch.randint(0, 5, (512,), generator=torch.Generator().manual_seed(2))
    return capstone.CapstoneTask(
        make_model, x, y, budget_bytes=int(1.5 * 2**20), device=torch.device("cpu"), steps=3
    )


def plain_step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def step_in_a_thread(model, optimizer, x, y):
    box = {}
    worker = threading.Thread(target=lambda: box.update(loss=plain_step(model, optimizer, x, y)))
    worker.start()
    worker.join()
    return box["loss"]


def step_without_dispatch_modes(model, optimizer, x, y):
    with _disable_current_modes():
        return plain_step(model, optimizer, x, y)


def step_with_dispatch_disabled(model, optimizer, x, y):
    with torch._C._DisableTorchDispatch():
        return plain_step(model, optimizer, x, y)


def step_returning_none(model, optimizer, x, y):
    plain_step(model, optimizer, x, y)


# --- the table: wrong answer, what it did before the fix ----------------------------------

WRONG_ANSWERS = {
    "matmul_peak: int equal to all": (
        "rejected",
        lambda t: start.check_matmul_peak(lambda: EqInt(0)),
    ),
    "move_batch: non-tensors become mock.ANY": (
        "passed",
        lambda t: moving.check_move_batch(move_non_tensors_to_any),
    ),
    "move_batch: tensors of the wrong shape": (
        "passed",
        lambda t: moving.check_move_batch(move_flattened),
    ),
    "move_batch: returns None": ("rejected", lambda t: moving.check_move_batch(lambda b, d: None)),
    "build_on: returns None": ("passed", lambda t: creating.check_build_on(lambda d: None)),
    "following_module: returns None": (
        "passed",
        lambda t: creating.check_following_module(lambda f: None),
    ),
    "bubble: NaN": ("passed", lambda t: parallel.check_bubble(lambda p, m: NAN)),
    "bubble: None": ("rejected", lambda t: parallel.check_bubble(lambda p, m: None)),
    "sampler_padding: mock.ANY": (
        "passed",
        lambda t: parallel.check_sampler_padding(mock.ANY, mock.ANY),
    ),
    "sampler_padding: ints equal to all": (
        "passed",
        lambda t: parallel.check_sampler_padding(EqInt(0), EqInt(0)),
    ),
    "sampler_padding: NaN": ("rejected", lambda t: parallel.check_sampler_padding(NAN, NAN)),
    "microbatch_step: NaN in the last gradient": (
        "passed",
        lambda t: parallel.check_microbatch_step(microbatch_nan_last, _mb_model(), *_mb_data()),
    ),
    "microbatch_step: returns None, does nothing": (
        "rejected",
        lambda t: parallel.check_microbatch_step(lambda *a: None, _mb_model(), *_mb_data()),
    ),
    "training_state_bytes: NaN": (
        "rejected",
        lambda t: oom.check_training_state_bytes(models.MLP(8, 8, 2), NAN),
    ),
    "training_state_bytes: mock.ANY": (
        "rejected",
        lambda t: oom.check_training_state_bytes(models.MLP(8, 8, 2), mock.ANY),
    ),
    "evaluate: NaN": ("rejected", lambda t: oom.check_evaluate(lambda model, batches: NAN)),
    "evaluate: None": ("rejected", lambda t: oom.check_evaluate(lambda model, batches: None)),
    "fp16_survival: the hard keys deleted": (
        "passed",
        lambda t: precision.check_fp16_survival({70000.0: "inf"}),
    ),
    "fp16_survival: one easy key only": (
        "passed",
        lambda t: precision.check_fp16_survival({1.0: "ok"}),
    ),
    "fp16_survival: answers equal to all": (
        "rejected",
        lambda t: precision.check_fp16_survival({70000.0: EqualToAll(), 1e-9: mock.ANY}),
    ),
    "amp_step: right step, NaN loss returned": (
        "passed",
        lambda t: precision.check_accumulated_clipped_step(amp_nan_loss),
    ),
    "amp_step: returns None": (
        "rejected",
        lambda t: precision.check_accumulated_clipped_step(lambda *a: (amp_right(*a), None)[1]),
    ),
    "capstone: the plain step run in a thread": (
        "passed",
        lambda t: capstone.grade(step_in_a_thread, t).feedback,
    ),
    "capstone: the plain step with dispatch modes popped": (
        "passed",
        lambda t: capstone.grade(step_without_dispatch_modes, t).feedback,
    ),
    "capstone: the plain step with torch dispatch disabled": (
        "passed",
        lambda t: capstone.grade(step_with_dispatch_disabled, t).feedback,
    ),
    "capstone: returns None": (
        "rejected",
        lambda t: capstone.grade(step_returning_none, t).feedback,
    ),
    "capstone: returns mock.ANY": (
        "rejected",
        lambda t: capstone.grade(lambda *a: (plain_step(*a), mock.ANY)[1], t).feedback,
    ),
}


def outcome(check, task) -> str:
    """What a checker did with a wrong answer: "passed", "rejected" or the exception's name."""
    try:
        fb = check(task)
    except Exception as exc:  # noqa: BLE001 - the table records any crash by name
        return type(exc).__name__
    return "passed" if fb.passed else "rejected"


@pytest.mark.parametrize("case", WRONG_ANSWERS)
def test_wrong_answer_is_rejected(case, task):
    before, check = WRONG_ANSWERS[case]
    now = outcome(check, task)
    assert now == "rejected", f"{case}: before the fix {before}, now {now}"


def test_the_table_counts_what_passed_before():
    passed_before = [case for case, (before, _) in WRONG_ANSWERS.items() if before == "passed"]
    assert len(passed_before) == 14  # the issue note said 15; 02 exercise 1 was dropped (issue 38)


# --- bad arguments from the notebook: one sentence, before the learner's code runs ---------


def _frozen():
    model = models.MLP(8, 8, 2)
    model.requires_grad_(False)
    return model


def _task_with(task, **changes):
    fields = {f: getattr(task, f) for f in capstone.CapstoneTask.__dataclass_fields__}
    return capstone.CapstoneTask(**(fields | changes))


BAD_ARGUMENTS = {
    # case: (what it raised before the fix, the call)
    "sampler_padding world=0": (
        "IndexError",
        lambda t: parallel.check_sampler_padding(1, 0, world=0),
    ),
    "sampler_padding n=0": ("passed", lambda t: parallel.check_sampler_padding(0, 0, n=0)),
    "microbatch_step frozen model": (
        "RuntimeError",
        lambda t: parallel.check_microbatch_step(microbatch_right, _frozen(), *_mb_data()),
    ),
    "microbatch_step m=0": (
        "rejected",
        lambda t: parallel.check_microbatch_step(microbatch_right, _mb_model(), *_mb_data(), m=0),
    ),
    "ddp_script nproc=0": (
        "ValueError",
        lambda t: parallel.check_ddp_script(SCRIPTS / "ddp_exercise.py", [0.0], nproc=0),
    ),
    "training_state_bytes frozen model": (
        "ZeroDivisionError",
        lambda t: oom.check_training_state_bytes(_frozen(), 16),
    ),
    "evaluate device='gpu'": ("RuntimeError", lambda t: oom.check_evaluate(lambda *a: 0.0, "gpu")),
    "move_batch device='cuda' without a GPU": (
        "rejected",
        lambda t: moving.check_move_batch(move_ref, "cuda"),
    ),
    "amp_step device='cuda:9'": (
        "AssertionError",
        lambda t: precision.check_accumulated_clipped_step(amp_right, "cuda:9"),
    ),
    "capstone frozen model": (
        "rejected",
        lambda t: capstone.grade(plain_step, _task_with(t, make_model=_frozen)),
    ),
    "capstone steps=0": (
        "IndexError",
        lambda t: capstone.grade(plain_step, _task_with(t, steps=0)),
    ),
    "capstone budget=-1": (
        "ValueError",
        lambda t: capstone.grade(plain_step, _task_with(t, budget_bytes=-1)),
    ),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_argument_raises_one_sentence(case, task):
    before, call = BAD_ARGUMENTS[case]
    try:
        result = call(task)
    except (ValueError, DeviceUnavailableError) as exc:
        message = str(exc)
        assert message and "\n" not in message, f"{case}: not one sentence: {message!r}"
        return
    except Exception as exc:  # noqa: BLE001 - name the crash in the failure
        now = type(exc).__name__
    else:
        feedback = getattr(result, "feedback", result)
        now = "passed" if feedback.passed else "rejected"
    pytest.fail(f"{case}: before the fix {before}, now {now}")
