"""GPU cards as programs see them, and sizes people type, without torch.

One job: turn ``'A100-80GB'``, ``'RTX 4090'`` or ``'24GB'`` into a ``Gpu``: a name and the
bytes the verdict compares with, and where that figure comes from.

A card's capacity is the total its driver reports, where a report could be found: the
``Memory-Usage`` total of ``nvidia-smi`` (and ``FB Memory Usage: Total`` of ``nvidia-smi -a``),
read from nvidia-smi printouts captured on real machines in November 2024 and published in
thamada/nvidia-smi (each row names its file); the A100 and H100 figures appear the same in
many other published printouts. Elsewhere it is the maker's spec sheet, read as 10**9 bytes per GB,
and the name says so ("spec sheet"): the reported total is then a little larger (an "80 GB"
A100 reports 80 GiB), so a spec figure errs on the side of "does not fit".
``torch.cuda.mem_get_info()``'s total is a little under nvidia-smi's (an A100-SXM4-80GB:
79.15 GiB in a published log); the CUDA context, a headroom term, comes off either.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..units import refuse_bits
from .inputs import key, pick

__all__ = ["CARDS", "GB", "GPUS", "Card", "GiB", "Gpu", "MiB", "gpu", "gpu_memory", "parse_size"]

GB, GiB, MiB = 10**9, 2**30, 2**20


@dataclass(frozen=True)
class Gpu:
    """A card and its memory in bytes (``name`` is what was asked for when it is a size)."""

    name: str
    memory_bytes: int
    source: str = ""

    def __str__(self) -> str:
        if self.name.endswith(" GPU"):
            return self.name
        if self.memory_bytes % MiB == 0 and self.source.startswith("nvidia-smi"):
            return f"{self.name} ({self.memory_bytes // MiB:,} MiB reported)"
        return f"{self.name} ({self.memory_bytes / GB:g} GB, spec sheet)"


@dataclass(frozen=True)
class Card:
    """One row of the table: the reported total in MiB (None where none was found), the spec
    sheet's GB, and the source of the figure used."""

    reported_mib: int | None
    spec_gb: int
    source: str

    @property
    def memory_bytes(self) -> int:
        return self.reported_mib * MiB if self.reported_mib else self.spec_gb * GB


_SMI = "nvidia-smi's total (Memory-Usage), thamada/nvidia-smi"
_SPEC = "the maker's spec sheet (GB = 10**9 bytes); no reported total found"

CARDS: dict[str, Card] = {
    "T4": Card(None, 16, _SPEC),
    "V100-16GB": Card(None, 16, _SPEC),
    "V100-32GB": Card(None, 32, _SPEC),
    "RTX 3090": Card(24576, 24, f"{_SMI} gls/RTX3090_smi.py@b09ef13: GeForce RTX 3090, 24576MiB"),
    "RTX 4090": Card(
        24564, 24, f"{_SMI} package/RTX4090_smi.py@6f38a71: GeForce RTX 4090, 24564MiB"
    ),
    "A10": Card(None, 24, _SPEC),
    "A10G": Card(None, 24, _SPEC),
    "L4": Card(23034, 24, f"{_SMI} gls/L4_smi.py@b09ef13: NVIDIA L4, 23034MiB"),
    "RTX A6000": Card(None, 48, _SPEC),
    "L40S": Card(None, 48, _SPEC),
    "A100-40GB": Card(None, 40, _SPEC),
    "A100-80GB": Card(
        81920, 80, f"{_SMI} gls/A100SXMx4_smi.py@b09ef13: NVIDIA A100-SXM4-80GB, 81920MiB"
    ),
    "H100": Card(
        81559, 80, f"{_SMI} nvsim/H100SXMx8_smi.py@03fbe6e: NVIDIA H100 80GB HBM3, 81559MiB"
    ),
    "H200": Card(None, 141, _SPEC),
}
#: Each card's capacity in bytes, as the verdict uses it.
GPUS: dict[str, int] = {name: card.memory_bytes for name, card in CARDS.items()}
_GPU_ALIASES = {
    "a100": "A100-80GB",
    "a100-40": "A100-40GB",
    "a100-80": "A100-80GB",
    "a100-sxm4-80gb": "A100-80GB",
    "a100-sxm4-40gb": "A100-40GB",
    "h100-80gb": "H100",
    "h100-80gb-hbm3": "H100",
    "h200-141gb": "H200",
    "3090": "RTX 3090",
    "4090": "RTX 4090",
    "geforce-rtx-4090": "RTX 4090",
    "geforce-rtx-3090": "RTX 3090",
    "a6000": "RTX A6000",
    "v100": "V100-32GB",
    "tesla-t4": "T4",
}


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgtp]i?b?|b)?\s*$", re.I)
_FACTORS = {"": GB, "b": 1}
for _i, _p in enumerate("kmgtp", start=1):
    _FACTORS |= {f"{_p}": 10 ** (3 * _i), f"{_p}b": 10 ** (3 * _i), f"{_p}ib": 2 ** (10 * _i)}


def parse_size(text) -> int:
    """``parse_size('24GB') == 24 * 10**9``, ``parse_size('80GiB') == 80 * 2**30``; a bare
    number is GB, as people say "a 24 GB card"."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise TypeError(f"a memory size must be text such as '24GB' or '80GiB', not {text!r}")
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"cannot read {text!r} as a memory size: write it like '24GB' or '80GiB'")
    refuse_bits(text, match.group(1), match.group(2) or "")  # '24Gb' is gigabits
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if unit.endswith("i"):
        unit += "b"
    size = number * _FACTORS[unit]
    if not math.isfinite(size) or size < 2**20 or size > 2**50:
        raise ValueError(
            f"{text!r} is not a GPU's memory: give a size between 1 MiB and 1 PiB, like '24GB'"
        )
    return int(size)


def gpu(text) -> Gpu:
    """A card from ``CARDS`` by name (``'RTX 4090'``, ``'a100-40gb'``) or a size (``'24GB'``)."""
    if isinstance(text, str):
        by_key = {key(n): n for n in CARDS} | {key(a): n for a, n in _GPU_ALIASES.items()}
        name = by_key.get(key(text)) or by_key.get(key(text).removeprefix("nvidia-"))
        if name:
            return Gpu(name, CARDS[name].memory_bytes, CARDS[name].source)
        if not _SIZE.match(text):
            try:
                pick("GPU", text, tuple(CARDS), _GPU_ALIASES)
            except ValueError as err:  # "did you mean", or the choices
                raise ValueError(f"{err}; or give its memory instead, like '24GB'") from None
    return gpu_memory(text)


def gpu_memory(text) -> Gpu:
    """A GPU known by its memory only: ``gpu_memory('80GiB')``."""
    return Gpu(f"{str(text).strip()} GPU", parse_size(text), "the size given")
