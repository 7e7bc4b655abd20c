"""Checkers for notebooks 07 (data parallelism) and 08 (model parallelism).

* ``check_ddp_script``: runs the learner's DDP script for real (2 processes, ``launch``) and
  compares what it reports with single-process training the notebook computed.
* ``check_sampler_padding``: what ``DistributedSampler`` does when the data does not split evenly.
* ``check_allreduce_counts``: how many all-reduces gradient accumulation costs, with and
  without ``no_sync()``.
* ``check_no_sync_step``: the learner's accumulation loop on a real DDP model must give the
  full-batch gradients with one all-reduce per bucket (counted by a communication hook).
* ``check_bubble``: the learner's formula for the idle fraction of a GPipe pipeline.
* ``check_microbatch_step``: the learner's micro-batch loop must give the full-batch gradients
  (also when the batch does not split into equal micro-batches).

A bug-hunt exercise starts from code that is wrong on purpose; run as shipped, it is "not
answered yet" (``@checker`` finds it in ``shipped.json``, read from the notebooks), and its hint
(``shipped_hint``) names no bug, so the saved output gives nothing away.
* ``check_split_forward``: the learner's forward over two stages on two devices must let the
  gradient reach the first stage (the bug hunt of notebook 08).
"""

from __future__ import annotations

import ast
import copy
import gc
import hashlib
import math
import os
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.utils.data import DistributedSampler

from ..distributed import LaunchError, launch
from . import Feedback, checker
from .answers import Given, checker_device, describe, finite_number, number_problem, whole_number

__all__ = [
    "check_allreduce_counts",
    "check_bubble",
    "check_ddp_script",
    "check_microbatch_step",
    "check_no_sync_step",
    "check_sampler_padding",
    "check_split_forward",
    "not_answered",
]

#: sha256 of ``notebooks/scripts/ddp_exercise.py`` as the course ships it (with its two bugs);
#: ``tests/test_exercises_parallel.py`` keeps it equal to the file.
#: ddp_exercise.py against one process after its 3 epochs: 12 SGD steps, each summing 8 and 32
#: products and 16 samples in another order (notebook 07, check 2), relative to the largest weight.
DDP_RUN_RTOL = 12 * 2 * (8 + 32 + 16) * 2.0**-24
DDP_EXERCISE_SHA256 = "1369850e79eca32f056142b3455909b7fb7593e07e41186bcdacbcf6616fa18d"


def not_answered(title: str, what: str, hint: str) -> Feedback:
    """The feedback for a bug hunt run as shipped: not an attempt, and no answer shown."""
    fb = Feedback(title)
    fb.answered = False
    sentence = (
        f"{what} is still the exercise's starting code: find the bug, change it, then run the "
        "cell again (this run did not count as an attempt)"
    )
    fb.problems, fb.briefs = [sentence], [sentence]
    fb.hint(hint)
    return fb


def _positive_int(value: object, name: str, purpose: str) -> int:
    number = whole_number(value)
    if number is None or number < 1:
        raise ValueError(f"{purpose}: {name} must be a whole number of at least 1, not {value!r}")
    return number


def _tolerance(value: object, purpose: str) -> float:
    number = finite_number(value)
    if number is None or number < 0:
        raise ValueError(f"{purpose}: rtol must be a finite number >= 0, not {value!r}")
    return number


def rounding_bound(terms: int) -> float:
    """How far two correct computations that add the same ``terms`` numbers in other orders can
    drift apart, relative to the largest value: each order is within ``terms`` fp32 roundings
    (2**-24) of the exact sum, so two are within twice that. The graders compare a learner's
    gradients, outputs and weights with their own reference this way: a learner's loop may sum
    in another order than the reference (per micro-batch, per rank) and is still right, while a
    mistake (a missing average, a wrong graph) is off by far more."""
    return 2 * terms * 2.0**-24


