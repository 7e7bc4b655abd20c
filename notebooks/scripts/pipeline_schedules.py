"""The newer pipeline schedules on 2 ranks: two stages per rank, four in all.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 pipeline_schedules.py

Notebook 08's model (``pipeline_gpipe.py``: 8 Linear + Tanh layers, 256 samples) is cut into 4
stages of 2 layers. Each rank holds two of them:

* looped placement (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble): rank r holds stages r
  and r + 2, so every stage boundary crosses between the ranks;
* V placement (ZBVZeroBubble, DualPipeV): rank r holds stages r and 3 - r, so the boundary
  between stages 1 and 2 stays on rank 1 and sends nothing.

For each schedule, with 4 micro-batches, each rank checks its stages' gradients against one
process doing the whole batch, counts the bytes it sends (wrapping the schedules' point-to-point
helper), the activations autograd holds at the worst moment (``HeldActivations``, as in notebook
08), and the schedule's own plan of actions per rank (``pipeline_order``). DualPipeV is also
built with fewer micro-batches than stages, which it refuses.
torch.distributed.pipelining is an alpha API: its names may still change.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from common import log, relative_gap, report, setup, teardown, within
from pipeline_gpipe import HeldActivations, batch, build_model, grad_tolerance, stage_layers
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as pp

STAGES, M = 4, 4  # stages in all (two per rank on 2 ranks), micro-batches
SCHEDULES = {  # name: where rank r's two stages sit
    "Interleaved1F1B": "loop",
    "LoopedBFS": "loop",
    "InterleavedZeroBubble": "loop",
    "ZBVZeroBubble": "v",
    "DualPipeV": "v",
}


def stage_ids(rank: int, world: int, style: str) -> list[int]:
    """The two stages rank ``rank`` holds: looped (r, r + world), V-shaped (r, 2 world - 1 - r)."""
    return [rank, rank + world] if style == "loop" else [rank, 2 * world - 1 - rank]


class SentBytes:
    """Bytes this rank hands to ``isend``, booked by wrapping the schedules' ``_batch_p2p``."""

    def __init__(self) -> None:
        self.sends: list[int] = []
        self._real = pp._batch_p2p

    def __enter__(self) -> SentBytes:
        def counted(ops, desc=None):
            for op in ops:
                if op.op.__name__ == "isend":
                    self.sends.append(op.tensor.numel() * op.tensor.element_size())
            return self._real(ops, desc)

        pp._batch_p2p = counted
        return self

    def __exit__(self, *exc) -> None:
        pp._batch_p2p = self._real


def build_schedule(name: str, rank: int, world: int, device, m: int = M):
    """Fresh stages for this rank and the schedule ``name`` over them (``Schedule<name>``)."""
    model = build_model().to(device)
    ids = stage_ids(rank, world, SCHEDULES[name])
    parts = [stage_layers(model, i, STAGES) for i in ids]
    stages = [PipelineStage(p, i, STAGES, device) for p, i in zip(parts, ids, strict=True)]
    schedule = getattr(pp, f"Schedule{name}")(
        stages, n_microbatches=m, loss_fn=nn.functional.mse_loss
    )
    return schedule, ids, parts


def run(name: str, rank: int, world: int, device, x, y, ref) -> dict:
    schedule, ids, parts = build_schedule(name, rank, world, device)
    params = [p for part in parts for p in part.parameters()]
    args = (x,) if 0 in ids else ()  # the rank with stage 0 feeds the input
    kwargs = {"target": y} if STAGES - 1 in ids else {}  # the last stage computes the loss
    held = HeldActivations(params)
    dist.barrier()
    with SentBytes() as sent, held.hooks():
        schedule.step(*args, **kwargs)
    want = [p.grad for i in ids for p in ref[i]]
    gap = relative_gap([p.grad for p in params], want)
    within(f"pipeline_schedules {name} grad_gap", gap, grad_tolerance())
    plan = schedule.pipeline_order  # rank -> [Action or None per time slot]
    return {
        "stages": ids,
        "grad_gap": gap,
        "grad_tol": grad_tolerance(),
        "sent_bytes": sum(sent.sends),
        "sends": len(sent.sends),
        "peak_bytes": held.peak,
        "plan": {r: [str(a) if a is not None else "" for a in acts] for r, acts in plan.items()},
    }


def one_stage_microbatch_bytes(device, x) -> int:
    """Bytes autograd saves for one micro-batch through one middle stage, outside any schedule."""
    part = stage_layers(build_model().to(device), 1, STAGES)
    held = HeldActivations(part.parameters())
    inp = torch.randn(len(x) // M, x.shape[1], device=device, requires_grad=True)
    with held.hooks():
        part(inp)
    return held.peak


def main() -> None:
    rank, world, device = setup()
    if world != 2:
        raise SystemExit("pipeline_schedules.py places 4 stages on 2 ranks: run it with 2")
    x, y = (t.to(device) for t in batch())
    full = build_model().to(device)
    nn.functional.mse_loss(full(x), y).backward()  # one process, the whole batch
    ref = {i: list(stage_layers(full, i, STAGES).parameters()) for i in range(STAGES)}

    out = {
        "world": world,
        "m": M,
        "stages": STAGES,
        "activation_bytes": (len(x) // M) * x.shape[1] * x.element_size(),  # one micro-batch
        "one_stage_microbatch_bytes": one_stage_microbatch_bytes(device, x),
        "runs": {name: run(name, rank, world, device, x, y, ref) for name in SCHEDULES},
    }
    try:
        build_schedule("DualPipeV", rank, world, device, m=STAGES // 2)
        out["dualpipev_few"] = "built"
    except ValueError as e:
        out["dualpipev_few"] = str(e)
    log(f"{len(SCHEDULES)} schedules, {STAGES} stages on {world} ranks, {M} micro-batches: ran")
    report(out)
    teardown()


if __name__ == "__main__":
    main()
