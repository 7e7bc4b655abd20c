"""The anatomy of one training step: ``breakdown`` (real), ``estimate`` (fake tensors), ``spec``.

One job: say where the memory of a forward, backward and optimizer step goes, by category
(parameters, gradients, optimizer state, activations) and at its peak. The categories come from
the accountant's books (``tutorial_utils.accounting``); on the CPU the peak of a real step comes
from the CPU allocator itself (profiler memory events), on CUDA from the caching allocator.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
import numbers
import operator
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from .accounting import (
    _SCRATCH_OPS,
    _Accountant,
    _AllocatorRecorder,
    _cuda_close,
    _cuda_open,
    _local,
    _resolve,
    _scratch_bytes,
)
from .units import format_bytes

__all__ = [
    "PROTOCOLS",
    "EstimateError",
    "MemoryBreakdown",
    "ModuleMemory",
    "TensorSpec",
    "breakdown",
    "estimate",
    "spec",
]


# -----------------------------------------------------------------------------
# The result of breakdown and estimate


@dataclass(frozen=True)
class ModuleMemory:
    """One module's share: its own parameters, and the tensors its forward saved for backward."""

    name: str
    kind: str
    parameters: int
    activations: int


@dataclass(frozen=True)
class MemoryBreakdown:
    """Where the memory of one training step goes, in bytes.

    ``parameters`` (and ``buffers``) and ``inputs`` exist before the step; ``activations`` are
    the tensors saved for backward at the end of forward; ``gradients`` and
    ``optimizer_state`` exist after backward and the optimizer step; ``peak`` is the most that
    was alive at once during the step. Shared storages (views, tied weights) count once.
    """

    device: str
    parameters: int
    buffers: int
    inputs: int
    gradients: int
    optimizer_state: int
    activations: int
    peak: int
    peak_phase: str  # "forward", "backward" or "optimizer step"
    estimated: bool
    # Where ``peak`` comes from: "CPU allocator" (the profiler's memory events, scratch inside
    # operators included), "CUDA allocator", "tensor storages" (the dispatch-level books, when
    # another profiler is running) or "fake tensors" (estimate).
    peak_source: str = "tensor storages"
    # The peak of the tensor storages booked at dispatch (no scratch); 0 for a real CPU step,
    # which runs without the books so that they cannot change it.
    booked_peak: int = 0
    # estimate only: operators in the step whose CPU kernels allocate scratch that fake tensors
    # cannot see, so the true peak may be higher than ``peak``.
    unseen_scratch: tuple[str, ...] = ()
    # How the step was run (the repr says it): LOOP (the default) keeps the model's output and
    # the loss alive until the step ends, as ``out = model(x); loss = loss_fn(out);
    # loss.backward(); opt.step()`` does; FREED drops the output before backward (the least a
    # step can hold: ``loss_fn(model(x)).backward()`` with nothing else kept).
    protocol: str = "loop"
    modules: tuple[ModuleMemory, ...] = field(default=(), repr=False)

    _CATEGORIES = ("parameters", "buffers", "inputs", "gradients", "optimizer_state", "activations")

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in (*self._CATEGORIES, "peak")}

    @property
    def title(self) -> str:
        how = "estimated with fake tensors" if self.estimated else "measured"
        return f"training step on {self.device}, {how}, {PROTOCOLS[self.protocol]}"

    def __repr__(self) -> str:
        lines = [f"MemoryBreakdown({self.title})"]
        for name in self._CATEGORIES:
            lines.append(f"  {name.replace('_', ' '):<16}{format_bytes(getattr(self, name)):>12}")
        lines.append(f"  {'peak':<16}{format_bytes(self.peak):>12}  (during {self.peak_phase})")
        if self.unseen_scratch:
            lines.append(f"  {self.scratch_note}")
        return "\n".join(lines)

    @property
    def scratch_note(self) -> str:
        """One sentence on the scratch an estimate cannot see ('' when there is none)."""
        if not self.unseen_scratch:
            return ""
        return (
            "the real peak may be higher: scratch inside "
            + ", ".join(self.unseen_scratch)
            + " is not visible to fake tensors"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{n.replace('_', ' ')}</td>"
            f"<td style='text-align:right'>{format_bytes(getattr(self, n))}</td></tr>"
            for n in self._CATEGORIES
        )
        rows += (
            f"<tr><th>peak</th><th style='text-align:right'>{format_bytes(self.peak)}</th></tr>"
            f"<tr><td colspan='2'>peak reached during {self.peak_phase}</td></tr>"
        )
        if self.unseen_scratch:
            rows += f"<tr><td colspan='2'>{self.scratch_note}</td></tr>"
        table = f"<table><caption>{self.title}</caption>{rows}</table>"
        shown = [m for m in self.modules if m.parameters or m.activations]
        if shown:
            body = "".join(
                f"<tr><td>{m.name}</td><td>{m.kind}</td>"
                f"<td style='text-align:right'>{format_bytes(m.parameters)}</td>"
                f"<td style='text-align:right'>{format_bytes(m.activations)}</td></tr>"
                for m in shown
            )
            table += (
                "<table><caption>by module</caption><tr><th>module</th><th>type</th>"
                f"<th>parameters</th><th>activations</th></tr>{body}</table>"
            )
        return table

    def plot(self, ax=None):
        """A stacked bar of the categories beside the peak; returns the matplotlib Axes.

        The categories do not all live at the same time (activations are freed as gradients
        appear), and the peak also holds temporaries, so the two bars differ.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 2.6))
        left = 0.0
        for name in self._CATEGORIES:
            mib = getattr(self, name) / 2**20
            if mib > 0:
                ax.barh(0, mib, left=left, label=name.replace("_", " "))
                left += mib
        ax.barh(1, self.peak / 2**20, color="0.35", label="peak")
        ax.set_yticks([0, 1], ["categories (sum)", "peak"])
        ax.set_xlabel("MiB")
        ax.set_title(f"Memory of one {self.title}")
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
        ax.figure.tight_layout()
        return ax


#: What each ``keep_output`` choice measures, as the repr says it.
PROTOCOLS = {
    "loop": "output kept through backward, as in a training loop",
    "freed": "output freed before backward",
}


def _protocol(keep_output) -> str:
    if not isinstance(keep_output, bool):
        raise TypeError(
            f"keep_output must be True (the output lives through backward, as in a training "
            f"loop) or False (it is freed before backward), not {keep_output!r}"
        )
    return "loop" if keep_output else "freed"


# -----------------------------------------------------------------------------
# One instrumented training step, shared by breakdown (real tensors) and estimate (fake ones)


def _unique_bytes(tensors, skip: set[int] | None = None) -> tuple[int, set[int]]:
    """Bytes of the distinct storages among ``tensors`` (minus ``skip``), and their keys."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        if s._cdata in seen or (skip and s._cdata in skip):
            continue
        seen.add(s._cdata)
        total += s.nbytes()
    return total, seen


