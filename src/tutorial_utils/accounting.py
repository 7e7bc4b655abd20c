"""Counting tensor memory as it happens: ``measure``, ``Tracker``, ``budget`` and the accountant.

One job: how many bytes of tensor storage are alive on a device, now and at the highest point of
a block. On CUDA the caching allocator counts; on the CPU a ``TorchDispatchMode`` (the
accountant) books each new storage as operators produce it and un-books it through a weak
reference when it is freed. ``tutorial_utils.anatomy`` builds the training-step breakdown and
the estimate on top of it; ``tutorial_utils.memory`` gathers both for the notebooks (read its
docstring for what the counts can and cannot see).

>>> import torch
>>> with measure("cpu") as m:
...     x = torch.empty(1024, 1024)
>>> m.delta_bytes
4194304
"""

from __future__ import annotations

import _thread
import ctypes
import gc
import math
import os
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode,
    _get_current_dispatch_mode_stack,
    _pop_mode,
    _push_mode,
    is_traceable_wrapper_subclass,
)

from . import devices
from .units import format_bytes, parse_bytes

__all__ = ["Measurement", "Tracker", "budget", "measure"]


# -----------------------------------------------------------------------------
# The accountant: books tensor storages as operators produce them


class _Window:
    """One reader of an accountant (a measure block, a budget, a Tracker): its own peak."""

    def __init__(self, current: int, limit: int | None = None):
        self.start = current
        self.peak = current  # folded peak; the live value is max(self.peak, accountant.peak)
        self.limit = limit


def _blas_copy_bytes(m: torch.Tensor) -> int:
    """Bytes a CPU matrix multiply copies for operand ``m``: 0 when BLAS can read it in place.

    BLAS reads row-major or column-major matrices. Anything else (an expanded gradient with
    stride 0, a strided slice) is first cloned to a contiguous scratch copy inside the operator.
    """
    if m.dim() != 2 or m.device.type != "cpu":
        return 0
    rows, cols = m.shape
    s0, s1 = m.stride()
    if (s1 == 1 and s0 >= max(1, cols)) or (s0 == 1 and s1 >= max(1, rows)):
        return 0
    return m.numel() * m.element_size()


