"""What every checker needs to judge a learner's value without being fooled by it.

A learner's answer may be ``None`` (a missing ``return``), NaN (which compares false both ways,
so ``abs(nan - x) > tol`` is False and ``max(0.0, nan)`` is 0.0), ``mock.ANY`` or an ``int``
subclass whose ``__eq__`` says yes to everything. These helpers turn an answer into a plain
Python value first (or say it is not one), so the comparison that follows is the checker's own.

``LeftoverGradients`` hands a learner's training step a model whose ``.grad`` still holds a
previous step's gradients, and says whether the step cleared them before its first backward.

``META`` is the device every machine has: checkers run the learner's code there too, so a
tensor made on the CPU by mistake shows as a device mismatch even without a GPU.
"""

from __future__ import annotations

import copy
import dis
import math
import numbers
import operator
import types
from dataclasses import dataclass
from typing import Any

import torch

from .. import devices
from . import _describe as describe

__all__ = [
    "META",
    "Given",
    "LeftoverGradients",
    "checker_device",
    "describe",
    "finite_number",
    "number_problem",
    "placeholder",
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


# -----------------------------------------------------------------------------
# Placeholders: what an exercise cell holds before the learner touched it

_NOTHING_OPS = {"RESUME", "NOP", "CACHE", "LOAD_CONST", "RETURN_CONST", "RETURN_VALUE"}


def _does_nothing(fn: types.FunctionType) -> bool:
    """Is ``fn``'s body only ``pass``, ``...``, ``return None`` or ``return ...`` (a docstring
    allowed)? Read from its bytecode, so it works for functions typed in a notebook."""
    for ins in dis.get_instructions(fn):
        if ins.opname not in _NOTHING_OPS:
            return False
        if ins.opname in ("LOAD_CONST", "RETURN_CONST") and ins.argval not in (None, Ellipsis):
            return False
    return True


def placeholder(value: object, *, zero: bool = False) -> str | None:
    """How ``value`` shows it is still an exercise's placeholder, or ``None`` when it is an answer.

    Placeholders are what the notebooks' TODO cells hold: ``...``, ``None``, a string starting
    with ``TODO`` (or an empty one, or ``"..."`` typed as text), a function whose body only
    returns ``None`` (``pass``, ``...``), a non-empty dict whose values are all placeholders
    (``{70000.0: "TODO"}``), and, with ``zero=True``, a bare ``0`` (an exercise that starts
    from ``answer = 0``). Anything the learner computed is an answer, right or wrong: a
    function with a body, ``0.0``, ``5``.
    """
    if value is Ellipsis:
        return "`...`"
    if value is None:
        return "None"
    if isinstance(value, str):  # "TODO", "", and the ellipsis typed as text ("...", "…")
        text = value.strip()
        untouched = not text or text.upper().startswith("TODO") or text in ("...", "\u2026")
        return repr(value) if untouched else None
    if zero and type(value) is int and value == 0:
        return "0"
    if isinstance(value, types.FunctionType) and _does_nothing(value):
        return f"{value.__name__} does nothing yet: it returns None"
    if type(value) is dict and value and all(placeholder(v) for v in value.values()):
        return "a dict of TODO placeholders"
    return None


# -----------------------------------------------------------------------------
# Given: an input the learner's code gets a copy of


def _changes(original: Any, handed: Any, where: str) -> str | None:
    """The first way ``handed`` (the learner's copy) differs from ``original``, in words."""
    if isinstance(original, torch.Tensor):
        if not isinstance(handed, torch.Tensor):
            return f"{where} was replaced by {describe(handed)}"
        for attr in ("dtype", "device"):
            if getattr(handed, attr) != getattr(original, attr):
                return (
                    f"{where} changed {attr} from {getattr(original, attr)} to "
                    f"{getattr(handed, attr)}"
                )
        if handed.shape != original.shape:
            return f"{where} changed shape from {tuple(original.shape)} to {tuple(handed.shape)}"
        if handed.requires_grad != original.requires_grad:
            return f"{where} changed requires_grad to {handed.requires_grad}"
        if original.device.type != "meta":
            a, b = original.detach(), handed.detach()
            same = torch.equal(a, b) or (
                a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())
            )
            if not same:
                return f"{where} changed its values (an in-place operation such as .zero_())"
        return None
    if isinstance(original, dict):
        if type(handed) is not type(original) or list(handed) != list(original):
            return f"the keys of {where} changed"
        for key in original:
            found = _changes(original[key], handed[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(original, (list, tuple)):
        if type(handed) is not type(original) or len(handed) != len(original):
            return f"{where} changed its length or type"
        for i, (o, h) in enumerate(zip(original, handed, strict=True)):
            found = _changes(o, h, f"{where}[{i}]")
            if found:
                return found
        return None
    if type(handed) is not type(original) or handed != original:
        return f"{where} was changed to {describe(handed)}"
    return None


@dataclass(frozen=True)
class Given:
    """An input for the learner's code: ``Feedback.run`` hands over a copy, then checks it.

    The checker keeps ``value`` (its own data, or the notebook's) for the reference, and the
    learner's code never sees it: ``copy()`` makes the copy the code gets (tensors, dicts,
    lists and tuples copied deeply, views kept as views), ``require_unchanged`` fails the
    check with a sentence when the code changed that copy. So ``labels.zero_()`` in a step
    neither fools the reference nor wipes the notebook's labels.
    """

    name: str
    value: Any

    def copy(self) -> Any:
        """A private copy of ``value`` for the learner's code (views of one tensor stay views)."""
        try:
            return copy.deepcopy(self.value)
        except RuntimeError as err:  # a non-leaf tensor: the checker's own bug
            raise ValueError(
                f"the checker's input {self.name} cannot be copied ({err}): pass plain data"
            ) from None

    def changes(self, handed: Any) -> str | None:
        """How the learner's copy ``handed`` differs from the original, or ``None``."""
        return _changes(self.value, handed, self.name)

    def require_unchanged(self, fb: Any, what: str, handed: Any) -> None:
        """Fail ``fb`` (a ``Feedback``) when the learner's code changed its copy."""
        found = self.changes(handed)
        fb.require(
            found is None,
            f"{what} changed its input: {found}. Leave the inputs as they are: compute new "
            "tensors from them (out of place) or work on a copy",
            brief=f"{what} changes the {self.name} it is given",
        )


# -----------------------------------------------------------------------------
# Leftover gradients: a training step starts from what the previous step left in .grad


class LeftoverGradients:
    """A training step's model as a previous step leaves it: ``.grad`` still full.

    ``optimizer.step()`` does not clear the gradients; the next step must (``optimizer.zero_grad()``
    at its start), or its backward passes add to them. On a fresh model ``.grad`` is empty and a
    step without ``zero_grad`` looks right, so a grader that runs a learner's step puts
    ``grads`` (its own reference, made before the step runs) into ``.grad`` first. A hook on each
    parameter, run before a backward pass adds to ``.grad``, notes what ``.grad`` held at the
    step's first backward: ``kept`` is True when some of it was still the leftover (non-zero).
    ``zero_grad()`` at any point before the first backward, ``set_to_none`` or not, clears it;
    a step that clears them only at its end, after ``optimizer.step()``, relies on its caller
    having cleared them, and is refused too.
    """

    HINT = (
        "a model's .grad keeps what the previous step's backward left there until something "
        "clears it: where does optimizer.zero_grad() belong in a step?"
    )
    FIX = (
        "call optimizer.zero_grad(set_to_none=True) at the start of the step, before the first "
        "backward: otherwise every backward adds to the previous step's gradients"
    )
    BRIEF = "the step adds its gradients to the previous step's"

    def __init__(self, params: list[torch.Tensor], grads: list[torch.Tensor]):
        if len(params) != len(grads):
            raise ValueError("LeftoverGradients: one leftover gradient per parameter")
        self.kept = False
        self._seen: set[int] = set()
        self._handles = []
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.grad = g.detach().to(dtype=p.dtype, device=p.device).clone()
        for p in params:
            if p.requires_grad:
                self._handles.append(p.register_hook(self._before_adding(p)))

    def _before_adding(self, p: torch.Tensor):
        def hook(_grad: torch.Tensor) -> None:
            if id(p) in self._seen:  # a later backward (micro-batches) adds on purpose
                return
            self._seen.add(id(p))
            if p.grad is not None and p.grad.device.type != "meta":
                self.kept = self.kept or bool(p.grad.detach().count_nonzero())

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def require_cleared(self, fb: Any, what: str) -> None:
        """Fail ``fb`` with the zero_grad hint when the step kept the leftover gradients."""
        if self.kept:
            fb.hints[:], fb.fixes[:] = [self.HINT], [self.FIX]
            fb.fail(
                f"{what} started from a model whose .grad still held the previous step's "
                "gradients, and its first backward added to them, so the optimizer stepped "
                "with both steps' gradients: call optimizer.zero_grad(set_to_none=True) at "
                "the start of the step",
                brief=self.BRIEF,
            )