def _default_loss(output) -> torch.Tensor:
    """The sum of the output's floating-point elements (a tensor, or a tuple / dict of them)."""
    if isinstance(output, dict):
        output = list(output.values())
    parts = [output] if isinstance(output, torch.Tensor) else list(output)
    floats = [t.sum() for t in parts if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floats:
        raise TypeError("the model's output has no floating-point tensor to sum; pass loss_fn=")
    return floats[0] if len(floats) == 1 else torch.stack(floats).sum()


def _make_optimizer(optimizer, params: list[nn.Parameter]):
    if optimizer is None:
        return None
    if isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "pass the optimizer class (e.g. torch.optim.AdamW) or a function of the parameters, "
            "not an optimizer instance, so the step starts from a fresh optimizer"
        )
    return optimizer(params)


class EstimateError(RuntimeError):
    """The model's step cannot run on fake tensors; the message names the module and why."""


class _ModuleWatch:
    """Forward hooks that say which module is running, so saved tensors can be attributed."""

    def __init__(self, model: nn.Module):
        self.stack: list[str] = []
        self.names = {m: name or "(model)" for name, m in model.named_modules()}
        self.handles = []
        for m in self.names:
            self.handles.append(m.register_forward_pre_hook(self._enter))
            self.handles.append(
                m.register_forward_hook(self._leave)
            )  # not on error: keep the culprit

    def _enter(self, module, args):
        self.stack.append(self.names[module])

    def _leave(self, module, args, output):
        if self.stack:
            self.stack.pop()

    def remove(self):
        for h in self.handles:
            h.remove()

    def explain(self, exc: Exception) -> EstimateError:
        """One sentence naming the innermost module that was running when ``exc`` was raised."""
        if self.stack:
            name = self.stack[-1]
            kind = next(type(m).__name__ for m, n in self.names.items() if n == name)
            where = f"{name} ({kind})"
        else:
            where = "the loss function"
        text = str(exc).strip()
        reason = text.splitlines()[0] if text else "no message"
        if reason.startswith("Storage size calculation overflowed"):  # torch's words for it
            reason = (
                f"one of its tensors would be larger than any tensor can be (2**63 bytes; "
                f"{reason.partition(' with ')[2]}): give smaller input shapes or a smaller model"
            )
        else:
            reason = f"{type(exc).__name__}: {reason}"
        return EstimateError(f"estimate could not run {where} on fake tensors: {reason}")


