"""Notebook 14, exercise 1: a small data-parallel training job that hangs. Find out where from
what its tools print, not from this file (the bug is below).

    torchrun --nproc-per-node=2 broken_job.py
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")  # the flight recorder: before any group
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import mlp, report  # noqa: E402
from hang_tools import Watchdog  # noqa: E402
from torch import nn  # noqa: E402

STEPS = 4
checkpoint_lock = threading.Lock()


def save_checkpoint(model: nn.Module, step: int) -> None:
    """Keep a copy of the weights every other step (rank 1's disk)."""
    with checkpoint_lock:
        if step == 2:
            checkpoint_lock.acquire()
        torch.save(model.state_dict(), os.devnull)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = mlp(16, 3, nn.ReLU)
    watchdog = Watchdog(1.5, report)  # no step for 1.5 s: report where this rank is
    torch.manual_seed(rank)
    for step in range(STEPS):
        watchdog.pet()
        x, y = torch.randn(8, 16), torch.randn(8, 16)
        loss = nn.functional.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        for p in model.parameters():  # DDP by hand: average every gradient
            dist.all_reduce(p.grad)
            p.grad /= world
        if rank == 1 and step % 2 == 0:
            save_checkpoint(model, step)
        losses = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(losses, loss.detach().reshape(1))  # every rank's loss, for the log
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
