"""Train a small regression model with DistributedDataParallel (DDP).

    torchrun --nnodes=1 --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 \
        ddp_train.py --epochs 3

Each process holds a full copy of the model and sees a different shard of every batch
(DistributedSampler). backward() averages the gradients over all processes (all-reduce), so
every copy takes the same step: the result equals one process training on the whole batch.

With --checkpoint FILE, rank 0 alone saves the model, the optimizer and the epoch reached, and
a run that finds FILE carries on from it. SIGUSR1 (what slurm_ddp.sbatch passes on when the
job's time is nearly up) makes every rank stop after the current epoch, once rank 0 has saved:
the requeued job then resumes where this one stopped.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.distributed as dist
from common import log, report, setup, teardown, torchrun_env
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

_asked_to_stop = False  # set by SIGUSR1, in whichever rank received it


def _on_usr1(signum, frame) -> None:
    global _asked_to_stop
    _asked_to_stop = True


def stop_requested(device: torch.device) -> bool:
    """True on every rank as soon as any rank got SIGUSR1: they must all stop at the same step."""
    flag = torch.tensor([float(_asked_to_stop)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def build_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # the same initial weights in every process
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def build_data(n: int = 64, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x[:, :1] * 2.0 - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def save_checkpoint(path: str, model: nn.Module, opt: torch.optim.Optimizer, epoch: int) -> None:
    """Rank 0 only (every rank holds the same model); written whole or not at all."""
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def prepare(rank: int, world: int, device: torch.device, batch: int, lr: float) -> tuple:
    """The data, each rank's shard of it (DistributedSampler), the model in DDP, the optimizer."""
    data = build_data()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    model = DDP(
        build_model().to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return data, sampler, loader, model, opt


def train_epoch(model: DDP, loader, sampler, opt, epoch: int, device: torch.device) -> list[int]:
    """One epoch, written as on one device: DDP does its work inside backward()."""
    sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
    return list(sampler)  # the samples this rank saw


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="per process")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--checkpoint", help="save here (rank 0) and resume from it if it exists")
    args = parser.parse_args()

    signal.signal(signal.SIGUSR1, _on_usr1)
    rank, world, device = setup()
    data, sampler, loader, model, opt = prepare(rank, world, device, args.batch, args.lr)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"]
        log(f"resumed from the checkpoint at epoch {start}")

    orders = []  # which samples this rank saw, per epoch
    saved = []  # the epochs at which this rank wrote the checkpoint
    done = start  # epochs trained, counting those before a resume
    for epoch in range(start, args.epochs):
        orders.append(train_epoch(model, loader, sampler, opt, epoch, device))
        with torch.no_grad():  # every rank holds the same model: rank 0 speaks for all
            X, Y = (t.to(device) for t in data.tensors)
            log(
                f"epoch {epoch}: loss on all {len(data)} samples = "
                f"{nn.functional.mse_loss(model(X), Y).item():.4f}"
            )
        done = epoch + 1
        if stop_requested(device):
            break
    if args.checkpoint and rank == 0:
        save_checkpoint(args.checkpoint, model.module, opt, done)
        saved.append(done)
        stopped = " (asked to stop: SIGUSR1)" if done < args.epochs else ""
        log(f"checkpoint saved by rank 0 at epoch {done}{stopped}")

    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).cpu()
    report(
        {
            "rank": rank,
            "world": world,
            "backend": str(torch.distributed.get_backend()),
            "node": os.environ.get("SLURMD_NODENAME"),  # the Slurm node this rank ran on
            "torchrun_env": torchrun_env(),  # RANK, WORLD_SIZE, MASTER_ADDR... as torchrun set them
            "start_epoch": start,
            "epochs_done": done,
            "saved_checkpoint": saved,
            "orders": orders,
            "params": params.tolist(),
        }
    )
    teardown()


if __name__ == "__main__":
    main()