def _run_step(
    model,
    inputs,
    loss_fn,
    optimizer,
    acc: _Accountant,
    estimated: bool,
    device_name: str,
    recorder: _AllocatorRecorder | None = None,
    protocol: str = "loop",
):
    """Forward, backward and (optionally) an optimizer step, booked by ``acc``.

    ``protocol`` "loop": the output and the loss stay alive until the step ends (a learner's
    ``out = model(x)`` does); "freed": the output is dropped before backward.

    With a ``recorder`` (real CPU steps), the peak is the CPU allocator's own (scratch inside
    operators included); the categories always come from the dispatch-level books.
    """
    mark = recorder.mark if recorder is not None else _no_mark
    params = list(model.parameters())
    buffers = list(model.buffers())
    param_bytes, param_keys = _unique_bytes(params)
    buffer_bytes, buffer_keys = _unique_bytes(buffers, param_keys)
    input_bytes, input_keys = _unique_bytes([x for x in inputs if isinstance(x, torch.Tensor)])
    known = param_keys | buffer_keys | input_keys

    saved: dict[int, int] = {}  # storage -> bytes, tensors saved for backward
    per_module: dict[str, int] = {}
    watch = _ModuleWatch(model)

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        if s._cdata not in known and s._cdata not in saved:
            saved[s._cdata] = s.nbytes()
            where = watch.stack[-1] if watch.stack else "(loss)"
            per_module[where] = per_module.get(where, 0) + s.nbytes()
        return t

    acc.book(params + buffers + [x for x in inputs if isinstance(x, torch.Tensor)])
    window = acc.open_window()
    phase_peaks = {}
    try:
        # With the allocator recording, the books stay off: any dispatch mode changes some
        # steps (CPU autocast's cast cache, MultiheadAttention's path), and the categories come
        # from the parameters, the saved-tensor hooks and the optimizer state, not the books.
        books = acc if recorder is None else contextlib.nullcontext()
        with recorder or contextlib.nullcontext(), books:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                try:
                    with mark("forward"):
                        output = model(*inputs)
                        loss = (loss_fn or _default_loss)(output)
                except Exception as exc:
                    if not estimated:
                        raise
                    raise watch.explain(exc) from None
            phase_peaks["forward"] = acc.window_peak(window)
            if protocol == "freed":
                del output
            acc.reset_window_peak(window)
            with mark("backward"):
                loss.backward()
                if protocol == "freed":
                    del loss
            phase_peaks["backward"] = acc.window_peak(window)
            gradients, grad_keys = _unique_bytes([p.grad for p in params], known)
            opt = _make_optimizer(optimizer, params)
            state_bytes = 0
            if opt is not None:
                acc.reset_window_peak(window)
                with mark("optimizer step"):
                    opt.step()
                phase_peaks["optimizer step"] = acc.window_peak(window)
                state = [
                    v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
                ]
                state_bytes, _ = _unique_bytes(state, known | grad_keys)
            del opt
            output = loss = None  # (the loop's out and loss end here)
    finally:
        watch.remove()
        acc.close_window(window)
    booked_peak = max(phase_peaks.values()) if recorder is None else 0
    if recorder is not None:
        phase_peaks = {name: window.start + peak for name, peak in recorder.peaks().items()}
    phase = max(phase_peaks, key=phase_peaks.get)
    modules, counted = [], set()
    for module, name in watch.names.items():  # a tied weight counts in the first module only
        own, keys = _unique_bytes(module.parameters(recurse=False), counted)
        counted |= keys
        modules.append(ModuleMemory(name, type(module).__name__, own, per_module.get(name, 0)))
    return MemoryBreakdown(
        device=device_name,
        parameters=param_bytes,
        buffers=buffer_bytes,
        inputs=input_bytes,
        gradients=gradients,
        optimizer_state=state_bytes,
        activations=sum(saved.values()),
        peak=phase_peaks[phase],
        peak_phase=phase,
        estimated=estimated,
        booked_peak=booked_peak,
        protocol=protocol,
        modules=tuple(modules),
    )


