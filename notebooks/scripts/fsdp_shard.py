"""Shard a model's parameters, gradients and optimizer state over all processes with FSDP2.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 fsdp_shard.py

fully_shard() turns each parameter into a DTensor split on dim 0: every rank keeps 1/world of
it. Forward and backward gather a layer's full weights just before it runs (all-gather) and
free them after; gradients are averaged and split again (reduce-scatter); the optimizer
only ever sees the local shard, so its state is split too. Each rank counts the bytes it
holds, first without sharding and then with it, and checks both take the same step.

The smallest complete FSDP2 script of the course, to read and run from a terminal. Notebook 09
measures the same things on five setups (``zero_stages.py``) and runs FSDP2's options
(``fsdp_depth.py``: meta-device init, prefetching, clipping, checkpoints, offloading,
gradient accumulation with ``set_requires_gradient_sync``, reduce dtypes).
"""

from __future__ import annotations

import torch
from common import local_bytes, log, relative_gap, report, setup, sum_bound, teardown, within
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

WIDTH, DEPTH, LR = 512, 4, 1e-3


def build_model(seed: int = 0, width: int = WIDTH, depth: int = DEPTH) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


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
) -> list[torch.Tensor]:
    """One Adam step; returns the gradients it stepped with (whole tensors, also when sharded)."""
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    grads = [
        g.full_tensor() if isinstance(g, DTensor) else g.clone()
        for g in (p.grad for p in model.parameters())
    ]
    opt.step()
    return grads


def shard(model: nn.Sequential, mesh, **kwargs) -> nn.Sequential:
    """Each Linear its own FSDP unit (gathered only while it runs), then the root."""
    for layer in model:
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def main() -> None:
    rank, world, device = setup()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8 * world, 512, generator=g).to(device)  # the global batch
    y = torch.randn(8 * world, 512, generator=g).to(device)
    mine = slice(8 * rank, 8 * (rank + 1))  # this rank's part of it

    # 1. Unsharded: every rank holds everything (this is what DDP does).
    full = build_model().to(device)
    opt_full = torch.optim.Adam(full.parameters(), lr=LR)
    full_grads = train_step(full, opt_full, x, y)  # on the whole batch: the reference step
    unsharded = held_bytes(full, opt_full)

    # 2. Sharded: each Linear is its own FSDP unit (gathered only while it runs), then the root.
    mesh = init_device_mesh(device.type, (world,))
    model = shard(build_model().to(device), mesh)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    grads = train_step(model, opt, x[mine], y[mine])  # gradients are averaged over the ranks
    sharded = held_bytes(model, opt)

    # The same step? First the gradients it took, each relative to its largest value. Each one
    # is a chain of DEPTH sums of WIDTH products and a sum over the batch, in another order on
    # each side (halves of the batch, then the average): within sum_bound of each other.
    grad_gap = relative_gap(grads, full_grads)
    grad_tol = sum_bound(DEPTH * WIDTH + len(x))
    # Then the weights (gathering them is a collective: every rank takes part). Adam's first
    # step is lr * g / (|g| + eps): each weight moves by less than lr, but where |g| is near
    # eps a rounding-sized change of g moves it by a visible part of lr. So the weights of two
    # correct runs differ by less than 2 lr, and by far less where gradients are large.
    weight_gap = max(
        (p.full_tensor() - q).abs().max().item()
        for p, q in zip(model.parameters(), full.parameters(), strict=True)
    )
    weight_tol = 2 * LR
    same = within("fsdp_shard grad_gap", grad_gap, grad_tol)
    same &= within("fsdp_shard weight_gap", weight_gap, weight_tol)
    log(f"FSDP2 takes the same step as one process (gradients, then weights): {same}")
    shard_shape = tuple(next(model.parameters()).to_local().shape)
    log(f"{world} ranks; first weight: global shape (512, 512), local shard {shard_shape}")
    report(
        {
            "rank": rank,
            "unsharded": unsharded,
            "sharded": sharded,
            "grad_gap": grad_gap,
            "grad_tol": grad_tol,
            "weight_gap": weight_gap,
            "weight_tol": weight_tol,
            "shard_shape": list(shard_shape),
        }
    )
    teardown()


if __name__ == "__main__":
    main()
