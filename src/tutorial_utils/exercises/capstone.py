"""The capstone's grader (notebook 06): does your training step fit the budget, and still train?

``grade(train_step, task)`` runs your ``train_step(model, optimizer, tokens, labels) -> float``
and reports every problem it finds. Before your step runs, the grader copies the task's batch
(``task.tokens``, ``task.labels``: the notebook's own tensors) into private copies; every
reference comes from those, and every call of your step gets a fresh copy of them. A step that
changes its copy (``labels.zero_()``) is refused; a step that changes the notebook's batch (a
global ``tokens``) is refused too, and the grader puts the notebook's batch back as it was.

1. Once, unbudgeted, from fresh weights whose ``.grad`` still holds a previous step's gradients
   (``answers.LeftoverGradients``: a step without ``optimizer.zero_grad()`` adds to them, and is
   refused with a hint that names it): the gradients your step hands to ``optimizer.step()``
   must be the full-batch gradients (within 2.5%: bf16 autocast is about 0.5% off; a loss
   divided by ``k + 1`` instead of ``k`` is 6% off), so a step that drops samples or scales the
   loss wrongly is caught even when it does not fit.
2. ``task.steps`` times inside ``memory.budget(task.budget_bytes)``: no out-of-memory error, and
   the peak measured by ``memory.measure`` stays under the budget. *Every* one of these calls
   must show that it trained on the whole batch: it calls ``optimizer.step()`` exactly once,
   the gradients it hands to it match the full-batch gradients at the weights the call started
   from, the weights after it are what Adam's own step gives with those gradients, the model
   keeps its parameters, and the loss it returns is the batch's loss at those weights. The
   grader copies what it needs (weights, gradients) into host memory outside the tensor books,
   and checks after the last call, so none of this counts against your budget.
3. The losses it returns must be finite numbers, and fall.

It also checks what each call carried: one backward per micro-batch (a step that runs k
forward passes and one backward keeps every micro-batch's graph alive at once, even if
checkpointing makes it fit), the forward's precision in *every* call when the exercise asks for
fp32 gradients, and, unless the exercise is to choose its options, that the step is your own
and not a call to ``solution_step``.

A peak is only worth grading if the whole step was counted. On a GPU the caching allocator
counts every byte of the process, whatever thread asks. On the CPU the count is
``memory``'s accountant, a dispatch mode that sees only the operators of its own thread while
it is on the dispatch stack. So in step 2 on the CPU the grader also:

* records the CPU allocator's own events during the budgeted calls (the profiler's memory
  events, ``accounting._AllocatorRecorder``), which no dispatch trick hides: a step whose
  allocator peak is far above the accountant's (functional ops under
  ``torch._C._DisableTorchDispatch()`` or ``_disable_current_modes()``) is refused;
* notes every ``threading.Thread`` that starts during a call (``threading.setprofile``): the
  allocator's events are per thread, so a step that runs in a thread is refused;
* watches the step run: hooks on every module and every parameter check that the forward and
  backward passes run on the grading thread, with the accountant on the stack and torch
  dispatch not turned off, and that the accountant's books are the grader's: the budget still
  set, its windows open, the peak never lowered;
* and, on every device, compares the books with what the step itself produced: the gradients
  and optimizer state it made must show up in the measured peak.

A step that hides its memory in any of these ways, or edits the accountant (lifts the budget's
limit, resets the peak), is refused, not graded.

Out of scope: Python lets any code rewrite any object, this grader included. A step that
replaces the grader's, the accountant's or ``threading``'s functions, starts a thread without
``threading`` (``_thread.start_new_thread``) or hands its work to a thread that was already
running before the call, or edits the books and puts them back between two of the grader's
looks (a module's forward, a gradient's accumulation, the end of the call), is not something a
checker in the same process can rule out. On a GPU the grader does not watch the allocator's
counters during the call (``reset_peak_memory_stats`` inside a step is not detected there).
When another profiler is already running, the allocator's events cannot be recorded, and the
feedback says so.
"""

from __future__ import annotations

import gc
import math
import statistics
import sys
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import accounting, memory
from ..accounting import _AllocatorRecorder
from ..units import format_bytes
from . import Feedback, checker
from .answers import (
    Given,
    LeftoverGradients,
    checker_device,
    describe,
    finite_number,
    tensor_number,
    whole_number,
)

__all__ = [
    "CapstoneTask",
    "Grade",
    "check_fastest_fit",
    "grade",
    "reference_gradients",
    "measure_combinations",
    "solution_step",
]


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


# --- host copies: what the grader keeps, outside the tensor books ---------------------------


def _host(t: torch.Tensor | None) -> tuple[np.ndarray, torch.dtype] | None:
    """A private copy of ``t`` in host memory that no tensor count sees (a numpy array is no
    torch storage), so the grader's records never count against the learner's budget."""
    if t is None:
        return None
    t = t.detach()
    dtype = t.dtype
    if dtype == torch.bfloat16:  # numpy has no bfloat16: keep the bits
        t = t.view(torch.int16)
    return np.array(t.cpu().numpy(), copy=True), dtype


def _tensor(host: tuple[np.ndarray, torch.dtype], device: torch.device) -> torch.Tensor:
    array, dtype = host
    t = torch.from_numpy(array.copy())
    return (t.view(dtype) if dtype == torch.bfloat16 else t).to(device)


