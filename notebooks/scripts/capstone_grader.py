"""Capstone 2's grader (notebook 11): run a sharding plan on real ranks, and check what it did.

``check_plan(plan, train_step, predicted)`` first loads your ``train_step`` here, in the
notebook's process, as the ranks will (its source alone, with ``torch``, ``torch.distributed as
dist`` and ``nn``): a step that cannot load there (a lambda, a default argument or a name of
the notebook's) is one sentence, and nothing is launched. Then it writes your ``train_step`` and
your ``plan`` to a temporary folder (removed by a watchdog if the kernel dies meanwhile),
launches ``capstone_ranks.py`` on ``nproc`` ranks with torchrun
(``tutorial_utils.distributed.launch``: gloo on a CPU), and checks what every rank reported:

1. the step equals one process at every step: every rank computes one process's gradients on
   the whole batch *first*, before your code runs, from its own copy of the batch (for each
   step after the first, at the weights that step starts from, before your code runs again);
   the gradients your step hands to each ``optimizer.step()`` (each rank's shard) must be within
   the rounding of the sums they go through (``rounding_bound``, derived below), and
   ``optimizer.step()`` runs once per call of your step;
2. every rank's peak, measured by the package's accountant (``memory.measure``; on a GPU the
   caching allocator), over both steps, stays under the budget;
3. the communication per step, counted at the collectives themselves: each collective within
   the bytes you predicted for it (``predicted``: ``{"all_gather": bytes, ...}``), and each
   prediction a bound worth the name: at most 10% above what that collective moved, and 0 for a
   collective the plan does not call.

A plan may add ``"gradient_sync": "last"`` (``capstone_ranks.py``): the ranks then reduce the
gradients in the last micro-batch's backward only, so the reduction's bytes are counted once a
step, and each rank holds whole gradients (4 PSI bytes) until then, which its peak counts.

The hint fits the kind of attempt: over the budget, which lever is left; a wrong step, what
differs from one process (the ranks' sum instead of their average, a micro-batch weighted k
times, the previous step's gradients still in ``p.grad``); more bytes than predicted, which
collective and why. The reference is computed in the ranks before your step runs, and the
verdict is this module's: a learner's step that edits the grader's books in its own process (the
rank script's counters) is out of scope, as in capstone 1's grader. Your step runs in other
processes: it may use only its arguments, ``torch``, ``torch.distributed as dist`` and ``nn``,
not the notebook's variables.

Importing this module leaves the notebook's random state as it was (``build_model`` seeds inside
``torch.random.fork_rng``).
"""

from __future__ import annotations

import builtins
import dis
import inspect
import json
import textwrap
import tokenize
import types
from pathlib import Path

from capstone_ranks import BLOCKS, GLOBAL_BATCH, SHARDS, STEPS, WIDTH, build_model

from tutorial_utils.distributed import LaunchError, launch
from tutorial_utils.exercises import Feedback, checker
from tutorial_utils.exercises.answers import describe, whole_number
from tutorial_utils.exercises.parallel import rounding_bound
from tutorial_utils.exercises.shipped import is_shipped
from tutorial_utils.processes import temporary_folder
from tutorial_utils.units import format_bytes

__all__ = ["BUDGET", "COLLECTIVES", "PSI", "check_plan", "gradient_tolerance"]

SCRIPT = Path(__file__).with_name("capstone_ranks.py")
BUDGET = 30 * 2**20  # bytes per rank: one plain step (DDP) peaks near 54 MiB, ZeRO-3 near 38
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SYNCS = ("every", "last")  # plan["gradient_sync"]: which micro-batches' backward reduces
PSI = sum(p.numel() for p in build_model().parameters())  # parameters, biases included
LOOSE = 1.10  # a prediction more than 10% above what moved is not a bound worth the name
TIMEOUT_S = 240


