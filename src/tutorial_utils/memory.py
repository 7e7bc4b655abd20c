"""Exact tensor-memory measurement and estimation, on every device (CPU included).

This module gathers two rooms: ``tutorial_utils.accounting`` (counting: ``measure``, ``Tracker``,
``budget``) and ``tutorial_utils.anatomy`` (one training step: ``breakdown``, ``estimate``,
``spec``). Import it as ``from tutorial_utils import memory``.

On a GPU, PyTorch's caching allocator counts every byte it hands out (``memory_allocated``,
``max_memory_allocated``). On a CPU there is no such counter, and RSS is no substitute (pages
count only once written, and the allocator keeps freed memory). So on the CPU we count
ourselves: a ``TorchDispatchMode`` sees the output of every operator (forward, backward and
optimizer step alike, since it sits below autograd), books each new tensor storage once (views
and tied weights share one storage) and un-books it through a weak reference when the storage
is freed. That gives current and peak bytes that match the PyTorch profiler's allocation
events, cheaply enough to stay on while a notebook runs.

The public surface:

- ``measure(device)``: current / peak / delta of tensor memory for a ``with`` block.
- ``Tracker``: the same counter left running across notebook cells (the live gauges read it).
- ``budget(nbytes)``: raise the real ``torch.OutOfMemoryError`` when a block goes over a budget.
- ``breakdown(model, inputs)``: one real training step, bytes by category and by module.
- ``estimate(model, inputs)``: the same answer with fake tensors, no memory allocated.

>>> import torch
>>> with measure("cpu") as m:
...     x = torch.empty(1024, 1024)
>>> m.delta_bytes
4194304

What the CPU accounting cannot see, and what we do about it:

- Scratch buffers an operator allocates and frees *inside itself* never leave it, so no
  dispatch-level counter sees them. ``breakdown`` therefore takes its CPU peak from the CPU
  allocator itself (the profiler's memory events, ``accounting._AllocatorRecorder``), scratch
  included, and runs the step without the books: any ``TorchDispatchMode`` (ours, or a no-op
  one) changes some programs (under CPU bf16 autocast a tied-embedding LM peaks 27% higher with
  a mode on, ``nn.MultiheadAttention`` 8% higher). Its categories come from the parameters,
  saved-tensor hooks and optimizer state. A ``Tracker`` left running during ``breakdown`` keeps
  its mode on, with that effect.
- ``measure`` and ``Tracker`` stay on the books (the profiler costs about 0.1 s to stop);
  where PyTorch's CPU kernels make scratch predictably the books add it (``_scratch_bytes``:
  the operand copy of a matrix multiply, the im2col buffer of PyTorch's own convolution, a
  temporary in batch-norm backward; checked against the profiler in tests).
- ``estimate`` runs on fake tensors, which cannot see scratch at all beyond those rules: its
  ``unseen_scratch`` names the operators of the step known to need more (oneDNN convolutions,
  GroupNorm / LayerNorm backward, CPU flash attention, oneDNN's LSTM...).
- Python numbers passed to an operator become 8-byte tensors before dispatch: a few bytes.
- Code compiled by ``torch.compile`` allocates its buffers below the dispatcher: measure the
  uncompiled model.
- Only the thread that started the counting is booked (dispatch modes are thread-local); a
  notebook runs every cell on one thread. A count may end on another thread (a generator
  closed there, ``Tracker.stop()`` or a gauge's finalizer in a worker): it stops booking at
  once, and its mode comes off the thread that started it, at once when that is the main
  thread, otherwise at that thread's next count (a warning says so).
- Starting the count (the first ``measure``, ``budget`` or ``Tracker`` that is not nested in
  another) books the tensors that already exist with one pass over the garbage collector's
  objects. That pass grows with every object of the session, tensor or not: about 20 ms just
  after ``import torch`` on a small machine, more in a big notebook, plus about 1.5 us per
  existing tensor (``benchmarks/memory_accuracy.py --timings-only``). A running ``Tracker``
  makes later blocks free of it.
"""

from __future__ import annotations

from .accounting import Measurement, Tracker, budget, measure
from .anatomy import (
    PROTOCOLS,
    EstimateError,
    MemoryBreakdown,
    ModuleMemory,
    TensorSpec,
    breakdown,
    estimate,
    spec,
)

__all__ = [
    "PROTOCOLS",
    "EstimateError",
    "Measurement",
    "MemoryBreakdown",
    "ModuleMemory",
    "TensorSpec",
    "Tracker",
    "breakdown",
    "budget",
    "estimate",
    "measure",
    "spec",
]
