"""SOLUTION of ddp_exercise.py: the same loop with its two bugs fixed."""

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
        sampler.set_epoch(epoch)  # fix 1: without it every epoch repeats the same shuffle
        orders.append(list(sampler))
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()  # fix 2: DDP has already averaged the gradients; no second division
            opt.step()
        log(f"epoch {epoch} done")

    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).cpu()
    report({"rank": rank, "orders": orders, "params": params.tolist()})
    teardown()


if __name__ == "__main__":
    main()
