"""Checkers for notebooks 09 (ZeRO, FSDP2) and 10 (tensor parallelism, a 2-D mesh).

* ``check_zero_bytes``: the learner's ``zero_bytes(stage, psi, n, k)``, the bytes a rank holds
  during a step under DDP (stage 0) and ZeRO-1, -2, -3, for fp32 parameters and gradients and
  ``k`` bytes of optimizer state per parameter, against the formulas on a grid of sizes. During
  a step ZeRO-2 holds every parameter whole: DeepSpeed's ZeRO-2 all the time, FSDP2's
  (``reshard_after_forward=False``) from each layer's forward to its backward, which at rest
  keeps only a shard (notebook 09 section 1 measures it; notebook 11 calls that mode
  ``shard_grad_op``).
* ``check_fsdp_bytes``: the learner's ``fsdp_bytes(psi, k, sync, param_bytes, reduce_bytes)``,
  the bytes FSDP2's ZeRO-3 all-gathers and reduce-scatters in one step of ``k`` micro-batches,
  reducing in every micro-batch or in the last only (``set_requires_gradient_sync``), with
  ``param_bytes`` per gathered parameter and ``reduce_bytes`` per reduced gradient (the
  ``MixedPrecisionPolicy``'s dtypes), against the formulas notebook 09 section 5 measures.
* ``check_tp_plan``: the learner's tensor-parallel plan for notebook 10's block (section 1),
  judged by what it costs: every Linear split, and no more collectives in forward than the
  cheapest plan (found by trying all of them with the same rules).
* ``check_batch_for``: the bug hunt. ``batch_for(x, dp, tp, dp_size, tp_size)`` must give the
  ranks of one tensor-parallel group the same rows and different data-parallel groups
  disjoint rows that cover the batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import torch

from . import Feedback, checker
from .answers import Given, describe, finite_number, number_problem

__all__ = [
    "LINEARS",
    "check_batch_for",
    "check_fsdp_bytes",
    "check_tp_plan",
    "check_zero_bytes",
    "tp_plan_cost",
]


# ---------------------------------------------------------------------------------------------
# ZeRO bytes per rank


CATEGORIES = ("params", "grads", "state")  # notebook 09 section 1's names for the three parts


def _zero_parts(
    stage: int, psi: int, n: int, k: float, width: int = 4, at_rest: bool = False
) -> dict[str, float]:
    """Bytes of each part on one rank during a step: ``width``-byte parameters and gradients
    (fp32: 4), k bytes of optimizer state each; stage 1 shards the state, 2 the gradients too,
    3 the parameters. ``at_rest``: FSDP2's ZeRO-2 between steps, whose parameters are a shard."""
    params, grads, state = width * psi, width * psi, k * psi
    if stage >= 1:
        state /= n
    if stage >= 2:
        grads /= n
    if stage >= 3 or (at_rest and stage >= 2):
        params /= n
    return {"params": params, "grads": grads, "state": state}


def _zero_reference(stage: int, psi: int, n: int, k: float, width: int = 4) -> float:
    """The total of ``_zero_parts``."""
    return sum(_zero_parts(stage, psi, n, k, width).values())


_GRID = [
    (stage, psi, n, k)
    for stage in range(4)
    for psi in (1000, 197_376, 10**9)
    for n in (2, 8)
    for k in (8, 12)
]

_SHARDED = {"params": 3, "grads": 2, "state": 1}  # the first stage that shards each part
_NAMES = {"params": "the parameters", "grads": "the gradients", "state": "the optimizer state"}


def _bytes_by_name(
    fb: Feedback, call: str, fn: Callable, args: tuple, names, what: str, brief: str
) -> dict[str, float]:
    """``fn(*args)`` run for ``fb`` as ``call``: a dict of a number of bytes for each of
    ``names``, or a refusal that says which key or value is wrong."""
    got = fb.run(call, fn, *args, returns=dict)
    shape = "{" + ", ".join(f'"{name}": ...' for name in names) + "}"
    fb.require(
        set(got) == set(names),
        f"{call} returned a dict with keys {describe(sorted(map(str, got)))}: return "
        f"{shape}, {what}",
        brief=brief,
    )
    values = {name: finite_number(got[name]) for name in names}
    bad = next((name for name in names if values[name] is None), None)
    fb.require(
        bad is None,
        number_problem(f"{call}[{bad!r}]", got.get(bad)) + " (a number of bytes)",
        brief=f"{call.split('(')[0]} does not return numbers",
    )
    return values


