"""Checkers for notebook 05 (out-of-memory troubleshooting).

``check_training_state_bytes(model, answer)``: the learner computes, from the parameter
count, the bytes that fp32 parameters, their gradients and Adam's two moment tensors take.
The checker compares with the exact number and, when the answer is off by a recognisable
factor, says which part was forgotten.

``check_evaluate(evaluate)``: the learner fixes an evaluation loop,
``evaluate(model, batches) -> float``. The checker runs it under ``memory.measure`` on a
seeded model and checks that it returns the right mean loss as a plain number (not a tensor
holding a graph), and that no tensor memory is left behind once it returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import memory
from . import Feedback

__all__ = ["check_evaluate", "check_training_state_bytes", "training_state_bytes"]


def training_state_bytes(model: nn.Module) -> int:
    """Bytes of parameters + gradients + Adam's ``exp_avg`` and ``exp_avg_sq``, in the parameters' dtype."""
    return sum(4 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def check_training_state_bytes(model: nn.Module, answer: int | float) -> Feedback:
    """Is ``answer`` the bytes of parameters + gradients + Adam state of ``model``?"""
    fb = Feedback("bytes of parameters, gradients and Adam state")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or answer <= 0:
        fb.expect(False, f"give a positive number of bytes, got {answer!r}")
        return fb
    truth = training_state_bytes(model)
    per_weight = {1: "only the parameters", 2: "parameters and gradients but not Adam's state",
                  3: "Adam's state as 1x the parameters (it keeps two tensors: exp_avg and exp_avg_sq)"}
    n_weights = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if math.isclose(answer, truth, rel_tol=1e-9):
        return fb
    for k, what in per_weight.items():
        if math.isclose(answer, k * truth / 4, rel_tol=1e-9):
            fb.expect(False, f"{answer:,} bytes counts {what}; the answer is 4 copies of the parameters")
            return fb
    if math.isclose(answer, n_weights, rel_tol=1e-9):
        fb.expect(False, "that is the number of weights, not bytes: each weight is stored 4 times "
                         "(weight, gradient, exp_avg, exp_avg_sq) at 4 bytes each in fp32")
        return fb
    fb.expect(False, f"{answer:,} bytes is not right (you are off by a factor of {answer / truth:.3g})")
    fb.hint("sum(p.numel() for p in model.parameters()) weights; each is stored 4 times (weight, "
            "gradient, exp_avg, exp_avg_sq) at 4 bytes in fp32")
    return fb


def _eval_setup(device: torch.device) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 5)).to(device)
    gen = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(128, 64, generator=gen).to(device), torch.randint(0, 5, (128,), generator=gen).to(device))
        for _ in range(4)
    ]
    return model, batches


def _reference_mean_loss(model: nn.Module, batches) -> float:
    with torch.no_grad():
        return sum(nn.functional.cross_entropy(model(x), y).item() for x, y in batches) / len(batches)


def check_evaluate(evaluate: Callable[..., Any], device: str | torch.device = "cpu") -> Feedback:
    """Run ``evaluate(model, batches)`` under ``memory.measure`` and check value, type and memory left."""
    fb = Feedback("an evaluation loop that keeps no memory")
    device = torch.device(device)
    model, batches = _eval_setup(device)
    expected = _reference_mean_loss(model, batches)
    try:
        with memory.measure(device) as m:
            result = evaluate(model, batches)
        kept_while_alive = m.delta_bytes
    except Exception as exc:  # the learner's code: report it, do not show a deep traceback
        fb.expect(False, f"evaluate raised {type(exc).__name__}: {exc}")
        return fb
    if isinstance(result, torch.Tensor):
        if result.requires_grad:
            fb.expect(False, "evaluate returns a tensor that still holds the autograd graph of every batch "
                             f"({kept_while_alive:,} bytes kept alive): accumulate loss.item() or use torch.no_grad()")
        else:
            fb.expect(False, "evaluate returns a tensor; return a Python float (call .item() once at the end, or per batch)")
        value = float(result.detach())
    elif isinstance(result, (int, float)) and not isinstance(result, bool):
        value = float(result)
    else:
        fb.expect(False, f"evaluate should return the mean loss as a float, not {type(result).__name__}")
        return fb
    fb.expect(math.isclose(value, expected, rel_tol=1e-4),
              f"the mean loss should be {expected:.4f}, got {value:.4f}: average cross_entropy over the batches")
    del result
    if fb.passed:
        fb.expect(kept_while_alive == 0,
                  f"{kept_while_alive:,} bytes of tensors were still alive after evaluate returned")
    if not fb.passed:
        fb.hint("with torch.no_grad(): total += loss.item()  ... return total / len(batches)")
    return fb
