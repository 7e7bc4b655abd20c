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
    "MACHINES",
    "SPEED_CLAIMS",
    "Capabilities",
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
    "resolve",
    "capabilities",
]

_KNOWN_TYPES = ("cpu", "cuda", "mps", "meta")
_MAX_INDEX = 127  # torch stores a device index in a signed byte


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
            parts.append(
                f"{format_bytes(self.free_bytes)} free of {format_bytes(self.total_bytes)}"
            )
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
        f"torch was built with CUDA {torch.version.cuda or torch.version.hip} "
        "but found no usable GPU: "
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


def _check_gpu_number(n: object, name: str = "n") -> int:
    """A number of GPUs to ask for: a whole number, 1 or more (asking for 0 GPUs is always true)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} is a number of GPUs, a whole number of 1 or more, not {n!r}")
    return n


def _check_demo_count(n: object) -> int:
    """The number of devices a demo asks for: 1 to 128 (torch numbers GPUs 0 to 127), so a
    typo such as 10**9 is one sentence rather than a billion CPU stand-ins."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_INDEX + 1:
        raise ValueError(
            f"a demo needs at least one device and at most {_MAX_INDEX + 1} (a whole number), "
            f"got n={n!r}"
        )
    return n


def has_gpu(n: int = 1) -> bool:
    """True when at least ``n`` CUDA devices can be used (``n`` is 1 or more)."""
    return gpu_count() >= _check_gpu_number(n)


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
        if spec > _MAX_INDEX:
            raise ValueError(
                f"device index {spec} is far above any machine's GPU count: "
                f"use 0 to {_MAX_INDEX} (devices.gpu_count() says how many GPUs there are)"
            )
        return torch.device("cuda", spec)
    text = spec.strip().lower()
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in _KNOWN_TYPES:
        raise ValueError(
            f"{spec!r} is not a device this course uses: "
            "write 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'"
        )
    return device


