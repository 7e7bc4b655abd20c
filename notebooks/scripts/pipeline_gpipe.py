"""Pipeline a model over 2 processes with torch.distributed.pipelining (GPipe schedule).

    torchrun --standalone --nproc-per-node=2 pipeline_gpipe.py

Rank 0 holds the first half of the layers (stage 0), rank 1 the second half (stage 1). The
batch is cut into micro-batches: while stage 1 works on micro-batch i, stage 0 already works
on micro-batch i+1. Each rank checks its stage's gradients against one process doing the
whole batch, and times a training step for each number of micro-batches.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from common import log, report, setup, teardown
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

WIDTH, DEPTH, BATCH = 512, 8, 256


def build_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


def stage_layers(model: nn.Sequential, stage: int, n_stages: int) -> nn.Sequential:
    """Stage ``stage`` of ``n_stages`` equal slices of the layers."""
    per = len(model) // n_stages
    return model[stage * per : (stage + 1) * per]


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    rank, world, device = setup()
    x, y = (t.to(device) for t in batch())

    # The reference: one process, the whole model, the whole batch.
    full = build_model().to(device)
    nn.functional.mse_loss(full(x), y).backward()
    ref_grads = [p.grad for p in stage_layers(full, rank, world).parameters()]

    part = stage_layers(build_model(), rank, world).to(device)  # this rank's stage only

    runs = {}
    for m in args.microbatches:
        # A fresh stage per micro-batch count: a stage works out the shapes of the activations
        # it sends on its first step and keeps them, so a stage reused with another micro-batch
        # size fails with PipeliningShapeError (seen on torch 2.11).
        stage = PipelineStage(part, stage_index=rank, num_stages=world, device=device)
        schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=nn.functional.mse_loss)
        seconds = []
        for _ in range(4):  # the first step also works out the shapes to send: not timed
            part.zero_grad()
            dist.barrier()  # both stages start together
            t0 = time.perf_counter()
            if rank == 0:
                schedule.step(x)  # stage 0 feeds the input
            else:
                schedule.step(target=y)  # the last stage computes the loss of each micro-batch
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # CUDA runs asynchronously: wait before timing
            seconds.append(time.perf_counter() - t0)
        diff = max(
            (p.grad - r).abs().max().item()
            for p, r in zip(part.parameters(), ref_grads, strict=True)
        )
        runs[m] = {"step_seconds": sorted(seconds[1:])[1], "max_grad_diff": diff}
        log(f"GPipe, {m} micro-batch(es): stage 0 gradients equal one process's: {diff < 1e-5}")
    report({"rank": rank, "world": world, "runs": runs})
    teardown()


if __name__ == "__main__":
    main()