def _slow_conv_columns(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
) -> int:
    """Bytes of the im2col buffer of PyTorch's own CPU convolution ("Slow2d"; oneDNN is used
    when it can be, and has no such buffer). It is (N, C_in/groups * kh * kw, H_out * W_out)."""
    if x.device.type != "cpu" or weight.dim() != 4 or transposed:
        return 0
    backend = torch._C._select_conv_backend(
        x,
        weight,
        None,
        list(stride),
        list(padding),
        list(dilation),
        transposed,
        list(output_padding),
        groups,
    )
    if backend != torch._C._ConvBackend.Slow2d:
        return 0
    kh, kw = weight.shape[2], weight.shape[3]
    if (kh, kw) == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0):
        return 0  # a 1x1 convolution reads its input directly
    h_out = (x.shape[2] + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    w_out = (x.shape[3] + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return x.shape[0] * (x.shape[1] // groups) * kh * kw * h_out * w_out * x.element_size()


def _scratch_bytes(func, args, storage_device: str) -> int:
    """Bytes an operator allocates and frees inside itself, where we know them (CPU only).

    Checked against the profiler's allocation events in tests/test_memory_accuracy.py. Only
    operators on the accountant's own storages count: a fake tensor (meta storage) passing
    through the real CPU accountant allocates nothing.
    """
    first = next(a for a in args if isinstance(a, torch.Tensor))
    if first.untyped_storage().device.type != storage_device:
        return 0
    if func is torch.ops.aten.mm.default:
        return _blas_copy_bytes(args[0]) + _blas_copy_bytes(args[1])
    if func is torch.ops.aten.addmm.default:
        return _blas_copy_bytes(args[1]) + _blas_copy_bytes(args[2])
    if func is torch.ops.aten.convolution.default:  # (input, weight, bias, stride, padding, ...)
        return _slow_conv_columns(args[0], args[1], *args[3:9])
    if (
        func is torch.ops.aten.convolution_backward.default
    ):  # (grad, input, weight, bias_sizes, ...)
        return _slow_conv_columns(args[1], args[2], *args[4:10])
    if func is torch.ops.aten.native_batch_norm_backward.default and args[1].device.type == "cpu":
        return args[1].numel() * args[1].element_size()  # a temporary the size of the input
    return 0


_SCRATCH_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.convolution.default,
    torch.ops.aten.convolution_backward.default,
    torch.ops.aten.native_batch_norm_backward.default,
}

_FACTORIES = {  # operators whose first argument is the size of the tensor they create
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.zeros.default,
    torch.ops.aten.ones.default,
    torch.ops.aten.full.default,
    torch.ops.aten.rand.default,
    torch.ops.aten.randn.default,
}
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
_PRECHECKED = (
    _FACTORIES
    | _MATMULS
    | {
        torch.ops.aten.randint.default,  # (high, size)
        torch.ops.aten.randint.low,  # (low, high, size)
        torch.ops.aten.arange.default,  # (end)
        torch.ops.aten.arange.start,  # (start, end)
        torch.ops.aten.arange.start_step,  # (start, end, step)
        torch.ops.aten.repeat.default,  # (self, repeats)
        torch.ops.aten.cat.default,  # (tensors, dim)
    }
)


def _is_size(size) -> bool:
    return isinstance(size, (list, tuple)) and all(isinstance(n, int) for n in size)


def _planned_output(func, args, kwargs) -> tuple[tuple[int, ...], torch.dtype] | None:
    """Shape and dtype of what ``func`` is about to allocate, for the common allocating ops."""
    aten = torch.ops.aten
    dtype = kwargs.get("dtype")
    if func in _FACTORIES:
        size = args[0] if args else kwargs.get("size")
        return (tuple(size), dtype or torch.get_default_dtype()) if _is_size(size) else None
    if func in (aten.randint.default, aten.randint.low):
        size = args[1] if func is aten.randint.default else args[2]
        return (tuple(size), dtype or torch.int64) if _is_size(size) else None
    if func in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        ends = list(args) + [1] * (3 - len(args))
        start, end, step = (0, ends[0], 1) if func is aten.arange.default else ends[:3]
        if not all(isinstance(v, (int, float)) for v in (start, end, step)) or step == 0:
            return None
        numel = max(0, math.ceil((end - start) / step))
        integral = all(isinstance(v, int) for v in (start, end, step))
        return (numel,), dtype or (torch.int64 if integral else torch.get_default_dtype())
    if func is aten.repeat.default:
        x, repeats = args[0], args[1]
        if len(repeats) < x.dim():
            return None  # the operator itself refuses this
        shape = [1] * (len(repeats) - x.dim()) + list(x.shape)
        return tuple(n * r for n, r in zip(shape, repeats, strict=True)), x.dtype
    if func is aten.cat.default:
        tensors = [t for t in args[0] if t.numel() > 0]
        if not tensors:
            return None
        dtype = tensors[0].dtype
        for t in tensors[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
        return (sum(t.numel() for t in tensors),), dtype
    if func in _MATMULS:
        a, b = args[-2], args[-1]
        if a.dim() != b.dim() or a.dim() not in (2, 3):
            return None
        return (*a.shape[:-1], b.shape[-1]), a.dtype
    return None


_PLAIN = (torch.Tensor, nn.Parameter)  # tensor types whose storage is where they say


_active: weakref.WeakSet = weakref.WeakSet()  # accountants that are counting now, any thread


class _StorageRef(weakref.ref):
    """A weak reference to a booked storage that carries its address and booked size.

    One shared callback (``_Accountant._on_free``) reads them when the storage dies: about half
    the cost of a weak reference with a closure of its own, which matters when the first
    ``measure`` of a session books every tensor that already exists (hundreds of thousands in
    a big notebook).
    """

    __slots__ = ("key", "nbytes", "owner")


def _patch_storage_resize() -> None:
    """Book ``untyped_storage().resize_(n)``: it changes a storage's size without an operator
    the dispatcher sees (FSDP2 frees its gathered weights this way). Installed once; a plain
    pass-through when nothing is counting."""
    storage = torch.UntypedStorage
    if getattr(storage.resize_, "_tutorial_utils", False):
        return
    original = storage.resize_

    def resize_(self, size):
        out = original(self, size)
        for acc in list(_active):
            acc.rebook(self)
        return out

    resize_._tutorial_utils = True
    storage.resize_ = resize_
    _patch_operatorless_constructors()


def _book_here(made) -> None:
    """Book ``made`` (a tensor or a storage) in the accountants this thread has entered."""
    me = _thread.get_ident()
    for acc in list(_active):
        if acc.cpu and acc.thread_ident == me and not acc.retiring:
            acc.book_storages(_storages_of(made) if isinstance(made, torch.Tensor) else [made])


def _patch_operatorless_constructors() -> None:
    """Book what ``torch.frombuffer``, ``torch.from_dlpack`` and ``torch.UntypedStorage(n)``
    make: they create memory-holding objects without an operator the dispatcher sees, where
    ``torch.from_numpy`` goes through one (``detach``). Installed once; a pass-through when
    nothing counts. (Code that took ``frombuffer`` into its own namespace before the first
    count keeps the unpatched function: such tensors count from the next count that starts.)"""
    if getattr(torch.frombuffer, "_tutorial_utils", False):
        return

    def counted(original):
        def wrapper(*args, **kwargs):
            made = original(*args, **kwargs)
            if _active:
                _book_here(made)
            return made

        wrapper._tutorial_utils = True
        wrapper.__doc__ = original.__doc__
        return wrapper

    torch.frombuffer = counted(torch.frombuffer)
    torch._C._from_dlpack = counted(torch._C._from_dlpack)
    storage = torch.UntypedStorage
    original_new = storage.__new__

    def __new__(cls, *args, **kwargs):
        made = original_new(cls, *args, **kwargs)
        if _active and made.device.type == "cpu":
            _book_here(made)
        return made

    storage.__new__ = __new__


def _storages_of(t: torch.Tensor) -> list:
    """The storages that hold ``t``'s memory: its own, a sparse tensor's index and value
    tensors' (a sparse tensor has no storage of its own), or a wrapper subclass's inner tensors'
    (a ``DTensor`` holds its rank's shard in a plain tensor, while its own storage reports the
    global size and holds nothing). Empty where there is none to see."""
    if type(t) not in _PLAIN and is_traceable_wrapper_subclass(t):
        try:
            inner = [getattr(t, name) for name in t.__tensor_flatten__()[0]]
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            return []
        # (DTensor's list also names its device mesh, which holds no tensor memory)
        return [s for x in inner if isinstance(x, torch.Tensor) for s in _storages_of(x)]
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError, TypeError):
        pass
    layout = t.layout
    try:
        if layout == torch.sparse_coo:
            parts = [t._indices(), t._values()]
        elif layout in (torch.sparse_csr, torch.sparse_bsr):
            parts = [t.crow_indices(), t.col_indices(), t.values()]
        elif layout in (torch.sparse_csc, torch.sparse_bsc):
            parts = [t.ccol_indices(), t.row_indices(), t.values()]
        else:  # nested, and tensor subclasses without storage
            return []
        return [p.untyped_storage() for p in parts]
    except (RuntimeError, NotImplementedError, TypeError):
        return []


def _holds_memory(s: torch.UntypedStorage) -> bool:
    """False for the storage object of a wrapper subclass (a ``DTensor``'s reports its global
    size but points at nothing: asking for its address raises), which a learner's
    ``d.untyped_storage()`` keeps alive for the scan to find."""
    try:
        s.data_ptr()
    except RuntimeError:
        return False
    return True


class _Accountant(TorchDispatchMode):
    """Counts the bytes of live tensor storages on one device type, as operators create them.

    ``storage_device`` is where the storages live: ``'cpu'`` for real CPU tensors, ``'meta'``
    for the fake tensors of ``estimate`` (a fake tensor reports a CPU device but keeps a meta
    storage). Thread-safe to read; it books only the ops of the thread that entered it.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Keep __torch_dispatch__ a plain method. By default torch wraps it in
        # torch._dynamo.disable, which imports torch._dynamo (about 3 s) at the first operator
        # and adds a wrapper call to every operator after that.
        return False

    def __init__(self, storage_device: str = "cpu"):
        super().__init__()
        self.storage_device = storage_device
        self.cpu = storage_device == "cpu"
        self.lock = threading.RLock()  # RLock: a weakref callback can fire while we book
        self.live: dict[int, _StorageRef] = {}  # storage address -> its weak reference
        # Storages whose memory lies inside a booked one (``from_numpy(a.numpy())``, ``as_tensor``
        # of the same array, ``from_dlpack``): counted 0, each linked to the storage that holds
        # it (``ref.owner``), counted on its own if that one dies first.
        self.aliases: dict[int, _StorageRef] = {}
        self.thread_ident = 0  # the thread that entered it (whose operators it books)
        self.current = 0
        self.peak = 0  # running peak since the last window opened or reset
        self.windows: list[_Window] = []
        self.limited = False  # is any window a budget? (skip the checks when not)
        # Set when the last reader left from another thread than the one whose dispatch stack
        # holds this mode: it stops booking (a pass-through) until that thread takes it off.
        self.retiring = False
        self.on_main_thread = False  # pushed by the main thread (see _retire_elsewhere)
        self.pending = False  # a call to take it off is queued on the main thread
        self.owner_name = ""  # the name of the thread that pushed it, for messages

    def __enter__(self):
        self.thread_ident = _thread.get_ident()
        _active.add(self)
        _patch_storage_resize()
        return super().__enter__()

    def __exit__(self, *exc):
        _active.discard(self)
        return super().__exit__(*exc)

    # --- booking -------------------------------------------------------------------------

    def rebook(self, storage: torch.UntypedStorage) -> None:
        """A booked storage changed size without an operator (``untyped_storage().resize_``)."""
        with self.lock:
            entry = self.live.get(storage._cdata)
            if entry is None:
                return
            nbytes = storage.nbytes()
            self.current += nbytes - entry.nbytes
            entry.nbytes = nbytes
            self.peak = max(self.peak, self.current)

    def _on_free(self, ref: _StorageRef) -> None:
        """A booked storage died (the callback of its weak reference)."""
        with self.lock:
            if self.live.get(ref.key) is ref:
                del self.live[ref.key]
                self.current -= ref.nbytes
                if self.aliases:
                    self._promote(ref.key)

    def _on_alias_free(self, ref: _StorageRef) -> None:
        with self.lock:
            if self.aliases.get(ref.key) is ref:
                del self.aliases[ref.key]

    def _container(self, s: torch.UntypedStorage, key: int) -> int | None:
        """The key of a booked storage whose memory holds all of ``s``'s, else None.

        Two storages share memory only where one wraps memory it did not allocate (NumPy's,
        a buffer's, another storage's through ``.numpy()`` or DLPack), and such a storage
        cannot be resized: only those are looked up, so operators' fresh outputs cost nothing.
        """
        if not self.cpu or s.resizable():  # (fake tensors' meta storages have no memory)
            return None
        n, start = s.nbytes(), s.data_ptr()
        if n == 0 or start == 0:
            return None
        end = start + n
        for k, ref in list(self.live.items()):
            if k == key or ref.nbytes < n:
                continue
            other = ref()
            if other is None:
                continue
            begin = other.data_ptr()
            if begin <= start and end <= begin + ref.nbytes:
                return k
        return None

    def _alias(self, key: int, s: torch.UntypedStorage, owner: int) -> None:
        ref = self.aliases[key] = _StorageRef(s, self._on_alias_free)
        ref.key, ref.nbytes, ref.owner = key, s.nbytes(), owner

    def _promote(self, owner: int) -> None:
        """The storage ``owner`` died: its aliases still hold their memory (NumPy keeps it)."""
        for key, ref in list(self.aliases.items()):
            if getattr(ref, "owner", None) != owner:
                continue
            del self.aliases[key]
            s = ref()
            if s is None:
                continue
            holder = self._container(s, key)
            if holder is not None:
                self._alias(key, s, holder)
                continue
            new = self.live[key] = _StorageRef(s, self._on_free)
            new.key, new.nbytes = key, s.nbytes()
            self.current += new.nbytes
            self.peak = max(self.peak, self.current)

    def _new_bytes(self, tensors: Sequence) -> tuple[int, list]:
        """Bytes of storages in ``tensors`` not booked yet (or grown), and what to book."""
        storages = []
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            if type(t) in _PLAIN and self.storage_device == "cpu" and not t.is_cpu:
                continue  # fast path: no device object
            storages.extend(_storages_of(t))
        return self._new_storage_bytes(storages)

    def _new_storage_bytes(self, storages: Sequence) -> tuple[int, list]:
        added, todo, seen = 0, [], set()
        for s in storages:
            if s.device.type != self.storage_device:  # fake tensors keep meta storages
                continue
            key, nbytes = s._cdata, s.nbytes()
            if key in seen or key in self.aliases:
                continue
            seen.add(key)
            entry = self.live.get(key)
            if entry is None:
                holder = self._container(s, key)
                if holder is not None:
                    todo.append((key, s, -1 - holder))  # an alias: counted 0
                    continue
                added += nbytes
                todo.append((key, s, nbytes))
            elif entry.nbytes != nbytes:  # resized in place
                added += nbytes - entry.nbytes
                todo.append((key, None, nbytes))
        return added, todo

    def book_storages(self, storages: Sequence) -> None:
        """Book storages made without an operator (``torch.UntypedStorage(n)``, ``frombuffer``)."""
        with self.lock:
            added, todo = self._new_storage_bytes(storages)
            if self.limited and added:
                self._check_budget(added, "a storage made without an operator")
            self._apply(todo, added, 0)

    def _apply(self, todo: list, added: int, transient: int) -> None:
        live, on_free = self.live, self._on_free
        for key, s, nbytes in todo:
            if s is None:
                live[key].nbytes = nbytes
            elif nbytes < 0:
                self._alias(key, s, -1 - nbytes)
            else:
                ref = live[key] = _StorageRef(s, on_free)
                ref.key, ref.nbytes = key, nbytes
        self.current += added
        self.peak = max(self.peak, self.current + transient)

    def book(self, tensors: Sequence, transient: int = 0, what: object = "a tensor") -> None:
        """Count the storages of ``tensors``; ``transient`` bytes exist only during this op.

        ``what`` names the allocation in a budget error: a string, or the operator.
        """
        with self.lock:
            added, todo = self._new_bytes(tensors)
            if not todo and not transient:  # (an empty storage is booked too: it may grow)
                return
            if self.limited:
                self._check_budget(added + transient, what)
            self._apply(todo, added, transient)

    def _book_one(self, t: torch.Tensor) -> None:
        """``book([t])`` for one plain tensor, no transient bytes and no budget (a CPU op's
        usual output): the per-operator cost of a running Tracker is mostly here."""
        if not t.is_cpu:
            return
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):  # sparse: its parts
            self.book([t])
            return
        key, nbytes = s._cdata, s.nbytes()
        with self.lock:
            entry = self.live.get(key)
            if entry is None:
                if key in self.aliases:
                    return
                if not s.resizable():  # it may wrap memory already booked (see _container)
                    holder = self._container(s, key)
                    if holder is not None:
                        self._alias(key, s, holder)
                        return
                ref = self.live[key] = _StorageRef(s, self._on_free)
                ref.key, ref.nbytes = key, nbytes
                self.current += nbytes
            elif entry.nbytes != nbytes:  # resized in place
                self.current += nbytes - entry.nbytes
                entry.nbytes = nbytes
            else:
                return  # a view, or an in-place op: nothing new
            if self.current > self.peak:
                self.peak = self.current

    def _check_budget(self, nbytes: int, what: object) -> None:
        for w in self.windows:
            if w.limit is not None and self.current + nbytes > w.limit:
                what = what if isinstance(what, str) else f"the output of {what}"
                raise torch.OutOfMemoryError(
                    f"CPU out of memory (memory.budget). Tried to allocate {format_bytes(nbytes)} "
                    f"for {what}. Budget {format_bytes(w.limit)}, {format_bytes(self.current)} "
                    f"already in use, {format_bytes(max(0, w.limit - self.current))} free under "
                    "the budget. Free references you no longer need (del, .detach(), .item()), "
                    "use a smaller batch, or raise the budget."
                )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.retiring:  # nobody reads these books any more: only wait to be taken off
            _take_off_soon(self)
            return func(*args, **kwargs)
        if self.limited and func in _PRECHECKED:  # refuse before allocating, when we can
            self._precheck(func, args, kwargs)
        out = func(*args, **kwargs)
        if type(out) is torch.Tensor and self.cpu and not self.limited and func not in _SCRATCH_OPS:
            self._book_one(out)  # the common case, without book()'s lists
            return out
        outs = out if isinstance(out, (tuple, list)) else (out,)
        transient = _scratch_bytes(func, args, self.storage_device) if func in _SCRATCH_OPS else 0
        self.book(outs, transient, what=func)
        return out

    def _precheck(self, func, args, kwargs) -> None:
        """Raise the budget's OOM before ``func`` allocates its output, when its size is known."""
        if self.storage_device != "cpu" or getattr(_local, "estimating", False):
            return  # fake tensors (estimate inside a budget) allocate nothing
        device = kwargs.get("device")
        if device is not None and torch.device(device).type != "cpu":
            return
        planned = _planned_output(func, args, kwargs)
        if planned is not None:
            shape, dtype = planned
            numel = 1
            for n in shape:
                numel *= n
            what = (
                f"a new tensor of shape {tuple(shape)}"
                if func in _FACTORIES
                else f"the output of {func} (shape {tuple(shape)})"
            )
            with self.lock:
                self._check_budget(numel * dtype.itemsize, what)

    # --- windows ---------------------------------------------------------------------------

    def open_window(self, limit: int | None = None) -> _Window:
        with self.lock:
            for w in self.windows:  # hand them the running peak before we reset it
                w.peak = max(w.peak, self.peak)
            self.peak = self.current
            window = _Window(self.current, limit)
            self.windows.append(window)
            self.limited = any(w.limit is not None for w in self.windows)
            return window

    def close_window(self, window: _Window) -> None:
        with self.lock:
            window.peak = max(window.peak, self.peak)
            if window in self.windows:
                self.windows.remove(window)
            self.limited = any(w.limit is not None for w in self.windows)

    def window_peak(self, window: _Window) -> int:
        with self.lock:
            return max(window.peak, self.peak) if window in self.windows else window.peak

    def reset_window_peak(self, window: _Window) -> None:
        with self.lock:
            for w in self.windows:
                w.peak = max(w.peak, self.peak)
            self.peak = self.current
            window.peak = self.current

    def book_existing(self) -> None:
        """Book every tensor Python can reach now (a notebook's earlier tensors, the model...)."""
        kinds = _storage_kinds()
        # A tensor's gc traversal visits its class, so this finds them all in one C-level pass
        # over the tracked objects: about 3x faster than filtering gc.get_objects() in Python.
        # That pass is most of the cost of starting the count (it grows with every object of
        # the session, tensor or not), and each class asked for slows it a little.
        found = [o for o in gc.get_referrers(*kinds) if type(o) in kinds]
        storages = [o for o in found if type(o) is torch.UntypedStorage]  # made by hand
        found = [o for o in found if type(o) is not torch.UntypedStorage]
        # A gradient that autograd created in C++ has no Python object until someone reads
        # ``.grad``, so the scan above cannot see it: reach it through its parameter.
        grads = [g for t in found if (g := _leaf_grad(t)) is not None]
        # What book() does, in one loop without its per-tensor tuples: this is the part of
        # starting the count that grows with the number of tensors.
        # The collector stays off meanwhile: each weak reference is a tracked object, and with
        # 200k tensors it would run hundreds of young-generation passes over what we just made.
        cpu, collecting = self.storage_device == "cpu", gc.isenabled()
        gc.disable()
        try:
            self._book_found(found + grads, cpu)
            if storages:  # those a tensor uses are booked already; the others count too
                with self.lock:
                    mine = [
                        t
                        for t in storages
                        if t.device.type == self.storage_device and _holds_memory(t)
                    ]
                    added, todo = self._new_storage_bytes(mine)
                    self._apply(todo, added, 0)
                    self.peak = self.current
        finally:
            if collecting:
                gc.enable()

    def _book_found(self, tensors: list, cpu: bool) -> None:
        with self.lock:
            live, on_free, added = self.live, self._on_free, 0
            wrapping = []  # storages that may wrap memory another one holds (see _container)
            for t in tensors:
                if type(t) not in _PLAIN and is_traceable_wrapper_subclass(t):
                    wrapping.extend(_storages_of(t))  # its inner tensors (a DTensor's shard)
                    continue
                try:
                    s = t.untyped_storage()
                except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, ...
                    wrapping.extend(_storages_of(t))
                    continue
                if cpu and type(t) in _PLAIN:  # fast path: no device object
                    if not t.is_cpu:
                        continue
                elif s.device.type != self.storage_device:
                    continue
                key = s._cdata
                if key in live:  # a view of a storage booked already
                    continue
                if not s.resizable():
                    wrapping.append(s)
                    continue
                ref = live[key] = _StorageRef(s, on_free)
                ref.key = key
                ref.nbytes = nbytes = s.nbytes()
                added += nbytes
            self.current += added
            # Largest first, so that a storage and what wraps it (same memory) keep the first.
            wrapping.sort(key=lambda s: s.nbytes(), reverse=True)
            for s in wrapping:  # one at a time: each may wrap the memory of one booked before
                added, todo = self._new_storage_bytes([s])
                self._apply(todo, added, 0)
            self.peak = self.current

    def clear(self) -> None:
        with self.lock:
            self.live.clear()  # dropping the weak references also drops their callbacks
            self.aliases.clear()


def _leaf_grad(t: torch.Tensor) -> torch.Tensor | None:
    """``t.grad`` of a leaf that requires a gradient; None otherwise. A view whose base was
    modified in place after a multi-output view op (FSDP1's flat-parameter splits) refuses even
    ``is_leaf``: it is no leaf, and its storage is its base's, which the scan books."""
    try:
        return t.grad if t.requires_grad and t.is_leaf else None
    except RuntimeError:
        return None


def _storage_kinds() -> set[type]:
    """``torch.Tensor``, ``nn.Parameter`` and the tensor subclasses defined outside torch.

    The other subclasses torch defines own no CPU memory of their own: wrapper subclasses
    (FakeTensor, FunctionalTensor, MaskedTensor, NestedTensor, the semi-structured sparse
    ones...) keep an empty or ``meta`` storage, their data in plain tensors the scan finds
    anyway; ``nn.Buffer(x)`` returns a plain tensor; an ``UninitializedParameter`` holds 0 bytes
    until it materializes, through operators we book. A subclass defined outside torch (a
    learner's, a library's) is always scanned. Each class left out makes the scan faster.
    """
    kinds, todo = set(), [torch.Tensor]
    while todo:  # torch.Tensor and all its subclasses
        kind = todo.pop()
        if kind not in kinds:
            kinds.add(kind)
            todo.extend(kind.__subclasses__())
    return {
        k
        for k in kinds
        if k in (torch.Tensor, nn.Parameter) or not k.__module__.startswith("torch.")
    } | {torch.UntypedStorage}


# One running CPU accountant per thread (dispatch modes are thread-local): measure, budget and
# Tracker share it, so nested blocks cost one set of books, not one each. Kept in a
# threading.local, not a dict keyed by thread id: a thread that dies with a Tracker still running
# takes its accountant with it, and a new thread that reuses its id starts clean.
_local = threading.local()
_MAIN_IDENT = threading.main_thread().ident


def _acquire_shared(limit: int | None = None) -> tuple[_Accountant, _Window]:
    _local.busy = True  # (a call _retire_elsewhere queued waits until we are done)
    acc = None
    try:
        acc = getattr(_local, "shared", None)
        if acc is not None and acc.retiring:  # left from another thread: off, and start afresh
            _take_off(acc)
            acc = None
        if acc is None:
            acc = _Accountant("cpu")
            acc.book_existing()
            acc.on_main_thread = _thread.get_ident() == _MAIN_IDENT
            acc.owner_name = threading.current_thread().name
            _local.shared = acc
            acc.__enter__()  # push the mode; it stays pushed across notebook cells
        return acc, acc.open_window(limit)
    except BaseException:  # a KeyboardInterrupt while starting: leave no mode behind
        if acc is not None and not acc.windows and getattr(_local, "shared", None) is acc:
            _take_off(acc)
        raise
    finally:
        _local.busy = False


def _release_shared(acc: _Accountant, window: _Window) -> None:
    """Close ``window``; the last one out takes the mode off the thread that pushed it.

    From another thread (a generator closed elsewhere, a gauge's finalizer in its sampling
    thread, ``Tracker.stop()`` called from a worker) the mode cannot be popped here: dispatch
    modes live on each thread's own stack. The accountant then stops booking at once and is
    taken off by its own thread (``_retire_elsewhere``).
    """
    acc.close_window(window)
    if acc.windows:
        return
    if getattr(_local, "shared", None) is acc:
        _local.busy = True
        try:
            _take_off(acc)
        finally:
            _local.busy = False
    elif not acc.retiring:
        _retire_elsewhere(acc)


def _take_off(acc: _Accountant) -> bool:
    """Pop ``acc`` off this thread's dispatch stack (it must be this thread's); True when done.

    Another mode may sit above ours (a learner's, or one entered inside the block and left
    on): lift it off, take ours out, and put it back, so nothing keeps counting after us.
    """
    stack = _get_current_dispatch_mode_stack()
    if acc in stack:
        above = []
        while _get_current_dispatch_mode() not in (acc, None):
            above.append(_pop_mode())
        try:
            if _get_current_dispatch_mode() is acc:
                acc.__exit__(None, None, None)
        finally:
            for mode in reversed(above):
                _push_mode(mode)
    elif acc.retiring:
        return False  # inside one of its own operators (it is off the stack meanwhile): later
    acc.retiring = False
    acc.clear()
    if getattr(_local, "shared", None) is acc:
        _local.shared = None
    return True


def _retire_elsewhere(acc: _Accountant) -> None:
    """The last reader of ``acc`` left from another thread: stop booking, and get it taken off.

    On the main thread (a notebook's cells, a script) it is taken off at once, by a call the
    interpreter runs there between two bytecodes (``Py_AddPendingCall``, as a signal handler
    is). Another thread takes it off the next time it uses ``measure``, ``budget`` or a
    ``Tracker``; until then every operator it runs passes through one Python call, and a
    warning says so.
    """
    acc.retiring = True
    acc.clear()  # no weak references left to call back
    if acc.on_main_thread:
        acc.pending = _call_in_main_thread(lambda: _take_off_in_main(acc))
        if acc.pending:
            return
    warnings.warn(
        f"a memory count (measure, budget or Tracker) begun in thread {acc.owner_name!r} was "
        f"ended in thread {threading.current_thread().name!r}: its dispatch mode stays on in "
        f"{acc.owner_name!r}, slowing each operator there, until that thread next calls "
        "measure(), budget() or Tracker.start() or ends. End a count in the thread that began it.",
        RuntimeWarning,
        stacklevel=3,
    )


def _take_off_in_main(acc: _Accountant) -> None:
    """Queued by ``_retire_elsewhere``; runs on the main thread, between two bytecodes."""
    acc.pending = False
    if acc.retiring and getattr(_local, "shared", None) is acc and not _local.__dict__.get("busy"):
        _take_off(acc)  # False inside one of its own operators: the next operator asks again


def _take_off_soon(acc: _Accountant) -> None:
    """From an operator of a retiring accountant: ask its (main) thread to take it off."""
    if acc.on_main_thread and not acc.pending and _thread.get_ident() == _MAIN_IDENT:
        acc.pending = _call_in_main_thread(lambda: _take_off_in_main(acc))


_PendingCall = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_pending: dict[int, object] = {}  # the callbacks ctypes made, alive until the interpreter runs them


def _call_in_main_thread(fn) -> bool:
    """Run ``fn()`` on the main thread at its next bytecode boundary; False if that is refused.

    ``Py_AddPendingCall`` (CPython's C API, what delivers signals to Python code): the main
    thread runs it when it next checks for signals, soon even in a long loop, right after a
    blocking call returns otherwise. ``fn`` must not raise (errors are dropped).
    """
    try:
        add = ctypes.pythonapi.Py_AddPendingCall
    except (AttributeError, OSError):  # not CPython
        return False

    def run(_):
        _pending.pop(id(callback), None)
        try:
            fn()
        except Exception:  # nothing may escape into whatever the main thread was doing
            pass
        return 0

    callback = _PendingCall(run)
    add.argtypes, add.restype = [_PendingCall, ctypes.c_void_p], ctypes.c_int
    _pending[id(callback)] = callback
    if add(callback, None) != 0:  # the queue is full
        _pending.pop(id(callback), None)
        return False
    return True


# -----------------------------------------------------------------------------
# The CPU allocator itself, through the profiler's memory events


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2: the profiler's C++ side writes a line when it starts and stops,
    past Python's sys.stderr (a notebook would show it under the cell)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _AllocatorRecorder:
    """Every allocation and free of PyTorch's CPU allocator during a block, with phase marks.

    The dispatcher only sees the tensors an operator returns. Scratch buffers that an operator
    allocates and frees inside itself (a transposed convolution's columns, a norm's temporaries,
    oneDNN's LSTM workspace) go through the CPU allocator too, and the allocator reports them to
    the profiler when ``profile_memory`` is on: the ``[memory]`` events of ``torch.profiler``.
    That is the only hook that sees the CPU allocator in PyTorch 2.13 (there is no CPU
    counterpart of ``torch.cuda.max_memory_allocated``). It costs a few microseconds per
    operator and about 0.1 s to stop, so ``breakdown`` (one step) uses it and ``measure`` does
    not. ``mark(name)`` opens a phase; ``peaks()`` gives the running peak per phase, in bytes
    above the start of the block.
    """

    PREFIX = "tutorial_utils.phase:"

    def __init__(self) -> None:
        self.result = None

    @staticmethod
    def available() -> bool:
        """False when a profiler is already running (PyTorch allows one at a time)."""
        return not torch.autograd._profiler_enabled()

    def __enter__(self) -> _AllocatorRecorder:
        from torch._C._profiler import _ExperimentalConfig
        from torch.autograd import (
            ProfilerActivity,
            ProfilerConfig,
            ProfilerState,
            _enable_profiler,
            _prepare_profiler,
        )

        # (state, report_input_shapes, profile_memory, with_stack, with_flops, with_modules, ...)
        # Kineto reads its log level once, when the first profiler starts in the process: set
        # the quiet level notebook 04 uses (unless the user chose one), or every later
        # torch.profiler run in the session prints a start and a stop line on stderr.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        config = ProfilerConfig(
            ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig()
        )
        with _quiet_stderr():
            _prepare_profiler(config, {ProfilerActivity.CPU})
            _enable_profiler(config, {ProfilerActivity.CPU})
        return self

    def __exit__(self, *exc) -> None:
        from torch.autograd import _disable_profiler

        with _quiet_stderr():
            self.result = _disable_profiler()

    @contextmanager
    def mark(self, phase: str) -> Iterator[None]:
        with torch.profiler.record_function(self.PREFIX + phase):
            yield

    def peaks(self) -> dict[str, int]:
        """Highest running total of CPU allocations in each marked phase (bytes above the start)."""
        marks, allocations = [], []
        for e in self.result.events():
            name = e.name()
            if name == "[memory]":
                if e.device_type() == torch._C._autograd.DeviceType.CPU:
                    allocations.append((e.start_ns(), e.nbytes()))
            elif name.startswith(self.PREFIX):
                marks.append((e.start_ns(), name.removeprefix(self.PREFIX)))
        marks.sort()
        allocations.sort(key=lambda a: a[0])  # stable: equal times keep the allocator's order
        peaks = {name: 0 for _, name in marks}
        running, i, phase = 0, 0, None
        for t, nbytes in allocations:
            while i < len(marks) and marks[i][0] <= t:
                phase = marks[i][1]
                peaks[phase] = max(peaks[phase], running)  # what was alive when it began
                i += 1
            running += nbytes
            if phase is not None:
                peaks[phase] = max(peaks[phase], running)
        return peaks


# -----------------------------------------------------------------------------
# CUDA: the allocator already counts; we only keep nested peaks honest


_cuda_windows: dict[int, list[_Window]] = {}


def _cuda_open(index: int) -> _Window:
    torch.cuda.synchronize(index)
    running = torch.cuda.max_memory_allocated(index)
    for w in _cuda_windows.setdefault(index, []):  # resetting the peak must not erase theirs
        w.peak = max(w.peak, running)
    torch.cuda.reset_peak_memory_stats(index)
    window = _Window(torch.cuda.memory_allocated(index))
    _cuda_windows[index].append(window)
    return window


def _cuda_peak(index: int, window: _Window) -> int:
    return max(window.peak, torch.cuda.max_memory_allocated(index))


def _cuda_close(index: int, window: _Window) -> None:
    torch.cuda.synchronize(index)
    window.peak = _cuda_peak(index, window)
    if window in _cuda_windows.get(index, []):
        _cuda_windows[index].remove(window)


def _resolve(device) -> torch.device:
    device = devices.pick_device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"memory accounting works on 'cpu' and 'cuda' devices, not {device.type!r}; "
            "pass device='cpu' or a CUDA device"
        )
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