def gradient_tolerance() -> float:
    """How far a correct step's gradients may be from one process's, relative to the largest.

    A weight's gradient is a chain of sums: back through each block's two matrix products (over
    ``4 * WIDTH`` and ``WIDTH`` terms) and, last, the sum over the ``GLOBAL_BATCH`` samples, which
    the ranks and micro-batches split and add in another order. Each sum of n terms is within n
    fp32 roundings of the exact one, on either side (``rounding_bound``): about 7e-4 here,
    while a gradient summed over 2 ranks instead of averaged is off by 100%, one weighted k
    times by (k - 1) x 100%."""
    return rounding_bound(BLOCKS * (4 * WIDTH + WIDTH) + GLOBAL_BATCH)


_WHY = {
    "all_gather": "FSDP2 all-gathers each block's parameters (4 B per parameter in fp32) before "
    "its forward in every micro-batch and, with ZeRO-3, again before its backward",
    "reduce_scatter": "FSDP2 reduce-scatters each block's gradients (4 B per parameter) after "
    "every micro-batch's backward, or only after the last one's with gradient_sync='last' "
    "(model.set_requires_gradient_sync(False) before the others)",
    "all_reduce": "DDP all-reduces every gradient (4 B per parameter) after every micro-batch's "
    "backward, or only after the last one's with gradient_sync='last' (model.no_sync() before "
    "the others); a step that averages by hand all-reduces each gradient itself",
    "broadcast": "a broadcast sends a whole tensor from one rank to every other",
}

# Notebook 09 calls FSDP2's reshard_after_forward=False "ZeRO-2", as PyTorch does; DeepSpeed's
# ZeRO-2 (and the Playbook's) differs at rest, so the plan names the FSDP mode instead.
_ZERO2 = (
    "plan['shard'] = 'zero2' names two things: DeepSpeed's ZeRO-2 keeps every parameter whole "
    "on every rank, which FSDP2 has no mode for, and FSDP2's nearest, 'shard_grad_op' "
    "(fully_shard(reshard_after_forward=False), FSDP1's SHARD_GRAD_OP), keeps only shards at "
    "rest (16 PSI / N in all, notebook 09 section 1) and each block's parameters gathered from "
    "its forward to its backward: write 'shard_grad_op' for that one"
)


def _plan(fb: Feedback, plan: object) -> dict:
    fb.require(
        type(plan) is dict,
        f"plan is a dict like {{'shard': 'zero3', 'micro_batches': 4, 'checkpointing': False}}, "
        f"not {type(plan).__name__}",
        brief="plan is not a dict",
    )
    shard, k, ckpt = (
        plan.get("shard"),
        whole_number(plan.get("micro_batches")),
        plan.get("checkpointing"),
    )
    fb.require(shard != "zero2", _ZERO2, brief="plan['shard'] = 'zero2' is ambiguous here")
    fb.require(
        isinstance(shard, str) and str(shard) in SHARDS,
        f"plan['shard'] is one of {', '.join(SHARDS)}, not {shard!r}",
        brief="plan['shard'] is not one of the choices",
    )
    per_rank = GLOBAL_BATCH // 4  # the most ranks the notebook uses
    fb.require(
        k is not None and 1 <= k and per_rank % k == 0,
        f"plan['micro_batches'] is a whole number that divides {per_rank} (the samples of a "
        f"rank, with up to 4 ranks), not {plan.get('micro_batches')!r}",
        brief="plan['micro_batches'] is not a usable number",
    )
    fb.require(
        type(ckpt) is bool,
        f"plan['checkpointing'] is True or False, not {ckpt!r}",
        brief="plan['checkpointing'] is not True or False",
    )
    sync = plan.get("gradient_sync", "every")
    fb.require(
        isinstance(sync, str) and str(sync) in SYNCS,
        f"plan['gradient_sync'] is 'every' (the default: reduce in every micro-batch's backward) "
        f"or 'last' (only in the last one's), not {sync!r}",
        brief="plan['gradient_sync'] is not one of the choices",
    )
    fb.require(
        not (sync == "last" and shard == "replicate"),
        "plan['gradient_sync'] = 'last' asks DDP or FSDP2 to skip their reduction until the last "
        "micro-batch; with 'replicate' your step reduces by hand, so it decides that itself",
        brief="gradient_sync='last' needs a shard that reduces for you",
    )
    return {"shard": str(shard), "micro_batches": k, "checkpointing": ckpt, "gradient_sync": sync}


