"""NVML (NVIDIA's management library, through ``nvidia-ml-py``) without tracebacks or hangs.

NVML is what ``nvidia-smi`` reads: memory used on the whole device (every process, plus the
CUDA context), utilization, driver version. Three traps handled here:

* On a machine without the NVIDIA driver, ``nvmlInit()`` raises ``NVMLError_LibraryNotFound``.
  ``probe()`` turns that into a value that says so; ``init()`` into one sentence.
* NVML numbers devices in PCI order and ignores ``CUDA_VISIBLE_DEVICES``; torch numbers them in
  its own order. ``gpus()`` (the one loop over NVML's devices) maps each to its CUDA index by UUID.
* On a wedged driver an NVML call can block for good. ``init``, ``gpus`` and ``probe`` take a
  ``timeout_s``: the call runs in a helper thread, and after the timeout the caller gets an
  ``NvmlError`` saying "timed out after N s". (A blocked C call cannot be interrupted: the helper
  thread is a daemon, left waiting; if NVML ever answers, it undoes what it did.)

>>> status = probe()          # never raises
>>> status.available or bool(status.reason)
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

try:
    import pynvml  # the nvidia-ml-py package: a dependency, but an environment may lack it
except ImportError:
    pynvml = None

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "NvmlDevice",
    "NvmlError",
    "NvmlGpu",
    "NvmlStatus",
    "cuda_uuids",
    "gpus",
    "init",
    "memory",
    "probe",
    "shutdown",
    "utilization_pct",
]

#: Seconds an NVML call may take before it counts as hung (a healthy one takes microseconds;
#: the first ``nvmlInit`` on a big machine without persistence mode can take a few seconds).
DEFAULT_TIMEOUT_S = 10.0

_lock = threading.Lock()
_initialized = 0
T = TypeVar("T")


class NvmlError(RuntimeError):
    """NVML cannot start, answer or be reached in time; the message is one sentence."""


@dataclass(frozen=True)
class NvmlDevice:
    nvml_index: int
    name: str
    uuid: str
    total_bytes: int
    used_bytes: int
    cuda_index: int | None  # None: not visible to torch (hidden by CUDA_VISIBLE_DEVICES)


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML lists it, with the handle to query it and its index in torch's order."""

    nvml_index: int
    name: str
    uuid: str
    cuda_index: int | None  # None: hidden from torch by CUDA_VISIBLE_DEVICES
    handle: Any = field(repr=False, compare=False)


@dataclass(frozen=True)
class NvmlStatus:
    available: bool
    reason: str = ""  # why not, when not available
    driver_version: str | None = None
    devices: tuple[NvmlDevice, ...] = field(default_factory=tuple)


def _library():
    if pynvml is None:
        raise NvmlError("the nvidia-ml-py package is not installed (pip install nvidia-ml-py)")
    return pynvml