@checker(answers=("zero_bytes",))
def check_zero_bytes(zero_bytes: Callable[[int, int, int, float], dict]) -> Feedback:
    """``zero_bytes(stage, psi, n, k)``: the bytes of each part on one rank during a step, as a
    dict ``{"params": ..., "grads": ..., "state": ...}``, stage 0 (DDP) to 3, ``psi`` fp32
    parameters, ``n`` ranks, ``k`` bytes of state each.

    Graded part by part: the totals alone cannot tell ZeRO-2 sharding the parameters from
    ZeRO-2 sharding the gradients (both 4 bytes each in fp32). An answer that is right but for
    ZeRO-2's parameters counted at rest (FSDP2's shard) is told which moment counts."""
    fb = Feedback(
        "zero_bytes(stage, psi, n, k) gives the bytes of each part on one rank during a step"
    )
    fb.hint(
        "under DDP every rank keeps three things per parameter: which, and how many bytes each? "
        "Then: which of them does each ZeRO stage split over the n ranks?"
    )
    fb.fix(
        "DDP keeps 4 + 4 + k bytes per parameter on every rank; each stage divides one more of "
        "the three by n: first the optimizer state, then the gradients, then the parameters: "
        "params, grads, state = 4 * psi, 4 * psi, k * psi; then state /= n from stage 1, "
        "grads /= n from stage 2, params /= n at stage 3"
    )
    wrong: list[str] = []
    parts_wrong: dict[str, list[int]] = {c: [] for c in CATEGORIES}
    bf16 = 0  # answers that match the Playbook's bf16 form (2-byte parameters and gradients)
    rest = 0  # answers that match FSDP2's ZeRO-2 at rest (a shard of the parameters)
    for stage, psi, n, k in _GRID:
        want = _zero_parts(stage, psi, n, k)
        call = f"zero_bytes({stage}, {psi:,}, {n}, {k})"
        values = _bytes_by_name(
            fb,
            call,
            zero_bytes,
            (stage, psi, n, k),
            CATEGORIES,
            "the bytes of each part",
            "zero_bytes does not return the three parts",
        )
        off = [c for c in CATEGORIES if abs(values[c] - want[c]) > 1e-9 * want[c] + 0.5]
        if off:
            wrong.append(
                f"{call}: "
                + ", ".join(f"{c} {values[c]:,.0f}, expected {want[c]:,.0f}" for c in off)
            )
            for c in off:
                parts_wrong[c].append(stage)
            half = _zero_parts(stage, psi, n, k, width=2)
            if all(abs(values[c] - half[c]) <= 1e-9 * want[c] + 0.5 for c in CATEGORIES):
                bf16 += 1
            shard = _zero_parts(stage, psi, n, k, at_rest=True)
            if all(abs(values[c] - shard[c]) <= 1e-9 * want[c] + 0.5 for c in CATEGORIES):
                rest += 1
    if bf16 and bf16 == len(wrong):  # only when that is the one mistake
        fb.hint(
            "this course trains in fp32: a parameter and its gradient take 4 bytes each, not 2 "
            "(the Playbook's formula is for bf16 with an fp32 master copy inside k)"
        )
    if rest and rest == len(wrong):  # the one mistake: ZeRO-2's parameters counted at rest
        fb.hint(
            "zero_bytes counts what a rank holds during a step, not at rest: FSDP2's ZeRO-2 keeps "
            "a shard of the parameters between steps (section 1 measured it) but holds each "
            "layer's gathered from its forward to its backward, all of them by the last forward; "
            "DeepSpeed's ZeRO-2 keeps them whole all the time"
        )
    for part, stages in parts_wrong.items():
        first = _SHARDED[part]
        if stages and bf16 != len(wrong):
            fb.expect(
                False,
                f"{_NAMES[part]} are wrong at stage(s) {', '.join(map(str, sorted(set(stages))))}: "
                f"ZeRO shards them from stage {first} on (divided by n), not before",
                brief=f"{_NAMES[part]} are wrong at some stages",
            )
    fb.expect(
        not wrong,
        "; ".join(wrong[:3]) + (" ..." if len(wrong) > 3 else ""),
        brief=f"{len(wrong)} of {len(_GRID)} setups are wrong",
    )
    return fb


# ---------------------------------------------------------------------------------------------
# FSDP2's bytes per collective: micro-batches and the reduce dtype

COLLECTIVES = ("all_gather", "reduce_scatter")


