"""Checkers for notebooks 03 (data parallelism) and 04 (model parallelism).

* ``check_ddp_script``: runs the learner's DDP script for real (2 processes, ``launch``) and
  compares what it reports with single-process training the notebook computed.
* ``check_sampler_padding``: what ``DistributedSampler`` does when the dataset does not split evenly.
* ``check_bubble``: the learner's formula for the idle fraction of a GPipe pipeline.
* ``check_microbatch_step``: the learner's micro-batch loop must give the full-batch gradients.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..distributed import LaunchError, launch
from . import Feedback

__all__ = ["check_bubble", "check_ddp_script", "check_microbatch_step", "check_sampler_padding"]


def check_ddp_script(script: str | os.PathLike, reference_params: Sequence[float] | torch.Tensor,
                     nproc: int = 2, timeout: float = 180.0, atol: float = 1e-5) -> Feedback:
    """Run ``script`` on ``nproc`` processes; it must shuffle anew each epoch and match one process.

    The script reports (``report()`` in ``scripts/common.py``) ``orders``: the sample indices this
    rank saw, per epoch, and ``params``: its final parameters, flattened.
    """
    fb = Feedback(f"{os.path.basename(script)} trains like one process on the full batch")
    try:
        result = launch(script, nproc=nproc, timeout=timeout, echo=None)
    except LaunchError as exc:
        fb.expect(False, f"the script did not finish: {exc}")
        return fb
    if not fb.expect(sorted(result.reports) == list(range(nproc)),
                     f"every rank must call report(...); got reports from ranks {sorted(result.reports)}"):
        return fb
    reports = [result.reports[r] for r in range(nproc)]
    orders = reports[0].get("orders", [])
    fb.expect(len(orders) >= 2 and any(o != orders[0] for o in orders[1:]),
              "every epoch visits the samples in the same order: call sampler.set_epoch(epoch) "
              "at the start of each epoch, so DistributedSampler shuffles differently each time")
    ref = torch.as_tensor(reference_params, dtype=torch.float32).flatten()
    params = [torch.tensor(r.get("params", []), dtype=torch.float32) for r in reports]
    if not fb.expect(all(p.shape == ref.shape for p in params),
                     "report 'params' as all the model's parameters, flattened, like ddp_train.py"):
        return fb
    fb.expect(all(torch.equal(params[0], p) for p in params[1:]),
              "the ranks ended with different parameters: every rank must start from the same "
              "seed and step with the same (all-reduced) gradients")
    diff = (params[0] - ref).abs().max().item()
    if not fb.expect(diff <= atol,
                     f"the parameters differ from single-process training by up to {diff:.1e}"):
        fb.hint("DDP's backward already averages the gradients over the ranks; dividing them by "
                "the world size again halves every step")
    return fb


def check_sampler_padding(per_rank: int | None, repeated: int | None, n: int = 64,
                          world: int = 3) -> Feedback:
    """``n`` samples on ``world`` ranks: samples per rank per epoch, and how many are seen twice."""
    from torch.utils.data import DistributedSampler

    data = list(range(n))
    shards = [list(DistributedSampler(data, num_replicas=world, rank=r, shuffle=True, seed=0))
              for r in range(world)]
    want_per_rank = len(shards[0])
    want_repeated = sum(len(s) for s in shards) - len(set().union(*shards))
    fb = Feedback(f"{n} samples on {world} ranks with DistributedSampler")
    if not fb.expect(per_rank is not None and repeated is not None,
                     "set per_rank and repeated (build the samplers and count)"):
        return fb
    fb.expect(per_rank == want_per_rank,
              f"per_rank = {per_rank}, but each rank gets {want_per_rank} samples per epoch")
    fb.expect(repeated == want_repeated,
              f"repeated = {repeated}, but {want_repeated} sample(s) are seen twice in an epoch")
    if not fb.passed:
        fb.hint("with drop_last=False the sampler pads the shuffled indices to a multiple of the "
                "world size by repeating the first ones: every rank gets ceil(n / world)")
    return fb


def check_bubble(bubble: Callable[[int, int], float]) -> Feedback:
    """``bubble(p, m)``: the fraction of time a GPipe stage idles, p stages and m micro-batches."""
    fb = Feedback("bubble(p, m) is the idle fraction of a GPipe pipeline")
    wrong = []
    for p in (1, 2, 4, 8):
        for m in (1, 2, 4, 16, 64):
            want = (p - 1) / (m + p - 1)
            try:
                got = bubble(p, m)
            except Exception as exc:  # the learner's code: report any error as feedback
                fb.expect(False, f"bubble({p}, {m}) raised {type(exc).__name__}: {exc}")
                return fb
            if isinstance(got, bool) or not isinstance(got, (int, float)):
                fb.expect(False, f"bubble({p}, {m}) returned {got!r}: return a number between 0 and 1")
                return fb
            if abs(got - want) > 1e-9:
                wrong.append(f"bubble({p}, {m}) = {got:.4f}, expected {want:.4f}")
    fb.expect(not wrong, "; ".join(wrong[:3]) + (" ..." if len(wrong) > 3 else ""))
    if wrong:
        fb.hint("one step lasts m + p - 1 slots; each stage works in m of them")
    return fb


def check_microbatch_step(step: Callable[[nn.Module, torch.Tensor, torch.Tensor, int], None],
                          model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                          m: int = 4, atol: float = 1e-6) -> Feedback:
    """``step(model, x, y, m)`` must leave in ``.grad`` the gradients of MSE on the whole batch.

    ``model`` is not modified: the checker works on copies.
    """
    fb = Feedback(f"{m} micro-batches give the full-batch gradients")
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    nn.functional.mse_loss(ref(x), y).backward()
    mine = copy.deepcopy(model)
    mine.zero_grad(set_to_none=True)
    try:
        step(mine, x, y, m)
    except Exception as exc:  # the learner's code: report any error as feedback
        fb.expect(False, f"step(...) raised {type(exc).__name__}: {exc}")
        return fb
    grads = [(p.grad, q.grad) for p, q in zip(mine.parameters(), ref.parameters(), strict=True)]
    if not fb.expect(all(g is not None for g, _ in grads),
                     "some parameters have no gradient: call backward() on each micro-batch's loss"):
        return fb
    diff = max((g - r).abs().max().item() for g, r in grads)
    if not fb.expect(diff <= atol, f"the gradients differ from the full batch by up to {diff:.1e}"):
        ratio = sum(float(g.norm()) for g, _ in grads) / max(sum(float(r.norm()) for _, r in grads), 1e-30)
        if abs(ratio - m) < 0.05 * m:
            fb.hint(f"they are {m}x too large: divide each micro-batch's loss by m (the "
                    "mean over the batch is the mean of the micro-batch means)")
        else:
            fb.hint("cut x and y the same way (torch.chunk(x, m) and torch.chunk(y, m)) and "
                    "accumulate: do not zero the gradients between micro-batches")
    return fb
