"""Checkers for notebook 13 (fewer bytes: communication hooks, FP8, pipeline schedules).

* ``check_powersgd_bytes``: the learner's ``powersgd_bytes(shapes, rank)``, the bytes one DDP rank
  hands to ``all_reduce`` in a step of ``powerSGD_hook`` (fp32): every tensor of one dimension
  whole, every matrix as its two factors P (n x r) and Q (m x r), except a matrix that
  compression would not shrink at least ``MIN_COMPRESSION_RATE`` times, which PyTorch sends
  whole. Graded on a grid of models and ranks against ``powersgd_reference``.
* ``check_to_float8``: the learner's ``to_float8(x)``, a tensor-wise scaled cast to
  ``float8_e4m3fn`` that returns ``(x8, scale_inv)`` as ``torch._scaled_mm`` takes them:
  ``x8.float() * scale_inv`` must give ``x`` back within what one rounding to e4m3 can move it,
  for tensors of tiny, ordinary and large values.
* ``check_stage_ids``: the bug hunt. ``stage_ids(rank, world, style)`` must place two stages per
  rank the way each schedule expects: looped (``r, r + world``) or V-shaped
  (``r, 2 world - 1 - r``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import Feedback, checker
from .answers import Given, describe, finite_number, tensor_number, whole_number

__all__ = [
    "MIN_COMPRESSION_RATE",
    "check_powersgd_bytes",
    "check_stage_ids",
    "check_to_float8",
    "powersgd_reference",
]

# ---------------------------------------------------------------------------------------------
# PowerSGD's bytes per step

#: ``PowerSGDState``'s default: a matrix is compressed only when that shrinks it more than this
MIN_COMPRESSION_RATE = 2


def _compressed(n: int, m: int, rank: int) -> bool:
    """PyTorch's ``_should_compress``: (n + m) r elements, times the rate, below n m."""
    return (n + m) * rank * MIN_COMPRESSION_RATE < n * m


def powersgd_reference(
    shapes: Sequence[Sequence[int]],
    rank: int,
    *,
    compress_all: bool = False,
    vectors: bool = True,
    factors: int = 2,
    width: int = 4,
) -> int:
    """Bytes one rank hands to all_reduce per PowerSGD step. The keywords give the plain
    mistakes (every matrix compressed, the vectors forgotten, one factor, 2-byte elements) so
    the checker can name them."""
    total = 0
    for shape in shapes:
        if len(shape) < 2:
            total += shape[0] if vectors and shape else (1 if vectors else 0)
            continue
        n, m = shape[0], 1
        for d in shape[1:]:
            m *= d  # a conv weight is viewed as (out_channels, everything else)
        if compress_all or _compressed(n, m, rank):
            total += rank * (n + (m if factors == 2 else 0))
        else:
            total += n * m
    return width * total


_MODELS = {  # name: parameter shapes (weights and biases), as model.parameters() lists them
    "section 1's MLP": [(256, 256), (256,), (256, 256), (256,)],
    "a wide layer": [(1024, 512), (1024,)],
    "a small head": [(8, 256), (8,)],
    "an embedding table": [(1000, 8)],
    "a conv net": [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (10, 1024), (10,)],
}
_RANKS = (1, 2, 4)


