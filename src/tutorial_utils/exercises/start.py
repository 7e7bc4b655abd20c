"""Checkers for notebook 00 (start here)."""

from __future__ import annotations

from numbers import Integral

from . import Feedback

__all__ = ["check_tensor_bytes", "check_matmul_peak"]


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_tensor_bytes(answer: object) -> Feedback:
    """Bytes of ``torch.zeros(1000, 3, 224, 224, dtype=torch.bfloat16)``."""
    fb = Feedback("bytes of a 1000 x 3 x 224 x 224 bf16 tensor")
    elements = 1000 * 3 * 224 * 224
    expected = elements * 2
    if not fb.expect(_is_int(answer), f"give a whole number of bytes, not {answer!r}"):
        fb.hint("multiply the number of elements by the bytes per element")
        return fb
    if answer == elements:
        fb.expect(False, "that is the number of elements; each bf16 element takes 2 bytes")
    elif answer == elements * 4:
        fb.expect(False, "that is the size in float32 (4 bytes per element); bfloat16 is 2 bytes")
    else:
        fb.expect(answer == expected, f"{answer:,} bytes is not right")
        if answer != expected:
            fb.hint("torch.finfo(torch.bfloat16).bits // 8 gives the bytes per element")
    return fb


def check_matmul_peak(answer: object) -> Feedback:
    """Peak bytes above the start of ``torch.randn(512, 256) @ torch.randn(256, 128)`` (float32)."""
    fb = Feedback("peak of a 512x256 @ 256x128 float32 matmul")
    a, b, out = 512 * 256 * 4, 256 * 128 * 4, 512 * 128 * 4
    expected = a + b + out
    if not fb.expect(_is_int(answer), f"give a whole number of bytes, not {answer!r}"):
        fb.hint("with memory.measure('cpu') as m: ...; then m.peak_bytes - m.start_bytes")
        return fb
    if answer == out:
        fb.expect(False, "that is only the output; at the peak both inputs are alive too")
    elif answer == a + b:
        fb.expect(False, "that is only the inputs; the output is allocated while they are alive")
    else:
        fb.expect(answer == expected, f"{answer:,} bytes is not the peak above the start")
    return fb