class _CountingOptimizer:
    """Wraps the real optimizer: counts ``step()`` calls and keeps the gradients it is given.

    ``calls`` holds, per call of the learner's step (``new_call()``), the gradients handed to
    each ``step()`` in host memory (``_host``): the grader checks them after the last call.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self._optimizer = optimizer
        self.steps = 0
        self.calls: list[list[list]] = []
        self.grad_bytes = 0  # the most gradient bytes handed to one step()

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self._optimizer.param_groups for p in group["params"]]

    def new_call(self) -> None:
        self.calls.append([])

    def step(self, *args, **kwargs):
        self.steps += 1
        params = self._params()
        self.grad_bytes = max(self.grad_bytes, _storage_bytes(p.grad for p in params))
        if self.calls:
            self.calls[-1].append([_host(p.grad) for p in params])
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
    the watch started (the accountant among them), and torch dispatch not turned off. It also
    checks the accountant's books at each of these moments (``books()``): the same accountant,
    the grader's windows still open, the budget's limit still set, and the peak never below the
    highest count seen so far.
    """

    def __init__(self, model: nn.Module, budget_bytes: int | None = None):
        self.model = model
        self.budget_bytes = budget_bytes
        self.handles: list = []
        self.thread = threading.get_ident()
        self.depth = 0
        self.forwards = 0
        self.elsewhere: set[str] = set()
        self.edited: set[str] = set()
        self.acc = None
        self.windows: list = []
        self.high = 0

    def _check(self, what: str) -> None:
        if threading.get_ident() != self.thread:
            self.elsewhere.add(f"the {what} ran in another thread")
        elif torch._C._len_torch_dispatch_stack() < self.depth:
            self.elsewhere.add(f"the {what} ran with the dispatch modes popped")
        elif torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python):
            self.elsewhere.add(f"the {what} ran with torch dispatch turned off")
        else:
            if what == "forward pass":
                self.forwards += 1
            self.books()

    def books(self) -> None:
        """Are the accountant's books still the grader's? Records what was edited, if not."""
        acc = self.acc
        if acc is None:
            return
        if getattr(accounting._local, "shared", None) is not acc:
            self.edited.add("the accountant was replaced")
            return
        if any(w not in acc.windows for w in self.windows):
            self.edited.add("a window of the grader's count was closed")
            return
        limited = [w for w in self.windows if w.limit is not None]
        if not acc.limited or any(w.limit != self.budget_bytes for w in limited) or not limited:
            self.edited.add("the budget's limit was lifted")
        self.high = max(self.high, acc.current)
        if min(acc.window_peak(w) for w in self.windows) < self.high:
            self.edited.add("the peak was reset")

    def __enter__(self) -> _Watch:
        self.thread = threading.get_ident()
        self.depth = torch._C._len_torch_dispatch_stack()
        acc = getattr(accounting._local, "shared", None)
        if acc is not None and self.budget_bytes is not None:
            # measure()'s window and budget()'s, the last two opened (the grader's)
            self.acc, self.windows = acc, list(acc.windows[-2:])
            self.high = acc.current
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