def _prediction(fb: Feedback, predicted: object) -> dict[str, int]:
    fb.require(
        type(predicted) is dict and set(predicted) <= set(COLLECTIVES),
        f"predicted maps collectives ({', '.join(COLLECTIVES)}) to the bytes each moves in one "
        f"step, not {predicted!r}",
        brief="predicted is not a dict of collectives to bytes",
    )
    plain = {name: whole_number(predicted.get(name, 0)) for name in COLLECTIVES}
    bad = [name for name, b in plain.items() if b is None or b < 0]
    fb.require(
        not bad,
        f"predicted[{bad[0] if bad else ''!r}] must be a whole number of bytes (0 or more): "
        "compute it from PSI, the micro-batches and 4 bytes per fp32 value",
        brief="a predicted byte count is not a whole number",
    )
    return plain


_HEADER = "import torch\nimport torch.distributed as dist\nfrom torch import nn\n\n"
_GIVEN = "only its arguments, torch, dist (torch.distributed) and nn"


def _globals_used(code: types.CodeType) -> set[str]:
    """The global names a function's code reads (its nested functions' and comprehensions' too),
    less those it assigns itself (``global x; x = ...``)."""
    read, written = set(), set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            read.add(ins.argval)
        elif ins.opname == "STORE_GLOBAL":
            written.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            read |= _globals_used(const)
    return read - written


def _step_source(train_step: object) -> tuple[str, str | None]:
    """``step.py`` as the ranks will import it, loaded here first: (its text, None), or ("", the
    one sentence that says why the ranks could not load or run it)."""
    if not inspect.isfunction(train_step):
        return "", f"train_step must be a function defined with `def`, not {describe(train_step)}"
    name = train_step.__name__
    if name == "<lambda>":
        return "", (
            "train_step is a lambda: the ranks run the step from its source in a file of their "
            "own, so define it with `def train_step(model, optimizer, x, y, micro_batches):` in "
            "a cell"
        )
    try:
        inspect.signature(train_step).bind(*range(5))
    except TypeError:
        return "", (
            f"the ranks call train_step(model, optimizer, x, y, micro_batches), five arguments, "
            f"and {name}{inspect.signature(train_step)} does not take them"
        )
    broken = (
        "train_step's source does not compile on its own (SyntaxError: {}): define the step "
        "with `def` at the top level of a cell (its file, if you import it, as it is now)"
    )
    try:
        source = textwrap.dedent(inspect.getsource(train_step))
    except (OSError, TypeError):
        return "", "the grader cannot read train_step's source: define it with `def` in a cell"
    except (SyntaxError, tokenize.TokenError) as err:  # its file was edited since the import
        return "", broken.format(err.args[0] if err.args else type(err).__name__)
    text = _HEADER + source + f"\n\ntrain_step = {name}\n"
    try:
        code = compile(text, "step.py", "exec")
    except SyntaxError as err:
        line = (err.lineno or 0) - _HEADER.count("\n")
        return "", broken.format(f"{err.msg}, line {line} of it")
    namespace: dict = {"__name__": "learner_step"}
    try:
        exec(code, namespace)  # what each rank's import will run: the imports and the def
    except Exception as err:  # the learner's code: a default argument, a decorator
        return "", (
            f"train_step cannot be loaded on the ranks ({type(err).__name__}: {err}, while "
            "defining it: a default argument or a decorator): they run in other processes, "
            f"where the step has {_GIVEN}"
        )
    loaded = namespace["train_step"]
    code_of = getattr(loaded, "__code__", None)
    missing = (
        sorted(_globals_used(code_of) - set(namespace) - set(dir(builtins))) if code_of else []
    )
    if missing:
        names = ", ".join(f"`{n}`" for n in missing)
        return "", (
            f"train_step uses {names}, which the ranks do not have: they run in other processes, "
            f"where the step has {_GIVEN} (import anything else inside the function)"
        )
    return text, None


