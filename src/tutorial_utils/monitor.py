"""Live readings of memory and utilization, from four sources behind one small interface.

Every source has a ``name`` and the same life cycle (``open()``, ``read()`` as often as
needed, ``close()``), and answers two questions:

* ``available`` / ``reason``: can it read anything on this machine, and if not, why not
  (one sentence: "no NVIDIA driver", "nvidia-smi not found", ...).
* ``read()``: a list of :class:`Reading`, one per device (or per process / system row).
  A failure while reading raises :class:`SourceError` with one sentence; the gauge shows it
  in that row and keeps going.

The sources, from exact to approximate:

* :class:`TorchSource` -- the PyTorch caching allocator: allocated, reserved and peak bytes per
  CUDA device. Its peak counter is updated at every allocation, so it never misses a spike.
  On a CPU-only machine it reads the exact tensor accounting of :mod:`tutorial_utils.memory`.
* :class:`NvmlSource` -- NVML through ``nvidia-ml-py`` (what ``nvidia-smi`` reads): memory used
  on the whole device (every process plus the CUDA context) and utilization. NVML numbers
  devices in PCI order and ignores ``CUDA_VISIBLE_DEVICES``; rows are labelled with torch's
  CUDA index, matched by UUID.
* :class:`GPUtilSource` -- what the source guide uses. Every call starts an ``nvidia-smi``
  process, so it costs milliseconds per sample and sees no more than ``nvidia-smi``.
  Kept so a learner can compare.
* :class:`PsutilSource` -- the process's resident memory (RSS), system memory and CPU %:
  what a CPU-only learner watches. RSS counts touched pages only.

Example::

    >>> from tutorial_utils import monitor
    >>> src = monitor.PsutilSource()
    >>> src.open()
    >>> [r.label for r in src.read()]
    ['process', 'system']
    >>> src.close()
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from . import nvml
from .units import format_bytes

__all__ = [
    "Reading",
    "SourceError",
    "Source",
    "TorchSource",
    "NvmlSource",
    "GPUtilSource",
    "PsutilSource",
    "SOURCE_NAMES",
    "GPUTIL_TIMEOUT_S",
    "gputil_gpus",
    "make_source",
]


class SourceError(RuntimeError):
    """A source failed to read; the message is one sentence a learner can act on."""


@dataclass(frozen=True)
class Reading:
    """One row at one instant. ``None`` means "this source does not know"."""

    label: str  # row name, e.g. "cuda:0", "NVML cuda:0 (NVIDIA H100)", "process"
    used_bytes: int | None = None  # allocated (torch), used on the device (NVML), RSS (psutil)
    reserved_bytes: int | None = None  # torch's cached pool: allocated + free blocks it keeps
    total_bytes: int | None = None  # device or system memory, when known
    peak_bytes: int | None = None  # the allocator's exact peak (torch / memory.Tracker only)
    utilization_pct: float | None = None  # GPU busy %, or CPU % for psutil rows
    note: str = ""  # a short remark shown after the numbers
    # What 100% means, when it is not the whole device: "one core" for a process's CPU %,
    # which goes above 100 when its threads use several cores: shown as cores ("1.4 cores
    # busy"), never as "142% busy"; "N cores" for the whole machine ("15% of 2 cores").
    utilization_of: str = ""

    def parts(self, peak_bytes: int | None = None) -> list[tuple[str, str]]:
        """The known numbers as ``(kind, text)`` pairs in display order, in binary units.

        ``kind`` is one of used, reserved, total, peak, busy, note; ``peak_bytes`` overrides
        the reading's own peak (the gauge shows the highest value over all its samples).
        """
        peak = self.peak_bytes if peak_bytes is None else peak_bytes
        parts = []
        if self.used_bytes is not None:
            parts.append(("used", f"{format_bytes(self.used_bytes)} used"))
        if self.reserved_bytes is not None:
            parts.append(("reserved", f"{format_bytes(self.reserved_bytes)} reserved"))
        if self.total_bytes is not None:
            parts.append(("total", f"of {format_bytes(self.total_bytes)}"))
        if peak:
            parts.append(("peak", f"peak {format_bytes(peak)}"))
        if self.utilization_pct is not None:
            if self.utilization_of == "one core":
                cores = self.utilization_pct / 100.0
                parts.append(("busy", f"{cores:.1f} core{'' if cores == 1 else 's'} busy"))
            elif self.utilization_of:
                parts.append(("busy", f"{self.utilization_pct:.0f}% of {self.utilization_of}"))
            else:
                parts.append(("busy", f"{self.utilization_pct:.0f}% busy"))
        if self.note:
            parts.append(("note", self.note))
        return parts


class Source:
    """The interface every source implements.

    Lifecycle: ``open()`` once (may set ``available = False`` with a ``reason``), then
    ``read()`` as often as needed, then ``close()``. ``open`` and ``close`` never raise;
    ``read`` raises only :class:`SourceError`.
    """

    name: str = "source"

    def __init__(self) -> None:
        self.available: bool = False
        self.reason: str = "not opened yet: call open()"
        # Unavailable because this machine simply has none of it (no NVIDIA driver on a CPU
        # machine): normal, so the gauge says it calmly instead of as an error.
        self.absent: bool = False

    def open(self) -> None:
        self.available, self.reason = True, ""

    def read(self) -> list[Reading]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        state = "available" if self.available else f"unavailable: {self.reason}"
        return f"{type(self).__name__}({state})"


# --------------------------------------------------------------------------- torch allocator


def _cuda_count() -> int:
    from .devices import gpu_count  # deferred: devices imports torch (see TorchSource.open)

    return gpu_count()


class TorchSource(Source):
    """The PyTorch allocator: exact bytes held by tensors, from ``tutorial_utils.memory.Tracker``.

    On CUDA, one row per device (``cuda:0``, ...): ``memory_allocated`` (used),
    ``memory_reserved`` (the cached pool), the total, and the exact peak since ``open()``
    (the allocator's peak counter, kept honest when ``memory.measure`` blocks nest inside).

    Without CUDA, one row ``cpu (exact)``: bytes of live CPU tensor storage and their exact
    peak, booked by memory's accountant at every operator. It counts the tensors of the thread
    that called ``open()`` (a notebook runs all its cells on its main thread), so open and
    close the source from that thread -- ``LiveGauge.start()`` / ``stop()`` do.
    """

    name = "torch"

    def __init__(self) -> None:
        super().__init__()
        self._trackers: list[tuple[str, Any]] = []  # (row label, memory.Tracker)
        self._totals: dict[str, int | None] = {}

    def open(self) -> None:
        # Deferred, as every torch import in this module: torch takes seconds to import, and a
        # gauge of psutil or NVML sources alone never needs it.
        import torch

        from .memory import Tracker

        n = _cuda_count()
        labels = [f"cuda:{i}" for i in range(n)] if n else ["cpu"]
        self.close()  # opened twice: the first trackers stop, or their mode would stay on
        for label in labels:
            try:
                tracker = Tracker(label).start()
            except Exception as exc:
                self.close()
                self.available, self.reason = (
                    False,
                    f"the {label} memory tracker failed to start ({exc})",
                )
                return
            self._trackers.append((label, tracker))
            if label.startswith("cuda"):
                try:
                    self._totals[label] = int(
                        torch.cuda.get_device_properties(int(label[5:])).total_memory
                    )
                except Exception:
                    self._totals[label] = None
        self.available, self.reason = True, ""

    def read(self) -> list[Reading]:
        if not self.available:
            raise SourceError(self.reason)
        import torch  # deferred, see open(); already imported by then, so this costs nothing

        out = []
        for label, tracker in self._trackers:
            try:
                if label == "cpu":
                    out.append(
                        Reading(
                            "cpu (exact)",
                            used_bytes=int(tracker.current_bytes),
                            peak_bytes=int(tracker.peak_bytes),
                            note="tensor storage",
                        )
                    )
                    continue
                index = int(label[5:])
                out.append(
                    Reading(
                        label,
                        used_bytes=int(torch.cuda.memory_allocated(index)),
                        reserved_bytes=int(torch.cuda.memory_reserved(index)),
                        total_bytes=self._totals.get(label),
                        peak_bytes=int(tracker.peak_bytes),
                    )
                )
            except Exception as exc:  # a CUDA error (device lost, driver reset)
                raise SourceError(f"torch could not read {label}: {exc}") from exc
        return out

    def close(self) -> None:
        for _, tracker in reversed(self._trackers):
            try:
                tracker.stop()
            except Exception:  # stopped from another thread, or the device is gone
                pass
        self._trackers = []


# --------------------------------------------------------------------------- NVML


# NVML's errors that mean "this machine has no NVIDIA GPU to watch", not "something broke"
_NO_NVIDIA_GPU = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")


class NvmlSource(Source):
    """NVML via ``nvidia-ml-py``: memory used / total and utilization per physical GPU.

    Rows are labelled ``NVML cuda:N`` with torch's index (matched by UUID), or
    ``NVML #k (hidden)`` for a GPU that ``CUDA_VISIBLE_DEVICES`` hides from torch.
    Used memory includes every process and the CUDA context, so it is larger than what torch
    reports as allocated or reserved. ``open()`` gives NVML ``timeout_s`` seconds to start and
    list the GPUs (a hung driver makes the source unavailable, saying so); each read runs on the
    gauge's thread, whose ``stop()`` never waits for a hung one.
    """

    name = "nvml"

    def __init__(self, timeout_s: float = nvml.DEFAULT_TIMEOUT_S) -> None:
        super().__init__()
        self.timeout_s = timeout_s
        self._gpus: list[tuple[str, nvml.NvmlGpu]] = []
        self._opened = False

    def open(self) -> None:
        self.absent = False
        try:
            nvml.init(self.timeout_s)
        except RuntimeError as exc:
            self.available, self.reason = False, str(exc)
            # no NVIDIA driver at all (a CPU machine), or its library without a loaded driver
            # (a CPU machine with the package installed): nothing is wrong
            self.absent = type(exc.__cause__).__name__ in _NO_NVIDIA_GPU
            return
        self._opened = True
        try:
            gpus = nvml.gpus(self.timeout_s)
        except RuntimeError as exc:
            self.close()
            self.available, self.reason = False, str(exc)
            return
        if not gpus:
            self.close()
            self.available, self.reason, self.absent = False, "NVML found no GPU", True
            return
        rows = []
        for gpu in gpus:
            if gpu.cuda_index is not None:
                rows.append((gpu.cuda_index, f"NVML cuda:{gpu.cuda_index} ({gpu.name})", gpu))
            else:  # hidden from torch: after the visible ones
                rows.append(
                    (1000 + gpu.nvml_index, f"NVML #{gpu.nvml_index} (hidden, {gpu.name})", gpu)
                )
        self._gpus = [(label, gpu) for _, label, gpu in sorted(rows, key=lambda t: t[0])]
        self.available, self.reason = True, ""

    def read(self) -> list[Reading]:
        if not self.available:
            raise SourceError(self.reason)
        out = []
        for label, gpu in self._gpus:
            try:
                used, total = nvml.memory(gpu)
            except nvml.NvmlError as exc:
                raise SourceError(str(exc)) from exc
            out.append(
                Reading(
                    label,
                    used_bytes=used,
                    total_bytes=total,
                    utilization_pct=nvml.utilization_pct(gpu),
                )
            )
        return out

    def close(self) -> None:
        if self._opened:
            self._opened = False
            self._gpus = []
            nvml.shutdown()


# --------------------------------------------------------------------------- GPUtil

#: Seconds one ``nvidia-smi`` call (through GPUtil) may take before it counts as hung.
GPUTIL_TIMEOUT_S = 5.0
_gputil_lock = threading.Lock()


def _import_gputil() -> Any:
    # Deferred: GPUtil imports distutils, which Python 3.12 no longer ships (setuptools brings
    # it back); a failing import must be a row that says so, not an error importing this module.
    try:
        import GPUtil
    except ImportError as exc:
        raise SourceError(
            f"GPUtil cannot be imported ({exc}); pip install GPUtil setuptools"
        ) from exc
    return GPUtil


class _BoundedPopen(subprocess.Popen):
    """What GPUtil gets as ``Popen`` during :func:`gputil_gpus`: ``communicate`` has a timeout.

    GPUtil starts ``nvidia-smi`` and waits for it without one, inside a bare ``except:`` that
    turns every failure into "no GPU". So the outcome is recorded here, on the class made for
    that one call, and the whole process group of ``nvidia-smi`` is killed and reaped on timeout.
    """

    timeout_s = GPUTIL_TIMEOUT_S
    problem = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs["start_new_session"] = True
        try:
            super().__init__(*args, **kwargs)
        except OSError as exc:
            type(self).problem = f"nvidia-smi could not be run: {exc}"
            raise

    def communicate(self, input: Any = None, timeout: float | None = None) -> Any:
        try:
            return super().communicate(input, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            type(self).problem = f"nvidia-smi did not answer: timed out after {self.timeout_s:g} s"
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
                super().communicate(timeout=5)
            raise


def gputil_gpus(timeout_s: float = GPUTIL_TIMEOUT_S) -> list[Any]:
    """``GPUtil.getGPUs()``, but never longer than ``timeout_s`` and never a silent failure.

    Raises :class:`SourceError` with one sentence when GPUtil cannot be imported, ``nvidia-smi``
    cannot be run, hangs (it and what it started are killed), or answers with something that is
    not a list of GPUs. Returns GPUtil's ``GPU`` objects (memory in MiB, ``load`` as a fraction).
    """
    gputil = _import_gputil()
    module = getattr(gputil, "GPUtil", gputil)  # GPUtil.GPUtil holds getGPUs' globals
    bounded = type("BoundedPopen", (_BoundedPopen,), {"timeout_s": float(timeout_s)})
    with _gputil_lock:
        original = getattr(module, "Popen", None)
        module.Popen = bounded
        try:
            gpus = gputil.getGPUs()
        except (ValueError, IndexError) as exc:
            raise SourceError(
                "nvidia-smi gave output GPUtil cannot parse "
                f"(GPUtil raised {type(exc).__name__}: {exc})"
            ) from exc
        finally:
            module.Popen = original
    if bounded.problem:
        raise SourceError(bounded.problem)
    for gpu in gpus:
        total = float(getattr(gpu, "memoryTotal", math.nan))
        if not (str(getattr(gpu, "uuid", "")).startswith("GPU-") and math.isfinite(total)):
            raise SourceError(
                f"nvidia-smi gave output that is not a GPU list (GPU uuid {gpu.uuid!r}, "
                f"memory {gpu.memoryTotal!r} MiB)"
            )
    return list(gpus)


class GPUtilSource(Source):
    """GPUtil, as the source guide uses it: ``GPUtil.getGPUs()`` parses ``nvidia-smi`` output.

    Each read starts one ``nvidia-smi`` process (milliseconds), so sample it slowly; every row's
    note shows what the last call cost (``last_call_s``).
    GPUtil reports memory in MiB; rows are labelled ``GPUtil cuda:N`` (matched by UUID).
    A broken or hung ``nvidia-smi`` (GPUtil itself would raise ``ValueError`` or wait forever)
    becomes a :class:`SourceError` after at most ``timeout_s`` seconds.
    """

    name = "gputil"

    def __init__(self, timeout_s: float = GPUTIL_TIMEOUT_S) -> None:
        super().__init__()
        self.timeout_s = timeout_s
        self._uuids: dict[str, int] = {}
        self.last_call_s: float | None = None  # how long the last getGPUs() took

    def open(self) -> None:
        try:
            _import_gputil()
        except SourceError as exc:
            self.available, self.reason = False, str(exc)
            return
        if shutil.which("nvidia-smi") is None:
            self.available, self.reason, self.absent = (
                False,
                "nvidia-smi is not on PATH (no NVIDIA driver), so GPUtil sees no GPU",
                True,
            )
            return
        try:
            self._uuids = nvml.cuda_uuids()
        except Exception:
            self._uuids = {}
        self.available, self.reason = True, ""

    def read(self) -> list[Reading]:
        if not self.available:
            raise SourceError(self.reason)
        t = time.perf_counter()
        gpus = gputil_gpus(self.timeout_s)
        self.last_call_s = time.perf_counter() - t
        if not gpus:
            raise SourceError("GPUtil found no GPU (nvidia-smi listed none)")
        cost = f"{self.last_call_s * 1000:.0f} ms per call (one nvidia-smi process)"
        out = []
        for gpu in gpus:
            cuda = self._uuids.get(str(gpu.uuid))
            label = f"GPUtil cuda:{cuda}" if cuda is not None else f"GPUtil #{gpu.id}"
            out.append(
                Reading(
                    label,
                    used_bytes=int(float(gpu.memoryUsed) * 2**20),
                    total_bytes=int(float(gpu.memoryTotal) * 2**20),
                    utilization_pct=round(float(gpu.load) * 100.0, 1),  # GPUtil divides by 100
                    note=cost,
                )
            )
        return out


# --------------------------------------------------------------------------- psutil


class PsutilSource(Source):
    """psutil: this process's RSS and CPU %, and system memory used / total and CPU %.

    CPU % is measured between two reads (the first read after ``open()`` covers the time since
    ``open()``); 100% is one full core for the process row (shown in cores, "1.4 cores busy": it
    goes past one when the process's threads share the work), all cores for the system row
    ("15% of 2 cores").
    """

    name = "psutil"

    def __init__(self, pid: int | None = None) -> None:
        super().__init__()
        self.pid = pid
        self._proc: Any = None
        self._cpu_mark = (0.0, 0.0)  # (process CPU seconds, monotonic seconds) at the last read

    def open(self) -> None:
        try:
            self._proc = psutil.Process(self.pid if self.pid is not None else os.getpid())
            self._proc.cpu_percent(None)  # prime the CPU counters
            psutil.cpu_percent(None)
            self._cpu_mark = (time.process_time(), time.monotonic())
        except psutil.Error as exc:
            self.available, self.reason = False, f"psutil cannot see the process: {exc}"
            return
        self.available, self.reason = True, ""

    def read(self) -> list[Reading]:
        if not self.available:
            raise SourceError(self.reason)
        try:
            rss = int(self._proc.memory_info().rss)
            proc_cpu = (
                self._own_cpu_pct() if self.pid is None else float(self._proc.cpu_percent(None))
            )
            vm = psutil.virtual_memory()
            sys_cpu = float(psutil.cpu_percent(None))
        except psutil.Error as exc:
            raise SourceError(f"psutil failed: {exc}") from exc
        return [
            Reading(
                "process",
                used_bytes=rss,
                total_bytes=int(vm.total),
                utilization_pct=proc_cpu,
                note="RSS",
                utilization_of="one core",
            ),
            Reading(
                "system",
                used_bytes=int(vm.total - vm.available),
                total_bytes=int(vm.total),
                utilization_pct=sys_cpu,
                utilization_of=_cores(),
            ),
        ]

    def _own_cpu_pct(self) -> float:
        # This process's CPU time from the C library clock: a few microseconds, where
        # psutil's cpu_percent() parses /proc (about 100 us) -- it adds up at 10 Hz.
        cpu, wall = time.process_time(), time.monotonic()
        last_cpu, last_wall = self._cpu_mark
        self._cpu_mark = (cpu, wall)
        return 100.0 * (cpu - last_cpu) / (wall - last_wall) if wall > last_wall else 0.0


def _cores() -> str:
    """What 100% of the system row's CPU means: "2 cores" (all of them)."""
    n = os.cpu_count() or 1
    return f"{n} core{'s' if n != 1 else ''}"


# --------------------------------------------------------------------------- factory

SOURCE_NAMES = ("torch", "nvml", "gputil", "psutil")
_CLASSES: dict[str, type[Source]] = {
    "torch": TorchSource,
    "nvml": NvmlSource,
    "gputil": GPUtilSource,
    "psutil": PsutilSource,
}


def make_source(spec: str | Source) -> Source:
    """A source from its name (``'torch'``, ``'nvml'``, ``'gputil'``, ``'psutil'``) or as given."""
    if isinstance(spec, Source):
        return spec
    key = str(spec).lower()
    if key not in _CLASSES:
        raise ValueError(
            f"unknown source {spec!r}: choose from {', '.join(SOURCE_NAMES)} or pass a Source"
        )
    return _CLASSES[key]()