# -----------------------------------------------------------------------------
# Tracker: a counter that keeps running between notebook cells


class Tracker:
    """Live tensor-memory counter for one device, started in one cell and stopped in a later one.

    ``current_bytes`` and ``peak_bytes`` are safe to read from another thread (the live gauge
    polls them). On the CPU it books the operators run by the thread that called ``start()``
    (a notebook runs every cell on its main thread); on CUDA it reads the caching allocator.
    ``stop()`` may come from any thread: the counting comes off the thread that started it
    (at once when that is the main thread; otherwise when it next counts, with a warning).

    >>> tracker = Tracker("cpu").start()
    >>> x = torch.zeros(256, 1024)          # 1 MiB
    >>> tracker.current_bytes - tracker.start_bytes
    1048576
    >>> tracker.stop()
    """

    def __init__(self, device: str | torch.device | None = None):
        self.device = _resolve(device)
        self._acc: _Accountant | None = None
        self._window: _Window | None = None
        self._start = 0
        self._final = (0, 0)  # (current, peak) when stopped

    @property
    def running(self) -> bool:
        return self._window is not None

    def start(self) -> Tracker:
        if self.running:
            raise RuntimeError(
                "this Tracker is already running; call stop() before starting it again"
            )
        if self.device.type == "cuda":
            self._window = _cuda_open(self.device.index)
        else:
            self._acc, self._window = _acquire_shared()
        return self

    def stop(self) -> None:
        if not self.running:
            return
        if self.device.type == "cuda":
            _cuda_close(self.device.index, self._window)
            self._final = (self.current_bytes, int(self._window.peak))
        else:
            self._final = (self.current_bytes, self.peak_bytes)
            _release_shared(self._acc, self._window)
        self._start = self._window.start
        self._window = None

    def __enter__(self) -> Tracker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def start_bytes(self) -> int:
        """Tensor bytes alive on the device when ``start()`` was called."""
        return self._window.start if self._window else self._start

    @property
    def current_bytes(self) -> int:
        """Tensor bytes alive on the device now (the last reading once stopped)."""
        if not self.running:
            return self._final[0]
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device.index))
        return self._acc.current

    @property
    def peak_bytes(self) -> int:
        """Highest ``current_bytes`` since start (or the last ``reset_peak``)."""
        if not self.running:
            return self._final[1]
        if self.device.type == "cuda":
            return int(_cuda_peak(self.device.index, self._window))
        return self._acc.window_peak(self._window)

    def reset_peak(self) -> None:
        """Start the peak again from the current value."""
        if not self.running:
            return
        if self.device.type == "cuda":
            _cuda_close(self.device.index, self._window)
            self._window = _cuda_open(self.device.index)
        else:
            self._acc.reset_window_peak(self._window)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"Tracker({self.device}, {state}: current {format_bytes(self.current_bytes)}, "
            f"peak {format_bytes(self.peak_bytes)})"
        )


