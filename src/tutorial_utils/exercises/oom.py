"""Checkers for notebook 04 (out-of-memory troubleshooting).

``check_training_state_bytes(model, answer)``: the learner computes, from the parameter
count, the bytes that fp32 parameters, their gradients and Adam's two moment tensors take
(with or without Adam's 4-byte ``step`` counter per tensor: both answers pass).
The checker compares with the exact number and, when the answer is off by a recognisable
factor, says which part was forgotten. (No notebook asks it since issue 20's editorial pass:
04's first exercise was answered by the cell above it, and 03 §2 now teaches the count.)

``check_evaluate(evaluate)``: the learner fixes an evaluation loop,
``evaluate(model, batches) -> float``. The checker runs it under ``memory.measure`` on a
seeded model and checks that it returns the right mean loss as a plain number (not a tensor
holding a graph), that no tensor memory is left behind once it returns, and that the peak
*while it runs* stays at what one batch at a time needs: a loop that adds up the loss tensors
and calls ``.item()`` once at the end returns a float and leaves nothing behind, but holds every
batch's graph until then.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import memory
from . import Feedback, checker
from .answers import (
    checker_device,
    describe,
    finite_number,
    number_problem,
    tensor_number,
    whole_number,
)

__all__ = [
    "check_evaluate",
    "check_largest_batch",
    "check_training_state_bytes",
    "training_state_bytes",
]


def training_state_bytes(model: nn.Module) -> int:
    """Bytes of parameters, gradients, Adam's ``exp_avg`` and ``exp_avg_sq`` (parameters' dtype)."""
    return sum(4 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


@checker(answers=("answer",), zero=True)
def check_training_state_bytes(model: nn.Module, answer: int | float) -> Feedback:
    """Is ``answer`` the bytes of parameters + gradients + Adam state of ``model``?"""
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"check_training_state_bytes: model must be an nn.Module, not {type(model).__name__}"
        )
    truth = training_state_bytes(model)
    if truth == 0:
        raise ValueError(
            "check_training_state_bytes: the model has no parameter that requires grad "
            "(frozen?), so there is nothing to train"
        )
    fb = Feedback("bytes of parameters, gradients and Adam state")
    fb.hint("count what a training step with Adam keeps for every weight, and its size in bytes")
    fb.fix(
        "sum(p.numel() for p in model.parameters()) weights; each is stored 4 times (weight, "
        "gradient, exp_avg, exp_avg_sq) at 4 bytes in fp32"
    )
    value = finite_number(answer)
    fb.require(
        value is not None and value > 0,
        f"give a positive number of bytes, got {describe(answer)}",
        brief="the answer is not a positive number of bytes",
    )
    if math.isclose(value, truth, rel_tol=1e-9):
        return fb
    # Adam also keeps a 4-byte ``step`` counter per parameter tensor (the notebook's check
    # counts it): that answer is right too.
    n_tensors = sum(1 for p in model.parameters() if p.requires_grad)
    if math.isclose(value, truth + 4 * n_tensors, rel_tol=1e-12):
        return fb
    per_weight = {
        1: "only the parameters",
        2: "parameters and gradients but not Adam's state",
        3: "Adam's state as 1x the parameters (it keeps two tensors: exp_avg and exp_avg_sq)",
    }
    for k, what in per_weight.items():
        if math.isclose(value, k * truth / 4, rel_tol=1e-9):
            fb.fail(
                f"{value:,.0f} bytes counts {what}; the answer is 4 copies of the parameters",
                brief="part of the training state is missing",
            )
    n_weights = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if math.isclose(value, n_weights, rel_tol=1e-9):
        fb.fail(
            "that is the number of weights, not bytes: each weight is stored 4 times "
            "(weight, gradient, exp_avg, exp_avg_sq) at 4 bytes each in fp32",
            brief="that counts weights, not bytes",
        )
    fb.expect(
        False,
        f"{value:,.0f} bytes is not right (you are off by a factor of {value / truth:.3g})",
        brief="the number is wrong",
    )
    return fb


def _eval_setup(device: torch.device) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    with torch.random.fork_rng(devices=[]):  # seed the model without touching the learner's RNG
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 5)
        ).to(device)
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(128, 64, generator=gen).to(device),
            torch.randint(0, 5, (128,), generator=gen).to(device),
        )
        for _ in range(4)
    ]
    return model, batches


def _reference_mean_loss(model: nn.Module, batches) -> float:
    with torch.no_grad():
        return sum(nn.functional.cross_entropy(model(x), y).item() for x, y in batches) / len(
            batches
        )


def _one_batch_at_a_time_peak(device: torch.device) -> int:
    """The peak above the start of the most an evaluation may hold: one batch and its graph at a
    time (``.item()`` per batch, autograd on). ``no_grad`` needs less."""
    model, batches = _eval_setup(device)
    with memory.measure(device) as m:
        total = 0.0
        for x, y in batches:
            total += nn.functional.cross_entropy(model(x), y).item()
    return m.peak_above_start_bytes


@checker(answers=("evaluate",))
def check_evaluate(evaluate: Callable[..., Any], device: str | torch.device = "cpu") -> Feedback:
    """Run ``evaluate(model, batches)`` under ``memory.measure``: check value, type, memory left."""
    device = checker_device(device, "check_evaluate", allowed=("cuda", "cpu"))
    fb = Feedback("an evaluation loop that keeps no memory")
    fb.hint("what does a loss tensor keep alive while you add it up, and does evaluation need it?")
    fb.fix("with torch.no_grad(): total += loss.item()  ... return total / len(batches)")
    allowed_peak = _one_batch_at_a_time_peak(device)
    model, batches = _eval_setup(device)
    expected = _reference_mean_loss(model, batches)
    with memory.measure(device) as m:
        result = fb.run("evaluate(model, batches)", evaluate, model, batches)
    kept_while_alive = m.delta_bytes
    peak = m.peak_above_start_bytes
    if isinstance(result, torch.Tensor):
        if result.requires_grad:
            fb.expect(
                False,
                "evaluate returns a tensor that still holds the autograd graph of every batch "
                f"({kept_while_alive:,} bytes kept alive): accumulate loss.item() or use "
                "torch.no_grad()",
                brief="evaluate returns a tensor that keeps the graph of every batch alive",
            )
        else:
            fb.expect(
                False,
                "evaluate returns a tensor; return a Python float (call .item() once at the "
                "end, or per batch)",
                brief="evaluate returns a tensor, not a number",
            )
        value = tensor_number(result)
    else:
        value = finite_number(result)
        fb.require(
            value is not None,
            number_problem("evaluate", result) + ": the mean loss as a float",
            brief="evaluate does not return the mean loss as a number",
        )
    got = "no single number" if value is None else f"{value:.4f}"
    samples = sum(len(y) for _, y in batches)
    per_sample = value is not None and math.isclose(
        value * samples, expected * len(batches), rel_tol=1e-4
    )
    fb.expect(
        value is not None and math.isclose(value, expected, rel_tol=1e-4),
        f"the mean loss should be {expected:.4f}, got {got}: average cross_entropy over the "
        "batches"
        + (
            " (cross_entropy is each batch's mean already: divide the sum of the batches' "
            "losses by the number of batches, not of samples)"
            if per_sample
            else ""
        ),
        brief="the mean loss is divided by the samples, not the batches"
        if per_sample
        else "the mean loss is not right",
    )
    del result
    if not fb.passed and all(b.startswith("the mean loss") for b in fb.briefs):
        # only the number is wrong (a float, no graph kept): the hint is about averaging
        fb.hints = [
            "cross_entropy gives each batch's mean loss: to average over the batches, what do "
            "you divide the sum of those losses by?"
        ]
    if fb.passed:
        fb.expect(
            kept_while_alive == 0,
            f"{kept_while_alive:,} bytes of tensors were still alive after evaluate returned",
            brief="evaluate leaves tensors behind",
        )
    if fb.passed:
        fb.expect(
            peak <= 1.1 * allowed_peak,
            f"while evaluate ran, tensor memory peaked {peak:,} bytes above the start, more than "
            f"one batch at a time needs ({allowed_peak:,}): the loss tensors you add up keep "
            "every batch's autograd graph alive until the end; add loss.item() per batch "
            "(under torch.no_grad())",
            brief="evaluate holds every batch's graph until it returns",
        )
    return fb


# -----------------------------------------------------------------------------
# Exercise 3: debug a retry that holds the failed attempt's memory


def _retry_model() -> nn.Module:
    with torch.random.fork_rng(devices=[]):  # seed the model without touching the learner's RNG
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )


@checker(answers=("largest_fitting_batch",))
def check_largest_batch(
    largest_fitting_batch: Callable[[Callable[[int], None], int], Any],
    fits: int = 64,
    start: int = 1024,
) -> Feedback:
    """``largest_fitting_batch(try_step, start)`` halves the batch until ``try_step`` fits.

    ``try_step(n)`` runs one training step at batch ``n`` under a CPU ``memory.budget`` set
    halfway between the peaks of batch ``fits`` and ``2 * fits`` (measured here, exactly), so
    ``fits`` is the right answer when nothing else is alive. A retry made inside the ``except``
    block still holds the failed attempt (its traceback keeps every frame and tensor), so it
    fails at sizes that fit, and gives up too early or raises.
    """
    for name, value in (("fits", fits), ("start", start)):
        if whole_number(value) is None or value < 1 or value & (value - 1):
            raise ValueError(f"check_largest_batch: {name} is a power of two, not {value!r}")
    if start <= fits:
        raise ValueError(f"check_largest_batch: start ({start}) must be above fits ({fits})")
    fb = Feedback("largest_fitting_batch finds the largest batch that fits under the budget")
    fb.hint(
        "when it tries a size that fits, is any earlier failed attempt still alive? Where is "
        "that call made?"
    )
    fb.fix(
        "catch the error without retrying inside the except block: set a flag there (or just "
        "let the block end), then halve the batch and try again after it"
    )
    if not callable(largest_fitting_batch):
        fb.fail(
            f"pass a function: {describe(largest_fitting_batch)} is not one",
            brief="the answer must be a function",
        )
    model = _retry_model()
    gen = torch.Generator().manual_seed(1)  # the checker's own: the learner's RNG is left alone

    def step(n: int) -> None:
        model.zero_grad(set_to_none=True)
        x = torch.randn(n, 64, generator=gen)
        y = torch.zeros(n, dtype=torch.long)
        nn.functional.cross_entropy(model(x), y).backward()
        model.zero_grad(set_to_none=True)

    step(1)  # anything created once (lazy state) exists before the peaks are measured
    peaks = []
    for n in (fits, 2 * fits):
        with memory.measure("cpu") as m:
            step(n)
        peaks.append(m.peak_above_start_bytes)
    tried: list[int] = []
    tracker = memory.Tracker("cpu").start()
    limit = tracker.current_bytes + (peaks[0] + peaks[1]) // 2

    def try_step(n: int) -> None:
        if whole_number(n) is None or n < 1:
            raise ValueError(f"a batch size is a whole number of 1 or more, not {describe(n)}")
        if len(tried) >= 32:
            raise RuntimeError(f"try_step was called {len(tried)} times: does the loop stop?")
        tried.append(int(n))
        with memory.budget(limit, "cpu"):
            step(int(n))

    got: Any = None
    raised = ""
    try:  # stop the tracker on every path (a KeyboardInterrupt too): its accountant slows ops
        try:
            got = largest_fitting_batch(try_step, start)
        except torch.OutOfMemoryError:
            raised = "OutOfMemoryError"
        except Exception as exc:  # the learner's code: one sentence, not a deep traceback
            raised = f"{type(exc).__name__}: {exc}"
        left = tracker.current_bytes - tracker.start_bytes  # after the exception is gone
    finally:
        tracker.stop()
    model.zero_grad(set_to_none=True)
    sizes = ", ".join(str(n) for n in tried) or "none"
    if fits in tried and (raised or got != fits):
        outcome = f"raised {raised.split(':')[0]}" if raised else f"returned {describe(got)}"
        fb.fail(
            f"it tried batch sizes {sizes} and {outcome}, though a batch of {fits} fits on its "
            "own: when it tried that size, earlier failed attempts were still holding memory",
            brief=f"it gives up below {fits}, a batch that fits on its own",
        )
    fb.require(
        not raised,
        f"it raised {raised} (batch sizes tried: {sizes})",
        brief="it raised an error",
    )
    value = whole_number(got)
    fb.require(
        value is not None,
        f"it should return the batch size as an int, not {describe(got)}",
        brief="it does not return a batch size",
    )
    halving = [start >> i for i in range((start // fits).bit_length())]  # start, start/2, .. fits
    fb.require(
        value == fits and tried == halving,
        f"it returned {value} after trying {sizes}; halve from {start} until an attempt "
        "succeeds, and return that attempt's batch size",
        brief="it does not halve the batch until an attempt succeeds",
    )
    fb.require(
        left == 0,
        f"{left:,} bytes of tensors were still alive after it returned: the failed attempts "
        "were not released",
        brief="it leaves memory behind",
    )
    return fb