def relative_difference(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """The largest difference, in units of the largest reference value (NaN stays NaN; a
    missing or misshapen tensor is infinitely far)."""
    got, want = list(got), list(want)
    if len(got) != len(want) or any(
        not isinstance(g, torch.Tensor) or g.shape != w.shape
        for g, w in zip(got, want, strict=True)
    ):
        return math.inf
    scale = max(float(w.detach().abs().max()) for w in want) or 1.0
    gaps = [float((g.detach() - w.detach()).abs().max()) for g, w in zip(got, want, strict=True)]
    return max(gaps) / scale


def _flat_floats(values: object) -> torch.Tensor | None:
    """A report's list of numbers as a flat float32 tensor, or None when it is not one."""
    try:
        flat = torch.as_tensor(values, dtype=torch.float32).flatten()
    except (TypeError, ValueError, RuntimeError):
        return None
    return flat


def check_ddp_script(
    script: str | os.PathLike,
    reference_params: Sequence[float] | torch.Tensor,
    nproc: int = 2,
    timeout: float = 180.0,
    rtol: float = DDP_RUN_RTOL,
) -> Feedback:
    """Run ``script`` on ``nproc`` processes; it must shuffle anew each epoch and match one process.

    The script reports (``report()`` in ``scripts/common.py``) ``orders``: the sample indices this
    rank saw, per epoch, and ``params``: its final parameters, flattened. They must be within
    ``rtol`` of ``reference_params``, relative to the largest (notebook 07's check 2 derives it).
    """
    purpose = "check_ddp_script"
    nproc = _positive_int(nproc, "nproc", purpose)
    rtol = _tolerance(rtol, purpose)
    ref = _flat_floats(reference_params)
    if ref is None or not bool(torch.isfinite(ref).all()):
        raise ValueError(f"{purpose}: reference_params must be finite numbers")
    title = f"{os.path.basename(script)} trains like one process on the full batch"
    hint = "compare the training loop with ddp_train.py's, line by line"
    try:
        digest = hashlib.sha256(open(script, "rb").read()).hexdigest()  # noqa: SIM115
    except OSError:
        digest = None  # launch() says what is wrong with the path
    if digest == DDP_EXERCISE_SHA256:
        return not_answered(title, os.path.basename(script), hint)
    return _check_ddp_run(script, ref, nproc, timeout, rtol, title, hint)


#: The learning rate of ``ddp_train.py`` and ``ddp_exercise.py`` (``ref_params`` was trained at it).
DDP_LR = 0.1


def _learning_rate_changed(script: str | os.PathLike) -> str | None:
    """How the script changes the course's learning rate, or ``None``: the module constant
    ``LR`` and every ``lr=`` keyword must be ``DDP_LR`` (or the name ``LR``). Read from the
    script's syntax tree; a script that cannot be read or parsed is left to ``launch``."""
    try:
        tree = ast.parse(open(script, encoding="utf-8").read())  # noqa: SIM115
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target, value in _assigned(node):
                if target == "LR" and not _is_rate(value, allow_name=False):
                    return f"the script sets LR = {ast.unparse(value)}"
        elif isinstance(node, ast.keyword) and node.arg == "lr":
            if not _is_rate(node.value, allow_name=True):
                return f"the optimizer gets lr={ast.unparse(node.value)}"
    return None


def _assigned(node: ast.Assign) -> list[tuple[str, ast.expr]]:
    """``(name, value)`` for ``NAME = value`` and ``A, B = x, y`` assignments."""
    pairs = []
    for target in node.targets:
        if isinstance(target, ast.Name):
            pairs.append((target.id, node.value))
        elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            pairs += [
                (t.id, v)
                for t, v in zip(target.elts, node.value.elts, strict=False)
                if isinstance(t, ast.Name)
            ]
    return pairs


def _is_rate(value: ast.expr, allow_name: bool) -> bool:
    if allow_name and isinstance(value, ast.Name) and value.id in ("LR", "lr"):
        return True
    return isinstance(value, ast.Constant) and value.value == DDP_LR


@checker
def _check_ddp_run(
    script: str | os.PathLike,
    ref: torch.Tensor,
    nproc: int,
    timeout: float,
    rtol: float,
    title: str,
    hint: str,
) -> Feedback:
    fb = Feedback(title)
    fb.hint(hint)
    changed = _learning_rate_changed(script)
    fb.require(
        changed is None,
        f"{changed}: ref_params were trained with lr {DDP_LR}, and SGD's step is lr times the "
        "gradient, so a changed learning rate can hide gradients of the wrong size; keep "
        f"LR = {DDP_LR} and fix the gradients",
        brief="the learning rate was changed",
    )
    try:
        result = launch(script, nproc=nproc, timeout=timeout, echo=None)
    except LaunchError as exc:
        fb.fail(f"the script did not finish: {exc}", brief="the script did not finish")
    fb.require(
        sorted(result.reports) == list(range(nproc)),
        f"every rank must call report(...); got reports from ranks {sorted(result.reports)}",
        brief="not every rank reported its result",
    )
    reports = [result.reports[r] for r in range(nproc)]
    fb.require(
        all(isinstance(r, dict) for r in reports),
        "each rank must report a dict, like ddp_train.py: report(orders=..., params=...)",
        brief="a rank reported something that is not a dict",
    )
    orders = reports[0].get("orders")
    fb.expect(
        isinstance(orders, list) and len(orders) >= 2 and any(o != orders[0] for o in orders[1:]),
        "every epoch visits the samples in the same order: call sampler.set_epoch(epoch) "
        "at the start of each epoch, so DistributedSampler shuffles differently each time",
        brief="the ranks see the samples in the same order every epoch",
    )
    params = [_flat_floats(r.get("params")) for r in reports]
    fb.require(
        all(p is not None and p.shape == ref.shape for p in params),
        "report 'params' as all the model's parameters, flattened, like ddp_train.py",
        brief="the reported parameters are missing or have the wrong size",
    )
    fb.require(
        all(bool(torch.isfinite(p).all()) for p in params),
        "the parameters have NaN or infinite values: the training diverged",
        brief="the training diverged",
    )
    fb.expect(
        all(torch.equal(params[0], p) for p in params[1:]),
        "the ranks ended with different parameters: every rank must start from the same "
        "seed and step with the same (all-reduced) gradients",
        brief="the ranks ended with different parameters",
    )
    diff = relative_difference([params[0]], [ref])  # relative to the largest parameter
    if not fb.expect(
        diff <= rtol,
        f"the parameters differ from single-process training by up to {diff:.1e}",
        brief="the parameters differ from single-process training",
    ):
        fb.fix(
            "DDP's backward already averages the gradients over the ranks; dividing them by "
            "the world size again halves every step"
        )
    return fb


@checker(answers=("per_rank", "repeated"))
def check_sampler_padding(
    per_rank: int | None, repeated: int | None, n: int = 64, world: int = 3
) -> Feedback:
    """``n`` samples on ``world`` ranks: samples per rank per epoch, and how many are seen twice."""
    n = _positive_int(n, "n", "check_sampler_padding")
    world = _positive_int(world, "world", "check_sampler_padding")
    data = list(range(n))
    shards = [
        list(DistributedSampler(data, num_replicas=world, rank=r, shuffle=True, seed=0))
        for r in range(world)
    ]
    want_per_rank = len(shards[0])
    want_repeated = sum(len(s) for s in shards) - len(set().union(*shards))
    fb = Feedback(f"{n} samples on {world} ranks with DistributedSampler")
    fb.hint("build the samplers and count: what does a sampler do when n does not split evenly?")
    fb.require(
        per_rank is not None and repeated is not None,
        "set per_rank and repeated (build the samplers and count)",
        brief="per_rank and repeated are not set yet",
    )
    got_per_rank, got_repeated = whole_number(per_rank), whole_number(repeated)
    fb.expect(
        got_per_rank == want_per_rank,
        f"per_rank = {describe(per_rank)}, but each rank gets {want_per_rank} samples per epoch",
        brief="per_rank is not the number of samples each rank gets",
    )
    fb.expect(
        got_repeated == want_repeated,
        f"repeated = {describe(repeated)}, but {want_repeated} sample(s) are seen twice in an "
        "epoch",
        brief="repeated is not the number of samples seen twice",
    )
    fb.fix(
        "with drop_last=False the sampler pads the shuffled indices to a multiple of the "
        "world size by repeating the first ones: every rank gets ceil(n / world)"
    )
    return fb


@checker(answers=("plain", "with_no_sync"))
def check_allreduce_counts(
    plain: object, with_no_sync: object, k: int = 8, buckets: int = 1
) -> Feedback:
    """All-reduces in one optimizer step of ``k`` accumulated micro-batches, for a model whose
    gradients fill ``buckets`` DDP buckets: ``plain`` without ``no_sync()``, ``with_no_sync``
    with it on all but the last micro-batch."""
    k = _positive_int(k, "k", "check_allreduce_counts")
    buckets = _positive_int(buckets, "buckets", "check_allreduce_counts")
    fb = Feedback(f"all-reduces for {k} accumulated micro-batches ({buckets} bucket(s))")
    fb.hint(
        "DDP all-reduces every bucket at the end of every backward() it is allowed to sync; "
        "no_sync() turns that off for the backward passes inside it"
    )
    fb.fix(
        f"plain = k * buckets = {k * buckets} (every backward syncs); "
        f"with_no_sync = buckets = {buckets} (only the last backward syncs)"
    )
    fb.require(
        plain is not None and with_no_sync is not None,
        "set plain and with_no_sync to whole numbers",
        brief="plain and with_no_sync are not set yet",
    )
    got_plain, got_sync = whole_number(plain), whole_number(with_no_sync)
    fb.expect(
        got_plain == k * buckets,
        f"plain = {describe(plain)}, but each of the {k} backward passes all-reduces all "
        f"{buckets} bucket(s): {k * buckets}",
        brief="plain is not the number of all-reduces without no_sync",
    )
    fb.expect(
        got_sync == buckets,
        f"with_no_sync = {describe(with_no_sync)}, but only the last backward (outside "
        f"no_sync) all-reduces, once per bucket: {buckets}",
        brief="with_no_sync is not the number of all-reduces with no_sync",
    )
    return fb


def _counting_ddp(module: nn.Module) -> tuple[nn.Module, list[int]]:
    """``module`` in DDP, with a communication hook that counts the buckets it reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(module)
    calls = [0]

    def hook(state, bucket):
        calls[0] += 1
        return default_hooks.allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, hook)
    return ddp, calls


@checker(answers=("accumulate",))
def check_no_sync_step(
    accumulate: Callable[[nn.Module, torch.Tensor, torch.Tensor, int], None], k: int = 4
) -> Feedback:
    """``accumulate(model, x, y, k)``: ``model`` is a DDP model; cut the batch into ``k``
    micro-batches and leave in ``.grad`` the full batch's MSE gradients, all-reducing each
    gradient bucket once (``no_sync()`` around all but the last backward).

    Runs in this process: a one-process gloo group (created here and destroyed after, unless
    one exists already), a seeded model, and a communication hook that counts the all-reduces.
    The reference (one backward over the whole batch, its all-reduces counted) comes first,
    on private copies.
    """
    import torch.distributed as dist

    k = _positive_int(k, "k", "check_no_sync_step")
    fb = Feedback(f"{k} micro-batches under DDP: full-batch gradients, one all-reduce per bucket")
    fb.hint(
        "inside `with model.no_sync():` a backward only adds to .grad; DDP all-reduces at the "
        "first backward outside it: which one should that be?"
    )
    fb.fix(
        "with model.no_sync(): backward of all micro-batches but the last, each loss divided "
        "by k; then the last micro-batch's backward outside it, which all-reduces the sum"
    )
    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        created = True
    ref = model = None
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            base = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
            gen = torch.Generator().manual_seed(1)
            x, y = torch.randn(8 * k, 16, generator=gen), torch.randn(8 * k, 4, generator=gen)
        ref, ref_calls = _counting_ddp(copy.deepcopy(base))
        nn.functional.mse_loss(ref(x), y).backward()
        buckets = ref_calls[0]
        ref_grads = [p.grad.clone() for p in ref.parameters()]
        model, calls = _counting_ddp(copy.deepcopy(base))
        weights = [p.detach().clone() for p in model.parameters()]
        backwards: list[int] = []
        events: list[str] = []  # what each pass carried: "F8" a forward of 8 rows, "B" a backward
        first = next(model.module.parameters())

        def backward_seen(_param) -> None:
            backwards.append(1)
            events.append("B")

        hooks = [
            first.register_post_accumulate_grad_hook(backward_seen),
            model.module.register_forward_pre_hook(
                lambda _m, args: events.append(
                    f"F{args[0].shape[0]}" if args and isinstance(args[0], torch.Tensor) else "F?"
                )
            ),
        ]
        try:
            fb.run("accumulate(model, x, y, k)", accumulate, model, Given("x", x), Given("y", y), k)
        finally:
            for hook in hooks:
                hook.remove()
        rows = len(x) // k
        fb.expect(
            events == [f"F{rows}", "B"] * k,
            f"the passes ran as {' '.join(events) or 'nothing'} (F8: a forward of 8 rows, B: a "
            f"backward): each of the {k} micro-batches needs its own forward of {rows} rows, "
            "then its own backward",
            brief=f"each micro-batch ({rows} rows) does not get its own forward and backward",
        )
        fb.expect(
            all(
                torch.equal(w, p.detach()) for w, p in zip(weights, model.parameters(), strict=True)
            ),
            "the weights changed: only accumulate the gradients, do not step",
            brief="the weights changed",
        )
        fb.expect(
            len(backwards) == k,
            f"{len(backwards)} backward pass(es) reached the model; run one per micro-batch ({k})",
            brief=f"not one backward per micro-batch ({k})",
        )
        if calls[0] == 0:
            fb.expect(
                False,
                "no all-reduce ran: every backward was inside no_sync(), so each rank keeps "
                "its own gradients and the ranks drift apart",
                brief="the gradients were never all-reduced",
            )
        elif calls[0] != buckets:
            fb.expect(
                False,
                f"{calls[0]} all-reduces ran for a model whose gradients fill {buckets} "
                f"bucket(s): one backward outside no_sync() should make {buckets}",
                brief="more all-reduces than one per bucket",
            )
        grads = [p.grad for p in model.parameters()]
        fb.require(
            all(g is not None for g in grads),
            "some parameters have no gradient: call backward on each micro-batch's loss",
            brief="some parameters have no gradient",
        )
        diff = relative_difference(grads, ref_grads)
        # a Linear(16, 32), a Linear(32, 4) and 8 k rows, summed in another order
        if not (math.isfinite(diff) and diff <= rounding_bound(16 + 32 + 8 * k)):
            ratio = sum(float(g.norm()) for g in grads) / max(
                sum(float(r.norm()) for r in ref_grads), 1e-30
            )
            size = f"they are {k}x too large; " if abs(ratio - k) < 0.05 * k else ""
            fb.expect(
                False,
                f"{size}the gradients differ from one backward over the whole batch by up "
                f"to {diff:.1e}",
                brief="the gradients differ from the full batch's",
            )
    finally:
        # The counting hook's all-reduce ends with a Python callback on gloo's worker thread. A
        # DDP model freed while that callback waits for the GIL drops the last reference to the
        # group, whose destructor joins that thread with the GIL held: a hang (seen under load).
        # barrier() waits with the GIL released, so every callback has run when it returns; the
        # models go next, while the group still exists, and the group last.
        if dist.is_initialized():
            dist.barrier()
        ref = model = None
        gc.collect()
        if created:
            dist.destroy_process_group()
    return fb


@checker(answers=("bubble",))
def check_bubble(bubble: Callable[[int, int], float]) -> Feedback:
    """``bubble(p, m)``: the fraction of time a GPipe stage idles, p stages and m micro-batches."""
    fb = Feedback("bubble(p, m) is the idle fraction of a GPipe pipeline")
    fb.hint("draw the schedule: how many time slots does one step take, and how many are busy?")
    wrong = []
    for p in (1, 2, 4, 8):
        for m in (1, 2, 4, 16, 64):
            want = (p - 1) / (m + p - 1)
            got = fb.run(f"bubble({p}, {m})", bubble, p, m)
            value = finite_number(got)
            fb.require(
                value is not None,
                number_problem(f"bubble({p}, {m})", got) + " between 0 and 1",
                brief="bubble does not return a number",
            )
            if abs(value - want) > 1e-9:
                wrong.append(f"bubble({p}, {m}) = {value:.4f}, expected {want:.4f}")
    fb.expect(
        not wrong,
        "; ".join(wrong[:3]) + (" ..." if len(wrong) > 3 else ""),
        brief=f"{len(wrong)} of 20 values are wrong",
    )
    fb.fix("one step lasts m + p - 1 slots; each stage works in m of them: (p - 1) / (m + p - 1)")
    return fb


def check_microbatch_step(
    step: Callable[[nn.Module, torch.Tensor, torch.Tensor, int], None],
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    m: int = 4,
    rtol: float | None = None,
) -> Feedback:
    """``step(model, x, y, m)`` must leave in ``.grad`` the full batch's MSE gradients (see
    ``_check_microbatch_step``), within ``rtol`` of the largest (by default the rounding of a sum
    as long as all the model's parameters and the batch together: no sum in it is longer).
    Notebook 08's starting code (right only when the micro-batches are equal) run as shipped on
    uneven ones is not an answer yet."""
    return _check_microbatch_step(step, model, x, y, m, rtol)


@checker(
    answers=("step",),
    shipped_hint="how many samples are in each micro-batch here, and what is the whole batch's "
    "mean loss in terms of the micro-batches' mean losses?",
)
def _check_microbatch_step(
    step: Callable[[nn.Module, torch.Tensor, torch.Tensor, int], None],
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    m: int = 4,
    rtol: float | None = None,
) -> Feedback:
    """``step(model, x, y, m)`` must leave in ``.grad`` the gradients of MSE on the whole batch,
    from ``m`` backward passes, one per micro-batch.

    Nothing of the notebook's is modified: the checker works on copies of ``model``, ``x`` and
    ``y`` (changing them fails). The step must not change the weights (no optimizer step) or
    the model's parameters, must call backward ``m`` times (one full-batch backward gives the
    same gradients but is not the exercise), and every gradient must be finite and match.
    """
    purpose = "check_microbatch_step"
    if not isinstance(model, nn.Module):
        raise ValueError(f"{purpose}: model must be an nn.Module, not {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"{purpose}: the model has no parameter that requires grad (frozen?)")
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or len(x) != len(y):
        raise ValueError(f"{purpose}: x and y must be tensors with the same number of rows")
    if not (x.is_floating_point() and y.is_floating_point()):
        raise ValueError(
            f"{purpose}: x and y must be floating-point tensors, not {x.dtype} and {y.dtype}: "
            "make them with torch.randn(...) or call .float() on them"
        )
    m = _positive_int(m, "m", purpose)
    if m > len(x):
        raise ValueError(f"{purpose}: m={m} micro-batches is more than the {len(x)} samples")
    n_params = sum(p.numel() for p in model.parameters())
    rtol = rounding_bound(n_params + len(x)) if rtol is None else _tolerance(rtol, purpose)
    fb = Feedback(f"{m} micro-batches give the full-batch gradients")
    fb.hint(
        "the loss of the whole batch is a mean over all samples: what is it in terms of the "
        "micro-batches' mean losses?"
    )
    fb.fix(
        "cut x and y the same way (x.chunk(m), y.chunk(m)), weight each micro-batch's mean "
        "loss by its share of the batch, len(xm) / len(x) (1 / m when they are equal), and "
        "call backward on it: gradients add up in .grad"
    )
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    try:
        nn.functional.mse_loss(ref(x), y).backward()
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ValueError(f"{purpose}: the model cannot train on x and y ({first})") from None
    sizes = [len(c) for c in x.chunk(m)]
    by_m = None  # the gradients of "divide each micro-batch's loss by m", when sizes differ
    if len(set(sizes)) > 1:
        by_m = copy.deepcopy(model)
        by_m.zero_grad(set_to_none=True)
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            (nn.functional.mse_loss(by_m(xm), ym) / len(sizes)).backward()
    mine = copy.deepcopy(model)
    mine.zero_grad(set_to_none=True)
    shapes = [(name, p.shape) for name, p in mine.named_parameters()]
    weights = [p.detach().clone() for p in mine.parameters()]
    first_param = next(p for p in mine.parameters() if p.requires_grad)
    backwards: list[int] = []  # one entry per backward pass that reached the model
    hook = first_param.register_post_accumulate_grad_hook(lambda p: backwards.append(1))
    try:
        fb.run("step(model, x, y, m)", step, mine, Given("x", x), Given("y", y), m)
    finally:
        hook.remove()
    fb.require(
        [(name, p.shape) for name, p in mine.named_parameters()] == shapes,
        "the step changed the model's parameters (added, removed or reshaped some): only "
        "compute the gradients of the model as it is given",
        brief="the step changed the model's parameters",
    )
    pairs = [
        (name, p.grad, q.grad)
        for (name, p), q in zip(mine.named_parameters(), ref.parameters(), strict=True)
        if q.requires_grad
    ]
    fb.expect(
        all(torch.equal(w, p.detach()) for w, p in zip(weights, mine.parameters(), strict=True)),
        "the step changed the model's weights: only compute the gradients, do not step",
        brief="the step changed the weights",
    )
    missing = [name for name, g, _ in pairs if g is None]
    fb.require(
        not missing,
        f"these parameters have no gradient: {', '.join(missing)}: call backward() on each "
        "micro-batch's loss",
        brief="some parameters have no gradient",
    )
    fb.require(
        all(bool(torch.isfinite(g).all()) for _, g, _ in pairs),
        "some gradients are NaN or infinite",
        brief="some gradients are not finite",
    )
    fb.expect(
        len(backwards) == m,
        f"the step ran {len(backwards)} backward pass(es) through the model; with m={m} "
        f"micro-batches, call backward once per micro-batch ({m} passes), so only one "
        "micro-batch's activations are alive at a time",
        brief=f"the step does not run one backward pass per micro-batch ({m})",
    )
    diff = relative_difference([g for _, g, _ in pairs], [r for _, _, r in pairs])
    if not math.isfinite(diff) or diff > rtol:
        ratio = sum(float(g.norm()) for _, g, _ in pairs) / max(
            sum(float(r.norm()) for _, _, r in pairs), 1e-30
        )
        size = f"they are {m}x too large; " if abs(ratio - m) < 0.05 * m else ""
        by_m_grads = [] if by_m is None else [q.grad for q in by_m.parameters() if q.requires_grad]
        if by_m is not None and relative_difference([g for _, g, _ in pairs], by_m_grads) <= rtol:
            size = (
                f"the micro-batches hold {sizes} samples, yet each loss was divided by {m}: "
                "the short one then counts as much as a full one; "
            )
        fb.expect(
            False,
            f"{size}the gradients differ from the full batch's by up to {diff:.1e} of the largest",
            brief="the gradients differ from the full batch's",
        )
    return fb


def _two_stages(d0: torch.device, d1: torch.device) -> tuple[nn.Module, nn.Module]:
    with torch.random.fork_rng(devices=[]):  # seeded without touching the learner's RNG
        torch.manual_seed(0)
        stage0 = nn.Sequential(nn.Linear(16, 32), nn.ReLU()).to(d0)
        stage1 = nn.Linear(32, 4).to(d1)
    return stage0, stage1


def check_split_forward(forward: Callable, devices: Iterable[torch.device]) -> Feedback:
    """``forward(stage0, stage1, x, d0, d1) -> output``: run stage 0 on ``d0``, stage 1 on ``d1``.

    The checker trains nothing: it runs the learner's forward once on a seeded batch, calls
    backward on an MSE loss (labels on the output's device), and compares the output and every
    gradient of both stages with the same layers run on one device. When both devices are the
    same (CPU stand-ins), it also runs the forward with ``d1='meta'``: the output must be there,
    so a forward that runs both stages on the first device is caught. The colleague's code as
    shipped is not an answer yet.
    """
    return _check_split_forward(forward, devices)


@checker(
    answers=("forward",),
    shipped_hint="train it for a few steps, or look at which parameters get a gradient",
)
def _check_split_forward(forward: Callable, devices: Iterable[torch.device]) -> Feedback:
    need = "check_split_forward needs two devices, e.g. devices.demo_devices(2)"
    if isinstance(devices, (str, torch.device)):
        raise ValueError(need)
    try:
        pair = [torch.device(d) for d in devices]
    except (TypeError, RuntimeError):
        raise ValueError(need) from None
    if len(pair) < 2:
        raise ValueError(need)
    d0, d1 = (checker_device(d, "check_split_forward") for d in pair[:2])
    fb = Feedback("a forward pass split over two devices that autograd can go back through")
    fb.hint(
        "compare which parameters get a gradient: does anything on the way from stage 0 to "
        "stage 1 cut the activation out of the graph?"
    )
    fb.fix(
        "move the activation with h.to(d1) only: .detach() (or .data, or a new tensor made "
        "from h) cuts the graph, so stage 0 never gets a gradient and never learns"
    )
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
    ref0, ref1 = _two_stages(torch.device("cpu"), torch.device("cpu"))
    ref_out = ref1(ref0(x))
    nn.functional.mse_loss(ref_out, y).backward()

    stage0, stage1 = _two_stages(d0, d1)
    out = fb.run(
        "your forward", forward, stage0, stage1, Given("x", x), d0, d1, returns=torch.Tensor
    )
    fb.require(
        out.shape == ref_out.shape,
        f"the output has shape {tuple(out.shape)}, not {tuple(ref_out.shape)}",
        brief="the output has the wrong shape",
    )
    fb.expect(
        out.device.type == d1.type,
        f"the output is on {out.device}, not on the second stage's device {d1}",
        brief="the output is not on the last stage's device",
    )
    # Linear(16, 32) then Linear(32, 4) on 8 rows: sums of 16 and 32 products, two devices
    bound = rounding_bound(16 + 32)
    fb.expect(
        relative_difference([out.detach().cpu().float()], [ref_out.detach()]) <= bound,
        "the output differs from stage1(stage0(x)) on one device",
        brief="the output is not the two stages applied in order",
    )
    fb.require(
        out.requires_grad,
        "the output is not part of an autograd graph: nothing can be trained through it",
        brief="nothing can be trained through the output",
    )
    nn.functional.mse_loss(out, y.to(out.device)).backward()
    for name, stage, ref in (("stage 0", stage0, ref0), ("stage 1", stage1, ref1)):
        grads = [p.grad for p in stage.parameters()]
        if not fb.expect(
            all(g is not None for g in grads),
            f"{name}'s parameters got no gradient from backward(): the graph is cut between "
            "the stages",
            brief=f"{name} gets no gradient",
        ):
            continue
        fb.expect(
            relative_difference([g.cpu() for g in grads], [r.grad for r in ref.parameters()])
            <= rounding_bound(16 + 32 + 4 + len(x)),
            f"{name}'s gradients differ from the same layers on one device",
            brief=f"{name}'s gradients are wrong",
        )
    if d0 == d1:  # CPU stand-ins cannot tell the stages apart: run stage 1 on meta too
        meta = torch.device("meta")
        s0, s1 = _two_stages(d0, meta)
        out = fb.run(
            f"your forward with d1='meta' (stage 0 on {d0})",
            forward,
            s0,
            s1,
            Given("x", x),
            d0,
            meta,
            returns=torch.Tensor,
        )
        fb.expect(
            out.device.type == "meta" and out.requires_grad,
            f"with stage 1 on 'meta' (a second device the stand-ins can tell apart) the output "
            f"is on {out.device}{'' if out.requires_grad else ', outside the graph'}: run stage "
            "1 on d1, with the activation moved there by .to(d1)",
            brief="the second stage does not run on the second device",
        )
    return fb