# -----------------------------------------------------------------------------
# measure and budget


@dataclass
class Measurement:
    """Tensor memory of one ``with measure():`` block; the fields are filled when it ends."""

    device: torch.device
    start_bytes: int = 0
    end_bytes: int = 0
    peak_bytes: int = 0
    reserved_bytes: int | None = None  # CUDA only: what the caching allocator holds at the end
    peak_reserved_bytes: int | None = None
    done: bool = False

    @property
    def delta_bytes(self) -> int:
        """End minus start: what the block left behind (negative when it freed memory)."""
        return self.end_bytes - self.start_bytes

    @property
    def peak_above_start_bytes(self) -> int:
        """How far above its starting point the block went at its highest."""
        return self.peak_bytes - self.start_bytes

    def _rows(self) -> list[tuple[str, str]]:
        rows = [
            ("peak", format_bytes(self.peak_bytes)),
            ("delta", ("+" if self.delta_bytes >= 0 else "") + format_bytes(self.delta_bytes)),
            ("start", format_bytes(self.start_bytes)),
            ("end", format_bytes(self.end_bytes)),
        ]
        if self.reserved_bytes is not None:
            rows.append(("reserved", format_bytes(self.reserved_bytes)))
            rows.append(("peak reserved", format_bytes(self.peak_reserved_bytes)))
        return rows

    def __repr__(self) -> str:
        if not self.done:
            return f"Measurement({self.device}, still measuring)"
        return f"Measurement({self.device}: " + ", ".join(f"{k} {v}" for k, v in self._rows()) + ")"

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><td>{k}</td><td style='text-align:right'>{v}</td></tr>" for k, v in self._rows()
        )
        return f"<table><caption>tensor memory on {self.device}</caption>{body}</table>"


