"""Byte counts as people read them: binary units (KiB, MiB, GiB), one helper for all modules."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(nbytes: float | int | None, precision: int = 2) -> str:
    """``format_bytes(3 * 2**20) == '3.00 MiB'``; ``None`` (unknown) reads as ``'n/a'``."""
    if nbytes is None:
        return "n/a"
    sign = "-" if nbytes < 0 else ""
    value = float(abs(nbytes))
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.{precision}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str | int | float) -> int:
    """``parse_bytes('1.5 GiB') == 1610612736``.

    Accepts B, KiB/MiB/GiB/TiB, and KB/MB/GB/TB (powers of 1000).
    """
    if isinstance(text, (int, float)):
        return int(text)
    s = text.strip().replace("_", "")
    number = s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
    unit = s[len(number) :].strip().lower()
    factors = {
        "": 1,
        "b": 1,
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "tib": 2**40,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "tb": 10**12,
        "k": 2**10,
        "m": 2**20,
        "g": 2**30,
        "t": 2**40,
    }
    if unit not in factors or not number:
        raise ValueError(
            f"cannot read {text!r} as a size: write it like '512 MiB', '1.5 GiB' or 1048576"
        )
    return int(float(number) * factors[unit])
