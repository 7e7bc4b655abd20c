"""What to change when it does not fit: the smallest changes that fit, each with its cost.

One job: given a ``FitReport`` that does not fit its GPU, try the knobs a person can turn and
return each smallest change that fits, with its total and what it costs (time, GPUs, or a
change in what is trained):

1. a smaller micro-batch with gradient accumulation, which keeps the batch (same effective
   batch, same gradients: notebook 05 checks it) before anything that changes it;
2. activation checkpointing, from the lightest policy up;
3. ZeRO stages and FSDP over the fewest GPUs;
4. the fused AdamW step (no foreach copy of the second moments), then an 8-bit AdamW, pure
   bf16, and LoRA (rank 16), which change what is trained.

A knob that cannot fit alone is tried with full checkpointing, then with micro-batch 1 and
accumulation too. When the model states alone are more than the GPU holds, no batch or
checkpointing change can help: ``Advice.states_alone`` says so.

>>> advice = advise(will_it_fit("gpt2", batch=64, seq=1024, gpu="T4"))  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..units import format_bytes
from .headroom import HEADROOM
from .inputs import SHARDING
from .peak import will_it_fit
from .report import FitReport

__all__ = ["Advice", "Change", "advise"]

#: How many GPUs the sharding search goes up to (powers of two).
MAX_GPUS = 1024
#: Checkpointing policies from the least to the most recomputation.
_STRONGER = ("none", "every-matmul", "every-second-matmul", "full")
#: What each change costs, said once.
COSTS = {
    "accumulate": "same effective batch and gradients; {k} smaller steps per update, so "
    "smaller kernels and a little more time",
    "every-matmul": "recomputes norms and activation functions in backward: a few % more time",
    "every-second-matmul": "recomputes every second matmul in backward: about 10-15 % more time",
    "full": "recomputes each block's forward in backward: about a third more compute",
    "sharding": "{n} GPUs, and their communication every step",
    "fused": "none in what is trained: the same update in one kernel, without foreach's "
    "copy of the second moments (not torch's default yet)",
    "adamw8bit": "changes the optimizer: 8-bit block-wise moments (bitsandbytes), close to "
    "AdamW in published runs but not the same",
    "pure-bf16": "changes what is trained: bf16 weights and moments lose small updates",
    "lora": "changes what is trained: rank-16 adapters on attention, the base frozen",
}


@dataclass(frozen=True)
class Change:
    """One change of the knobs that makes it fit, the answer with it, and its cost."""

    what: str
    report: FitReport
    cost: str = ""

    def __repr__(self) -> str:
        cost = f" (cost: {self.cost})" if self.cost else ""
        return f"{self.what}: {format_bytes(self.report.total)} per GPU{cost}"


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


def _try(r: FitReport, **changes) -> FitReport | None:
    """The report with ``changes``, if it fits; None if not or if the knobs make no sense."""
    try:
        new = will_it_fit(**(r.arguments | changes))
    except (TypeError, ValueError):
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


def _accumulated(r: FitReport, batch: int, **changes) -> FitReport | None:
    """Micro-batch ``batch`` with as many micro-batches as keep at least the batch asked for."""
    k = math.ceil(r.batch * r.arguments.get("grad_accumulation", 1) / batch)
    return _try(r, batch=batch, grad_accumulation=k, **changes)


def _largest_batch(r: FitReport, **changes) -> FitReport | None:
    """The largest micro-batch below ``r.batch`` that fits with accumulation and ``changes``.

    Every activation grows in proportion to the batch (the fake runs hold ``batch`` times
    what one sequence holds), so the totals at micro-batch 1 and 2 give the slope and a first
    guess; the guess is then checked with a real answer, and lowered until one fits.
    """
    one = _accumulated(r, 1, **changes)
    if one is None or r.batch <= 2:
        return one if r.batch > 1 else None
    two = _accumulated(r, 2, **changes) or one
    slope = max(1, two.total - one.total)
    guess = min(r.batch - 1, 1 + (r.gpu.memory_bytes - one.total) // slope)
    while guess > 1:
        new = _accumulated(r, guess, **changes)
        if new is not None:
            return new
        guess = min(guess - 1, int(guess * 0.98))
    return one


def _micro(new: FitReport) -> str:
    k = new.arguments.get("grad_accumulation", 1)
    return f"micro-batch {new.batch} x {k} accumulated"


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
        f"change helps on {where} {gpu}; shard them over more GPUs, use an 8-bit optimizer, "
        "or train fewer parameters (LoRA), below where one fits."
    )


def _lighter(r: FitReport, find, what: str, cost: str, alone: bool = False) -> Change | None:
    """``find(**changes)`` with the knobs as they are, then (unless ``alone``) with full
    checkpointing, then with micro-batch 1 accumulated as well; the first that fits."""
    new = find()
    if new is not None:
        return Change(what, new, cost)
    if alone:
        return None
    if r.checkpointing != "full":
        new = find(checkpointing="full")
        if new is not None:
            return Change(f"{what} and full checkpointing", new, f"{cost}; {COSTS['full']}")
    if r.batch > 1:
        k = r.batch * r.arguments.get("grad_accumulation", 1)
        new = find(checkpointing="full", batch=1, grad_accumulation=k)
        if new is not None:
            return Change(
                f"{what}, full checkpointing and micro-batch 1 x {k} accumulated",
                new,
                f"{cost}; {COSTS['full']}; {COSTS['accumulate'].format(k=k)}",
            )
    return None


def advise(report: FitReport) -> Advice:
    """The smallest changes that make ``report`` fit its GPU (``will_it_fit(..., gpu=...)``)."""
    if not isinstance(report, FitReport):
        raise TypeError(f"advise takes a fit.FitReport, not {type(report).__name__}")
    if report.gpu is None:
        raise ValueError("advise needs to know the GPU: call will_it_fit(..., gpu='H100') first")
    if report.fits:
        return Advice(True, ())
    changes: list[Change] = []
    alone = _states_alone(report)
    if not alone:
        if report.batch > 1 and not report.arguments.get("optimizer_in_backward"):
            new = _largest_batch(report)
            if new is not None:
                k = new.arguments["grad_accumulation"]
                changes.append(Change(_micro(new), new, COSTS["accumulate"].format(k=k)))
        later = _STRONGER[_STRONGER.index(report.checkpointing) + 1 :]
        for policy in later:
            new = _try(report, checkpointing=policy)
            if new is not None:
                changes.append(Change(f"checkpointing {policy}", new, COSTS[policy]))
                break
        if not changes and report.batch > 1 and report.checkpointing != "full":
            new = _largest_batch(report, checkpointing="full")
            if new is not None:
                changes.append(
                    Change(
                        f"{_micro(new)} and full checkpointing",
                        new,
                        f"{COSTS['full']}; "
                        + COSTS["accumulate"].format(k=new.arguments["grad_accumulation"]),
                    )
                )
    # When a batch or a checkpointing change alone fits, the other changes are offered only
    # if they fit on their own too: adding checkpointing and batch 1 would not be smaller
    alone_fits = any(" and " not in change.what for change in changes)
    first = max(1, SHARDING.index(report.sharding)) if report.sharding in SHARDING[:4] else 3
    for stage in SHARDING[first:4]:

        def shard(stage=stage, **changes):
            return _fewest_gpus(report, stage, **changes)

        change = _lighter(report, shard, stage, "", alone_fits)
        if change is not None:
            n = change.report.n_gpus
            what = change.what.replace(stage, f"{stage} on {n} GPUs or more", 1)
            cost = COSTS["sharding"].format(n=n) + change.cost
            changes.append(Change(what, change.report, cost))
    others = []
    if report.optimizer == "adamw" and report.arguments.get("optimizer_impl") == "foreach":
        others.append(
            ("fused AdamW step (fused=True)", {"optimizer_impl": "fused"}, COSTS["fused"])
        )
    if report.optimizer == "adamw":
        others.append(("8-bit AdamW", {"optimizer": "adamw8bit"}, COSTS["adamw8bit"]))
    if report.precision != "pure-bf16":
        others.append(
            (
                "pure bf16 (weights, gradients and AdamW state)",
                {"precision": "pure-bf16"},
                COSTS["pure-bf16"],
            )
        )
    if not report.arguments.get("lora_rank"):
        others.append(("LoRA rank 16 on attention", {"lora_rank": 16}, COSTS["lora"]))
    for what, knobs, cost in others:

        def other(knobs=knobs, **changes):
            return _try(report, **knobs, **changes)

        change = _lighter(report, other, what, cost, alone_fits)
        if change is not None:
            changes.append(change)
    return Advice(False, tuple(changes), alone)