def _fsdp_reference(
    psi: int, k: int, sync: str, param_bytes: int, reduce_bytes: int
) -> dict[str, int]:
    """ZeRO-3 (FSDP2's default): each micro-batch gathers every layer in forward and again in
    backward; the gradients are reduce-scattered in every micro-batch's backward, or in the last
    one's only when ``sync == "last"`` (``set_requires_gradient_sync(False)`` before the others)."""
    reduces = k if sync == "every" else 1
    return {"all_gather": 2 * k * param_bytes * psi, "reduce_scatter": reduces * reduce_bytes * psi}


_FSDP_GRID = [
    (psi, k, sync, param_bytes, reduce_bytes)
    for psi in (66_048, 10**9)
    for k in (1, 4, 8)
    for sync in ("every", "last")
    for param_bytes, reduce_bytes in ((4, 4), (2, 4), (2, 2))
]

# The mistakes a hint names: (hint, what that mistake computes).
_FSDP_MISTAKES = (
    (
        "with sync='last' only the last micro-batch's backward reduce-scatters "
        "(set_requires_gradient_sync(False) before the others): how many reduce-scatters is that?",
        lambda psi, k, sync, pb, rb: {
            "all_gather": 2 * k * pb * psi,
            "reduce_scatter": k * rb * psi,
        },
    ),
    (
        "which dtype does the reduce-scatter move: the gathered parameters' (param_dtype) or "
        "reduce_dtype? torchtitan gathers bf16 and reduces fp32",
        lambda psi, k, sync, pb, rb: _fsdp_reference(psi, k, sync, pb, pb),
    ),
    (
        "ZeRO-3 frees a layer's gathered parameters after its forward: what must its backward "
        "do before it can compute the layer's gradients?",
        lambda psi, k, sync, pb, rb: {
            "all_gather": k * pb * psi,
            "reduce_scatter": _fsdp_reference(psi, k, sync, pb, rb)["reduce_scatter"],
        },
    ),
)


@checker(answers=("fsdp_bytes",))
def check_fsdp_bytes(fsdp_bytes: Callable[[int, int, str, int, int], dict]) -> Feedback:
    """``fsdp_bytes(psi, k, sync, param_bytes, reduce_bytes)``: the bytes FSDP2's ZeRO-3 moves
    in one step of ``k`` micro-batches, as ``{"all_gather": ..., "reduce_scatter": ...}``
    (whole-tensor bytes, as notebook 09 counts them), ``sync`` "every" or "last".

    Every reference is computed before the learner's function runs; an answer that matches one
    of the mistakes ``_FSDP_MISTAKES`` names (on every call it got wrong) gets that hint."""
    wants = [(args, _fsdp_reference(*args)) for args in _FSDP_GRID]  # first, from the formulas
    fb = Feedback(
        "fsdp_bytes(psi, k, sync, param_bytes, reduce_bytes) gives the bytes ZeRO-3 all-gathers "
        "and reduce-scatters in one step"
    )
    fb.hint(
        "count per micro-batch: how many times is each layer gathered (forward, backward), and "
        "in which micro-batches are its gradients reduce-scattered? Then bytes per value"
    )
    fb.fix(
        "all_gather = 2 * k * param_bytes * psi (forward and backward of every micro-batch); "
        "reduce_scatter = (k if sync == 'every' else 1) * reduce_bytes * psi"
    )
    wrong: list[str] = []
    matches = [0] * len(_FSDP_MISTAKES)
    for (psi, k, sync, param_bytes, reduce_bytes), want in wants:
        call = f"fsdp_bytes({psi:,}, {k}, {sync!r}, {param_bytes}, {reduce_bytes})"
        values = _bytes_by_name(
            fb,
            call,
            fsdp_bytes,
            (psi, k, sync, param_bytes, reduce_bytes),
            COLLECTIVES,
            "the bytes of each",
            "fsdp_bytes does not return the two collectives",
        )
        off = [c for c in COLLECTIVES if abs(values[c] - want[c]) > 1e-9 * want[c] + 0.5]
        if not off:
            continue
        wrong.append(
            f"{call}: " + ", ".join(f"{c} {values[c]:,.0f}, expected {want[c]:,.0f}" for c in off)
        )
        for m, (_, mistake) in enumerate(_FSDP_MISTAKES):
            other = mistake(psi, k, sync, param_bytes, reduce_bytes)
            if all(abs(values[c] - other[c]) <= 1e-9 * other[c] + 0.5 for c in COLLECTIVES):
                matches[m] += 1
    for (hint, _), count in zip(_FSDP_MISTAKES, matches, strict=True):
        if wrong and count == len(wrong):  # only when that is the one mistake
            fb.hint(hint)
    fb.expect(
        not wrong,
        "; ".join(wrong[:3]) + (" ..." if len(wrong) > 3 else ""),
        brief=f"{len(wrong)} of {len(_FSDP_GRID)} steps are wrong",
    )
    return fb