def _launch(plan: dict, source: str, nproc: int):
    with temporary_folder("capstone2-") as tmp:  # a watchdog removes it if the kernel dies
        (tmp / "plan.json").write_text(json.dumps(plan))
        (tmp / "step.py").write_text(source)
        args = ["--plan", str(tmp / "plan.json"), "--step", str(tmp / "step.py")]
        return launch(SCRIPT, nproc, args, timeout=TIMEOUT_S, echo=None)


def run_plan(plan: dict, train_step, nproc: int = 2):
    """Launch ``plan`` with ``train_step`` on ``nproc`` ranks as ``check_plan`` does, ungraded:
    the ``launch`` result (``.command_line``; ``.reports``, each rank's peaks, bytes, gradients).
    A step the ranks could not load raises ``ValueError`` with one sentence, before any launch."""
    source, problem = _step_source(train_step)
    if problem:
        raise ValueError(problem)
    return _launch(plan, source, nproc)


def _run(fb: Feedback, plan: dict, source: str, nproc: int) -> dict[int, dict]:
    try:
        reports = _launch(plan, source, nproc).reports
    except LaunchError as err:
        reports = err.result.reports
        errors = [r["error"] for r in reports.values() if "error" in r]
        fb.require(
            errors,
            f"the ranks failed before they could report: {str(err).splitlines()[0]}",
            brief="the ranks failed",
        )
    errors = {rank: r["error"] for rank, r in reports.items() if "error" in r}
    if errors:
        rank, error = min(errors.items())
        fb.hints[:] = ["run it in your head on one rank: what does each line get, and return?"]
        fb.fail(f"your train_step raised on rank {rank}: {error}", brief="your train_step raised")
    fb.require(
        sorted(reports) == list(range(nproc)),
        f"only ranks {sorted(reports)} of {nproc} reported",
        brief="a rank did not report",
    )
    return reports