@contextmanager
def measure(device: str | torch.device | None = None) -> Iterator[Measurement]:
    """Measure the tensor memory of a ``with`` block: start, end, delta and peak bytes.

    CUDA: the caching allocator's counters (peak reset at entry, reserved memory reported too).
    CPU: exact accounting of live tensor storages (never RSS). Blocks nest.

    On the CPU, each byte of memory counts once: storages that share memory
    (``torch.from_numpy(a.numpy())``, ``torch.as_tensor`` of the same array, ``from_dlpack``)
    count as the one that holds it; a sparse tensor counts its index and value tensors;
    ``torch.frombuffer``, ``torch.from_dlpack``, ``torch.from_numpy`` and a raw
    ``torch.UntypedStorage(n)`` count like any tensor (their memory was not allocated by an
    operator, but it is held by a storage). Not counted: scratch inside an operator (see
    ``memory.breakdown``), memory ``torch.compile`` allocates below the dispatcher, and the
    operators of other threads.

    >>> with measure("cpu") as m:
    ...     y = torch.ones(1024, 256) * 2     # 1 MiB kept, 1 MiB temporary
    >>> m.peak_above_start_bytes, m.delta_bytes
    (2097152, 1048576)
    """
    device = _resolve(device)
    result = Measurement(device)
    if device.type == "cuda":
        index = device.index
        window = _cuda_open(index)  # resets the allocator's peaks, after saving the outer blocks'
        result.start_bytes = window.start
        try:
            yield result
        finally:
            _cuda_close(index, window)
            result.end_bytes = int(torch.cuda.memory_allocated(index))
            result.peak_bytes = int(window.peak)
            result.reserved_bytes = int(torch.cuda.memory_reserved(index))
            result.peak_reserved_bytes = int(torch.cuda.max_memory_reserved(index))
            result.done = True
        return
    acc = window = None
    try:
        acc, window = _acquire_shared()
        result.start_bytes = window.start
        yield result
    finally:
        if window is not None:
            result.end_bytes = acc.current
            _release_shared(acc, window)
            result.peak_bytes = window.peak
            result.done = True