class _Autocast:
    """Forward pre-hooks on every module: under which autocast dtype did the step's forward run?

    ``seen`` is the first autocast dtype seen since ``clear()`` (``None``: no autocast), so the
    reference runs the way the step did: bf16 autocast shifts the gradients by a few percent,
    more than a wrong weighting of micro-batches may hide in.
    """

    def __init__(self, model: nn.Module, device_type: str):
        self.device_type = device_type
        self.seen: torch.dtype | None = None
        self.handles = [m.register_forward_pre_hook(self._hook) for m in model.modules()]

    def _hook(self, *_) -> None:
        if self.seen is None and torch.is_autocast_enabled(self.device_type):
            self.seen = torch.get_autocast_dtype(self.device_type)

    def clear(self) -> torch.dtype | None:
        seen, self.seen = self.seen, None
        return seen

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class _Profile:
    """What one call of the step did, seen from hooks on the model: the facts the hint is chosen by.

    ``forwards``: forward passes of the model (its root module, or, when the step runs the
    pieces itself, its busiest direct child) outside backward, i.e. the micro-batches;
    ``recomputed``: forward passes run inside backward (activation checkpointing);
    ``backwards``: backward passes that reached the parameters (one per ``backward()`` call);
    ``autocast``: the autocast dtype its forward ran under (``None``: none).
    """

    def __init__(self, model: nn.Module, device_type: str):
        self.device_type = device_type
        # ids, not modules: the profile outlives the model, which must not stay alive for it
        self.root = id(model)
        self.children = [id(m) for _, m in model.named_children()]
        self.counts: dict[int, int] = {}
        self.recomputed = 0
        self.backwards = 0
        self.autocast: torch.dtype | None = None
        self.handles = [m.register_forward_pre_hook(self._forward) for m in model.modules()]
        first = next((p for p in model.parameters() if p.requires_grad), None)
        if first is not None:
            self.handles.append(first.register_post_accumulate_grad_hook(self._backward))

    def _forward(self, module: nn.Module, _args) -> None:
        if self.autocast is None and torch.is_autocast_enabled(self.device_type):
            self.autocast = torch.get_autocast_dtype(self.device_type)
        if torch._C._current_graph_task_id() != -1:  # inside backward: a recomputation
            self.recomputed += 1
            return
        self.counts[id(module)] = self.counts.get(id(module), 0) + 1

    def _backward(self, _param) -> None:
        self.backwards += 1

    @property
    def forwards(self) -> int:
        root = self.counts.get(self.root, 0)
        return root or max((self.counts.get(i, 0) for i in self.children), default=0)

    @property
    def checkpointed(self) -> bool:
        return self.recomputed > 0

    def describe(self) -> str:
        """The step in a few measured words: "4 forward passes, 4 backward calls, fp32"."""
        f, b = self.forwards, self.backwards
        parts = [
            f"{f} forward pass{'es' if f != 1 else ''}",
            f"{b} backward call{'s' if b != 1 else ''}",
            str(self.autocast).replace("torch.", "") + " autocast" if self.autocast else "fp32",
        ]
        if self.checkpointed:
            parts.append("checkpointed")
        return ", ".join(parts)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _advice(profile: _Profile | None, oom_step: int | None) -> tuple[str, str]:
    """The hint and the fix that fit what the step did (``profile``, from its unbudgeted call)
    and when it ran out of memory (``oom_step``, 1-based; ``None``: it did not)."""
    if profile is None or profile.forwards == 0:
        return _HINT, _FIX
    k, backwards = profile.forwards, profile.backwards
    dtype = str(profile.autocast).replace("torch.", "")
    if k > 1 and backwards == 1:
        return (
            "a micro-batch's activations stay alive until a backward pass runs through them: "
            f"with {k} forward passes and one backward, how many micro-batches are alive at once?",
            "call backward() on each micro-batch's loss (divided by k) inside the loop, which "
            "frees its activations at once, and add up loss.item() for the value you return",
        )
    if k == 1 and profile.autocast is not None:
        return (
            f"{dtype} autocast halves what is saved for backward, and that is not enough here: "
            "what else makes fewer activations alive at once?",
            "split the batch into k micro-batches (each loss divided by k, backward on each, "
            "one optimizer step), with or without autocast and checkpointing",
        )
    if k == 1 and profile.checkpointed:
        return (
            "checkpointing keeps only each layer's input, but for the whole batch at once: what "
            "shrinks the batch one pass works on?",
            "split the batch into k micro-batches (each loss divided by k, backward on each, "
            "one optimizer step), and keep the checkpointing",
        )
    if k == 1:
        return _HINT, _FIX
    if profile.checkpointed:
        more = "more micro-batches (checkpointing is on already): twice as many halve the "
        more += "activations alive at once"
    else:
        more = "more micro-batches (twice as many halve the activations alive at once), or "
        more += "checkpointing on top of them"
    how = f"{k} micro-batches" + (", checkpointed," if profile.checkpointed else "")
    if oom_step is not None and oom_step > 1:
        return (
            f"with {how} step 1 fit and step {oom_step} did not: what exists from step 2 on "
            "that step 1 did not have? (Adam's state, made by the first optimizer.step(): "
            "notebook 04 §5, bug 1.) The activations alive at once must shrink further",
            more,
        )
    done = "with checkpointing, " if profile.checkpointed else ""
    return (
        f"{k} micro-batches, {done}still keep too many activations alive at once: what makes "
        "each micro-batch's share smaller?",
        more,
    )


_HINT = (
    "the activations of the whole batch are what does not fit: what makes fewer of them "
    "alive at once?"
)
_FIX = (
    "micro-batches with gradient accumulation (divide each loss by k), activation "
    "checkpointing and bf16 autocast each shrink the activations; combine them"
)


def reference_gradients(
    task: CapstoneTask, autocast: torch.dtype | None = None, batch: _Batch | None = None
) -> list:
    """The plain full-batch gradients of a fresh model: what a correct step must reproduce
    (the forward under ``autocast``, when the step's ran under it), from ``batch`` (private
    copies of the task's batch; made here when not given)."""
    model, _ = task.new_run()
    return _reference_at(task, model, batch or _Batch(task), autocast)[0]


class _Batch:
    """Private copies of the task's batch, made before the learner's step runs: every reference
    comes from them, every call of the step gets a copy of them, and ``restore`` puts the
    notebook's own tensors back when a step changed them (through a global).

    The copies live in host memory (``_host``), outside the tensor books: on the CPU the budget
    counts every tensor in the process, and the grader's own must not count against the step.
    """

    def __init__(self, task: CapstoneTask):
        self.task = task
        self.host = {"tokens": _host(task.tokens), "labels": _host(task.labels)}

    @property
    def tokens(self) -> torch.Tensor:
        return _tensor(self.host["tokens"], self.task.device)

    @property
    def labels(self) -> torch.Tensor:
        return _tensor(self.host["labels"], self.task.device)

    def given(self, name: str) -> Given:
        """The input handed to the step: a fresh tensor from the private copy at each call."""
        return _PrivateGiven(name, self.host[name], self.task.device)

    def restore(self) -> list[str]:
        """Which of the notebook's tensors the step changed; each is put back as it was."""
        changed = []
        for name in ("tokens", "labels"):
            mine, theirs = getattr(self, name), getattr(self.task, name)
            if (
                type(theirs) is torch.Tensor
                and theirs.dtype == mine.dtype
                and theirs.device == mine.device
                and theirs.shape == mine.shape
                and torch.equal(theirs.detach(), mine)
            ):
                continue
            changed.append(name)
            if isinstance(theirs, torch.Tensor) and theirs.dtype == mine.dtype:
                with torch.no_grad():
                    theirs.resize_(mine.shape).copy_(mine)
        return changed


