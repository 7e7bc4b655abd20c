"""Checkers for notebook 00 (start here)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import torch

from .. import accounting
from . import Feedback, checker
from .answers import checker_device, describe, whole_number

__all__ = ["check_matmul_peak", "check_peak_of"]

_MiB = 2**20


_MATMUL = (512 * 256 * 4, 256 * 128 * 4, 512 * 128 * 4)  # bytes of a, b and a @ b (float32)


@checker(answers=("matmul_peak",))
def check_matmul_peak(matmul_peak: Callable[[], object]) -> Feedback:
    """``matmul_peak()``: the peak bytes above the start of ``torch.randn(512, 256) @
    torch.randn(256, 128)`` (float32), measured.

    The checker calls it twice, each time with 1 MiB of tensors alive that it made itself, so
    the diagnosis of an answer is the same however often the cell runs and whatever the
    notebook holds: a peak that forgets the start is always over, never right by luck (issue
    20 §6: with the answer a number, re-running the cell kept the last run's output alive and
    changed the diagnosis).
    """
    fb = Feedback("matmul_peak() returns the peak above the start of a 512x256 @ 256x128 matmul")
    a, b, out = _MATMUL
    expected = a + b + out
    fb.hint(
        "run the expression inside a memory.measure('cpu') block; section 3 shows which of "
        "its numbers is the peak above the start"
    )
    fb.fix(
        "with memory.measure('cpu') as m: (the expression); return m.peak_bytes - "
        f"m.start_bytes: both inputs and the output are alive at once, {a:,} + {b:,} + {out:,} "
        "bytes"
    )
    values, ran, read_delta = [], [], []
    for _ in range(2):
        already = torch.ones(_MiB // 4)  # 1 MiB alive before the block, as in any notebook
        with accounting.measure("cpu") as ours, _reads_of_delta() as reads:
            got = fb.run("matmul_peak()", matmul_peak)
        del already
        ran.append(ours.peak_bytes - ours.start_bytes >= expected)
        read_delta.extend(reads)
        value = whole_number(got)
        fb.require(
            value is not None,
            f"matmul_peak() must return a whole number of bytes, not {describe(got)}",
            brief="the answer is not a whole number of bytes",
        )
        values.append(value)
    fb.require(
        values[0] == values[1],
        f"matmul_peak() returned {values[0]:,} bytes, then {values[1]:,}: measure inside the "
        "function each time, and keep nothing between calls",
        brief="matmul_peak() returns a different number each time",
    )
    value = values[0]
    if value == out:
        fb.fail(
            "that is only the output; at the peak both inputs are alive too",
            brief="something else is alive at the peak",
        )
    if value == a + b:
        fb.fail(
            "that is only the inputs; the output is allocated while they are alive",
            brief="something else is alive at the peak",
        )
    if value > expected:
        fb.fail(
            f"{value:,} bytes is more than the block's own peak: it counts tensors alive before "
            "the block (the checker keeps 1 MiB alive); subtract m.start_bytes",
            brief="the number counts memory that was alive before the block",
        )
    fb.require(
        all(ran),
        "matmul_peak() does not run the matmul on the CPU (the checker saw no "
        f"{expected:,} bytes alive at once while it ran): measure the expression, do not type "
        "the number",
        brief="matmul_peak() does not measure the matmul",
    )
    fb.require(
        not read_delta,
        "m.delta_bytes is the end minus the start: what is still alive after the block, not the "
        "highest point during it; the peak above the start is m.peak_bytes - m.start_bytes",
        brief="the number is the change from start to end, not the peak",
    )
    fb.expect(
        value == expected,
        f"{value:,} bytes is not the peak above the start",
        brief="the number is wrong",
    )
    return fb


@contextlib.contextmanager
def _reads_of_delta() -> Iterator[list]:
    """Notes each read of ``Measurement.delta_bytes`` during the block (the concept the peak
    exercises teach against: end - start equals the peak only when everything stays alive)."""
    reads: list = []
    original = accounting.Measurement.__dict__["delta_bytes"]

    def delta_bytes(self):
        if sys._getframe(1).f_globals.get("__name__") != accounting.__name__:  # not its repr
            reads.append(1)
        return original.fget(self)

    accounting.Measurement.delta_bytes = property(delta_bytes, doc=original.__doc__)
    try:
        yield reads
    finally:
        accounting.Measurement.delta_bytes = original


# -----------------------------------------------------------------------------
# Exercise 2: debug a memory report (PyTorch's peak recipe, and what works without a GPU)


def _block(device: torch.device, mib: int, kept: list, calls: list | None = None):
    """A block whose peak is ``2 * mib`` MiB above its start and which leaves ``mib`` MiB alive.

    Each run appends to ``calls``: the checker sees whether ``peak_of`` really ran it."""

    def run() -> None:
        if calls is not None:
            calls.append(mib)
        a = torch.ones(mib * _MiB // 4, device=device)  # mib MiB of float32
        kept.append(a * 2)  # another mib MiB, kept by the caller
        del a

    return run


@checker(answers=("peak_of",))
def check_peak_of(
    peak_of: Callable[[Callable[[], None], torch.device], object], device: object = "cpu"
) -> Feedback:
    """``peak_of(fn, device)``: bytes above the start at the peak while ``fn()`` runs.

    Checked on the notebook's device and on the CPU (the function must work on both), each time
    after a bigger block has run, with tensors already alive, on blocks whose exact peak is known:
    a function that forgets ``reset_peak_memory_stats`` reports the older, bigger peak on a GPU;
    one that reads ``torch.cuda`` on the CPU reports 0; ``end - start`` is not the peak. The
    peak is measured while ``fn`` runs: the checker counts that ``peak_of`` calls ``fn()`` once,
    and a second block of another size (6 MiB peak) rules out a number that does not measure.
    """
    device = checker_device(device, "check_peak_of", allowed=("cuda", "cpu"))
    fb = Feedback("peak_of(fn, device) reports the peak above the start, on a GPU and on the CPU")
    fb.hint("section 3 shows which counters see which tensors, and how a peak is measured")
    fb.fix(
        "on CUDA: torch.cuda.reset_peak_memory_stats(device); before = "
        "torch.cuda.memory_allocated(device); fn(); return torch.cuda.max_memory_allocated("
        "device) - before. On the CPU: with memory.measure(device) as m: fn(); return "
        "m.peak_above_start_bytes"
    )
    for target in dict.fromkeys([device, torch.device("cpu")]):
        for mib in (4, 3):  # the documented block (8 MiB peak), then one of another size
            _check_one_block(fb, peak_of, target, mib)
    return fb


def _check_one_block(fb: Feedback, peak_of: Callable, target: torch.device, mib: int) -> None:
    """Run ``peak_of`` on a block that peaks ``2 * mib`` MiB above its start, on ``target``."""
    want = 2 * mib * _MiB
    kept: list = []
    calls: list = []
    already = torch.ones(_MiB // 4, device=target)  # 1 MiB alive before every call
    _block(target, 8, kept)()  # an earlier, bigger peak (16 MiB) the report must forget
    kept.clear()
    got = fb.run(f"peak_of(fn, {str(target)!r})", peak_of, _block(target, mib, kept, calls), target)
    del already
    kept.clear()
    where = f"on {target}"
    fb.require(
        len(calls) == 1,
        f"{where} peak_of called fn() {len(calls)} times: call it once, and measure the peak "
        "while it runs",
        brief=f"{where} peak_of does not run the block it measures, once",
    )
    value = whole_number(got)
    fb.require(
        value is not None,
        f"peak_of must return a whole number of bytes, not {describe(got)}",
        brief="the answer is not a whole number of bytes",
    )
    if value == 0 and target.type == "cpu":
        fb.fail(
            f"{where} it returned 0 for a block that peaks {2 * mib} MiB above its start: "
            "torch.cuda's counters do not see CPU tensors; use memory.measure(device) there",
            brief=f"{where} it reports 0 bytes for a block that allocates {2 * mib} MiB",
        )
    if value == mib * _MiB:
        fb.fail(
            f"{where} it returned {mib} MiB: what the block left behind (end - start), not the "
            "highest point it reached",
            brief=f"{where} it reports what the block left behind, not its peak",
        )
    if value == 16 * _MiB:
        fb.fail(
            f"{where} it returned 16 MiB, the peak of an earlier block: call "
            "torch.cuda.reset_peak_memory_stats(device) before the block",
            brief=f"{where} it reports the peak of something that ran before",
        )
    if value > want:
        fb.fail(
            f"{where} it returned {value:,} bytes, more than the block's peak ({want:,}): "
            "subtract the bytes alive at the start, and reset the peak first",
            brief=f"{where} it reports more than the block's own peak",
        )
    fb.require(
        value == want,
        f"{where} it returned {value:,} bytes; the block's peak is {want:,} bytes",
        brief=f"{where} the number is wrong",
    )
