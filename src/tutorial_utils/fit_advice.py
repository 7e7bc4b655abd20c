"""What to change when it does not fit: the smallest changes of the knobs that make it fit.

One job: given a ``fit.FitReport`` that does not fit its GPU, try the knobs a person can turn
(ZeRO stage and GPU count, batch, activation checkpointing, the precision recipe, and batch 1
with full checkpointing together) and return each smallest change that fits, with its total.
When the model states alone are more than the GPU holds, no batch or checkpointing change can
help: ``Advice.states_alone`` says so, and what would (sharding, an 8-bit optimizer or training
fewer parameters, the last two not modelled here).

>>> advice = advise(will_it_fit("gpt2", batch=64, seq=1024, gpu="T4"))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

from . import fit
from .fit import FitReport, will_it_fit
from .fit_inputs import HEADROOM
from .units import format_bytes

__all__ = ["Advice", "Change", "advise"]

#: How many GPUs the sharding search goes up to (powers of two).
MAX_GPUS = 1024
#: Checkpointing policies from the least to the most recomputation.
_STRONGER = ("none", "every-matmul", "every-second-matmul", "full")


@dataclass(frozen=True)
class Change:
    """One change of the knobs that makes it fit, and the answer with it."""

    what: str
    report: FitReport

    def __repr__(self) -> str:
        return f"{self.what}: {format_bytes(self.report.total)} per GPU"


@dataclass(frozen=True)
class Advice:
    """The changes that fit (smallest first within each knob), or why none of a kind can."""

    fits: bool
    changes: tuple[Change, ...]
    states_alone: str = ""  # said when the model states alone exceed the GPU

    def __repr__(self) -> str:
        if self.fits:
            return "It fits: nothing to change."
        lines = [self.states_alone] if self.states_alone else []
        lines += [f"- {c!r}" for c in self.changes]
        if not self.changes:
            lines.append("- no change of one or two knobs makes it fit on this GPU")
        return "\n".join(lines)


def _knobs(r: FitReport) -> dict:
    return {
        "preset": r.preset,
        "batch": r.batch,
        "seq": r.seq,
        "precision": r.precision,
        "optimizer": r.optimizer,
        "checkpointing": r.checkpointing,
        "sharding": r.sharding,
        "n_gpus": r.n_gpus,
        "gpu": r.gpu,
        "headroom": bool(r.headroom),
    }


def _try(r: FitReport, **changes) -> FitReport | None:
    """The report with ``changes``, if it fits; None if not or if the knobs make no sense."""
    try:
        new = will_it_fit(**(_knobs(r) | changes))
    except ValueError:
        return None
    return new if new.fits else None


def _fewest_gpus(r: FitReport, stage: str, **changes) -> FitReport | None:
    n = 2
    while n <= MAX_GPUS:
        if n >= r.n_gpus or r.sharding != stage:
            new = _try(r, sharding=stage, n_gpus=n, **changes)
            if new is not None:
                return new
        n *= 2
    return None


def _largest_batch(r: FitReport, **changes) -> FitReport | None:
    """The largest batch below ``r.batch`` that fits with ``changes``.

    Every activation grows in proportion to the batch (the fake runs hold ``batch`` times
    what one sequence holds), so the totals at batch 1 and 2 give the slope and a first guess;
    the guess is then checked with a real answer, and lowered until one fits. Two or three fake
    runs instead of a search over every batch.
    """
    one = _try(r, batch=1, **changes)
    if one is None or r.batch <= 2:
        return one if r.batch > 1 else None
    two = will_it_fit(**(_knobs(r) | changes | {"batch": 2}))
    slope = max(1, two.total - one.total)
    guess = min(r.batch - 1, 1 + (r.gpu.memory_bytes - one.total) // slope)
    while guess > 1:
        new = _try(r, batch=guess, **changes)
        if new is not None:
            return new
        guess = min(guess - 1, int(guess * 0.98))
    return one


def _states_alone(r: FitReport) -> str:
    """A sentence when the model states (with headroom) alone exceed the GPU, else ''."""
    gpu = r.gpu
    fixed = r.states_bytes
    kept = sum(t.fixed_bytes for t in HEADROOM) if r.headroom else 0
    if fixed + kept <= gpu.memory_bytes:
        return ""
    where = "one" if r.n_gpus == 1 else f"each of {r.n_gpus} x"
    return (
        f"Model states alone are {format_bytes(fixed)} per GPU: no batch or checkpointing "
        f"change helps on {where} {gpu}; shard them over more GPUs (below), use an 8-bit "
        "optimizer (not modelled), or fine-tune fewer parameters (LoRA; not modelled)."
    )


def _lighter(r: FitReport, find, what: str, alone: bool = False) -> Change | None:
    """``find(**changes)`` with the knobs as they are, then (unless ``alone``) with full
    checkpointing, then with batch 1 as well; the first that fits, described."""
    new = find()
    if new is not None:
        return Change(what, new)
    if alone:
        return None
    if r.checkpointing != "full":
        new = find(checkpointing="full")
        if new is not None:
            return Change(f"{what} and full checkpointing", new)
    if r.batch > 1:
        new = find(checkpointing="full", batch=1)
        if new is not None:
            return Change(f"{what}, full checkpointing and batch 1", new)
    return None


def advise(report: FitReport) -> Advice:
    """The smallest changes that make ``report`` fit its GPU (``will_it_fit(..., gpu=...)``).

    Each knob is searched on its own first (the largest batch that fits, the first
    checkpointing policy that fits, the fewest GPUs for each ZeRO stage, pure bf16); when a
    knob alone cannot, it is tried with full checkpointing, then with a smaller batch too. A
    smaller batch keeps the same effective batch with gradient accumulation.
    """
    if not isinstance(report, FitReport):
        raise TypeError(f"advise takes a fit.FitReport, not {type(report).__name__}")
    if report.gpu is None:
        raise ValueError("advise needs to know the GPU: call will_it_fit(..., gpu='H100') first")
    if report.fits:
        return Advice(True, ())
    changes: list[Change] = []
    alone = _states_alone(report)
    if not alone:
        if report.batch > 1:
            new = _largest_batch(report)
            if new is not None:
                changes.append(Change(f"batch {new.batch}", new))
        later = _STRONGER[_STRONGER.index(report.checkpointing) + 1 :]
        for policy in later:
            new = _try(report, checkpointing=policy)
            if new is not None:
                changes.append(Change(f"checkpointing {policy}", new))
                break
        if not changes and report.batch > 1 and report.checkpointing != "full":
            new = _largest_batch(report, checkpointing="full")
            if new is not None:
                changes.append(Change(f"batch {new.batch} and full checkpointing", new))
    # When a batch or a checkpointing change alone fits, a sharding or recipe change is
    # offered only if it fits on its own too: adding checkpointing and batch 1 to it would not
    # be a smaller change
    alone_fits = any(" and " not in change.what for change in changes)
    stages = fit.SHARDING[max(1, fit.SHARDING.index(report.sharding)) :]
    for stage in stages:

        def shard(stage=stage, **changes):
            return _fewest_gpus(report, stage, **changes)

        change = _lighter(report, shard, stage, alone_fits)
        if change is not None:
            what = change.what.replace(stage, f"{stage} on {change.report.n_gpus} GPUs or more", 1)
            changes.append(Change(what, change.report))
    if report.precision != "pure-bf16":

        def pure(**changes):
            return _try(report, precision="pure-bf16", **changes)

        change = _lighter(
            report, pure, "pure bf16 (weights, gradients and AdamW state)", alone_fits
        )
        if change is not None:
            changes.append(change)
    return Advice(False, tuple(changes), alone)