@dataclass(frozen=True)
class _PrivateGiven(Given):
    """A ``Given`` whose value is a host copy (``_host``): the step gets a tensor made from it."""

    device: torch.device = torch.device("cpu")

    def copy(self) -> torch.Tensor:
        return _tensor(self.value, self.device)

    def changes(self, handed: object) -> str | None:
        return Given(self.name, _tensor(self.value, self.device)).changes(handed)


def _reference_at(
    task: CapstoneTask, model: nn.Module, batch: _Batch, autocast: torch.dtype | None = None
) -> tuple[list[torch.Tensor], float]:
    """The full-batch gradients (fp32) and loss of ``model`` on the private copy of the batch."""
    model.zero_grad(set_to_none=True)
    device_type = task.device.type
    with torch.autocast(device_type, dtype=autocast or torch.bfloat16, enabled=bool(autocast)):
        logits = model(batch.tokens)
    loss = task.loss_fn(logits, batch.labels)
    loss.backward()
    grads = [
        torch.zeros_like(p, dtype=torch.float32) if p.grad is None else p.grad.detach().float()
        for p in model.parameters()
    ]
    model.zero_grad(set_to_none=True)
    return grads, float(loss.detach())


@dataclass(frozen=True)
class Grade:
    feedback: Feedback
    peak_bytes: int | None
    losses: tuple[float, ...]


GRADIENT_TOLERANCE = 0.025  # |g - full batch| / |full batch|: bf16 autocast is ~0.005, k+1 ~0.06


def _compare_grads(
    fb: Feedback, got: list, want: list[torch.Tensor], when: str = "", stop: bool = True
) -> None:
    """``got``: the gradients handed to ``optimizer.step()``; ``want``: the full batch's.

    A wrong direction or size ends the check when ``stop``; otherwise it is recorded and the
    grading goes on (the first, unbudgeted call: the budgeted calls still have their say)."""
    at = f" {when}" if when else ""
    fb.require(len(got) > 0, f"your step never called optimizer.step(){at}")
    fb.require(
        all(g is not None for g in got),
        f"some parameters had no gradient at optimizer.step(){at}",
        brief="some parameters had no gradient",
    )
    fb.require(
        len(got) == len(want) and all(g.shape == w.shape for g, w in zip(got, want, strict=True)),
        "the optimizer's parameters are not the model's",
    )
    g = torch.cat([t.flatten().float() for t in got])
    w = torch.cat([t.flatten() for t in want])
    fb.require(
        bool(torch.isfinite(g).all()),
        f"some gradients are NaN or infinite at optimizer.step(){at}",
        brief="some gradients are not finite",
    )
    error = float((g - w).norm() / w.norm())
    if error <= GRADIENT_TOLERANCE:
        return
    if any(b.startswith("your gradients") for b in fb.briefs):  # said once is enough
        if stop:
            fb.stop()
        return
    ratio = float(g.norm() / w.norm())
    cosine = float(torch.nn.functional.cosine_similarity(g, w, dim=0))
    if cosine <= 0.99:
        problem = (
            f"your gradients{at} point in another direction than the full batch's (cosine "
            f"{cosine:.3f}): does every sample of the batch take part in the step?"
        )
        brief = "your gradients are not the full batch's"
    elif abs(ratio - 1) > GRADIENT_TOLERANCE:
        problem = (
            f"your gradients{at} are {ratio:.2f}x the full-batch gradients ({error:.1%} off; "
            f"at most {GRADIENT_TOLERANCE:.1%} is allowed): with k micro-batches, divide each "
            "micro-batch's loss by k"
        )
        brief = "your gradients have the wrong size"
    else:
        problem = (
            f"your gradients{at} differ from the full batch's by {error:.1%} (at most "
            f"{GRADIENT_TOLERANCE:.1%} is allowed): does every sample count once, with the same "
            "weight (equal micro-batches, each loss divided by k)?"
        )
        brief = "your gradients are not the full batch's"
    fb.expect(False, problem, brief=brief)
    if stop:
        fb.stop()


def grade(
    train_step: Callable,
    task: CapstoneTask,
    exercise: str | None = None,
    fp32_gradients: bool = False,
    solution_allowed: bool = False,
) -> Grade:
    """Check ``train_step`` against ``task``; see the module docstring.

    ``exercise`` names which exercise this is, when a notebook grades several with the same
    grader: each then counts its own attempts, so its first wrong answer gets a hint.
    ``fp32_gradients=True`` asks for the full-batch gradients themselves: a step whose forward
    runs under autocast (close to them, not equal), in any call, is refused.
    ``solution_allowed=True``: the exercise is to choose ``solution_step``'s options; otherwise
    a step that calls ``solution_step`` is refused (it is the worked solution, not an answer).
    """
    if not isinstance(task, CapstoneTask):
        raise ValueError(f"grade needs a CapstoneTask, not {type(task).__name__}")
    if exercise is not None and not isinstance(exercise, str):
        raise ValueError(f"exercise is the exercise's name, a string, not {exercise!r}")
    result: dict = {
        "fp32_gradients": bool(fp32_gradients),
        "solution_allowed": bool(solution_allowed),
    }
    feedback = _grade(train_step, task, result, attempt_key=exercise)
    return Grade(feedback, result.get("peak"), tuple(result.get("losses", ())))


