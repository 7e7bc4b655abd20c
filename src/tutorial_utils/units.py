"""Byte counts as people read them: binary units (KiB, MiB, GiB), one helper for all modules."""

from __future__ import annotations

import math
import numbers

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

# What parse_bytes reads: binary units (what format_bytes prints), decimal KB/MB/... and the
# one-letter forms (binary, as in PyTorch's and most tools' memory flags).
_FACTORS = {"": 1, "b": 1}
for _i, _unit in enumerate(_UNITS[1:], start=1):
    _FACTORS[_unit.lower()] = 2 ** (10 * _i)  # kib, mib, ... pib
    _FACTORS[_unit[0].lower() + "b"] = 10 ** (3 * _i)  # kb, mb, ... pb
    _FACTORS[_unit[0].lower()] = 2 ** (10 * _i)  # k, m, ... p


# No machine holds anywhere near this much (1024 PiB, an exbibyte); a size above it is a typo.
_TOO_LARGE = 2**60
_TOO_LARGE_TEXT = "1024 PiB"


def format_bytes(nbytes: float | int | None, precision: int = 2) -> str:
    """``format_bytes(3 * 2**20) == '3.00 MiB'``; ``None`` or NaN (unknown) reads as ``'n/a'``.

    Anything but a number (text, a list) is a ``TypeError`` that says to use ``parse_bytes``.
    """
    if nbytes is None:
        return "n/a"
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
        raise TypeError(
            f"format_bytes needs a number of bytes, not {nbytes!r}; "
            "read a size written as text with parse_bytes() first"
        )
    if isinstance(precision, bool) or not isinstance(precision, int) or not 0 <= precision <= 15:
        raise ValueError(
            f"precision must be a whole number of digits from 0 to 15, not {precision!r}"
        )
    if isinstance(nbytes, numbers.Integral) and abs(int(nbytes)) >= 2**1000:  # beyond a float
        return f"{'-' if nbytes < 0 else ''}{abs(int(nbytes)) // 2**50} PiB"
    if math.isnan(nbytes):
        return "n/a"
    if math.isinf(nbytes):
        return ("-" if nbytes < 0 else "") + "inf B"
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


def refuse_bits(text: object, number: str, unit: str) -> None:
    """One sentence when ``unit`` ends in a lowercase ``b``: ``'10 Gb'`` is gigabits, which no
    memory counter counts, so it is refused rather than read as bytes (here and in
    ``fit_inputs.parse_size``)."""
    if not unit.endswith("b"):
        return
    prefix = unit[:-1].rstrip("iI").upper()
    iec = f"{prefix}iB" if prefix else "B"
    number = number.strip()
    raise ValueError(
        f"{text!r} reads as bits (a lowercase b), but memory is counted in bytes: "
        f"write '{number} {prefix}B'"
        + (f" (powers of 1000) or '{number} {iec}' (powers of 1024)" if prefix else "")
    )


def parse_bytes(text: str | int | float) -> int:
    """``parse_bytes('1.5 GiB') == 1610612736``: a size in bytes, 0 or more.

    Reads B, KiB to PiB (powers of 1024, as :func:`format_bytes` prints), KB to PB (powers of
    1000), and K/M/G/T/P (powers of 1024); or a whole number of bytes (``3`` or ``3.0``). A
    fraction of a unit is rounded to the nearest byte (``'1.1 KiB'``). Refused, each with one
    sentence: a fraction of a byte (``'1.5'``, ``2.7``: round it yourself), a negative size, and
    a lowercase ``b`` (``'10 Gb'`` is gigabits; memory is counted in bytes).
    """
    if isinstance(text, bool):
        raise ValueError(f"a size must be a number of bytes or text like '512 MiB', not {text!r}")
    # before float(): an int this large may not fit one
    if isinstance(text, numbers.Integral) and abs(int(text)) >= _TOO_LARGE:
        raise ValueError(
            f"{text} bytes is too large a size (over {_TOO_LARGE_TEXT}); give a real size, "
            "such as '512 MiB'"
        )
    digits = unit = ""
    if isinstance(text, numbers.Real):
        number, factor = float(text), 1
    elif isinstance(text, str):
        s = text.strip().replace("_", "")
        digits = s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
        unit = s[len(digits) :].strip()
        try:
            number, factor = float(digits), _FACTORS[unit.lower()]
        except (ValueError, KeyError):
            raise ValueError(
                f"cannot read {text!r} as a size: write it like '512 MiB', '1.5 GiB' or 1048576"
            ) from None
    else:
        raise ValueError(f"a size must be a number of bytes or text like '512 MiB', not {text!r}")
    refuse_bits(text, digits, unit)
    if not math.isfinite(number):
        raise ValueError(f"a size must be a finite number of bytes, not {text!r}")
    if number < 0:
        raise ValueError(
            f"a size cannot be negative: {text!r}; give 0 bytes or more, such as '512 MiB'"
        )
    nbytes = number * factor
    if not math.isfinite(nbytes) or nbytes >= _TOO_LARGE:
        raise ValueError(
            f"{text!r} is too large a size (over {_TOO_LARGE_TEXT}); write it in bytes, "
            "KiB, MiB, GiB, TiB or PiB, such as '512 MiB'"
        )
    if factor == 1 and nbytes != int(nbytes):  # '1.5', 2.7 or '2.5 B': a fraction of a byte
        raise ValueError(
            f"{text!r} is not a whole number of bytes: round it first (int(...)), "
            "or give a unit ('1.5 KiB')"
        )
    # A fraction of a unit ('1.1 KiB') is the nearest byte.
    return round(nbytes)
