"""The capstone's grader (notebook 07): does your training step fit the budget, and still train?

``grade(train_step, task)`` runs your ``train_step(model, optimizer, tokens, labels) -> float``
three ways and reports every problem it finds:

1. once, unbudgeted, from a fresh model, recording the gradients your step hands to
   ``optimizer.step()``: they must match the full-batch gradients (same direction, same size),
   so a step that drops samples or scales the loss wrongly is caught;
2. ``task.steps`` times inside ``memory.budget(task.budget_bytes)``: no out-of-memory error, and
   the peak measured by ``memory.measure`` stays under the budget;
3. the losses it returns must be finite numbers, and fall.

It must call ``optimizer.step()`` exactly once per call.

A peak is only worth grading if the whole step was counted. On a GPU the caching allocator
counts every byte of the process, whatever thread asks. On the CPU the count is
``memory``'s accountant, a dispatch mode that sees only the operators of its own thread while
it is on the dispatch stack. So in step 2 on the CPU the grader watches the step run: hooks on
every module and every parameter check that the forward and backward passes run on the
grading thread, with the accountant on the stack and torch dispatch not turned off. And on
every device it compares the books with what the step itself produced: the gradients and
optimizer state it made must show up in the measured peak. A step that hides its memory (in
a thread, under ``_disable_current_modes()`` or ``torch._C._DisableTorchDispatch()``) is
refused, not graded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .. import memory
from ..units import format_bytes
from . import Feedback, checker
from .answers import checker_device, describe, finite_number, tensor_number, whole_number

__all__ = ["CapstoneTask", "Grade", "check_fastest_fit", "grade", "reference_gradients"]


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

    def __post_init__(self) -> None:
        if not callable(self.make_model):
            raise ValueError("CapstoneTask: make_model must be a function that builds the model")
        if not isinstance(self.tokens, torch.Tensor) or not isinstance(self.labels, torch.Tensor):
            raise ValueError("CapstoneTask: tokens and labels must be tensors")
        if self.tokens.dim() == 0 or len(self.tokens) != len(self.labels) or not len(self.tokens):
            raise ValueError("CapstoneTask: tokens and labels must hold the same number of samples")
        budget = whole_number(self.budget_bytes)
        if budget is None or budget <= 0:
            raise ValueError(
                f"CapstoneTask: budget_bytes must be a positive whole number of bytes, not "
                f"{self.budget_bytes!r}"
            )
        lr = finite_number(self.lr)
        if lr is None or lr <= 0:
            raise ValueError(f"CapstoneTask: lr must be a positive number, not {self.lr!r}")
        steps = whole_number(self.steps)
        if steps is None or steps < 2:
            raise ValueError(
                f"CapstoneTask: steps must be 2 or more (the loss must fall), not {self.steps!r}"
            )
        device = checker_device(self.device, "CapstoneTask", allowed=("cuda", "cpu"))
        object.__setattr__(self, "budget_bytes", budget)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "device", device)

    def loss_fn(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.float(), labels)

    def new_run(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        model = self.make_model()
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"CapstoneTask: make_model() must return an nn.Module, not {type(model).__name__}"
            )
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError(
                "CapstoneTask: the model from make_model() has no parameter that requires grad "
                "(frozen?), so there is nothing to train"
            )
        model = model.to(self.device)
        return model, torch.optim.Adam(model.parameters(), lr=self.lr)


class _CountingOptimizer:
    """Wraps the real optimizer: counts ``step()`` calls and can copy the gradients it is given."""

    def __init__(self, optimizer: torch.optim.Optimizer, record: bool):
        self._optimizer = optimizer
        self._record = record
        self.steps = 0
        self.grads: list[torch.Tensor | None] = []
        self.grad_bytes = 0  # the most gradient bytes handed to one step()

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self._optimizer.param_groups for p in group["params"]]

    def step(self, *args, **kwargs):
        self.steps += 1
        params = self._params()
        self.grad_bytes = max(self.grad_bytes, _storage_bytes(p.grad for p in params))
        if self._record and self.steps == 1:
            self.grads = [
                None if p.grad is None else p.grad.detach().float().clone() for p in params
            ]
        return self._optimizer.step(*args, **kwargs)

    def state_bytes(self) -> int:
        return _storage_bytes(t for state in self._optimizer.state.values() for t in state.values())

    def __getattr__(self, name):
        return getattr(self._optimizer, name)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages among ``tensors`` (non-tensors and None are skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class _Watch:
    """Hooks that see where the step's forward and backward passes run (CPU accounting only).

    Each module's forward pre-hook and each parameter's post-accumulate-grad hook checks that
    it runs on the grading thread, with at least the dispatch modes that were on the stack when
    the watch started (the accountant among them), and torch dispatch not turned off.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.handles: list = []
        self.thread = threading.get_ident()
        self.depth = 0
        self.forwards = 0
        self.elsewhere: set[str] = set()

    def _check(self, what: str) -> None:
        if threading.get_ident() != self.thread:
            self.elsewhere.add(f"the {what} ran in another thread")
        elif torch._C._len_torch_dispatch_stack() < self.depth:
            self.elsewhere.add(f"the {what} ran with the dispatch modes popped")
        elif torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python):
            self.elsewhere.add(f"the {what} ran with torch dispatch turned off")
        elif what == "forward pass":
            self.forwards += 1

    def __enter__(self) -> _Watch:
        self.thread = threading.get_ident()
        self.depth = torch._C._len_torch_dispatch_stack()
        for module in self.model.modules():
            self.handles.append(
                module.register_forward_pre_hook(lambda *_: self._check("forward pass"))
            )
        for p in self.model.parameters():
            if p.requires_grad:
                self.handles.append(
                    p.register_post_accumulate_grad_hook(lambda _: self._check("backward pass"))
                )
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def reference_gradients(task: CapstoneTask) -> list[torch.Tensor]:
    """The plain full-batch gradients of a fresh model: what a correct step must reproduce."""
    model, _ = task.new_run()
    task.loss_fn(model(task.tokens), task.labels).backward()
    return [
        torch.zeros_like(p, dtype=torch.float32) if p.grad is None else p.grad.detach().float()
        for p in model.parameters()
    ]