@dataclass
class _Call:
    """What the grader kept of one budgeted call, in host memory (``_host``)."""

    before: list  # the weights the call started from
    after: list = field(default_factory=list)  # the weights it left
    loss: float | None = None
    autocast: torch.dtype | None = None  # the autocast dtype its forward ran under


def _same_parameters(fb: Feedback, model: nn.Module, shapes: list, what: str) -> None:
    now = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    fb.require(
        now == shapes,
        f"{what} changed the model's parameters ({len(shapes)} before, {len(now)} after, or "
        "their names or shapes): train the model as it is given",
        brief="your step changes the model's parameters",
    )


@checker(answers=("train_step",))
def _grade(train_step: Callable, task: CapstoneTask, result: dict) -> Feedback:
    fb = Feedback(f"fit a training step in {format_bytes(task.budget_bytes)} and keep learning")
    fb.hint(_HINT)
    fb.fix(_FIX)
    fb.require(
        callable(train_step),
        f"train_step must be a function, not {type(train_step).__name__}",
        brief="train_step is not a function",
    )
    batch = _Batch(task)  # private copies, before the step runs: every reference comes from them
    try:
        _grade_calls(fb, train_step, task, result, batch)
    finally:
        kept = result.get("memory_problem") or result.get("hint_kept")
        if fb.problems and "profile" in result and not kept:
            # it fits (or never got that far): the hint is about what it computes, not memory
            fb.hints[:], fb.fixes[:] = [_WRONG_HINT], [_WRONG_FIX]
        changed = batch.restore()
        if changed:
            fb.expect(
                False,
                f"your step changed the notebook's {' and '.join(changed)} (a global, not the "
                "copy it is given); the grader put them back: use only the step's own "
                "arguments, and leave them as they are",
                brief="your step changes the notebook's batch",
            )
    return fb


