"""Find, describe and pick devices (CUDA, MPS, CPU) without raising on any build.

Why this lives in one place: on a CPU-only build of torch, some ``torch.cuda`` calls quietly
return 0 or False while others raise ``AssertionError`` or ``AttributeError``
(``mem_get_info``, ``get_device_name``, ``reset_peak_memory_stats``...). Every notebook asks
the same questions ("is there a GPU? how many? how much memory?"), so the guarding is done
here, once, and tested with CUDA mocked present and absent.

Preference order when picking: CUDA, then Apple's MPS, then the CPU.

>>> pick_device("cpu")
device(type='cpu')
"""

from __future__ import annotations

import os
import platform
import warnings
from dataclasses import dataclass

import torch

from .units import format_bytes

__all__ = [
    "DeviceInfo",
    "DeviceSet",
    "DeviceUnavailableError",
    "cuda_unavailable_reason",
    "demo_devices",
    "gpu_count",
    "has_gpu",
    "list_devices",
    "mps_available",
    "parse_device",
    "pick_device",
    "require_gpu",
]

_KNOWN_TYPES = ("cpu", "cuda", "mps", "meta")


class DeviceUnavailableError(RuntimeError):
    """A device was asked for that this machine does not have. The message says how to get one."""


@dataclass(frozen=True)
class DeviceInfo:
    """One device as a learner would describe it."""

    device: torch.device
    name: str
    total_bytes: int | None = None  # None: unknown (CPU, MPS)
    free_bytes: int | None = None
    capability: tuple[int, int] | None = None  # CUDA compute capability
    note: str = ""

    def __str__(self) -> str:
        parts = [f"{self.device}: {self.name}"]
        if self.total_bytes is not None:
            parts.append(f"{format_bytes(self.free_bytes)} free of {format_bytes(self.total_bytes)}")
        if self.capability is not None:
            parts.append(f"compute capability {self.capability[0]}.{self.capability[1]}")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)