@checker(
    answers=("plan", "train_step", "predicted"),
    shipped_hint="what does each rank's p.grad hold after the loop, against one process's?",
)
def check_plan(
    plan: dict,
    train_step,
    predicted: dict,
    budget_bytes: int = BUDGET,
    nproc: int = 2,
    most_bytes: int | None = None,
) -> Feedback:
    """Run ``plan`` with ``train_step`` on ``nproc`` ranks; see the module docstring.
    ``most_bytes``: when given, the bytes moved in one step (all collectives) must not exceed it."""
    budget = whole_number(budget_bytes)
    if budget is None or budget <= 0 or whole_number(nproc) not in (2, 4):
        raise ValueError("check_plan: budget_bytes is a positive number of bytes, nproc 2 or 4")
    fb = Feedback(
        f"one training step in {format_bytes(budget)} per rank on {nproc} ranks, equal to one "
        "process, moving the bytes you predicted"
    )
    fb.hint("three things are checked in turn: the gradients, each rank's peak, the bytes moved")
    plan, predicted = _plan(fb, plan), _prediction(fb, predicted)
    fb.require(not is_shipped(train_step), "the step is the exercise's starting code")  # no launch
    source, problem = _step_source(train_step)  # loaded here first: no launch for what cannot
    if problem:
        fb.hints[:] = ["the step's code is copied to the ranks alone: what else does it need?"]
        fb.fail(problem, brief="the ranks could not load or run your train_step")
    reports = _run(fb, plan, source, nproc)
    fb.measured = reports  # for the notebook to show: each rank's peaks and bytes

    # 1. The same step as one process, at every optimizer.step().
    steps = {rank: r["optimizer_steps"] for rank, r in reports.items()}
    fb.require(
        all(n == [1] * STEPS for n in steps.values()),
        f"call optimizer.step() exactly once per train_step ({STEPS} calls ran; optimizer "
        f"steps in each, per rank: {steps})",
        brief="optimizer.step() is not called once per step",
    )
    tol = gradient_tolerance()
    for call in range(STEPS):
        for rank, r in sorted(reports.items()):
            g = r["grads"][call]
            fb.require(not g["missing"], "some parameters had no gradient at optimizer.step()")
            if g["gap"] >= tol:
                _wrong_gradients(fb, plan, nproc, rank, call, g, tol)

    # 2. Every rank's peak under the budget.
    rank, peak = max(((rank, max(r["peaks"])) for rank, r in reports.items()), key=lambda x: x[1])
    state = reports[rank]["state_bytes"]
    if not fb.expect(
        peak <= budget,
        f"rank {rank} peaked at {format_bytes(peak)}, over the budget of {format_bytes(budget)} "
        f"(its training state at rest: {format_bytes(state)}; the rest of the peak is activations "
        "and gathered parameters)",
        brief="a rank's peak is over the budget",
    ):
        fb.hints[:], fb.fixes[:] = _lever(plan, state, budget)

    # 3. The bytes moved per step: each collective within its own prediction.
    moved = {
        c: max(step.get(c, 0) for r in reports.values() for step in r["comm"]) for c in COLLECTIVES
    }
    earlier = len(fb.problems)
    over = [c for c in COLLECTIVES if moved[c] > predicted[c]]
    for c in over:
        fb.expect(
            False,
            f"{c} moved {moved[c]:,} B in one step ({moved[c] / (4 * PSI):.2f} x 4 PSI), you "
            f"predicted {predicted[c]:,} B: {_WHY[c]}",
            brief="more bytes moved than you predicted",
        )
    unused = [c for c in COLLECTIVES if moved[c] == 0 < predicted[c]]
    for c in unused:
        fb.expect(
            False,
            f"you predicted {predicted[c]:,} B of {c} and this plan calls no {c} in a step "
            f"(bytes per collective: {_moved_text(moved)}): {_WHY[c]}",
            brief=f"you predicted bytes of {c}, a collective this plan does not call",
        )
    loose = [c for c in COLLECTIVES if 0 < moved[c] and predicted[c] > LOOSE * moved[c]]
    for c in loose:
        fb.expect(
            False,
            f"you predicted {predicted[c]:,} B of {c} and {moved[c]:,} B moved: a bound "
            f"{predicted[c] / moved[c]:.1f}x too high says little; the formulas are exact here",
            brief=f"your prediction of {c} is far above what moved",
        )
    if len(fb.problems) > earlier == 0:  # the bytes are all that is wrong: hint at them
        if over:
            fb.hints[:] = [f"count the {over[0]} calls of one step: how many per micro-batch?"]
            fb.fixes[:] = [f"{c}: {moved[c] // (4 * PSI)} x 4 * PSI bytes" for c in over]
        else:
            fb.hints[:] = ["which collectives does your plan call, and how many times per step?"]
            reduced = {"reduce_scatter", "all_reduce"} & {*unused, *loose}
            if plan["gradient_sync"] == "last" and plan["micro_batches"] > 1 and reduced:
                fb.hints[:] = [
                    "with gradient_sync='last', in how many of the micro-batches' backward "
                    "passes are the gradients reduced?"
                ]
            fb.fixes[:] = [f"predicted[{c!r}] = {moved[c]:,}" for c in [*unused, *loose]]
    total_moved = sum(moved.values())
    if most_bytes is not None and not fb.expect(
        total_moved <= most_bytes,
        f"your plan moved {total_moved:,} B in one step, more than the {most_bytes:,} B asked for",
        brief="the plan moves more bytes than the exercise allows",
    ):
        fb.hints[:] = ["which lever multiplies the collectives, and which shrinks memory without?"]
    return fb


