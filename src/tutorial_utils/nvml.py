"""NVML (NVIDIA's management library, through ``nvidia-ml-py``) without tracebacks.

NVML is what ``nvidia-smi`` reads: memory used on the whole device (every process, plus the
CUDA context), utilization, driver version. Two traps handled here:

* On a machine without the NVIDIA driver, ``nvmlInit()`` raises ``NVMLError_LibraryNotFound``.
  ``probe()`` turns that into a value that says so.
* NVML numbers devices in PCI order and ignores ``CUDA_VISIBLE_DEVICES``; torch numbers them in
  its own order. ``probe()`` maps each NVML device to its CUDA index by UUID.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["NvmlDevice", "NvmlStatus", "probe", "init", "shutdown"]

_lock = threading.Lock()
_initialized = 0


@dataclass(frozen=True)
class NvmlDevice:
    nvml_index: int
    name: str
    uuid: str
    total_bytes: int
    used_bytes: int
    cuda_index: int | None  # None: not visible to torch (hidden by CUDA_VISIBLE_DEVICES)


@dataclass(frozen=True)
class NvmlStatus:
    available: bool
    reason: str = ""  # why not, when not available
    driver_version: str | None = None
    devices: tuple[NvmlDevice, ...] = field(default_factory=tuple)


def _pynvml():
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("the nvidia-ml-py package is not installed (pip install nvidia-ml-py)") from exc
    return pynvml


def init() -> None:
    """Initialise NVML once per process (reference counted, thread safe).

    Raises ``RuntimeError`` with one sentence when NVML cannot start.
    """
    global _initialized
    pynvml = _pynvml()
    with _lock:
        if _initialized == 0:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError_LibraryNotFound as exc:
                raise RuntimeError(
                    "the NVIDIA driver's NVML library was not found (no NVIDIA driver on this machine)"
                ) from exc
            except pynvml.NVMLError as exc:
                raise RuntimeError(f"NVML failed to start: {exc}") from exc
        _initialized += 1


def shutdown() -> None:
    global _initialized
    pynvml = _pynvml()
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


def probe() -> NvmlStatus:
    """What NVML can see right now, or why it cannot see anything. Never raises."""
    try:
        init()
    except RuntimeError as exc:
        return NvmlStatus(False, str(exc))
    pynvml = _pynvml()
    try:
        driver = _decode(pynvml.nvmlSystemGetDriverVersion())
        uuids = cuda_uuids()
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = _decode(pynvml.nvmlDeviceGetUUID(handle))
            devices.append(
                NvmlDevice(
                    nvml_index=i,
                    name=_decode(pynvml.nvmlDeviceGetName(handle)),
                    uuid=uuid,
                    total_bytes=int(mem.total),
                    used_bytes=int(mem.used),
                    cuda_index=uuids.get(uuid),
                )
            )
        return NvmlStatus(True, driver_version=driver, devices=tuple(devices))
    except pynvml.NVMLError as exc:
        return NvmlStatus(False, f"NVML query failed: {exc}")
    finally:
        shutdown()
