"""Capstone 1 (notebook 06 §5): one line per combination, its time against the plain step's.

The notebook times the steps itself (interleaved rounds, outside the accountant) and counts the
operators one step dispatches; this turns both into words. A combination is faster or slower
than plain only when every sample of it is on one side of every sample of plain's. The reason
printed is derived from this run too, never from a table written in advance: a step's time is
its number of operators times their mean time, so the line says which of the two factors moved
more against plain's.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode

from tutorial_utils.units import format_bytes


class _CountOperators(TorchDispatchMode):
    """Counts every ATen operator dispatched inside the block (backward and recomputation too)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_operators(step: Callable[..., object], *args, **kwargs) -> collections.Counter[str]:
    """``{ATen operator: calls}`` of one call of ``step(*args, **kwargs)``: forward, backward
    (recomputation included) and the optimizer's step."""
    with _CountOperators() as mode:
        step(*args, **kwargs)
    return mode.counts


def against_plain(seconds: dict[str, list[float]], name: str) -> str:
    """Faster, slower, or no difference that holds: every sample on one side of plain's."""
    if min(seconds[name]) > max(seconds["plain"]):
        return "slower in every round"
    if max(seconds[name]) < min(seconds["plain"]):
        return "faster in every round"
    return "no difference that holds"


def verdict(
    name: str,
    peak: int,
    seconds: dict[str, list[float]],
    operators: dict[str, collections.Counter[str]],
) -> str:
    """``name``'s peak, median time (range), ratio to plain's, operators per step and their mean
    time; the verdict, and which factor (how many operators, or how long each took) moved more."""
    ms = {n: 1e3 * statistics.median(s) for n, s in seconds.items()}
    ops = {n: sum(c.values()) for n, c in operators.items()}
    per_op = {n: 1e6 * statistics.median(seconds[n]) / ops[n] for n in seconds}  # microseconds
    low, high = 1e3 * min(seconds[name]), 1e3 * max(seconds[name])
    line = f"{name:32} {format_bytes(peak):>10}  {ms[name]:6.1f} ms ({low:.1f}-{high:.1f})"
    line += f", {ms[name] / ms['plain']:.2f}x plain; {ops[name]:,} operators"
    line += f" of {per_op[name]:.0f} µs on average"
    casts = operators[name]["_to_copy"]
    if casts:
        line += f" ({casts} of them casts)"
    if name == "plain":
        return line
    said = against_plain(seconds, name)
    if said == "no difference that holds":
        return f"{line}: {said}"
    count_ratio, each_ratio = ops[name] / ops["plain"], per_op[name] / per_op["plain"]
    if abs(math.log(count_ratio)) >= abs(math.log(each_ratio)):
        why = f"mostly from the number of operators ({count_ratio:.2f}x plain's)"
    else:
        why = f"mostly from each operator's mean time ({each_ratio:.2f}x plain's)"
    return f"{line}: {said}, {why}"
