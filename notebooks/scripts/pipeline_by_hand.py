"""A two-stage pipeline written by hand: each process is one stage, micro-batches go by send/recv.

    torchrun --standalone --nproc-per-node=2 pipeline_by_hand.py

Rank 0 runs the first half of the layers, rank 1 the second half and the loss. GPipe order:
every micro-batch forward (rank 0 sends each activation as soon as it has it, so rank 1 can
start while rank 0 computes the next one), then every backward (rank 1 sends each input
gradient back). Each rank records when it computed what (wall clock, shared by the processes
of one machine), for the timeline in notebook 08, and checks its gradients against one
process doing the whole batch.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from common import log, relative_gap, report, setup, teardown, within
from pipeline_gpipe import batch, build_model, grad_tolerance, stage_layers
from torch import nn
from torch.nn import functional as F


def now(device: torch.device) -> float:
    """Wall-clock time once the device has finished its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.time()


def gpipe_step(part: nn.Module, rank: int, x: torch.Tensor, y: torch.Tensor, m: int) -> list:
    """One training step in m micro-batches; returns [(kind, micro-batch, start, end)]."""
    events, saved, sends = [], [], []
    dev = x.device
    for i, xm in enumerate(x.chunk(m)):
        if rank == 0:
            inp = xm
        else:
            inp = torch.empty(xm.shape[0], part[0].in_features, device=xm.device)
            dist.recv(inp, src=0)  # waits for stage 0's activation (idle time)
            inp.requires_grad_()
        start = now(dev)
        out = part(inp)
        events.append(("F", i, start, now(dev)))
        if rank == 0:
            sends.append(dist.isend(out.detach(), dst=1))  # do not wait: start the next one
        saved.append((inp, out))
    for i, (inp, out) in enumerate(saved):
        if rank == 1:
            start = now(dev)
            (F.mse_loss(out, y.chunk(m)[i]) / m).backward()  # mean of m means = full-batch mean
            events.append(("B", i, start, now(dev)))
            sends.append(dist.isend(inp.grad, dst=0))
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=1)  # waits for stage 1's gradient (idle time)
            start = now(dev)
            out.backward(grad)
            events.append(("B", i, start, now(dev)))
    for s in sends:
        s.wait()
    return events


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    rank, world, device = setup()
    assert world == 2, "this hand-written pipeline has exactly 2 stages"
    x, y = (t.to(device) for t in batch())

    full = build_model().to(device)  # the reference: one process, whole model, whole batch
    F.mse_loss(full(x), y).backward()
    ref_grads = [p.grad for p in stage_layers(full, rank, world).parameters()]

    part = stage_layers(build_model(), rank, world).to(device)
    runs = {}
    for m in args.microbatches:
        for _ in range(2):  # a warm-up step, then the one we keep
            part.zero_grad()
            dist.barrier()
            events = gpipe_step(part, rank, x, y, m)
        diff = relative_gap([p.grad for p in part.parameters()], ref_grads)
        runs[m] = {"events": events, "max_grad_diff": diff, "grad_tol": grad_tolerance()}
        same = within("pipeline_by_hand grad_gap", diff, grad_tolerance())
        log(f"by hand, {m} micro-batch(es): stage 0 gradients equal one process's: {same}")
    report({"rank": rank, "runs": runs})
    teardown()


if __name__ == "__main__":
    main()