# ---------------------------------------------------------------------------------------------
# A tensor-parallel plan for the block, judged by its collectives

LINEARS = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc1", "mlp.fc2")
_STYLES = ("colwise", "rowwise", None)  # None: the Linear stays whole on every rank


def _style(value: object) -> str | None | bool:
    """'colwise', 'rowwise' or None from a string or a torch style object; False: not a style."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower().replace("parallel", "").replace("-", "").replace("_", "")
        return text if text in ("colwise", "rowwise") else False
    name = type(value).__name__
    if name == "ColwiseParallel":
        return "colwise"
    if name == "RowwiseParallel":
        return "rowwise"
    return False


def _to_replicated(layout: str) -> int:
    """Collectives to make an activation whole on every rank: sharded -> all-gather, partial
    sums -> all-reduce, already whole -> none."""
    return 0 if layout == "replicated" else 1


def _linear(style: str | None, layout: str) -> tuple[int, str]:
    """(collectives before it, layout after) of one Linear given its input's layout."""
    if style == "colwise":  # needs the whole input; each rank computes some output features
        return _to_replicated(layout), "sharded"
    if style == "rowwise":  # needs its input's features split: a whole input is sliced locally
        return (1 if layout == "partial" else 0), "partial"
    return _to_replicated(layout), "replicated"


def tp_plan_cost(plan: Mapping[str, str | None]) -> int:
    """Collectives in one forward of the block (attention and MLP) under ``plan`` (one style per
    name of ``LINEARS``), with the rules of Megatron-LM: a column split makes features sharded,
    a row split leaves partial sums; GELU and attention work on sharded features (heads), not on
    partial sums; a residual addition needs the whole activation."""
    cost, outs = 0, []
    for name in ("attn.q", "attn.k", "attn.v"):  # all read the block's whole (normed) input
        c, out = _linear(plan[name], "replicated")
        cost, outs = cost + c, [*outs, out]
    if all(o == "sharded" for o in outs):
        layout = "sharded"  # each rank has all of q, k, v for its heads: attention is local
    else:
        cost += sum(_to_replicated(o) for o in outs)
        layout = "replicated"
    c, layout = _linear(plan["attn.o"], layout)
    cost += c + _to_replicated(layout)  # the residual addition
    c, layout = _linear(plan["mlp.fc1"], "replicated")
    cost += c + (1 if layout == "partial" else 0)  # GELU(a + b) is not GELU(a) + GELU(b)
    layout = "replicated" if layout == "partial" else layout
    c, layout = _linear(plan["mlp.fc2"], layout)
    return cost + c + _to_replicated(layout)


def _cheapest_full_split() -> int:
    plans = itertools.product(("colwise", "rowwise"), repeat=len(LINEARS))
    return min(tp_plan_cost(dict(zip(LINEARS, p, strict=True))) for p in plans)


@checker(answers=("plan",))
def check_tp_plan(plan: Mapping[str, object]) -> Feedback:
    """``plan``: {"attn.q": ColwiseParallel() or "colwise", ...} for the six Linears of the block.

    Passes when every Linear is split (each rank stores part of every weight) and one forward
    needs no more collectives than the cheapest plan that splits them all."""
    best = _cheapest_full_split()  # the reference, before anything of the learner's is read
    fb = Feedback("a tensor-parallel plan that splits every Linear with the fewest collectives")
    fb.hint(
        "follow one activation through a sub-block: which split leaves each rank with whole "
        "features it can apply GELU (or attention, head by head) to, and which split's partial "
        "sums does one all-reduce make whole?"
    )
    fb.fix(
        'q, k, v and fc1 "colwise", o and fc2 "rowwise": one all-reduce per sub-block, after '
        "the row-split Linear (section 1 counted them)"
    )
    fb.require(
        isinstance(plan, Mapping),
        f"plan must be a dict from a Linear's name to its style, not {describe(plan)}",
        brief="the plan is not a dict",
    )
    missing = [n for n in LINEARS if n not in plan]
    unknown = [str(n) for n in plan if n not in LINEARS]
    fb.require(
        not missing and not unknown,
        (f"the plan lacks {', '.join(missing)}" if missing else "")
        + ("; " if missing and unknown else "")
        + (f"the block has no Linear named {', '.join(unknown)}" if unknown else "")
        + f" (its Linears: {', '.join(LINEARS)})",
        brief="the plan does not name the block's six Linears",
    )
    styles = {n: _style(plan[n]) for n in LINEARS}
    bad = [n for n, s in styles.items() if s is False]
    fb.require(
        not bad,
        f"{', '.join(bad)}: use ColwiseParallel() / RowwiseParallel() or 'colwise' / 'rowwise'",
        brief="a style in the plan is not colwise or rowwise",
    )
    whole = [n for n, s in styles.items() if s is None]
    fb.expect(
        not whole,
        f"{', '.join(whole)} stay whole on every rank: their weights are not split at all",
        brief="not every Linear is split",
    )
    cost = tp_plan_cost(styles)
    fb.expect(
        cost <= best,
        f"this plan needs {cost} collectives in one forward of the block; the cheapest plan that "
        f"splits every Linear needs {best}",
        brief="the plan needs more collectives than necessary",
    )
    return fb


