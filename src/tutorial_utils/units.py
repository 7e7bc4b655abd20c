"""Byte counts as people read them: binary units (KiB, MiB, GiB), one helper for all modules."""

from __future__ import annotations

import math

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

# What parse_bytes reads: binary units (what format_bytes prints), decimal KB/MB/... and the
# one-letter forms (binary, as in PyTorch's and most tools' memory flags).
_FACTORS = {"": 1, "b": 1}
for _i, _unit in enumerate(_UNITS[1:], start=1):
    _FACTORS[_unit.lower()] = 2 ** (10 * _i)  # kib, mib, ... pib
    _FACTORS[_unit[0].lower() + "b"] = 10 ** (3 * _i)  # kb, mb, ... pb
    _FACTORS[_unit[0].lower()] = 2 ** (10 * _i)  # k, m, ... p


def format_bytes(nbytes: float | int | None, precision: int = 2) -> str:
    """``format_bytes(3 * 2**20) == '3.00 MiB'``; ``None`` (unknown) reads as ``'n/a'``."""
    if nbytes is None:
        return "n/a"
    sign = "-" if nbytes < 0 else ""
    value = float(abs(nbytes))
    step = 0
    while value >= 1024 and step < len(_UNITS) - 1:  # PiB takes whatever is left
        value /= 1024
        step += 1
    unit = _UNITS[step]
    if unit == "B":
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.{precision}f} {unit}"


def parse_bytes(text: str | int | float) -> int:
    """``parse_bytes('1.5 GiB') == 1610612736``: a size in bytes (callers check the sign).

    Reads B, KiB to PiB (powers of 1024, as :func:`format_bytes` prints), KB to PB (powers of
    1000), and K/M/G/T/P (powers of 1024); or a plain number of bytes.
    """
    if isinstance(text, bool):
        raise ValueError(f"a size must be a number of bytes or text like '512 MiB', not {text!r}")
    if isinstance(text, (int, float)):
        number, factor = float(text), 1
    elif isinstance(text, str):
        s = text.strip().replace("_", "")
        digits = s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
        unit = s[len(digits) :].strip().lower()
        try:
            number, factor = float(digits), _FACTORS[unit]
        except (ValueError, KeyError):
            raise ValueError(
                f"cannot read {text!r} as a size: write it like '512 MiB', '1.5 GiB' or 1048576"
            ) from None
    else:
        raise ValueError(f"a size must be a number of bytes or text like '512 MiB', not {text!r}")
    if not math.isfinite(number):
        raise ValueError(f"a size must be a finite number of bytes, not {text!r}")
    return int(number * factor)