def _check_exists(device: torch.device) -> torch.device:
    if device.type == "cuda":
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise DeviceUnavailableError(
                f"{device} was asked for, but CUDA is not available: {reason}. "
                "On Colab: Runtime > Change runtime type > GPU."
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
        raise DeviceUnavailableError(
            "'mps' was asked for, but this is not an Apple-silicon Mac with MPS"
        )
    return device


def resolve(
    prefer: str | int | torch.device | None = None,
    *,
    allowed: tuple[str, ...] = ("cuda", "mps", "cpu"),
    purpose: str = "this",
) -> torch.device:
    """The package's one answer to "which device?"; every module asks it.

    ``None`` or ``'auto'``: the environment variable ``TUTORIAL_DEVICE`` when set, otherwise the
    first available of CUDA, MPS, CPU among ``allowed``. Anything else is parsed and checked to
    exist (``DeviceUnavailableError`` when it does not) and refused with one sentence
    (``ValueError``) when its type is not in ``allowed``: ``purpose`` names who refuses.

    >>> resolve("cpu", allowed=("cuda", "cpu"), purpose="memory.measure")
    device(type='cpu')
    """
    allowed = tuple(allowed)
    unknown = [t for t in allowed if t not in _KNOWN_TYPES]
    if not allowed or unknown:
        raise ValueError(f"allowed must list device types among {_KNOWN_TYPES}, got {allowed!r}")
    if prefer is None:
        prefer = os.environ.get("TUTORIAL_DEVICE") or "auto"
    if isinstance(prefer, str) and prefer.strip().lower() == "auto":
        if "cuda" in allowed and has_gpu():
            return torch.device("cuda", 0)
        if "mps" in allowed and mps_available():
            return torch.device("mps")
        if "cpu" in allowed:
            return torch.device("cpu")
        raise DeviceUnavailableError(
            f"{purpose} needs one of {', '.join(allowed)}, and this machine has none of them"
        )
    device = _check_exists(parse_device(prefer))
    if device.type not in allowed:
        raise ValueError(
            f"{purpose} works on {' or '.join(allowed)}, not on {device.type}; "
            f"pass device={allowed[-1]!r} or one of the others"
        )
    return device


def pick_device(prefer: str | int | torch.device | None = None) -> torch.device:
    """The device to compute on: ``resolve`` with every device type allowed.

    ``None`` or ``'auto'``: the best available (CUDA, then MPS, then CPU). Anything else is parsed
    and checked, raising ``DeviceUnavailableError`` with a sentence when it is missing.
    The environment variable ``TUTORIAL_DEVICE`` overrides ``None`` (handy to force the CPU).
    ``'meta'`` (shapes without data) is accepted too; ``'auto'`` never picks it.
    """
    return resolve(prefer, allowed=_KNOWN_TYPES, purpose="pick_device")


def require_gpu(n: int = 1, why: str = "this cell") -> None:
    """Raise ``DeviceUnavailableError`` unless ``n`` GPUs are usable; the message says why not.

    The GPU check and the GPU benchmarks call it before their CUDA-only parts, and show its
    sentence as the reason a part was skipped.
    """
    _check_gpu_number(n)
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
    """``n`` devices for a demo that needs several: ``cuda:0..n-1`` if present, else ``n`` x
    ``cpu``."""
    if has_gpu(_check_demo_count(n)):
        return DeviceSet(tuple(torch.device("cuda", i) for i in range(n)), stand_ins=False)
    return DeviceSet(tuple(torch.device("cpu") for _ in range(n)), stand_ins=True)


_MiB = 1024**2
_GiB = 1024**3

# Speed claims a notebook may assert, and the hardware each one needs. A check that states a
# speed effect names its requirement (``caps.needs(claim)``) and runs only where
# ``caps.expects_speedup(claim)`` is True, so a T4 is never asked for a bf16 speedup.
SPEED_CLAIMS: dict[str, tuple[tuple[int, int], str]] = {
    "fp16 autocast": ((7, 0), "fp16 Tensor Cores (compute capability 7.0 or newer)"),
    "bf16 autocast": ((8, 0), "native bf16 (compute capability 8.0 or newer)"),
    "TF32": ((8, 0), "TF32 matrix units (compute capability 8.0 or newer)"),
    "cudnn.benchmark": ((3, 5), "cuDNN on a CUDA GPU"),
}


@dataclass(frozen=True)
class Capabilities:
    """What this machine can do, and every decision the course makes from it, in one place.

    Notebooks read these fields instead of deciding inline (``if caps.grad_scaler: ...``), and the
    tests build one per machine a learner has (``Capabilities.machine("t4")``) to check every
    decision without the hardware. ``capabilities()`` describes the machine it runs on.

    >>> caps = Capabilities.machine("t4")
    >>> caps.amp_dtype, caps.grad_scaler, caps.tf32, caps.expects_speedup("bf16 autocast")
    (torch.float16, True, False, False)
    """

    kind: str  # the device type the notebooks compute on: "cuda", "mps" or "cpu"
    name: str
    gpu_count: int = 0
    compute_capability: tuple[int, int] | None = None  # of cuda:0; None off CUDA
    total_bytes: int | None = None  # memory of cuda:0; None off CUDA

    # ------------------------------------------------------------------ where things run
    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0) if self.kind == "cuda" else torch.device(self.kind)

    @property
    def cuda(self) -> bool:
        """A CUDA GPU is here: the GPU-only cells (allocator, OOM, events, cuDNN) run for real."""
        return self.kind == "cuda"

    def _cc_at_least(self, major: int, minor: int = 0) -> bool:
        return self.kind == "cuda" and (self.compute_capability or (0, 0)) >= (major, minor)

    # ------------------------------------------------------------------ precision (04, 05, 06)
    @property
    def tensor_cores(self) -> bool:
        """fp16 Tensor Cores: compute capability 7.0 (Volta) and newer."""
        return self._cc_at_least(7, 0)

    @property
    def fp8_matmul(self) -> bool:
        """FP8 Tensor Cores (``torch._scaled_mm`` on CUDA): compute capability 8.9 (Ada, Hopper)
        and newer."""
        return self._cc_at_least(8, 9)

    @property
    def native_bf16(self) -> bool:
        """bf16 in the GPU's hardware: compute capability 8.0 (Ampere) and newer.

        Not ``torch.cuda.is_bf16_supported()``: by default that also counts emulation, and says
        True on a T4 or a V100, where bf16 runs slower than fp32.
        """
        return self._cc_at_least(8, 0)

    @property
    def tf32(self) -> bool:
        """TF32 matrix units: compute capability 8.0 (Ampere) and newer."""
        return self._cc_at_least(8, 0)

    @property
    def amp_dtype(self) -> torch.dtype:
        """The autocast dtype: bf16 where the GPU has it, fp16 on older GPUs and MPS, bf16 on
        the CPU."""
        if self.kind == "cuda":
            return torch.bfloat16 if self.native_bf16 else torch.float16
        return torch.float16 if self.kind == "mps" else torch.bfloat16

    @property
    def grad_scaler(self) -> bool:
        """fp16 needs a ``GradScaler`` (small gradients underflow); bf16 has fp32's range."""
        return self.amp_dtype == torch.float16

    @property
    def amp_speedup_expected(self) -> bool:
        """Autocast (in ``amp_dtype``) is expected to beat fp32: a GPU with Tensor Cores."""
        return self.tensor_cores

    def expects_speedup(self, claim: str) -> bool:
        """May a notebook assert that ``claim`` (a key of ``SPEED_CLAIMS``) beats fp32 here?

        Only on a CUDA GPU with the hardware the claim needs: fp16 autocast on a T4 or newer,
        bf16 autocast and TF32 on an A100 or newer. On a CPU or MPS no speed claim is made.
        """
        (major, minor), _ = self._claim(claim)
        return self._cc_at_least(major, minor)

    def needs(self, claim: str) -> str:
        """The hardware ``claim`` needs, for an assert's message: 'needs native bf16 (...)'."""
        _, requirement = self._claim(claim)
        return f"{claim} is faster than fp32 only with {requirement}"

    @staticmethod
    def _claim(claim: str) -> tuple[tuple[int, int], str]:
        try:
            return SPEED_CLAIMS[claim]
        except KeyError:
            raise ValueError(
                f"unknown speed claim {claim!r}; the course makes these: {', '.join(SPEED_CLAIMS)}"
            ) from None

    # ---------------------------------------------------------- memory, budgets (00, 04, 06)
    @property
    def memory_device(self) -> torch.device:
        """Where memory is measured exactly: the GPU's allocator on CUDA, the CPU elsewhere.

        MPS has no peak counter, so on Apple silicon the memory lessons run on CPU tensors.
        """
        return self.device if self.kind == "cuda" else torch.device("cpu")

    @property
    def memory_note(self) -> str:
        """One sentence for the learner: where memory is measured here, and how exactly."""
        if self.kind == "cuda":
            return "memory is read from the CUDA caching allocator of cuda:0 (exact, to the byte)"
        if self.kind == "mps":
            return (
                "MPS has no peak-memory counter, so the memory lessons measure CPU tensors here "
                "(exact, by counting tensor storages)"
            )
        return "memory is measured on the CPU by counting tensor storages (exact, to the byte)"

    @property
    def oom_lab_headroom_bytes(self) -> int:
        """Budget above the baseline in 05's out-of-memory lab.

        40 MiB where memory is counted exactly (CPU, MPS's CPU tensors); 128 MiB on a GPU, whose
        caching allocator rounds every block up (to 2 MiB segments and 512-byte blocks).
        """
        return (128 if self.kind == "cuda" else 40) * _MiB

    @property
    def capstone_shape(self) -> tuple[int, int]:
        """(batch, sequence length) of 07's training run: larger on a GPU, where block rounding
        in the caching allocator must stay small next to the budget. A few hundred MiB at most:
        it fits the smallest GPU the course supports (a T4's 15 GiB) many times over."""
        return (256, 128) if self.kind == "cuda" else (64, 64)

    @property
    def speed_shape(self) -> tuple[int, int, int]:
        """(width, hidden, batch) of 05's speed table: big enough to keep a GPU busy (under
        2 GiB in fp32 with gradients), small on a CPU, so that the table takes seconds there."""
        return (1024, 4096, 8192) if self.kind == "cuda" else (256, 512, 128)

    @property
    def demo_tensor_bytes(self) -> int:
        """The largest single tensor a demo allocates: an eighth of the GPU (at most 4 GiB),
        so it fits next to everything else on a T4 (15 GiB -> 1.9 GiB); 256 MiB off CUDA."""
        if self.kind == "cuda" and self.total_bytes:
            return min(4 * _GiB, self.total_bytes // 8)
        return 256 * _MiB

    def budget_bytes(self, share: float) -> int:
        """``share`` (between 0 and 1) of the GPU's memory, in bytes: 0.5 on a T4 is 7.5 GiB.

        Raises ``ValueError`` with one sentence off CUDA, where a budget is a byte count you choose.
        """
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"share is a fraction of the GPU's memory in (0, 1], not {share!r}")
        if not self.cuda or not self.total_bytes:
            raise ValueError(
                f"budget_bytes needs a CUDA GPU and this is {self.kind}: give a budget in bytes"
            )
        return int(self.total_bytes * share)

    def fits(self, nbytes: int, share: float = 0.9) -> bool:
        """Do ``nbytes`` fit in ``share`` of the GPU's memory? True off CUDA (no GPU to fill)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes is a whole number of bytes, 0 or more, not {nbytes!r}")
        if not self.cuda or not self.total_bytes:
            return True
        return nbytes <= self.budget_bytes(share)

    # ------------------------------------------------------------------ several devices (07, 08)
    def ddp_backend(self, nproc: int = 2) -> str:
        """NCCL when every process gets its own GPU, gloo otherwise."""
        return "nccl" if self.kind == "cuda" and self.gpu_count >= nproc else "gloo"

    @property
    def multi_gpu(self) -> bool:
        """Two or more GPUs: DataParallel, NCCL DDP and the model-parallel branches run on them."""
        return self.kind == "cuda" and self.gpu_count >= 2

    @property
    def data_parallel_branch(self) -> str:
        """What 03's DataParallel cell shows here.

        ``"replicas"``: 2+ GPUs, the batch is split over real replicas. ``"one_gpu"``: a single
        GPU, nothing to split. ``"pass_through"``: no CUDA, DataParallel calls the module as is.
        """
        if self.multi_gpu:
            return "replicas"
        return "one_gpu" if self.kind == "cuda" and self.gpu_count == 1 else "pass_through"

    def demo_devices(self, n: int = 2) -> DeviceSet:
        """``n`` devices for a multi-device demo on this machine: GPUs when it has ``n``, else
        ``n`` CPU stand-ins (the same answer as ``devices.demo_devices`` gives on the machine)."""
        _check_demo_count(n)
        if self.kind == "cuda" and self.gpu_count >= n:
            return DeviceSet(tuple(torch.device("cuda", i) for i in range(n)), stand_ins=False)
        return DeviceSet(tuple(torch.device("cpu") for _ in range(n)), stand_ins=True)

    # ------------------------------------------------------------------ shown to the learner
    def __str__(self) -> str:
        parts = [f"{self.name} ({self.kind})"]
        if self.compute_capability is not None:
            parts.append(
                f"compute capability {self.compute_capability[0]}.{self.compute_capability[1]}"
            )
        if self.total_bytes is not None:
            parts.append(format_bytes(self.total_bytes))
        if self.gpu_count > 1:
            parts.append(f"{self.gpu_count} GPUs")
        return ", ".join(parts)

    def plan(self) -> dict[str, str]:
        """Every decision, as text, for a table in notebook 00 or a test's failure message."""
        return {
            "device": str(self.device),
            "autocast dtype": str(self.amp_dtype).replace("torch.", ""),
            "GradScaler": "yes" if self.grad_scaler else "no",
            "TF32": "available" if self.tf32 else "no",
            "speed claims": ", ".join(c for c in SPEED_CLAIMS if self.expects_speedup(c))
            or "none (no GPU with Tensor Cores)",
            "memory measured on": str(self.memory_device),
            "DDP backend (2 processes)": self.ddp_backend(2),
            "DataParallel": self.data_parallel_branch.replace("_", " "),
        }

    @classmethod
    def machine(cls, key: str) -> Capabilities:
        """A machine a learner may have, for tests and docs: one of ``MACHINES``' keys."""
        try:
            return MACHINES[key]
        except KeyError:
            raise ValueError(
                f"unknown machine {key!r}; pick one of {', '.join(MACHINES)}"
            ) from None