# ---------------------------------------------------------------------------------------------
# The bug hunt: which rows of the batch each rank of a 2-D mesh trains on

_MESHES = ((2, 2), (4, 2), (2, 4))


_BATCH_FOR_TITLE = "batch_for gives each data-parallel group its own rows, shared inside TP"


def check_batch_for(batch_for: Callable[..., torch.Tensor]) -> Feedback:
    """``batch_for(x, dp, tp, dp_size, tp_size)``: the rows of the global batch ``x`` that the rank
    at mesh coordinates (dp, tp) trains on, for several mesh shapes. The colleague's code as
    shipped is not an answer yet."""
    return _check_batch_for(batch_for)


@checker(shipped_hint="try it on a 2 x 2 mesh: which rows does each of the 4 ranks get?")
def _check_batch_for(batch_for: Callable[..., torch.Tensor]) -> Feedback:
    fb = Feedback(_BATCH_FOR_TITLE)
    fb.hint(
        "the ranks of one tp group split every layer between them: they must compute on the "
        "same samples. Which coordinate tells the groups with different data apart?"
    )
    fb.fix("rows = len(x) // dp_size; return x[dp * rows:(dp + 1) * rows]")
    for dp_size, tp_size in _MESHES:
        x = torch.arange(8 * dp_size * 3, dtype=torch.float32).reshape(8 * dp_size, 3)
        given = Given("x", x)
        got: dict[tuple[int, int], torch.Tensor] = {}
        for dp, tp in itertools.product(range(dp_size), range(tp_size)):
            call = f"batch_for(x, dp={dp}, tp={tp}, dp_size={dp_size}, tp_size={tp_size})"
            out = fb.run(call, batch_for, given, dp, tp, dp_size, tp_size, returns=torch.Tensor)
            fb.require(
                out.dim() == 2 and out.shape[1] == x.shape[1] and out.dtype == x.dtype,
                f"{call} returned a tensor of shape {tuple(out.shape)} and {out.dtype}: "
                f"return rows of x (shape (r, {x.shape[1]}), {x.dtype})",
                brief="batch_for does not return rows of x",
            )
            got[dp, tp] = out.detach().cpu()
        mesh = f"a {dp_size} x {tp_size} mesh"
        same = all(
            torch.equal(got[dp, tp], got[dp, 0]) for dp in range(dp_size) for tp in range(tp_size)
        )
        fb.expect(
            same,
            f"on {mesh} the ranks of one tp group (same dp, different tp) get different rows: "
            "TP splits the layers, so they must see the same samples",
            brief="the ranks of a tensor-parallel group see different data",
        )
        # rows as lists, not sets: a row given twice, or to two groups, counts twice
        rows = [[tuple(r.tolist()) for r in got[dp, 0]] for dp in range(dp_size)]
        every_row = sorted(tuple(r.tolist()) for r in x)
        fb.expect(
            sorted(r for group in rows for r in group) == every_row,
            f"on {mesh} the dp groups' rows do not split the batch (each row exactly once): "
            "each data-parallel group trains on its own part",
            brief="the data-parallel groups do not split the batch between them",
        )
        share = len(x) // dp_size
        fb.expect(
            all(len(group) == share for group in rows),
            f"on {mesh} the dp groups get {', '.join(str(len(g)) for g in rows)} rows: each "
            f"trains on an equal share of the {len(x)} rows ({share} each)",
            brief="the data-parallel groups do not get equal shares",
        )
        if not fb.passed:
            fb.stop()
    return fb