@contextmanager
def budget(nbytes: int | str, device: str | torch.device | None = None) -> Iterator[None]:
    """Raise ``torch.OutOfMemoryError`` when tensor memory in the block would exceed ``nbytes``.

    The budget caps *all* tensor memory on the device, as a GPU's size does (what was already
    allocated before the block counts). ``nbytes`` is an int or a string such as ``"512 MiB"``.
    CUDA: ``torch.cuda.set_per_process_memory_fraction`` (the real allocator error; the previous
    fraction is restored on exit). CPU: the operator that would cross the budget raises, before
    its result reaches your code. Nothing stays patched after the error: free what you no longer
    need and carry on.
    """
    limit = parse_bytes(nbytes)
    if limit <= 0:
        raise ValueError(f"a memory budget must be a positive number of bytes, got {nbytes!r}")
    device = _resolve(device)
    if device.type == "cuda":
        index = device.index
        total = torch.cuda.get_device_properties(index).total_memory
        getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        previous = getter(index) if getter is not None else 1.0
        torch.cuda.empty_cache()  # cached blocks would otherwise count against the fraction
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), index)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(previous, index)
        return
    acc = window = None
    try:
        acc, window = _acquire_shared(limit)
        if acc.current > limit:
            raise torch.OutOfMemoryError(
                f"CPU out of memory (memory.budget). Budget {format_bytes(limit)}, but "
                f"{format_bytes(acc.current)} is already in use before the block starts; "
                "free some tensors or raise the budget."
            )
        yield
    finally:
        if window is not None:
            _release_shared(acc, window)
