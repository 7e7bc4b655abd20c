"""EXERCISE: this DDP script runs without an error, yet trains differently from one process.

There are two bugs. Find them, fix them in this file, and run the checker in notebook 07.
The model and the data come from ddp_train.py; only the training loop is here.
"""

from __future__ import annotations

import torch
from common import log, report, setup, teardown
from ddp_train import build_data, build_model
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

EPOCHS, BATCH, LR = 3, 8, 0.1


def main() -> None:
    rank, world, device = setup()
    data = build_data()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    model = DDP(
        build_model().to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    orders = []
    for epoch in range(EPOCHS):
        orders.append(list(sampler))
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():  # "make sure the gradients are averaged"
                p.grad /= world
            opt.step()
        log(f"epoch {epoch} done")

    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).cpu()
    report({"rank": rank, "orders": orders, "params": params.tolist()})
    teardown()


if __name__ == "__main__":
    main()
