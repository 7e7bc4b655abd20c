"""Five things every DDP training loop needs, in one launch (each rank reports what it saw).

    torchrun --standalone --nproc-per-node=2 ddp_practice.py --checkpoint ckpt.pt

1. Gradient accumulation with ``no_sync()``: the first micro-batches of a step skip the
   all-reduce, the last one reduces everything accumulated. A communication hook counts the
   all-reduces; the gradients must equal one backward over the whole per-rank batch.
2. ``DistributedSampler.set_epoch``: without it, every epoch repeats the first shuffle.
3. Buffers: DDP sends rank 0's buffers (BatchNorm's running statistics) to every rank at the
   start of each forward, unless told not to. PyTorch 2.13 splits the old switch: the new
   ``forward_sync_buffers=False`` stops only that runtime sync (rank 0's buffers are still
   broadcast once when DDP is built, with ``init_sync=True``), while the deprecated
   ``broadcast_buffers=False`` (a FutureWarning in 2.13, the only name before) stops both.
4. A checkpoint saved by rank 0 only, a ``barrier()`` so nobody reads a half-written file, then
   loaded on every rank with ``map_location`` (on GPUs, each rank onto its own device).
5. ``SyncBatchNorm``: BatchNorm statistics over the global batch (every rank's samples), not each
   rank's shard. It runs on GPUs only; on CPU ranks the same statistics are computed by hand with
   ``all_reduce`` (what SyncBatchNorm does inside), and the refusal is reported.
"""

from __future__ import annotations

import argparse
import inspect
import warnings

import torch
import torch.distributed as dist
from common import log, report, setup, teardown
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler, TensorDataset

MICRO, MICRO_BATCH = 4, 4  # 4 micro-batches of 4 samples per rank per step
# The switch for syncing buffers in forward: renamed in PyTorch 2.13 (the old name warns there).
BUFFER_SYNC = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else "broadcast_buffers"
)


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

    diff = max((a - b).abs().max().item() for a, b in zip(grads(acc), grads(full), strict=True))
    naive_diff = max(
        (a - b).abs().max().item() for a, b in zip(grads(naive), grads(full), strict=True)
    )
    return {
        "allreduce_calls": {
            "full": full_calls[0],
            "naive": naive_calls[0],
            "no_sync": acc_calls[0],
        },
        "max_grad_diff": diff,
        "naive_max_grad_diff": naive_diff,
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


def buffers(rank: int, device: torch.device) -> dict:
    """BatchNorm running means on each rank, with the buffer sync on (the default) and off."""
    out = {"argument": BUFFER_SYNC}
    for flag in (True, False):
        torch.manual_seed(0)
        bn = nn.BatchNorm1d(4)
        model = wrap(nn.Sequential(nn.Linear(4, 4), bn), device, **{BUFFER_SYNC: flag})
        g = torch.Generator().manual_seed(200 + rank)
        model(torch.randn(8, 4, generator=g).to(device) + rank)  # each rank updates its own stats
        after_first = bn.running_mean.tolist()
        bn.momentum = 0.0  # the next batch no longer changes the stats: only a broadcast can
        model(torch.randn(8, 4, generator=g).to(device))
        out[str(flag)] = {"after_first": after_first, "after_second": bn.running_mean.tolist()}
    # At construction: each rank's own running mean going in, what it holds once DDP is built.
    out["at_init"] = {}
    names = (
        ["forward_sync_buffers", "broadcast_buffers"] if BUFFER_SYNC != "broadcast_buffers" else []
    )
    for name in names:
        bn = nn.BatchNorm1d(4)
        bn.running_mean.fill_(float(rank))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is deprecated
            wrap(nn.Sequential(nn.Linear(4, 4), bn), device, **{name: False})
        out["at_init"][f"{name}=False"] = bn.running_mean[0].item()
    return out


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


def sync_batchnorm(rank: int, world: int, device: torch.device) -> dict:
    """BatchNorm over the global batch: SyncBatchNorm on GPUs, its arithmetic by hand on CPU.

    Both are compared with one plain BatchNorm over every rank's samples together (the answer
    one process with the whole batch would give), and so is a plain BatchNorm on this rank alone.
    """
    g = torch.Generator().manual_seed(300 + rank)
    x = (torch.randn(8, 4, generator=g) + 2.0 * rank).to(device)  # ranks see different data
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x)
    full = nn.BatchNorm1d(4).to(device)  # one process, the whole global batch
    full_out = full(torch.cat(gathered))[rank * len(x) : (rank + 1) * len(x)]
    local = nn.BatchNorm1d(4).to(device)  # this rank's shard only: what plain BatchNorm does
    local_out = local(x)

    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(4))).to(device)
    layer = model[0]
    out = {"converted_to": type(layer).__name__, "refusal": None}
    try:
        sync_out = layer(x)  # on CPU ranks this raises: SyncBatchNorm needs GPU (or XPU) input
        mean, var, how = layer.running_mean, layer.running_var, "nn.SyncBatchNorm"
    except ValueError as err:
        out["refusal"] = str(err)
        # What SyncBatchNorm computes inside: every rank's sum, sum of squares and count, summed.
        stats = torch.stack([x.sum(0), (x * x).sum(0)])
        count = torch.tensor([float(len(x))], device=device)
        dist.all_reduce(stats)
        dist.all_reduce(count)
        global_mean = stats[0] / count
        biased_var = stats[1] / count - global_mean**2  # normalises this step's output
        sync_out = (x - global_mean) / torch.sqrt(biased_var + layer.eps)
        sync_out = sync_out * layer.weight + layer.bias
        m = layer.momentum  # the running statistics keep the unbiased variance, like BatchNorm
        mean = (1 - m) * layer.running_mean + m * global_mean
        var = (1 - m) * layer.running_var + m * biased_var * count / (count - 1)
        how = "all_reduce by hand, since SyncBatchNorm refuses CPU input"

    def gap(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a - b).abs().max().item()

    out.update(
        how=how,
        sync_vs_full={
            "running_mean": gap(mean, full.running_mean),
            "running_var": gap(var, full.running_var),
            "output": gap(sync_out, full_out),
        },
        local_vs_full={
            "running_mean": gap(local.running_mean, full.running_mean),
            "output": gap(local_out, full_out),
        },
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True, help="file rank 0 writes, all ranks read")
    args = parser.parse_args()
    rank, world, device = setup()

    acc = accumulation(rank, device)
    log(
        "no_sync accumulation: all-reduces per step",
        acc["allreduce_calls"],
        f"| gradients equal the full batch: {acc['max_grad_diff'] < 1e-6}",
    )
    sync_bn = sync_batchnorm(rank, world, device)
    log(
        f"BatchNorm over the global batch, {sync_bn['how']}: equal to one process: "
        f"{max(sync_bn['sync_vs_full'].values()) < 1e-5}"
    )
    ckpt = checkpoint(rank, device, args.checkpoint)
    log(f"checkpoint saved by rank 0, loaded on every rank: equal {ckpt['max_param_diff'] == 0}")
    report(
        {
            "rank": rank,
            "world": world,
            "accumulation": acc,
            "orders": sampler_orders(rank, world),
            "buffers": buffers(rank, device),
            "sync_batchnorm": sync_bn,
            "checkpoint": ckpt,
        }
    )
    teardown()


if __name__ == "__main__":
    main()