@checker(answers=("powersgd_bytes",))
def check_powersgd_bytes(powersgd_bytes: Callable[[list, int], int]) -> Feedback:
    """``powersgd_bytes(shapes, rank)``: the bytes one rank hands to ``all_reduce`` in one step of
    ``powerSGD_hook`` (fp32 gradients), for the parameter ``shapes`` of a model and the
    ``matrix_approximation_rank`` ``rank``. Graded on four models and three ranks."""
    want = {
        (name, r): powersgd_reference(shapes, r) for name, shapes in _MODELS.items() for r in _RANKS
    }
    mistakes = {  # a known wrong formula -> what it forgot, in words
        "compress_all": "a matrix that compression would not shrink more than "
        f"{MIN_COMPRESSION_RATE} times is sent whole: PyTorch checks (n + m) r x "
        f"{MIN_COMPRESSION_RATE} < n m for each matrix",
        "vectors": "the biases (tensors of one dimension) are not compressed: they are "
        "all-reduced whole, 4 bytes an element, in the same step",
        "factors": "each compressed matrix sends two factors: P (n x r), then Q (m x r)",
        "width": "PowerSGD all-reduces P and Q in the gradients' dtype: fp32, 4 bytes an element",
    }
    fb = Feedback("powersgd_bytes(shapes, rank) gives the bytes one rank all-reduces per step")
    fb.hint(
        "a matrix n x m is sent as two thin matrices, and PowerSGD leaves some tensors alone: "
        "which ones, and what does it do with them?"
    )
    fb.fix(
        "for each shape: one dimension -> 4 * n; a matrix n x m (m = the product of the other "
        "dimensions) -> 4 * r * (n + m) when (n + m) * r * 2 < n * m, otherwise 4 * n * m; "
        "add them up"
    )
    wrong: list[str] = []
    matched: dict[str, int] = dict.fromkeys(mistakes, 0)
    for (name, r), expected in want.items():
        shapes = _MODELS[name]
        call = f"powersgd_bytes({[tuple(s) for s in shapes]}, {r})"
        got = fb.run(
            call, powersgd_bytes, Given("shapes", [list(s) for s in shapes]), r, returns=object
        )
        value = whole_number(got)
        fb.require(
            value is not None,
            f"{call} returned {describe(got)}: return a whole number of bytes",
            brief="powersgd_bytes does not return a whole number of bytes",
        )
        if value != expected:
            wrong.append(f"{name}, rank {r}: {value:,} B, expected {expected:,} B")
            variants = {
                "compress_all": powersgd_reference(shapes, r, compress_all=True),
                "vectors": powersgd_reference(shapes, r, vectors=False),
                "factors": powersgd_reference(shapes, r, factors=1),
                "width": powersgd_reference(shapes, r, width=2),
            }
            for key, v in variants.items():
                if v == value and v != expected:
                    matched[key] += 1
    for key, count in matched.items():
        if wrong and count == len(wrong):  # that one mistake explains every wrong answer
            fb.hint(mistakes[key])
    fb.expect(
        not wrong,
        "; ".join(wrong[:3]) + (" ..." if len(wrong) > 3 else ""),
        brief=f"{len(wrong)} of {len(want)} models and ranks are wrong",
    )
    return fb


# ---------------------------------------------------------------------------------------------
# A scaled cast to float8

F8 = torch.float8_e4m3fn
_U = torch.finfo(F8).eps / 2  # one rounding to e4m3 (3 mantissa bits) moves a value by <= 1/16
# below e4m3's smallest normal (2**-6) the steps are 2**-9 apart: half a step at most
_HALF_SUBNORMAL_STEP = torch.finfo(F8).smallest_normal * torch.finfo(F8).eps / 2


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(13)
    ordinary = torch.randn(64, 32, generator=g)
    return {
        "tiny values (gradients near 1e-5)": ordinary * 1e-5,
        "ordinary values": ordinary,
        "large values (activations near 1e3)": ordinary * 1e3,
        "mostly negative": ordinary.abs().neg() * 10 + 1,
    }


def _error_bound(x: torch.Tensor, scale_inv: float) -> torch.Tensor:
    """What one scaled rounding to e4m3 may move each element by: u of it, or half a subnormal
    step (in x's units) for an element below e4m3's smallest normal once scaled."""
    return _U * x.abs() + _HALF_SUBNORMAL_STEP * scale_inv


