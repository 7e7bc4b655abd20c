"""The capstone's grader (notebook 07): does your training step fit the budget, and still train?

``grade(train_step, task)`` runs your ``train_step(model, optimizer, tokens, labels) -> float``
three ways and reports every problem it finds:

1. once, unbudgeted, from a fresh model, recording the gradients your step hands to
   ``optimizer.step()``: they must match the full-batch gradients (same direction, same size),
   so a step that drops samples or scales the loss wrongly is caught;
2. ``task.steps`` times inside ``memory.budget(task.budget_bytes)``: no out-of-memory error, and
   the peak measured by ``memory.measure`` stays under the budget;
3. the losses it returns must fall.

It must call ``optimizer.step()`` exactly once per call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .. import memory
from ..units import format_bytes
from . import Feedback

__all__ = ["CapstoneTask", "Grade", "grade", "reference_gradients"]


@dataclass(frozen=True)
class CapstoneTask:
    """What the learner must fit: a model factory, one batch, a budget and an optimizer setting."""

    make_model: Callable[[], nn.Module]
    tokens: torch.Tensor
    labels: torch.Tensor
    budget_bytes: int
    device: torch.device
    lr: float = 3e-4
    steps: int = 4

    def loss_fn(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.float(), labels)

    def new_run(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        model = self.make_model().to(self.device)
        return model, torch.optim.Adam(model.parameters(), lr=self.lr)


class _CountingOptimizer:
    """Wraps the real optimizer: counts ``step()`` calls and can copy the gradients it is given."""

    def __init__(self, optimizer: torch.optim.Optimizer, record: bool):
        self._optimizer = optimizer
        self._record = record
        self.steps = 0
        self.grads: list[torch.Tensor | None] = []

    def step(self, *args, **kwargs):
        self.steps += 1
        if self._record and self.steps == 1:
            self.grads = [
                None if p.grad is None else p.grad.detach().float().clone()
                for group in self._optimizer.param_groups
                for p in group["params"]
            ]
        return self._optimizer.step(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._optimizer, name)


def reference_gradients(task: CapstoneTask) -> list[torch.Tensor]:
    """The plain full-batch gradients of a fresh model: what a correct step must reproduce."""
    model, _ = task.new_run()
    task.loss_fn(model(task.tokens), task.labels).backward()
    return [p.grad.detach().float().clone() for p in model.parameters()]


@dataclass(frozen=True)
class Grade:
    feedback: Feedback
    peak_bytes: int | None
    losses: tuple[float, ...]


def _compare_grads(fb: Feedback, got: list, want: list[torch.Tensor]) -> None:
    if not fb.expect(len(got) > 0, "your step never called optimizer.step()"):
        return
    if not fb.expect(all(g is not None for g in got), "some parameters had no gradient at optimizer.step()"):
        return
    g = torch.cat([t.flatten() for t in got])
    w = torch.cat([t.flatten() for t in want])
    ratio = float(g.norm() / w.norm())
    cosine = float(torch.nn.functional.cosine_similarity(g, w, dim=0))
    fb.expect(
        cosine > 0.99,
        f"your gradients point in another direction than the full batch's (cosine {cosine:.3f}): "
        "does every sample of the batch take part in the step?",
    )
    if cosine > 0.99:
        fb.expect(
            0.9 < ratio < 1.1,
            f"your gradients are {ratio:.2f}x the full-batch gradients: with k micro-batches, "
            "divide each micro-batch's loss by k",
        )


def grade(train_step: Callable, task: CapstoneTask) -> Grade:
    """Check ``train_step`` against ``task``; see the module docstring."""
    fb = Feedback(f"fit a training step in {format_bytes(task.budget_bytes)} and keep learning")
    if not callable(train_step):
        fb.expect(False, f"train_step must be a function, not {type(train_step).__name__}")
        return Grade(fb, None, ())

    # 1. The gradients of one step, unbudgeted.
    model, optimizer = task.new_run()
    counting = _CountingOptimizer(optimizer, record=True)
    try:
        train_step(model, counting, task.tokens, task.labels)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        fb.expect(False, f"your train_step raised {type(exc).__name__}: {exc}")
        return Grade(fb, None, ())
    fb.expect(counting.steps == 1, f"call optimizer.step() exactly once per train_step (it was called {counting.steps} times)")
    _compare_grads(fb, counting.grads, reference_gradients(task))
    del model, optimizer, counting

    # 2. Several steps inside the budget.
    model, optimizer = task.new_run()
    counting = _CountingOptimizer(optimizer, record=False)
    losses: list[float] = []
    peak = None
    try:
        with memory.measure(task.device) as m, memory.budget(task.budget_bytes, task.device):
            for _ in range(task.steps):
                losses.append(float(train_step(model, counting, task.tokens, task.labels)))
        peak = m.peak_bytes
    except torch.OutOfMemoryError as err:
        first = str(err).strip().splitlines()[0]
        fb.expect(False, f"step {len(losses) + 1} ran out of memory: {first}")
        fb.hint("micro-batches with gradient accumulation, activation checkpointing and bf16 autocast each shrink the activations")
    if peak is not None:
        fb.expect(
            peak <= task.budget_bytes,
            f"the peak was {format_bytes(peak)}, over the budget of {format_bytes(task.budget_bytes)}",
        )
    # 3. Still learning.
    if len(losses) == task.steps:
        fb.expect(
            all(math.isfinite(x) for x in losses) and losses[-1] < losses[0],
            f"the loss did not fall over {task.steps} steps ({losses[0]:.4f} -> {losses[-1]:.4f}): "
            "return the batch's loss as a float, and step the optimizer",
        )
    return Grade(fb, peak, tuple(losses))