def _bounded(
    fn: Callable[[], T], timeout_s: float, what: str, undo: Callable[[], None] | None = None
) -> T:
    """``fn()`` in a daemon thread; ``NvmlError`` if it takes more than ``timeout_s`` seconds.

    ``undo`` runs in that thread if ``fn`` succeeds after the caller has given up on it.
    """
    box: dict[str, Any] = {}
    abandoned = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc
            return
        if abandoned.is_set() and undo is not None:
            undo()

    thread = threading.Thread(target=target, name=f"nvml {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        abandoned.set()
        raise NvmlError(
            f"NVML did not answer ({what}): timed out after {timeout_s:g} s; is the driver hung?"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


def _init_now() -> None:
    global _initialized
    nv = _library()
    with _lock:
        if _initialized == 0:
            try:
                nv.nvmlInit()
            except nv.NVMLError_LibraryNotFound as exc:
                raise NvmlError(
                    "the NVIDIA driver's NVML library was not found "
                    "(no NVIDIA driver on this machine)"
                ) from exc
            except nv.NVMLError as exc:
                raise NvmlError(f"NVML failed to start: {exc}") from exc
        _initialized += 1


def init(timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Initialise NVML once per process (reference counted, thread safe).

    Raises ``NvmlError`` (a ``RuntimeError``) with one sentence when NVML cannot start or does
    not answer within ``timeout_s`` seconds.
    """
    _bounded(_init_now, timeout_s, "nvmlInit", undo=shutdown)


def shutdown() -> None:
    """Release one ``init()``; NVML shuts down when the last user releases it."""
    global _initialized
    if pynvml is None:
        return
    with _lock:
        if _initialized == 0:
            return
        _initialized -= 1
        if _initialized == 0:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass


def _decode(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_uuids() -> dict[str, int]:
    """Map 'GPU-xxxx' UUIDs to torch's CUDA index (empty without CUDA)."""
    # Deferred: torch takes seconds to import, and NVML, the monitor sources and a psutil-only
    # gauge work without it (a gauge in a process that never imports torch starts at once).
    import torch

    from .devices import gpu_count

    out = {}
    for i in range(gpu_count()):
        try:
            uuid = str(torch.cuda.get_device_properties(i).uuid)
        except Exception:
            continue
        out[uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"] = i
    return out


def _gpus_now() -> tuple[NvmlGpu, ...]:
    nv = _library()
    uuids = cuda_uuids()
    out = []
    try:
        for k in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(k)
            uuid = _decode(nv.nvmlDeviceGetUUID(handle))
            name = _decode(nv.nvmlDeviceGetName(handle))
            out.append(NvmlGpu(k, name, uuid, uuids.get(uuid), handle))
    except nv.NVMLError as exc:
        raise NvmlError(f"NVML could not list the GPUs: {exc}") from exc
    return tuple(out)


def gpus(timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[NvmlGpu, ...]:
    """Every GPU NVML sees, in NVML (PCI) order, each with its CUDA index. Needs ``init()``."""
    return _bounded(_gpus_now, timeout_s, "listing the GPUs")


def memory(gpu: NvmlGpu) -> tuple[int, int]:
    """``(used_bytes, total_bytes)`` of one GPU; ``NvmlError`` when the query fails."""
    nv = _library()
    try:
        info = nv.nvmlDeviceGetMemoryInfo(gpu.handle)
    except nv.NVMLError as exc:
        raise NvmlError(f"NVML query failed: {exc}") from exc
    return int(info.used), int(info.total)


def utilization_pct(gpu: NvmlGpu) -> float | None:
    """How busy the GPU was (%, averaged by the driver), or ``None`` where it is not supported
    (MIG slices, vGPU) or the query fails."""
    nv = _library()
    try:
        return float(nv.nvmlDeviceGetUtilizationRates(gpu.handle).gpu)
    except nv.NVMLError:
        return None


def _probe_now() -> NvmlStatus:
    try:
        _init_now()
    except NvmlError as exc:
        return NvmlStatus(False, str(exc))
    nv = _library()
    try:
        driver = _decode(nv.nvmlSystemGetDriverVersion())
        devices = []
        for gpu in _gpus_now():
            used, total = memory(gpu)
            devices.append(
                NvmlDevice(gpu.nvml_index, gpu.name, gpu.uuid, total, used, gpu.cuda_index)
            )
        return NvmlStatus(True, driver_version=driver, devices=tuple(devices))
    except nv.NVMLError as exc:
        return NvmlStatus(False, f"NVML query failed: {exc}")
    except NvmlError as exc:
        return NvmlStatus(False, str(exc))
    finally:
        shutdown()


def probe(timeout_s: float = DEFAULT_TIMEOUT_S) -> NvmlStatus:
    """What NVML can see right now, or why it cannot see anything. Never raises."""
    try:
        return _bounded(_probe_now, timeout_s, "nvmlInit and a first query", undo=None)
    except NvmlError as exc:
        return NvmlStatus(False, str(exc))
    except Exception as exc:  # a broken binding: still a row, never a traceback
        return NvmlStatus(False, f"NVML failed: {type(exc).__name__}: {exc}")