@dataclass(frozen=True)
class Grade:
    feedback: Feedback
    peak_bytes: int | None
    losses: tuple[float, ...]


def _compare_grads(fb: Feedback, got: list, want: list[torch.Tensor]) -> None:
    fb.require(len(got) > 0, "your step never called optimizer.step()")
    fb.require(
        all(g is not None for g in got),
        "some parameters had no gradient at optimizer.step()",
        brief="some parameters had no gradient",
    )
    fb.require(
        len(got) == len(want) and all(g.shape == w.shape for g, w in zip(got, want, strict=True)),
        "the optimizer's parameters are not the model's",
    )
    g = torch.cat([t.flatten() for t in got])
    w = torch.cat([t.flatten() for t in want])
    fb.require(
        bool(torch.isfinite(g).all()),
        "some gradients are NaN or infinite at optimizer.step()",
        brief="some gradients are not finite",
    )
    ratio = float(g.norm() / w.norm())
    cosine = float(torch.nn.functional.cosine_similarity(g, w, dim=0))
    fb.expect(
        cosine > 0.99,
        f"your gradients point in another direction than the full batch's (cosine {cosine:.3f}): "
        "does every sample of the batch take part in the step?",
        brief="your gradients are not the full batch's",
    )
    if cosine > 0.99:
        fb.expect(
            0.9 < ratio < 1.1,
            f"your gradients are {ratio:.2f}x the full-batch gradients: with k micro-batches, "
            "divide each micro-batch's loss by k",
            brief="your gradients have the wrong size",
        )


def _loss_value(loss: object) -> float | None:
    """The loss a step returned, as a finite float: a number or a one-element tensor."""
    if isinstance(loss, torch.Tensor):
        return tensor_number(loss)
    return finite_number(loss)


def grade(train_step: Callable, task: CapstoneTask, exercise: str | None = None) -> Grade:
    """Check ``train_step`` against ``task``; see the module docstring.

    ``exercise`` names which exercise this is, when a notebook grades several with the same
    grader: each then counts its own attempts, so its first wrong answer gets a hint.
    """
    if not isinstance(task, CapstoneTask):
        raise ValueError(f"grade needs a CapstoneTask, not {type(task).__name__}")
    if exercise is not None and not isinstance(exercise, str):
        raise ValueError(f"exercise is the exercise's name, a string, not {exercise!r}")
    result: dict = {}
    feedback = _grade(train_step, task, result, attempt_key=exercise)
    return Grade(feedback, result.get("peak"), tuple(result.get("losses", ())))


