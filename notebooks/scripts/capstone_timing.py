"""Capstone 1 (notebook 06 §5): one line per combination, its time against the plain step's.

The notebook times the steps itself (interleaved rounds, outside the accountant); this turns its
samples into words: a combination is faster or slower than plain only when every sample of it
is on one side of every sample of plain's, and the reason printed is the one for that side.
"""

from __future__ import annotations

import statistics

import torch

from tutorial_utils.units import format_bytes

WHY = {  # technique: (what it costs when slower, what it saves when faster)
    "checkpointing": (
        "each encoder layer's forward runs again in backward",
        "it keeps fewer bytes alive, and here that outweighs the forward it repeats",
    ),
    "4 micro-batches": (
        "the same arithmetic in 4 times as many, smaller operators",
        "smaller operators whose data stays in the CPU's caches",
    ),
    "bf16 autocast": (
        "casts to and from bf16, and bf16 arithmetic on {unit}",
        "half the bytes per value, and bf16 arithmetic on {unit}",
    ),
}


def against_plain(seconds: dict[str, list[float]], name: str) -> str:
    """Faster, slower, or no difference that holds: every sample on one side of plain's."""
    if min(seconds[name]) > max(seconds["plain"]):
        return "slower in every round"
    if max(seconds[name]) < min(seconds["plain"]):
        return "faster in every round"
    return "no difference that holds"


def verdict(name: str, peak: int, seconds: dict[str, list[float]], device: torch.device) -> str:
    """``name``'s peak, median time (range) and ratio to plain's, the verdict, and why."""
    ms = {n: 1e3 * statistics.median(s) for n, s in seconds.items()}
    low, high = 1e3 * min(seconds[name]), 1e3 * max(seconds[name])
    line = f"{name:32} {format_bytes(peak):>10}  {ms[name]:6.1f} ms ({low:.1f}-{high:.1f})"
    line += f", {ms[name] / ms['plain']:.2f}x plain"
    if name == "plain":
        return line
    said = against_plain(seconds, name)
    unit = torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else "the GPU"
    cost, gain = (w.format(unit=unit) for w in WHY.get(name, ("", "")))
    reason = {"slower in every round": cost, "faster in every round": gain}.get(
        said, "the rounds overlap"
    )
    return f"{line}: {said}" + (f": {reason}" if reason else "")