def _grade_calls(
    fb: Feedback, train_step: Callable, task: CapstoneTask, result: dict, batch: _Batch
) -> None:
    # the learner's own name for the step (exercise 2 calls it tight_step), in every message
    name = getattr(train_step, "__name__", "")
    step = f"your {name}" if name.isidentifier() else "your train_step"
    tokens, labels = batch.given("tokens"), batch.given("labels")
    # 1. The gradients of one step, unbudgeted; the references first (with and without autocast).
    want = {None: reference_gradients(task, batch=batch)}
    model, optimizer = task.new_run()
    shapes = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    counting = _CountingOptimizer(optimizer)
    counting.new_call()
    profile = _Profile(model, task.device.type)
    # .grad as the previous step leaves it: a step without zero_grad adds to it (on a fresh
    # model it would pass here, and only run out of memory in step 2, for another reason)
    leftover = LeftoverGradients(list(model.parameters()), want[None])
    solutions = _solution_calls
    try:
        fb.run(step, train_step, model, counting, tokens, labels)
    finally:
        profile.remove()
        leftover.remove()
    if not result.get("solution_allowed"):
        fb.require(
            _solution_calls == solutions,
            f"{step} calls solution_step, the worked solution of section 5: write the step "
            "yourself (micro-batches, checkpointing, autocast), then compare",
            brief="your step calls the worked solution",
        )
    result["hint_kept"] = leftover.kept  # its hint names zero_grad: _grade keeps it
    leftover.require_cleared(fb, step)
    seen = profile.autocast
    result["profile"] = profile
    if seen is not None and result.get("fp32_gradients"):
        _autocast_refused(fb, result, f"{step} ran its forward under {_name(seen)} autocast")
    if seen not in want:
        want[seen] = reference_gradients(task, seen, batch)
    _same_parameters(fb, model, shapes, step)
    fb.expect(
        counting.steps == 1,
        f"call optimizer.step() exactly once per train_step (it was called {counting.steps} times)",
        brief="optimizer.step() is not called exactly once",
    )
    recorded = counting.calls[0]
    device = task.device
    handed = (
        [] if not recorded else [None if g is None else _tensor(g, device) for g in recorded[0]]
    )
    _compare_grads(fb, handed, want[seen], stop=False)
    # the hint that fits: a step that computes something else is not a memory problem (yet)
    hint, fix = (_WRONG_HINT, _WRONG_FIX) if fb.problems else _advice(profile, None)
    fb.hints[:], fb.fixes[:] = [hint], [fix]
    # nothing of the first call may stay alive: the budget counts every tensor in the process
    del model, optimizer, counting, recorded, handed, want, leftover
    # nor any garbage of earlier cells: the collector freeing it inside the window would lower
    # the count below what the step made (a false "ran where the grader cannot measure it")
    gc.collect()

    # 2. Several steps inside the budget, watched, each one kept for the checks after.
    model, optimizer = task.new_run()
    counting = _CountingOptimizer(optimizer)
    calls: list[_Call] = []
    losses: list[float] = []
    on_cpu = task.device.type == "cpu"
    watch = _Watch(model, task.budget_bytes)
    autocast = _Autocast(model, task.device.type)
    threads = _Threads()
    recorder = _AllocatorRecorder() if on_cpu and _AllocatorRecorder.available() else None
    allocated = 0  # the CPU allocator's highest peak in one call, bytes above the call's start
    try:
        with memory.measure(task.device) as m, memory.budget(task.budget_bytes, task.device):
            if on_cpu:
                watch.__enter__()
            for i in range(task.steps):
                calls.append(_Call([_host(p) for p in model.parameters()]))
                counting.new_call()
                # the recorder's phase for one call: its peak is read with peaks()
                mark = recorder.mark("call") if recorder is not None else nullcontext()
                with threads, recorder or nullcontext(), mark:
                    loss = fb.run(
                        f"{step} (step {i + 1})",
                        train_step,
                        model,
                        counting,
                        tokens,
                        labels,
                        passthrough=(torch.OutOfMemoryError,),
                    )
                if recorder is not None:
                    allocated = max(allocated, max(recorder.peaks().values(), default=0))
                watch.books()
                calls[-1].after = [_host(p) for p in model.parameters()]
                calls[-1].autocast = autocast.clear()
                # the loss as a finite float: a number or a one-element tensor
                value = tensor_number(loss) if torch.is_tensor(loss) else finite_number(loss)
                fb.require(
                    value is not None,
                    f"train_step must return the batch's loss as a finite number, not "
                    f"{describe(loss)}",
                    brief="train_step does not return the loss as a number",
                )
                calls[-1].loss = value
                losses.append(value)
    except torch.OutOfMemoryError as err:
        result["memory_problem"] = True
        first = str(err).strip().splitlines()[0]
        at = len(losses) + 1
        hint, fix = _advice(profile, at)
        fb.hints[:], fb.fixes[:] = [hint], [fix]
        did = f"; your step: {profile.describe()}" if profile.forwards else ""
        fit = " (step 1 fit)" if at > 1 else ""
        fb.fail(
            f"step {at} ran out of memory{fit}{did}. {first}",
            brief=f"step {at} ran out of memory{fit}{did}",
        )
    finally:
        watch.__exit__()
        autocast.remove()
        threads.close()
    result["losses"] = losses
    if threads.started:
        watch.elsewhere.add(f"{threads.started} thread(s) started during the step")
    if watch.elsewhere or (on_cpu and watch.forwards == 0):
        seen = "; ".join(sorted(watch.elsewhere)) or "the model's forward never ran in view"
        fb.fail(
            f"the grader could not count part of your step's memory ({seen}): run the whole "
            "step in the calling thread, without turning dispatch modes off",
            brief="part of your step ran where the grader cannot measure it",
        )
    if watch.edited:
        fb.fail(
            "your step changed the grader's memory count ("
            + "; ".join(sorted(watch.edited))
            + "): leave memory.budget and memory.measure as they are, and fit the budget",
            brief="your step edits the grader's memory count",
        )
    if on_cpu and recorder is None:
        fb.fail(
            "another profiler is running, so the grader cannot record the CPU allocator's "
            "events: stop it (leave the `with torch.profiler.profile()` block), then grade again",
            brief="a profiler is running: the grader cannot measure the step",
        )
    counted = m.peak_bytes - m.start_bytes
    fb.require(
        allocated <= _HIDDEN_FACTOR * counted + _HIDDEN_SLACK,
        f"the CPU allocator saw {format_bytes(allocated)} at the peak of one call, and the "
        f"grader's count only {format_bytes(counted)}: part of your step ran where the count "
        "cannot see it (torch dispatch turned off?); run the whole step normally, in the "
        "calling thread",
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
    if not fb.expect(
        m.peak_bytes <= task.budget_bytes,
        f"the peak was {format_bytes(m.peak_bytes)}, over the budget of "
        f"{format_bytes(task.budget_bytes)}",
        brief="the peak is over the budget",
    ):
        result["memory_problem"] = True
        hint, fix = _advice(profile, None)
        fb.hints[:], fb.fixes[:] = [hint], [fix]
    if result.get("fp32_gradients"):
        mixed = [i + 1 for i, c in enumerate(calls) if c.autocast is not None]
        if mixed:
            _autocast_refused(
                fb, result, f"in step {mixed[0]} {step} ran its forward under autocast"
            )
    fb.expect(  # what each call carried: one backward per micro-batch
        profile.forwards <= 1 or profile.backwards == 0 or profile.backwards >= profile.forwards,
        f"{step} runs {profile.forwards} forward passes and only {profile.backwards} backward "
        "call: every micro-batch's graph (its activations) stays alive until that backward, "
        "all at once; call backward() on each micro-batch's loss inside the loop",
        brief="one backward over several micro-batches keeps all their graphs alive at once",
    )
    _same_parameters(fb, model, shapes, step)
    _check_every_call(fb, task, batch, calls, counting.calls)
    # 3. Still learning.
    fb.expect(
        losses[-1] < losses[0],
        f"the loss did not fall over {task.steps} steps ({losses[0]:.4f} -> {losses[-1]:.4f}): "
        "return the batch's loss as a float, and step the optimizer",
        brief="the loss does not fall",
    )


# The CPU allocator's peak in one call (above the call's start) against the grader's count (the
# peak above the start of the budgeted calls, which also holds Adam's state and the weights of
# earlier calls). The allocator sees every storage the accountant books, plus the scratch an
# operator frees inside itself: in the capstone's steps it stays under 0.8x the count (measured:
# notebook 06's solutions 0.62-0.78x, the MLP of tests/test_exercises_capstone.py 0.62-0.78x);
# a full-batch step under torch._C._DisableTorchDispatch() shows 1.85x (the MLP) and 12x (06).
_HIDDEN_FACTOR = 1.25
_HIDDEN_SLACK = 64 << 10


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _autocast_refused(fb: Feedback, result: dict, what: str) -> None:
    """End the check: the exercise asks for fp32 gradients, and ``what`` ran under autocast."""
    result["hint_kept"] = True
    fb.hints[:] = [
        "autocast computes in a lower precision, so its gradients are close to the full "
        "batch's, not equal: which of the other levers shrink the activations in fp32?"
    ]
    fb.fixes[:] = [
        "drop the autocast: more micro-batches (twice as many halve the activations alive at "
        "once), with checkpointing, keep the gradients in fp32"
    ]
    fb.fail(
        f"{what}: its gradients are close to the full batch's, not equal, and this exercise "
        "asks for the full-batch gradients in every call; fit the budget without autocast",
        brief="this exercise asks for fp32 gradients, without autocast",
    )


_WRONG_HINT = (
    "the step runs, but it does not compute what the plain step computes: does every sample "
    "count once, with the same weight, and is the loss you return the whole batch's?"
)
_WRONG_FIX = (
    "with k micro-batches: divide each micro-batch's loss by k before backward(), call "
    "optimizer.step() once after the loop, and return the sum of the divided losses "
    "(loss.item() each)"
)


class _Threads:
    """Counts the ``threading.Thread``s that start while it is entered (``threading.setprofile``
    runs in each new thread before its target: the grading thread pays nothing)."""

    def __init__(self) -> None:
        self.started = 0
        self._old = None

    def _seen(self, *_):
        self.started += 1
        sys.setprofile(None)  # once per thread is enough: stop profiling it

    def __enter__(self) -> _Threads:
        self._old = threading.getprofile()
        threading.setprofile(self._seen)
        return self

    def __exit__(self, *exc) -> None:
        threading.setprofile(self._old)

    def close(self) -> None:
        if threading.getprofile() == self._seen:
            threading.setprofile(self._old)


_solution_calls = 0  # solution_step's calls so far: a step that calls it is the solution


def _check_every_call(
    fb: Feedback, task: CapstoneTask, batch: _Batch, calls: list[_Call], steps: list
) -> None:
    """After the budgeted calls: did each one train on the whole batch, with Adam's own step?

    For each call, from the weights it started from: the full-batch gradients and loss (the
    reference), then Adam's step with the gradients the call handed to ``optimizer.step()``
    (a shadow optimizer that follows the same path), which must give the weights it left.
    """
    device = task.device
    reference, _ = task.new_run()
    shadow, shadow_opt = task.new_run()
    wrong_loss = ""
    for i, (call, handed) in enumerate(zip(calls, steps, strict=True)):
        if not call.after:  # it ran out of memory (said already): nothing to compare
            break
        when = f"in step {i + 1}"
        fb.require(
            len(handed) == 1,
            f"call optimizer.step() exactly once per train_step ({when} it was called "
            f"{len(handed)} times)",
            brief="optimizer.step() is not called exactly once",
        )
        with torch.no_grad():
            for p, host in zip(reference.parameters(), call.before, strict=True):
                p.copy_(_tensor(host, device))
        want, batch_loss = _reference_at(task, reference, batch, call.autocast)
        grads = [None if g is None else _tensor(g, device) for g in handed[0]]
        _compare_grads(fb, grads, want, when)
        if call.loss is not None and not wrong_loss:
            # 2 %: a bf16 step's loss may be off by a few bf16 roundings (2**-8 = 0.4 % each)
            if not math.isclose(call.loss, batch_loss, rel_tol=0.02, abs_tol=1e-3):
                wrong_loss = (
                    f"{when} train_step returned {call.loss:.4f}, but the batch's loss at the "
                    f"weights that step started from is {batch_loss:.4f}: return the loss of the "
                    "whole batch you trained on (the mean over its micro-batches)"
                )
        with torch.no_grad():
            for p, host, g in zip(shadow.parameters(), call.before, grads, strict=True):
                p.copy_(_tensor(host, device))
                p.grad = g
        shadow_opt.step()
        after = [_tensor(host, device) for host in call.after]
        # the same optimizer step on the same gradients: equal but for a weight's last bits
        # (rtol) and 1 % of one step where Adam divides by a gradient near its eps (atol)
        fb.require(
            all(
                torch.allclose(p.detach(), a, rtol=1e-5, atol=1e-2 * task.lr)
                for p, a in zip(shadow.parameters(), after, strict=True)
            ),
            f"{when} the weights after train_step are not what the optimizer's own step gives "
            "with the gradients handed to it: step the optimizer once, through "
            "optimizer.step(), and change the weights no other way",
            brief="the weights change in some other way than the optimizer's step",
        )
        shadow_opt.zero_grad(set_to_none=True)
    fb.expect(not wrong_loss, wrong_loss, brief="the loss you return is not the batch's loss")


def _measured_table(peaks: object, seconds: object) -> dict[str, tuple[int, list[float]]]:
    """``{name: (peak bytes, [seconds per step, one per sample])}`` from the notebook's tables;
    a time is one number or a list of samples (interleaved rounds). ValueError if unusable."""
    if not isinstance(peaks, dict) or not isinstance(seconds, dict) or not peaks:
        raise ValueError("check_fastest_fit needs the notebook's peaks and seconds dicts")
    if set(peaks) != set(seconds):
        raise ValueError("peaks and seconds must name the same combinations")
    table = {}
    for name in peaks:
        times = seconds[name] if isinstance(seconds[name], (list, tuple)) else [seconds[name]]
        peak, secs = whole_number(peaks[name]), [finite_number(t) for t in times]
        if peak is None or peak < 0 or not secs or any(t is None or t <= 0 for t in secs):
            raise ValueError(f"{name!r} needs a peak in bytes and positive times in seconds")
        table[name] = (peak, secs)
    return table


@checker(answers=("choice",))
def check_fastest_fit(choice: object, peaks: dict, seconds: dict, budget_bytes: int) -> Feedback:
    """Exercise: the fastest combination in the measured table whose peak fits the budget.

    ``peaks`` (bytes) and ``seconds`` (per combination: seconds per step, one number or the
    samples of interleaved rounds) come from the notebook's own measurement. A combination is
    slower than another only where the difference holds: *every* sample of it slower than every
    sample of the other. So any combination that fits and is not slower than the fastest (by
    median) that fits passes; on another machine, or a busier one, the answer may differ.
    """
    table = _measured_table(peaks, seconds)
    budget = whole_number(budget_bytes)
    if budget is None or budget <= 0:
        raise ValueError(f"budget_bytes must be a positive number of bytes, not {budget_bytes!r}")
    fits = {name: secs for name, (peak, secs) in table.items() if peak <= budget}
    fb = Feedback("the fastest combination that fits the budget")
    fb.hint("two conditions: its peak is under the budget, and among those its time is the least")
    if fits:
        best = min(fits, key=lambda n: statistics.median(fits[n]))
        fb.fix(f"the least median time among those with peaks[n] <= BUDGET -> {best!r}")
    if isinstance(choice, str):
        choice = str.__str__(choice)  # a plain str: a subclass's __eq__ may say yes to anything
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
    ms = {n: statistics.median(s) * 1e3 for n, s in fits.items()}
    fb.expect(
        min(fits[choice]) <= max(fits[best]),  # slower only if every sample is slower
        f"{choice!r} fits, but {best!r} also fits and took {ms[best]:.1f} ms per step (median) "
        f"against {ms[choice]:.1f} ms, every sample of it faster than every one of yours",
        brief=f"{choice!r} fits, but something that fits is faster",
    )
    return fb


# -----------------------------------------------------------------------------
# The task's worked solution (notebook 06 section 5 measures its options; read it after trying)


def solution_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    k: int = 4,
    checkpointed: bool = True,
    bf16: bool = False,
) -> float:
    """One training step of 07's ``TinyTransformer`` in ``k`` micro-batches, each layer of the
    encoder checkpointed when ``checkpointed``, the forward under bf16 autocast when ``bf16``.

    Each micro-batch's loss is divided by ``k`` and back-propagated at once (which frees its
    activations), so the gradients add up in ``.grad`` to the full batch's; one optimizer step.
    Returns the batch's loss.
    """
    global _solution_calls
    _solution_calls += 1  # the grader refuses a step that calls it, where that is the task
    if not all(hasattr(model, name) for name in ("embed", "encoder", "head")):
        raise ValueError(
            "solution_step runs the pieces of notebook 06's TinyTransformer (embed, encoder, "
            f"head); {type(model).__name__} has other parts"
        )
    k = whole_number(k)
    if k is None or not 1 <= k <= len(tokens):
        raise ValueError(f"k must be a whole number of micro-batches from 1 to {len(tokens)}")
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for t, y in zip(tokens.chunk(k), labels.chunk(k), strict=True):
        with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=bool(bf16)):
            x = model.embed(t)
            for layer in model.encoder.layers:
                x = checkpoint(layer, x, use_reentrant=False) if checkpointed else layer(x)
            logits = model.head(x.mean(dim=1))
        loss = nn.functional.cross_entropy(logits.float(), y) / k  # 1/k of the batch's loss
        loss.backward()  # frees this micro-batch's activations; the gradients add up in .grad
        total += loss.item()
    optimizer.step()
    return total


def measure_combinations(step: Callable, task: CapstoneTask, combos: dict[str, dict]) -> dict:
    """``{name: peak bytes}``: for each named set of options, ``step(model, optimizer, tokens,
    labels, **options)`` on a fresh run, once to warm up (Adam makes its state), then once inside
    ``memory.measure``. Its time is not taken here: the accountant books every operator in
    Python, so time the steps outside it (the notebook does, with ``torch.utils.benchmark``)."""
    if not isinstance(combos, dict) or not combos:
        raise ValueError("combos maps a name to the options of one step: {'plain': dict(k=1)}")
    peaks: dict[str, int] = {}
    for name, options in combos.items():
        model, optimizer = task.new_run()
        step(model, optimizer, task.tokens, task.labels, **options)  # warm-up
        gc.collect()  # no earlier garbage freed inside the window
        with memory.measure(task.device) as m:
            step(model, optimizer, task.tokens, task.labels, **options)
        peaks[name] = m.peak_bytes
        del model, optimizer
    return peaks