@contextmanager
def _no_mark(phase: str) -> Iterator[None]:
    yield


def _model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def _as_tuple(inputs) -> tuple:
    if isinstance(inputs, (tuple, list)) and not _is_shape(inputs):
        return tuple(inputs)
    return (inputs,)


def breakdown(
    model: nn.Module,
    inputs,
    *,
    loss_fn: Callable | None = None,
    optimizer: Callable | None = None,
    keep_output: bool = True,
) -> MemoryBreakdown:
    """Run one real training step and say where its memory went.

    ``inputs``: a tensor, or a tuple of tensors passed to ``model(*inputs)``. ``loss_fn(output)``
    returns the scalar to backpropagate (default: the sum of the output's float elements).
    ``optimizer``: an optimizer class (``torch.optim.AdamW``) or a function of the parameters;
    with one, the model's weights take one real step. Gradients the model had before and
    BatchNorm's running statistics are put back afterwards; the step's own gradients and
    optimizer are dropped.

    ``keep_output`` (default True) runs the step as a training loop is written,
    ``out = model(x); loss = loss_fn(out); loss.backward(); opt.step()``: ``out`` stays alive
    through backward and the optimizer step. ``False`` frees it before backward (what
    ``loss_fn(model(x)).backward()`` holds). The repr says which was measured; the two differ
    most for a model whose large output is not saved for backward (a language model's logits).
    """
    _check_step_arguments(model, loss_fn, optimizer)
    protocol = _protocol(keep_output)
    inputs = _as_tuple(inputs)
    _check_what_is_counted(model, inputs)
    device = _model_device(model)
    if device.type == "meta":
        raise ValueError(
            "this model is on the meta device and has no real memory; "
            "use memory.estimate(model, inputs)"
        )
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.device != device:
            raise ValueError(
                f"the inputs are on {x.device} but the model is on {device}; "
                f"move them with .to({str(device)!r})"
            )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "no parameter of this model requires grad, so there is no training step to measure"
        )
    old_grads = {p: p.grad for p in model.parameters()}
    for p in old_grads:
        p.grad = None
    # A training-mode forward updates BatchNorm's running statistics: put them back afterwards,
    # so measuring a model does not change what it computes in eval mode.
    stats = {
        b: b.detach().clone()
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase)
        for b in m.buffers(recurse=False)
    }
    try:
        if device.type == "cuda":
            return _breakdown_cuda(model, inputs, loss_fn, optimizer, device, protocol)
        acc = _Accountant("cpu")
        if not _AllocatorRecorder.available():  # the caller's profiler is running: books only
            return _run_step(
                model, inputs, loss_fn, optimizer, acc, False, str(device), protocol=protocol
            )
        result = _run_step(
            model,
            inputs,
            loss_fn,
            optimizer,
            acc,
            False,
            str(device),
            _AllocatorRecorder(),
            protocol=protocol,
        )
        return dataclasses.replace(result, peak_source="CPU allocator")
    finally:
        for p, g in old_grads.items():
            p.grad = g
        with torch.no_grad():
            for b, saved in stats.items():
                b.copy_(saved)