@checker(answers=("to_float8",))
def check_to_float8(to_float8: Callable[[torch.Tensor], tuple]) -> Feedback:
    """``to_float8(x)`` returns ``(x8, scale_inv)``: ``x8`` in ``torch.float8_e4m3fn``, the shape
    of ``x``, and ``scale_inv`` a float32 number (or 1-element tensor) with ``x8.float() *
    scale_inv`` equal to ``x`` within one e4m3 rounding of each element, on four tensors."""
    inputs = _inputs()
    f8_max = torch.finfo(F8).max
    # the reference casts, before any learner's code runs
    right = {name: (x * (f8_max / x.abs().max())).to(F8).float() for name, x in inputs.items()}
    fb = Feedback("to_float8(x) casts x to float8_e4m3fn with a tensor-wise scale")
    fb.hint(
        "e4m3 holds magnitudes from about 0.002 to 448: before casting, multiply x so that its "
        "largest magnitude lands on 448, and hand back what undoes that multiplication"
    )
    fb.fix(
        "amax = x.abs().max(); scale = torch.finfo(torch.float8_e4m3fn).max / amax; "
        "return (x * scale).to(torch.float8_e4m3fn), (1 / scale).float()"
    )
    for name, x in inputs.items():
        call = f"to_float8(x) on {name}"
        got = fb.run(call, to_float8, Given("x", x), returns=tuple)
        fb.require(
            len(got) == 2 and type(got[0]) is torch.Tensor,
            f"{call} returned {describe(got)}: return a pair (x8, scale_inv)",
            brief="to_float8 does not return a pair (x8, scale_inv)",
        )
        x8, scale_inv = got
        fb.require(
            x8.dtype == F8 and x8.shape == x.shape,
            f"{call}: x8 is {x8.dtype} of shape {tuple(x8.shape)}; it must be "
            f"torch.float8_e4m3fn of shape {tuple(x.shape)}",
            brief="x8 is not x's shape in torch.float8_e4m3fn",
        )
        if isinstance(scale_inv, torch.Tensor):  # a plain one-element tensor, read as a float
            plain = type(scale_inv) is torch.Tensor and scale_inv.is_floating_point()
            s_value = tensor_number(scale_inv) if plain else None
        else:
            s_value = finite_number(scale_inv)
        fb.require(
            s_value is not None and s_value > 0,
            f"{call}: scale_inv is {describe(scale_inv)}; it must be one positive finite number",
            brief="scale_inv is not one positive number",
        )
        x8_float = x8.float()
        fb.require(
            not bool(torch.isnan(x8_float).any()),
            f"{call}: x8 holds NaN: x8 must be x times a finite scale, cast",
            brief="x8 holds NaN",
        )
        back = x8_float * s_value
        flushed = ((x8_float == 0) & (x != 0)).float().mean().item()
        fb.require(
            flushed < 0.5,
            f"{call}: {flushed:.0%} of the nonzero values became 0: unscaled, anything below "
            "e4m3's smallest step (2**-9) rounds to zero",
            brief="most values flushed to zero",
        )
        off = (back - x).abs() - _error_bound(x, s_value)
        clamped = int((x8_float.abs() == f8_max).sum())
        fb.require(
            off.max().item() <= 0 or clamped <= int((right[name].abs() == f8_max).sum()),
            f"{call}: {clamped} values of x8 sit at e4m3's largest, 448: x * scale went past it "
            "and the cast clamped them (their size is lost); the scale must bring the largest "
            "|x| to 448, not beyond",
            brief="some values went past 448 and were clamped to it",
        )
        worst = off.argmax()
        fb.require(
            off.max().item() <= 0,
            f"{call}: x8.float() * scale_inv is {back.flatten()[worst].item():.4g} where x is "
            f"{x.flatten()[worst].item():.4g}: scale_inv must undo the scale (1 / scale)",
            brief="x8.float() * scale_inv does not give x back",
        )
    return fb


# ---------------------------------------------------------------------------------------------
# The bug hunt: where each rank's two stages sit

_WORLDS = (2, 4, 8)


def _stage_reference(rank: int, world: int, style: str) -> list[int]:
    return [rank, rank + world] if style == "loop" else [rank, 2 * world - 1 - rank]


def check_stage_ids(stage_ids: Callable[[int, int, str], Sequence[int]]) -> Feedback:
    """``stage_ids(rank, world, style)``: the two stages rank ``rank`` of ``world`` holds, for
    ``style`` "loop" (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) or "v" (ZBVZeroBubble,
    DualPipeV). The colleague's code as shipped is not an answer yet."""
    return _check_stage_ids(stage_ids)


@checker(shipped_hint="run it for world = 2 and both styles: which stages does each rank get?")
def _check_stage_ids(stage_ids: Callable[[int, int, str], Sequence[int]]) -> Feedback:
    fb = Feedback("stage_ids places two stages per rank as each schedule expects")
    fb.hint(
        "a V schedule sends a micro-batch down the ranks and back up: which stage should the "
        "last rank hold besides its first one, so that the turn costs no send?"
    )
    fb.fix("return [rank, rank + world] if style == 'loop' else [rank, 2 * world - 1 - rank]")
    for style in ("loop", "v"):
        wrong = []
        for world in _WORLDS:
            for rank in range(world):
                call = f"stage_ids({rank}, {world}, {style!r})"
                got = fb.run(call, stage_ids, rank, world, style, returns=(list, tuple))
                values = [whole_number(v) for v in got]
                fb.require(
                    len(values) == 2 and None not in values,
                    f"{call} returned {describe(got)}: return the two stage numbers",
                    brief="stage_ids does not return two stage numbers",
                )
                if sorted(values) != sorted(_stage_reference(rank, world, style)):
                    wrong.append(
                        f"{call} = {values}, expected {_stage_reference(rank, world, style)}"
                    )
        what = "looped" if style == "loop" else "V-shaped"
        fb.expect(
            not wrong,
            f"the {what} placement is wrong: "
            + "; ".join(wrong[:2])
            + (" ..." if len(wrong) > 2 else ""),
            brief=f"the {what} placement ({style!r}) is wrong",
        )
    return fb