def _moved_text(moved: dict[str, int]) -> str:
    return ", ".join(f"{c} {b:,}" for c, b in moved.items())


def _wrong_gradients(
    fb: Feedback, plan: dict, world: int, rank: int, call: int, g: dict, tol: float
) -> None:
    """End the check on a step whose gradients at optimizer.step() are not one process's, with
    what they are instead: the previous step's left in p.grad, the ranks' sum, a micro-batch
    weighted k times, or only their size and direction."""
    k, ratio = plan["micro_batches"], g["ratio"]
    hint = (
        "the step runs, but its gradients are not one process's on the whole batch: which "
        "average is missing, over the micro-batches or over the ranks?"
    )
    brief = "the step's gradients are not one process's"
    if call and g.get("gap_less_previous", float("inf")) < tol:
        what = (
            "this step's plus the previous step's: the previous step's gradients were still in "
            "p.grad when this step's backward() added to them"
        )
        hint = (
            "the first step's gradients were right and the second's were not: backward() adds "
            "to p.grad, so what clears it at the start of each step (optimizer.zero_grad())?"
        )
        fix = "call optimizer.zero_grad(set_to_none=True) first in train_step, before any backward"
        brief = "the second step's gradients still hold the first step's"
    elif abs(ratio - world) < 0.05 * world:
        what = f"{ratio:.2f}x one process's: the ranks' gradients were summed, not averaged"
        fix = "divide each all-reduced gradient by dist.get_world_size()"
    elif k > 1 and abs(ratio - k) < 0.05 * k:
        what = f"{ratio:.2f}x one process's: each micro-batch counted as a whole batch"
        fix = "divide each micro-batch's loss by the number of micro-batches before backward()"
    else:
        what = f"{ratio:.2f}x one process's in size, cosine {g['cosine']:.3f} in direction"
        fix = "every sample once, with the same weight: equal micro-batches, each loss / k"
    fb.hints[:], fb.fixes[:] = [hint], [fix]
    fb.fail(
        f"on rank {rank} the gradients handed to optimizer.step() in step {call + 1} of {STEPS} "
        f"differ from one process's by {g['gap']:.1e} of the largest (at most {tol:.1e}, the "
        f"rounding): they are {what}",
        brief=brief,
    )


def _lever(plan: dict, state: int, budget: int) -> tuple[list[str], list[str]]:
    """The hint and the fix for a plan over the budget: the lever it has not pulled yet."""
    if plan["shard"] in ("replicate", "ddp"):
        return (
            [
                f"every rank keeps the whole training state ({format_bytes(state)}: 16 B per "
                "parameter with Adam): which ZeRO stage splits it over the ranks?"
            ],
            ["plan['shard'] = 'zero3': parameters, gradients and Adam's state, each 1/N per rank"],
        )
    if plan["shard"] == "shard_grad_op":
        return (
            ["shard_grad_op keeps each block's parameters gathered from forward to backward"],
            ["plan['shard'] = 'zero3' frees each block's gathered parameters after its forward"],
        )
    if state > budget:
        return (["the sharded state alone is over: more ranks split it further"], ["nproc=4"])
    if plan["gradient_sync"] == "last" and plan["micro_batches"] > 1:
        return (
            [
                "with gradient_sync='last' every rank keeps whole gradients between micro-batches "
                f"(4 B per parameter, {format_bytes(4 * PSI)}): what does that cost, and what "
                "does the default keep instead?"
            ],
            [
                "plan['gradient_sync'] = 'every' keeps only the sharded gradients (4 PSI / N); "
                "or more ranks (nproc=4) to split the rest"
            ],
        )
    levers = []
    if plan["micro_batches"] == 1:
        levers.append("plan['micro_batches'] = 4")
    if not plan["checkpointing"]:
        levers.append("plan['checkpointing'] = True")
    return (
        [
            "above the sharded state, the activations are what is left: what keeps fewer of them "
            "alive at once?"
        ],
        [" and/or ".join(levers) or "more micro-batches"],
    )
