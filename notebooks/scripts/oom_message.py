"""Notebook 04's reader for a CUDA out-of-memory message (the text of each clause), and for
what an out-of-memory error's traceback keeps alive (``tensors_held``).

The clauses are those of the message built in PyTorch's ``c10/cuda/CUDACachingAllocator.cpp``
(notebook 04 §2 has a table of what each one means); ``to_bytes`` turns a size into bytes.
"""

from __future__ import annotations

import re
import traceback
import weakref

import torch

CLAUSES = {  # clause -> the pattern that finds its value in the CUDA message
    "tried to allocate": r"Tried to allocate ([\d.]+ \w+)",
    "total capacity": r"total capacity of ([\d.]+ \w+)",
    "free": r"of which ([\d.]+ \w+) is free",
    "this process": r"(?:this process|Process \d+) has ([\d.]+ \w+) memory in use",
    "allowed": r"([\d.]+ \w+) allowed",
    "allocated by PyTorch": r"([\d.]+ \w+) is allocated by PyTorch",
    "reserved but unallocated": r"([\d.]+ \w+) is reserved by PyTorch but unallocated",
    "hint": r"(PYTORCH(?:_CUDA)?_ALLOC_CONF=expandable_segments:True)",
}
UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def clauses(message: str) -> dict[str, str | None]:
    """Each clause's value as the message writes it ("32.00 MiB"), None where it is absent."""
    found = {name: re.search(pattern, message) for name, pattern in CLAUSES.items()}
    return {name: m.group(1) if m else None for name, m in found.items()}


def to_bytes(size: str) -> float:
    """ "32.00 MiB" -> 33554432.0"""
    value, unit = size.split()
    return float(value) * UNITS[unit]


def tensors_held(exc: BaseException) -> list[tuple[str, str, weakref.ref]]:
    """(function, variable, weak reference) for each tensor a local of the exception's frames
    holds, the cell's own frame left out (it holds only globals)."""
    return [
        (f.f_code.co_name, k, weakref.ref(v))
        for f, _ in traceback.walk_tb(exc.__traceback__)
        if f.f_code.co_name != "<module>"
        for k, v in f.f_locals.items()
        if isinstance(v, torch.Tensor)
    ]
