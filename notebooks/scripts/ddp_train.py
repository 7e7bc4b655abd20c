"""Train a small regression model with DistributedDataParallel (DDP).

    torchrun --standalone --nproc-per-node=2 ddp_train.py --epochs 3

Each process holds a full copy of the model and sees a different shard of every batch
(DistributedSampler). backward() averages the gradients over all processes (all-reduce), so
every copy takes the same step: the result equals one process training on the whole batch.
"""

from __future__ import annotations

import argparse

import torch
from common import log, report, setup, teardown
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # the same initial weights in every process
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def build_data(n: int = 64, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x[:, :1] * 2.0 - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="per process")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    rank, world, device = setup()
    data = build_data()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    model = DDP(
        build_model().to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    orders = []  # which samples this rank saw, per epoch
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        orders.append(list(sampler))
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces (averages) the gradients here
            opt.step()
        with torch.no_grad():  # every rank holds the same model: rank 0 speaks for all
            X, Y = (t.to(device) for t in data.tensors)
            log(
                f"epoch {epoch}: loss on all {len(data)} samples = "
                f"{nn.functional.mse_loss(model(X), Y).item():.4f}"
            )

    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).cpu()
    report(
        {
            "rank": rank,
            "world": world,
            "backend": str(torch.distributed.get_backend()),
            "orders": orders,
            "params": params.tolist(),
        }
    )
    teardown()


if __name__ == "__main__":
    main()
