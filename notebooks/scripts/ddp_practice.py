"""Three things every DDP training loop needs, in one launch (each rank reports what it saw).

    torchrun --nnodes=1 --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 \
        ddp_practice.py --checkpoint ckpt.pt

1. Gradient accumulation with ``no_sync()``: the first micro-batches of a step skip the
   all-reduce, the last one reduces everything accumulated. A communication hook counts the
   all-reduces; the gradients must equal one backward over the whole per-rank batch.
2. ``DistributedSampler.set_epoch``: without it, every epoch repeats the first shuffle.
3. A checkpoint saved by rank 0 only, a ``barrier()`` so nobody reads a half-written file, then
   loaded on every rank with ``map_location`` (on GPUs, each rank onto its own device).

Buffers (``forward_sync_buffers``) and ``SyncBatchNorm`` are in ddp_seen.py (notebook 07,
section 4).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from common import (
    log,
    relative_gap,
    report,
    setup,
    sum_bound,
    teardown,
    torchrun_env,
    within,
)
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler, TensorDataset

MICRO, MICRO_BATCH = 4, 4  # 4 micro-batches of 4 samples per rank per step


def build_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def rank_batch(rank: int, n: int = MICRO * MICRO_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    return torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)


def wrap(module: nn.Module, device: torch.device, **kwargs) -> DDP:
    return DDP(
        module.to(device), device_ids=[device.index] if device.type == "cuda" else None, **kwargs
    )


def counted(model: DDP) -> list[int]:
    """Count the all-reduces: a comm hook runs once per gradient bucket that is reduced."""
    calls = [0]

    def hook(state, bucket):
        calls[0] += 1
        return default_hooks.allreduce_hook(None, bucket)  # the default: average over ranks

    model.register_comm_hook(None, hook)
    return calls


def grads(model: DDP) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def accumulation(rank: int, device: torch.device) -> dict:
    x, y = (t.to(device) for t in rank_batch(rank))
    loss_fn = nn.functional.mse_loss

    full = wrap(build_model(), device)  # reference: one backward over the rank's 16 samples
    full_calls = counted(full)
    loss_fn(full(x), y).backward()

    naive = wrap(build_model(), device)  # accumulation without no_sync: reduces every time
    naive_calls = counted(naive)
    for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO), strict=True):
        (loss_fn(naive(xm), ym) / MICRO).backward()

    acc = wrap(build_model(), device)  # no_sync for all but the last micro-batch
    acc_calls = counted(acc)
    pieces = list(zip(x.chunk(MICRO), y.chunk(MICRO), strict=True))
    with acc.no_sync():  # gradients accumulate locally, nothing is sent
        for xm, ym in pieces[:-1]:
            (loss_fn(acc(xm), ym) / MICRO).backward()
    xm, ym = pieces[-1]
    (loss_fn(acc(xm), ym) / MICRO).backward()  # this backward all-reduces the sum

    diff = relative_gap(grads(acc), grads(full))
    naive_diff = relative_gap(grads(naive), grads(full))
    # A 2-layer MLP (8 -> 32 -> 1): a chain of sums of 8 and 32 products, then the sum over
    # the 16 samples of each rank and the all-reduce, in another order (per micro-batch).
    tol = sum_bound(8 + 32 + MICRO * MICRO_BATCH * dist.get_world_size())
    within("ddp_practice accumulation grad_gap", diff, tol)
    within("ddp_practice naive grad_gap", naive_diff, tol)
    return {
        "allreduce_calls": {
            "full": full_calls[0],
            "naive": naive_calls[0],
            "no_sync": acc_calls[0],
        },
        "max_grad_diff": diff,
        "naive_max_grad_diff": naive_diff,
        "grad_tol": tol,
    }


def sampler_orders(rank: int, world: int) -> dict:
    data = TensorDataset(torch.arange(16.0))
    orders = {}
    for set_epoch in (True, False):
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
        runs = []
        for epoch in range(2):
            if set_epoch:
                sampler.set_epoch(epoch)
            runs.append(list(sampler))
        orders[str(set_epoch)] = runs
    return orders


def checkpoint(rank: int, device: torch.device, path: str) -> dict:
    model = wrap(build_model(), device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = (t.to(device) for t in rank_batch(rank))
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if rank == 0:  # one writer: every rank holds the same weights
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()}, path)
    dist.barrier()  # nobody reads the file before rank 0 has finished writing it

    fresh = build_model(seed=1).to(device)  # other weights: loading must replace them
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    state = torch.load(path, map_location=device)  # each rank onto its own device
    fresh.load_state_dict(state["model"])
    fresh_opt.load_state_dict(state["optimizer"])
    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(fresh.parameters(), model.module.parameters(), strict=True)
    )
    return {
        "max_param_diff": diff,
        "loaded_device": str(next(fresh.parameters()).device),
        "adam_steps": float(fresh_opt.state_dict()["state"][0]["step"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True, help="file rank 0 writes, all ranks read")
    args = parser.parse_args()
    rank, world, device = setup()

    acc = accumulation(rank, device)
    log(
        "no_sync accumulation: all-reduces per step",
        acc["allreduce_calls"],
        f"| gradients equal the full batch: {acc['max_grad_diff'] < acc['grad_tol']}",
    )
    ckpt = checkpoint(rank, device, args.checkpoint)
    log(f"checkpoint saved by rank 0, loaded on every rank: equal {ckpt['max_param_diff'] == 0}")
    report(
        {
            "rank": rank,
            "world": world,
            "accumulation": acc,
            "orders": sampler_orders(rank, world),
            "checkpoint": ckpt,
            "torchrun_env": torchrun_env(),  # where the ranks met: the port typed, or another
        }
    )
    teardown()


if __name__ == "__main__":
    main()
