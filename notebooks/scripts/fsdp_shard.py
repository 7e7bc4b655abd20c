"""Shard a model's parameters, gradients and optimizer state over all processes with FSDP2.

    torchrun --standalone --nproc-per-node=2 fsdp_shard.py

fully_shard() turns each parameter into a DTensor split on dim 0: every rank keeps 1/world of
it. Forward and backward gather a layer's full weights just before it runs (all-gather) and
free them after; gradients are averaged and split again (reduce-scatter); the optimizer
only ever sees the local shard, so its state is split too. Each rank counts the bytes it
holds, first without sharding and then with it, and checks both take the same step.
"""

from __future__ import annotations

import torch
from common import log, report, setup, teardown
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def build_model(seed: int = 0, width: int = 512, depth: int = 4) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes this rank really stores for ``t``: only its shard when ``t`` is a DTensor."""
    if t is None:
        return 0
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "parameters": sum(local_bytes(p) for p in params),
        "gradients": sum(local_bytes(p.grad) for p in params),
        "optimizer state": sum(local_bytes(v) for v in state),
    }


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()


def main() -> None:
    rank, world, device = setup()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8 * world, 512, generator=g).to(device)  # the global batch
    y = torch.randn(8 * world, 512, generator=g).to(device)
    mine = slice(8 * rank, 8 * (rank + 1))  # this rank's part of it

    # 1. Unsharded: every rank holds everything (this is what DDP does).
    full = build_model().to(device)
    opt_full = torch.optim.Adam(full.parameters(), lr=1e-3)
    train_step(full, opt_full, x, y)  # on the whole batch: the reference step
    unsharded = held_bytes(full, opt_full)

    # 2. Sharded: each Linear is its own FSDP unit (gathered only while it runs), then the root.
    mesh = init_device_mesh(device.type, (world,))
    model = build_model().to(device)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(model, opt, x[mine], y[mine])  # gradients are averaged over the ranks
    sharded = held_bytes(model, opt)

    # The same step? Gather the full parameters back (a collective: every rank takes part).
    diff = max(
        (p.full_tensor() - q).abs().max().item()
        for p, q in zip(model.parameters(), full.parameters(), strict=True)
    )
    shard_shape = tuple(next(model.parameters()).to_local().shape)
    log(f"{world} ranks; first weight: global shape (512, 512), local shard {shard_shape}")
    report(
        {
            "rank": rank,
            "unsharded": unsharded,
            "sharded": sharded,
            "max_diff": diff,
            "shard_shape": list(shard_shape),
        }
    )
    teardown()


if __name__ == "__main__":
    main()