@checker
def _grade(train_step: Callable, task: CapstoneTask, result: dict) -> Feedback:
    fb = Feedback(f"fit a training step in {format_bytes(task.budget_bytes)} and keep learning")
    fb.hint(
        "the activations of the whole batch are what does not fit: what makes fewer of them "
        "alive at once?"
    )
    fb.fix(
        "micro-batches with gradient accumulation (divide each loss by k), activation "
        "checkpointing and bf16 autocast each shrink the activations; combine them"
    )
    fb.require(
        callable(train_step),
        f"train_step must be a function, not {type(train_step).__name__}",
        brief="train_step is not a function",
    )
    # 1. The gradients of one step, unbudgeted.
    model, optimizer = task.new_run()
    counting = _CountingOptimizer(optimizer, record=True)
    fb.run("your train_step", train_step, model, counting, task.tokens, task.labels)
    fb.expect(
        counting.steps == 1,
        f"call optimizer.step() exactly once per train_step (it was called {counting.steps} times)",
        brief="optimizer.step() is not called exactly once",
    )
    _compare_grads(fb, counting.grads, reference_gradients(task))
    del model, optimizer, counting

    # 2. Several steps inside the budget, watched.
    model, optimizer = task.new_run()
    counting = _CountingOptimizer(optimizer, record=False)
    losses: list[float] = []
    watch = _Watch(model)
    on_cpu = task.device.type == "cpu"
    try:
        with memory.measure(task.device) as m, memory.budget(task.budget_bytes, task.device):
            if on_cpu:
                watch.__enter__()
            for i in range(task.steps):
                loss = fb.run(
                    f"your train_step (step {i + 1})",
                    train_step,
                    model,
                    counting,
                    task.tokens,
                    task.labels,
                    passthrough=(torch.OutOfMemoryError,),
                )
                value = _loss_value(loss)
                fb.require(
                    value is not None,
                    f"train_step must return the batch's loss as a finite number, not "
                    f"{describe(loss)}",
                    brief="train_step does not return the loss as a number",
                )
                losses.append(value)
    except torch.OutOfMemoryError as err:
        first = str(err).strip().splitlines()[0]
        fb.fail(
            f"step {len(losses) + 1} ran out of memory: {first}",
            brief=f"step {len(losses) + 1} ran out of memory",
        )
    finally:
        watch.__exit__()
    result["losses"] = losses
    if watch.elsewhere or (on_cpu and watch.forwards == 0):
        seen = "; ".join(sorted(watch.elsewhere)) or "the model's forward never ran in view"
        fb.fail(
            f"the grader could not count part of your step's memory ({seen}): run the whole "
            "step in the calling thread, without turning dispatch modes off",
            brief="part of your step ran where the grader cannot measure it",
        )
    made = counting.grad_bytes + counting.state_bytes()  # what the step itself produced
    fb.require(
        m.peak_bytes - m.start_bytes >= 0.9 * made,
        f"the measured peak ({format_bytes(m.peak_bytes - m.start_bytes)} above the start) is "
        f"less than the gradients and optimizer state your step made ({format_bytes(made)}): "
        "part of it ran where the grader cannot count it; run the whole step in the calling "
        "thread",
        brief="part of your step ran where the grader cannot measure it",
    )
    result["peak"] = m.peak_bytes
    fb.expect(
        m.peak_bytes <= task.budget_bytes,
        f"the peak was {format_bytes(m.peak_bytes)}, over the budget of "
        f"{format_bytes(task.budget_bytes)}",
        brief="the peak is over the budget",
    )
    # 3. Still learning.
    fb.expect(
        losses[-1] < losses[0],
        f"the loss did not fall over {task.steps} steps ({losses[0]:.4f} -> {losses[-1]:.4f}): "
        "return the batch's loss as a float, and step the optimizer",
        brief="the loss does not fall",
    )
    return fb


def _measured_table(peaks: object, seconds: object) -> dict[str, tuple[int, float]]:
    """``{name: (peak bytes, seconds)}`` from the notebook's two tables; ValueError if unusable."""
    if not isinstance(peaks, dict) or not isinstance(seconds, dict) or not peaks:
        raise ValueError("check_fastest_fit needs the notebook's peaks and seconds dicts")
    if set(peaks) != set(seconds):
        raise ValueError("peaks and seconds must name the same combinations")
    table = {}
    for name in peaks:
        peak, sec = whole_number(peaks[name]), finite_number(seconds[name])
        if peak is None or sec is None or peak < 0 or sec <= 0:
            raise ValueError(f"{name!r} needs a peak in bytes and a positive time in seconds")
        table[name] = (peak, sec)
    return table


@checker
def check_fastest_fit(choice: object, peaks: dict, seconds: dict, budget_bytes: int) -> Feedback:
    """Exercise: the fastest combination in the measured table whose peak fits the budget.

    ``peaks`` (bytes) and ``seconds`` come from the notebook's own measurement, so the answer
    is the one this machine measured; on another machine it may be another combination.
    """
    table = _measured_table(peaks, seconds)
    budget = whole_number(budget_bytes)
    if budget is None or budget <= 0:
        raise ValueError(f"budget_bytes must be a positive number of bytes, not {budget_bytes!r}")
    fits = {name: sec for name, (peak, sec) in table.items() if peak <= budget}
    fb = Feedback("the fastest combination that fits the budget")
    fb.hint("two conditions: its peak is under the budget, and among those its time is the least")
    if fits:
        best = min(fits, key=fits.__getitem__)
        fb.fix(f"min((n for n in peaks if peaks[n] <= BUDGET), key=seconds.get) -> {best!r}")
    fb.require(
        isinstance(choice, str) and choice in table,
        f"answer with one of the table's names ({', '.join(map(repr, table))}), not "
        f"{describe(choice)}",
        brief="the answer is not a name from the table",
    )
    fb.require(bool(fits), "nothing in the table fits this budget: there is no right answer")
    fb.require(
        choice in fits,
        f"{choice!r} peaks at {format_bytes(table[choice][0])}, over the budget of "
        f"{format_bytes(budget)}",
        brief=f"{choice!r} does not fit the budget",
    )
    fb.expect(
        choice == best,
        f"{choice!r} fits, but {best!r} also fits and took {fits[best] * 1e3:.1f} ms per step "
        f"against {fits[choice] * 1e3:.1f} ms",
        brief=f"{choice!r} fits, but something that fits is faster",
    )
    return fb