def _check_step_arguments(model, loss_fn, optimizer) -> None:
    """One sentence for the arguments a step cannot run with (before anything is touched)."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"the model must be an nn.Module (the one you train), not {type(model).__name__}"
        )
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be a function of the model's output, not {type(loss_fn).__name__}"
        )
    if (
        optimizer is not None
        and not callable(optimizer)
        and not isinstance(optimizer, torch.optim.Optimizer)  # (_make_optimizer says why not)
    ):
        raise TypeError(
            "optimizer must be an optimizer class such as torch.optim.AdamW (or a function of "
            f"the parameters that builds one), not {optimizer!r}"
        )


def _check_what_is_counted(model: nn.Module, inputs: tuple) -> None:
    """One sentence for what ``breakdown`` and ``estimate`` cannot count right, before anything
    runs: complex numbers (fake tensors and the books disagree with the allocator about them:
    an estimate 8 % under, unflagged) and sparse tensors or gradients (they have no storage to
    count). Called by both, on the model and on the inputs."""
    for m in model.modules():
        if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.sparse:
            raise ValueError(
                f"{type(m).__name__}(sparse=True) makes sparse gradients, which these counts "
                "cannot measure: build it with sparse=False to count its memory"
            )
    named = [*model.named_parameters(), *model.named_buffers()]
    named += [(f"input {k}", x) for k, x in enumerate(inputs)]
    for name, t in named:
        dtype = getattr(t, "dtype", None)
        layout = getattr(t, "layout", torch.strided)
        if isinstance(dtype, torch.dtype) and dtype.is_complex:
            raise ValueError(
                f"{name} is {dtype}: complex numbers are not counted right here "
                "(count a real model of the same shape, each complex value being two reals)"
            )
        if layout != torch.strided:
            raise ValueError(
                f"{name} is a {str(layout).removeprefix('torch.')} tensor, which these counts "
                "cannot measure: use dense tensors (.to_dense())"
            )


def _breakdown_cuda(model, inputs, loss_fn, optimizer, device, protocol) -> MemoryBreakdown:
    """On CUDA: the categories from our books, the peak from the allocator (workspaces too)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(index)
    before = torch.cuda.memory_allocated(index)
    window = _cuda_open(index)
    try:
        result = _run_step(
            model,
            inputs,
            loss_fn,
            optimizer,
            _Accountant("cuda"),
            False,
            str(device),
            protocol=protocol,
        )
    finally:
        _cuda_close(index, window)
    own = (
        result.parameters + result.buffers + result.inputs
    )  # allocated before and part of the step
    peak = window.peak - before + own
    return dataclasses.replace(result, peak=int(peak), peak_source="CUDA allocator")


# -----------------------------------------------------------------------------
# estimate: the same step on fake tensors


@dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype of an input, for ``estimate`` without real data."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32