def _call_quietly(fn, *args):
    """Call a torch.cuda function that may warn (no driver) and return (value, warning text)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn(*args)
    text = " ".join(str(w.message).strip() for w in caught)
    return value, text


def cuda_unavailable_reason() -> str | None:
    """``None`` when CUDA works; otherwise one sentence saying why it does not."""
    # ROCm builds answer through torch.cuda too, with torch.version.hip set instead.
    if torch.version.cuda is None and not getattr(torch.version, "hip", None):
        return (
            f"this torch build has no CUDA support (torch {torch.__version__}); "
            "install a CUDA build of torch or use Colab"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() == "":
        return "CUDA_VISIBLE_DEVICES is set to an empty string, which hides every GPU; unset it"
    if visible is not None and visible.strip() in ("-1", "none", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU; unset it"
    try:
        available, warning = _call_quietly(torch.cuda.is_available)
    except Exception as exc:  # a broken driver install can raise here
        return f"torch.cuda.is_available() failed: {exc}"
    if available:
        return None
    detail = f" ({warning})" if warning else ""
    return (
        f"torch was built with CUDA {torch.version.cuda or torch.version.hip} but found no usable GPU: "
        f"no NVIDIA driver, or a driver too old for this build{detail}"
    )


def gpu_count() -> int:
    """Number of CUDA devices torch can use (0 on any machine without one, never raises)."""
    if cuda_unavailable_reason() is not None:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:
        return 0


def has_gpu(n: int = 1) -> bool:
    """True when at least ``n`` CUDA devices can be used."""
    return gpu_count() >= n


def mps_available() -> bool:
    """Apple-silicon GPU (Metal Performance Shaders), False everywhere else."""
    backend = getattr(torch.backends, "mps", None)
    try:
        return bool(backend is not None and backend.is_available())
    except Exception:
        return False


def _cuda_info(index: int) -> DeviceInfo:
    device = torch.device("cuda", index)
    try:
        props = torch.cuda.get_device_properties(index)
        name = props.name
        total = int(props.total_memory)
        capability = (int(props.major), int(props.minor))
    except Exception as exc:
        return DeviceInfo(device, "unknown CUDA device", note=f"properties unavailable: {exc}")
    free: int | None
    try:
        free, total = (int(v) for v in torch.cuda.mem_get_info(index))
    except Exception:
        free = None
    return DeviceInfo(device, name, total, free, capability)


def list_devices() -> list[DeviceInfo]:
    """Every device torch can compute on here: each CUDA GPU, MPS if present, and the CPU."""
    out = [_cuda_info(i) for i in range(gpu_count())]
    if mps_available():
        out.append(DeviceInfo(torch.device("mps"), "Apple GPU (MPS)"))
    cpu_name = platform.processor() or platform.machine() or "CPU"
    out.append(DeviceInfo(torch.device("cpu"), f"{cpu_name}, {os.cpu_count()} logical cores"))
    return out


def parse_device(spec: str | int | torch.device) -> torch.device:
    """Turn ``'cuda:1'``, ``1``, ``'cpu'`` or a ``torch.device`` into a ``torch.device``.

    Raises ``ValueError`` with one sentence for a string torch does not understand, instead of
    torch's own parser error. It does not check that the device exists: see ``pick_device``.
    """
    if isinstance(spec, torch.device):
        return spec
    if isinstance(spec, bool) or not isinstance(spec, (str, int)):
        raise TypeError(
            f"a device is a string like 'cuda:0' or 'cpu', an int index, or a torch.device, "
            f"not {type(spec).__name__}"
        )
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"device index must be 0 or more, got {spec}")
        return torch.device("cuda", spec)
    text = spec.strip().lower()
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in _KNOWN_TYPES:
        raise ValueError(
            f"{spec!r} is not a device this course uses: write 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'"
        )
    return device


def _check_exists(device: torch.device) -> torch.device:
    if device.type == "cuda":
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise DeviceUnavailableError(
                f"{device} was asked for, but CUDA is not available: {reason}. "
                "Notebook 00 shows how to get a GPU on Colab."
            )
        index = 0 if device.index is None else device.index
        count = gpu_count()
        if index >= count:
            raise DeviceUnavailableError(
                f"{device} was asked for, but this machine has {count} GPU(s) "
                f"(cuda:0 to cuda:{count - 1}); pick one of those"
            )
        return torch.device("cuda", index)
    if device.type == "mps" and not mps_available():
        raise DeviceUnavailableError("'mps' was asked for, but this is not an Apple-silicon Mac with MPS")
    return device


def pick_device(prefer: str | int | torch.device | None = None) -> torch.device:
    """The device to compute on.

    ``None`` or ``'auto'``: the best available (CUDA, then MPS, then CPU). Anything else is parsed
    and checked, raising ``DeviceUnavailableError`` with a sentence when it is missing.
    The environment variable ``TUTORIAL_DEVICE`` overrides ``None`` (handy to force the CPU).
    """
    if prefer is None:
        prefer = os.environ.get("TUTORIAL_DEVICE") or "auto"
    if isinstance(prefer, str) and prefer.strip().lower() == "auto":
        if has_gpu():
            return torch.device("cuda", 0)
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    return _check_exists(parse_device(prefer))


def require_gpu(n: int = 1, why: str = "this cell") -> None:
    """Raise ``DeviceUnavailableError`` unless ``n`` GPUs are usable; the message says why not."""
    count = gpu_count()
    if count >= n:
        return
    reason = cuda_unavailable_reason()
    have = f"this machine has {count}" if reason is None else reason
    raise DeviceUnavailableError(
        f"{why} needs {n} GPU(s), but {have}. Run it on a GPU machine, or on Colab "
        "(Runtime > Change runtime type > GPU)."
    )


@dataclass(frozen=True)
class DeviceSet:
    """Devices for a multi-device demo: real GPUs when there are enough, CPU stand-ins otherwise."""

    devices: tuple[torch.device, ...]
    stand_ins: bool

    @property
    def notice(self) -> str:
        names = ", ".join(str(d) for d in self.devices)
        if self.stand_ins:
            return (
                f"{len(self.devices)} CPU stand-ins ({names}): the code is the same as on GPUs, "
                "but nothing runs in parallel and no data moves between devices"
            )
        return f"{len(self.devices)} real GPUs ({names})"

    def __iter__(self):
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def __getitem__(self, i: int) -> torch.device:
        return self.devices[i]

    def __repr__(self) -> str:
        return f"DeviceSet({self.notice})"


def demo_devices(n: int = 2) -> DeviceSet:
    """``n`` devices for a demo that needs several: ``cuda:0..n-1`` if present, else ``n`` x ``cpu``."""
    if n < 1:
        raise ValueError(f"a demo needs at least one device, got n={n}")
    if has_gpu(n):
        return DeviceSet(tuple(torch.device("cuda", i) for i in range(n)), stand_ins=False)
    return DeviceSet(tuple(torch.device("cpu") for _ in range(n)), stand_ins=True)