# The machines the course is written for. Memory sizes are what torch reports, rounded.
MACHINES: dict[str, Capabilities] = {
    "cpu": Capabilities("cpu", "CPU"),
    "mps": Capabilities("mps", "Apple GPU (MPS)"),
    "t4": Capabilities("cuda", "Tesla T4", 1, (7, 5), 15 * _GiB),
    "v100": Capabilities("cuda", "Tesla V100-SXM2-16GB", 1, (7, 0), 16 * _GiB),
    "a100": Capabilities("cuda", "NVIDIA A100-SXM4-40GB", 1, (8, 0), 40 * _GiB),
    "h100": Capabilities("cuda", "NVIDIA H100 80GB HBM3", 1, (9, 0), 80 * _GiB),
    "h200": Capabilities("cuda", "NVIDIA H200", 1, (9, 0), 140 * _GiB),
    "2x_t4": Capabilities("cuda", "Tesla T4", 2, (7, 5), 15 * _GiB),
    "2x_a100": Capabilities("cuda", "NVIDIA A100-SXM4-40GB", 2, (8, 0), 40 * _GiB),
}


def capabilities(prefer: str | int | torch.device | None = None) -> Capabilities:
    """Describe this machine (or the device ``prefer`` picks, e.g. ``'cpu'`` to force the CPU)."""
    device = resolve(prefer, allowed=("cuda", "mps", "cpu"), purpose="devices.capabilities")
    if device.type == "cuda":
        info = _cuda_info(device.index or 0)
        return Capabilities("cuda", info.name, gpu_count(), info.capability, info.total_bytes)
    if device.type == "mps":
        return Capabilities("mps", "Apple GPU (MPS)")
    return Capabilities("cpu", platform.processor() or platform.machine() or "CPU")
