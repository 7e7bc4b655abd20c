"""What every checker needs to judge a learner's value without being fooled by it.

A learner's answer may be ``None`` (a missing ``return``), NaN (which compares false both ways,
so ``abs(nan - x) > tol`` is False and ``max(0.0, nan)`` is 0.0), ``mock.ANY`` or an ``int``
subclass whose ``__eq__`` says yes to everything. These helpers turn an answer into a plain
Python value first (or say it is not one), so the comparison that follows is the checker's own.

``META`` is the device every machine has: checkers run the learner's code there too, so a
tensor made on the CPU by mistake shows as a device mismatch even without a GPU.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

from .. import devices
from . import _describe as describe

__all__ = [
    "META",
    "checker_device",
    "describe",
    "finite_number",
    "number_problem",
    "same_device",
    "tensor_number",
    "whole_number",
]

META = torch.device("meta")


def whole_number(value: object) -> int | None:
    """``value`` as a plain ``int`` when it is a whole number (not a bool), else ``None``.

    Python and NumPy integers pass; floats, tensors, ``True`` and look-alikes do not. The
    result is an exact ``int``, so an ``int`` subclass cannot bend the comparison after it.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    try:
        return operator.index(value)  # exact int since Python 3.10
    except TypeError:
        return None


def finite_number(value: object) -> float | None:
    """``value`` as a plain finite ``float`` when it is a real number (not a bool), else ``None``.

    NaN and infinities give ``None``; so do tensors (ask for ``.item()``) and strings.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if type(number) is float and math.isfinite(number) else None


def tensor_number(t: torch.Tensor) -> float | None:
    """The value of a one-element tensor with data (not ``meta``) as a finite float, else None."""
    if t.numel() != 1 or t.device.type == "meta" or t.is_complex():
        return None
    return finite_number(t.detach().double().cpu().item())


def same_device(t: torch.Tensor, device: torch.device) -> bool:
    """Is ``t`` on ``device``? ``cuda`` and ``cuda:0`` match when the index is not given."""
    if t.device.type != device.type:
        return False
    return device.index is None or t.device.index in (None, device.index)


def checker_device(
    device: object,
    purpose: str = "this checker",
    allowed: tuple[str, ...] = ("cuda", "mps", "cpu", "meta"),
) -> torch.device:
    """The device a notebook passed to a checker, checked to exist here and to be ``allowed``.

    A string torch does not understand raises ``ValueError``, a device this machine lacks
    ``DeviceUnavailableError``: one sentence each, before the learner's code runs.
    """
    if device is None:
        raise ValueError(f"{purpose} needs a device: pass device='cpu' (or 'cuda')")
    return devices.resolve(device, allowed=allowed, purpose=purpose)


def number_problem(what: str, value: object) -> str:
    """Why ``value`` (returned by ``what``) is not a finite number, in one sentence."""
    if isinstance(value, torch.Tensor):
        return f"{what} returned a tensor: return a Python number (call .item() on it)"
    if value is None:
        return f"{what} returned None: is the `return` statement missing?"
    return f"{what} returned {describe(value)}: return a finite number"