def spec(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> TensorSpec:
    """An input described by shape and dtype: ``spec((8, 128), torch.long)`` for token ids."""
    try:  # operator.index takes ints and NumPy ints, not floats
        sizes = [operator.index(n) for n in shape]
    except TypeError:
        sizes = None
    if (
        sizes is None
        or isinstance(shape, (str, bytes))
        or any(isinstance(n, bool) or n < 0 for n in shape)
    ):
        raise ValueError(
            f"a shape is a tuple of whole numbers, 0 or more, such as (8, 128); got {shape!r}"
        )
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype such as torch.long, not {dtype!r}")
    _check_addressable(tuple(sizes), dtype)
    return TensorSpec(tuple(sizes), dtype)


#: PyTorch sizes a tensor's storage in signed 64-bit bytes: one larger cannot exist, even fake.
_MAX_TENSOR_BYTES = 2**63 - 1


def _check_addressable(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """One sentence for a shape no tensor can have (torch's own error is "Storage size
    calculation overflowed", raised from deep inside the step)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > _MAX_TENSOR_BYTES:
        raise ValueError(
            f"an input of shape {shape} in {dtype} would hold {format_bytes(nbytes)}, more "
            "than any tensor can (2**63 bytes); give the shape of a real batch, such as (8, 128)"
        )


def _is_shape(x) -> bool:
    return (
        isinstance(x, (tuple, list, torch.Size))
        and len(x) > 0
        and all(isinstance(n, int) and not isinstance(n, bool) for n in x)
    )


def _check_shapes(inputs) -> None:
    """``estimate``'s plain shapes: whole numbers, 0 or more, that a tensor can have. A tuple
    of numbers that are not all whole (``(2.5, 4)``, ``(True, 4)``) is a shape gone wrong, not
    several inputs."""
    raw = _as_tuple(inputs)
    if raw and all(isinstance(n, numbers.Number) for n in raw):
        raw = (tuple(raw),)  # (2.5, 4): one shape, and a wrong one
    for x in raw:
        if not isinstance(x, (tuple, list, torch.Size)) or not x:
            continue
        if not all(isinstance(n, numbers.Number) for n in x):
            continue  # a tuple of tensors, flags...: the model's business
        if not _is_shape(x) or any(n < 0 for n in x):
            raise ValueError(
                f"an input shape is a tuple of whole numbers, 0 or more, such as (8, 128); got "
                f"{tuple(x)!r}" + (" (estimate cannot infer a -1)" if -1 in x else "")
            )
        _check_addressable(tuple(x), torch.float32)


def _fake_input(x, device: torch.device):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device)
    if isinstance(x, TensorSpec):
        return torch.empty(x.shape, dtype=x.dtype, device=device)
    if _is_shape(x):
        return torch.empty(tuple(x), dtype=torch.float32, device=device)
    return x  # anything else (a flag, a mask of None...) is passed through as it is


def _fake_model(model: nn.Module, device: torch.device, *, in_place: bool = False) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are fake (tied weights stay tied).

    ``in_place``: swap them into ``model`` itself instead, for a model ``estimate`` built from
    a factory and owns (a deep copy of a 7B model's 260 modules takes about 0.15 s).
    """
    memo: dict[int, torch.Tensor] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in memo:
            continue
        fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
        memo[id(t)] = (
            nn.Parameter(fake, requires_grad=t.requires_grad)
            if isinstance(t, nn.Parameter)
            else fake
        )
    if not in_place:
        return copy.deepcopy(model, memo)
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None:
                    table[name] = memo[id(t)]
    return model


_aten = torch.ops.aten

# Operators whose CPU kernels allocate scratch inside themselves that fake tensors cannot see
# (found with the profiler's memory events, benchmarks/memory_accuracy.py): name -> what it is.
_CONV_SCRATCH = "oneDNN's scratchpad, or the column buffer of a transposed convolution"
_UNSEEN_SCRATCH = {
    _aten.convolution.default: _CONV_SCRATCH,
    _aten.convolution_backward.default: _CONV_SCRATCH,
    _aten.native_group_norm_backward.default: "per-group temporaries",
    _aten.native_layer_norm_backward.default: "per-row temporaries",
    _aten.embedding_dense_backward.default: "index sort and counts",
    _aten._scaled_dot_product_flash_attention_for_cpu.default: "per-thread attention blocks",
    _aten._scaled_dot_product_flash_attention_for_cpu_backward.default: (
        "per-thread attention blocks"
    ),
    _aten.mkldnn_rnn_layer.default: "oneDNN's RNN workspace",
    _aten.mkldnn_rnn_layer_backward.default: "oneDNN's RNN workspace",
}

# Matrix products that PyTorch hands to oneDNN on a CPU with native reduced-precision units
# (AVX512-BF16 or AMX: a recent laptop or cloud CPU): oneDNN then allocates scratch inside the
# operator (a primitive's scratchpad and reordered operands, about 10 KiB to a few hundred KiB
# per call, not a function of the shapes we could write down) that fake tensors cannot see.
# On a CPU without those units (or under ONEDNN_MAX_CPU_ISA=AVX2) the same products run in
# PyTorch's own kernels, without that scratch. ATen's rule (aten/src/ATen/native/mkldnn/Matmul.cpp,
# use_mkldnn_bf16_matmul): oneDNN is enabled, every operand and the result are bf16 (fp16 where
# the CPU has native fp16; fp32 under torch.backends.mkldnn.matmul.fp32_precision == "bf16",
# which torch.set_float32_matmul_precision("medium") sets), and the product is larger than
# 16 * 16 * 16 (m * k * n, times the batch for bmm; m * k for mv; n for dot).
_ONEDNN_MATMUL_SCRATCH = "oneDNN's reduced-precision matmul scratch (this CPU has native bf16)"
_ONEDNN_MIN_SIZE = 16 * 16 * 16
_ONEDNN_MATMULS = {  # operator -> (index of the first matrix, of the second)
    _aten.mm.default: (0, 1),
    _aten.addmm.default: (1, 2),
    _aten.bmm.default: (0, 1),
    _aten.baddbmm.default: (1, 2),
    _aten.mv.default: (0, 1),
    _aten.addmv.default: (1, 2),
    _aten.dot.default: (0, 1),
}


@functools.cache
def _native_reduced_precision() -> frozenset[torch.dtype]:
    """The dtypes whose CPU matrix products oneDNN runs on this machine's native units.

    Asked once per process: oneDNN reads ``ONEDNN_MAX_CPU_ISA`` (and the CPU's features) when
    it starts, and ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` answers for that, where
    ``torch.backends.cpu.get_cpu_capability()`` (ATen's own kernels) does not: under
    ``ONEDNN_MAX_CPU_ISA=AVX2`` an AVX512-BF16 CPU still reports ``AVX512`` there.
    """
    if not torch.backends.mkldnn.is_available():
        return frozenset()
    found = set()
    for dtype, probe in (
        (torch.bfloat16, "_is_mkldnn_bf16_supported"),
        (torch.float16, "_is_mkldnn_fp16_supported"),
    ):
        try:
            if getattr(torch.ops.mkldnn, probe)():
                found.add(dtype)
        except (AttributeError, RuntimeError):  # a build without the probe: assume not
            pass
    return frozenset(found)


def onednn_matmul_dtypes() -> frozenset[torch.dtype]:
    """The dtypes whose CPU matrix products go to oneDNN right now (empty on most CPUs).

    bf16 (and fp16) on a CPU with native units for them, while ``torch.backends.mkldnn`` is
    enabled; fp32 too while ``torch.backends.mkldnn.matmul.fp32_precision`` is ``"bf16"``.
    """
    native = _native_reduced_precision()
    if not native or not torch.backends.mkldnn.enabled:
        return frozenset()
    if torch.bfloat16 in native and _mkldnn_fp32_precision() == "bf16":
        return native | {torch.float32}
    return native


def _mkldnn_fp32_precision() -> str:
    try:
        return str(torch.backends.mkldnn.matmul.fp32_precision)
    except (AttributeError, RuntimeError):  # older torch: no such setting
        return "none"


def _takes_onednn_matmul(func, args) -> bool:
    """Does this CPU matrix product run in oneDNN, with scratch fake tensors cannot see?"""
    first, second = _ONEDNN_MATMULS[func]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    dtypes = onednn_matmul_dtypes()
    kinds = {t.dtype for t in tensors}
    if len(kinds) != 1 or not kinds <= dtypes:  # every operand in one dtype oneDNN takes
        return False
    a, b = args[first], args[second]
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.dim() == 1:  # dot
        size = a.shape[0]
    elif b.dim() == 1:  # mv
        size = a.shape[0] * a.shape[1]
    elif a.dim() == 2:  # mm
        size = a.shape[0] * a.shape[1] * b.shape[1]
    else:  # bmm
        size = a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    return size > _ONEDNN_MIN_SIZE


# Operators whose real kernels refuse operands of different dtypes, where the fake (meta)
# kernel does not check (nn.Linear on a tensor of token ids runs on fake tensors).
_SAME_DTYPE = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten.baddbmm.default,
    _aten.addmv.default,
    _aten.mv.default,
    _aten.dot.default,
    _aten.convolution.default,
}


class _FakeAccountant(_Accountant):
    """The books of ``estimate``: fake tensors (meta storages), what the real kernels refuse, and
    the operators with scratch it cannot see. Not pushed as a mode of its own: while it is
    entered, the fake mode (``_booking_fake_mode_class``) hands it each operator, one Python
    mode per operator instead of two.
    """

    def __init__(self, target: torch.device):
        super().__init__("meta")
        self.target = target
        self.unseen: dict[str, str] = {}  # operator name -> what its scratch is
        self.on = False

    def __enter__(self):
        self.on = True
        return self

    def __exit__(self, *exc):
        self.on = False

    def run(self, func, args, kwargs, call):
        """Check ``func``, run it with ``call`` (the fake kernel) and book its outputs."""
        if func in _SAME_DTYPE:
            dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)}
            if len(dtypes) > 1:
                names = " and ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
                raise RuntimeError(
                    f"{func} needs its tensors in one dtype, got {names} (a real step raises too)"
                )
        if (
            func in _ONEDNN_MATMULS
            and self.target.type == "cpu"
            and _takes_onednn_matmul(func, args)
        ):
            self.unseen.setdefault(str(func.overloadpacket.__name__), _ONEDNN_MATMUL_SCRATCH)
        if func in _UNSEEN_SCRATCH and self.target.type == "cpu":
            if not (func is _aten.convolution.default and _scratch_bytes(func, args, "meta")):
                self.unseen.setdefault(str(func.overloadpacket.__name__), _UNSEEN_SCRATCH[func])
        out = call(func, args, kwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        transient = _scratch_bytes(func, args, "meta") if func in _SCRATCH_OPS else 0
        self.book(outs, transient, what=func)
        return out


@functools.cache
def _booking_fake_mode_class() -> type:
    """``FakeTensorMode`` that hands every operator the program calls to its ``acc``.

    Only the outermost call is booked: the operators FakeTensorMode runs inside one (a
    decomposition, a meta kernel written in Python) are not the program's, and a real step
    would not see them either. Booking here rather than in a second dispatch mode on top saves
    a Python mode round trip per operator, and the raw ``__torch_dispatch__`` (like the
    accountant's) skips the ``torch._dynamo.disable`` wrapper torch puts around each call.
    Made on first use: importing FakeTensorMode imports torch._dynamo (seconds).
    """
    from torch._subclasses.fake_tensor import _DISPATCH_META_HANDLERS, FakeTensorMode

    class _BookingFakeMode(FakeTensorMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # keep our __torch_dispatch__ a plain method (see _Accountant)

        def __init__(self, acc: _FakeAccountant) -> None:
            super().__init__(allow_non_fake_inputs=True)
            self.acc = acc
            self.nesting = threading.local()  # (the autograd engine may run a device thread)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # FakeTensorMode's own __torch_dispatch__, without its wrappers.
            return self.dispatch(func, types, args, kwargs or {})

        def dispatch(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            # Nested calls, the time outside the step and metadata queries (x.device from
            # C++, about half the calls of a step) allocate nothing the step owns.
            nesting = self.nesting
            if getattr(nesting, "depth", 0) or not self.acc.on or func in _DISPATCH_META_HANDLERS:
                return super().dispatch(func, types, args, kwargs)
            nesting.depth = 1
            try:
                return self.acc.run(func, args, kwargs, self._fake_call(types))
            finally:
                nesting.depth = 0

        def _fake_call(self, types):
            parent = super().dispatch
            return lambda func, args, kwargs: parent(func, types, args, kwargs)

    return _BookingFakeMode


@contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    """FakeTensorMode logs a traceback for an op that fails on fake tensors; our one-sentence
    EstimateError says the same thing, so keep that traceback out of the notebook."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def estimate(
    model_or_factory: nn.Module | Callable[[], nn.Module],
    inputs,
    *,
    loss_fn: Callable | None = None,
    optimizer: Callable | None = None,
    device: str | torch.device | None = None,
    keep_output: bool = True,
) -> MemoryBreakdown:
    """``breakdown`` without allocating: the same step on fake tensors (``FakeTensorMode``).

    ``model_or_factory``: a model (on ``meta``, or anywhere: it is copied with fake weights and
    left untouched) or a zero-argument function that builds one (built on ``meta``, so a
    7-billion-parameter config takes seconds). ``inputs``: tensors, ``spec(shape, dtype)``, or a
    plain tuple of ints for a float32 tensor of that shape: ``estimate(model, (64, 1024))``;
    several inputs as a tuple of those, ``((64, 1024), spec((64,), torch.long))``.
    ``device``: the device to simulate (default: the model's, or ``pick_device()`` for a model on
    meta). Runs under the caller's ``torch.autocast`` like ``breakdown`` does. ``keep_output``:
    as in ``breakdown`` (by default the output lives through backward, as in a training loop).
    """
    protocol = _protocol(keep_output)
    _check_step_arguments(nn.Module(), loss_fn, None)
    _check_step_arguments(nn.Module(), None, optimizer)
    if isinstance(model_or_factory, nn.Module):
        model = model_or_factory
    elif callable(model_or_factory):
        with torch.device("meta"):
            model = model_or_factory()
        if not isinstance(model, nn.Module):
            raise TypeError(f"the factory returned {type(model).__name__}, not an nn.Module")
    else:
        raise TypeError(
            "estimate needs an nn.Module or a function that builds one, "
            f"not {type(model_or_factory).__name__}"
        )
    home = _model_device(model)
    _check_shapes(inputs)
    _check_what_is_counted(model, _as_tuple(inputs))
    if device is not None:
        target = _resolve(device)
    elif home.type == "meta":
        target = _resolve(None)
    else:
        target = home
    raw = _as_tuple(inputs)
    for x in raw:
        if isinstance(x, torch.Tensor) and home.type != "meta" and x.device != home:
            raise ValueError(
                f"the inputs are on {x.device} but the model is on {home}; "
                f"move them with .to({str(home)!r})"
            )
    acc = _FakeAccountant(target)  # fake tensors keep their (empty) storage on meta
    fake_mode = _booking_fake_mode_class()(acc)
    outer, _local.estimating = getattr(_local, "estimating", False), True  # no budget checks
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, _local, "estimating", outer)
        stack.enter_context(fake_mode)
        stack.enter_context(_quiet_logger("torch._subclasses.fake_tensor"))
        fmodel = _fake_model(model, target, in_place=model is not model_or_factory)
        finputs = tuple(_fake_input(x, target) for x in raw)
        result = _run_step(
            fmodel,
            finputs,
            loss_fn,
            optimizer,
            acc,
            estimated=True,
            device_name=str(target),
            protocol=protocol,
        )
    return dataclasses.replace(
        result, peak_source="fake tensors", unseen_scratch=tuple(sorted(acc.unseen))
    )
