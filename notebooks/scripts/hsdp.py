"""HSDP: FSDP2 sharding inside each group of ranks, plain replication across the groups.

    torchrun --nproc-per-node=4 --master-addr=127.0.0.1 --master-port=29500 hsdp.py

Four ranks form a 2 x 2 ``DeviceMesh`` named ``("replicate", "shard")``::

                 shard=0  shard=1
    replicate=0  [ r0       r1 ]    r0 and r1 each hold half of every parameter (a "node")
    replicate=1  [ r2       r3 ]    r2 and r3 hold the same halves again (another "node")

``fully_shard(model, mesh=mesh)`` on a 2-D mesh is HSDP: every parameter is a DTensor placed
``(Replicate(), Shard(0))``. In backward FSDP2 reduce-scatters each gradient inside the shard
group, then all-reduces the shard it got across the replicate group. Each rank checks, against
one process on the whole batch: every gradient, the placements, the bytes it stores, and the
bytes of each collective (counted by ``CommDebugMode``, per mesh dimension) against the formulas.
It reports its own PSS, so the notebook can add up the memory of the four ranks.
"""

from __future__ import annotations

import os
import time

import psutil
import torch
import torch.distributed as dist
from common import log, mlp, relative_gap, report, setup, sum_bound, teardown, within
from mesh_2d import CommBytes, local
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WIDTH, LAYERS, BATCH = 64, 2, 8  # two Linear(64, 64): 8,320 parameters; 8 rows in all


def main() -> None:
    t0 = time.perf_counter()
    world = int(os.environ.get("WORLD_SIZE", 1))  # checked before joining: nothing to clean up
    if world != 4:
        raise SystemExit(f"hsdp.py needs 4 ranks (a 2 x 2 mesh), not {world}: --nproc-per-node=4")
    rank, world, device = setup()
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("replicate", "shard"))
    groups = {d: dist.get_process_group_ranks(mesh.get_group(d)) for d in ("replicate", "shard")}

    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)  # each rank its own rows

    ref = mlp(WIDTH, LAYERS, nn.ReLU)  # one process, the whole batch
    nn.functional.mse_loss(ref(x), y).backward()

    model = shard(mlp(WIDTH, LAYERS, nn.ReLU).to(device), mesh)
    placements = sorted({str(p.placements) for p in model.parameters()})
    param_bytes = sum(local(p).numel() * local(p).element_size() for p in model.parameters())

    with CommBytes(groups) as fwd:
        loss = nn.functional.mse_loss(model(x[rows].to(device)), y[rows].to(device))
    with CommBytes(groups) as bwd:
        loss.backward()  # FSDP2 averages the gradients over all 4 ranks: the whole batch's mean

    grad_gap = relative_gap(
        [p.grad.full_tensor().cpu() for p in model.parameters()],
        [p.grad for p in ref.parameters()],
    )
    # A weight's gradient adds BATCH rows' products, after the WIDTH products of the gradient
    # that reaches it; the collectives add the 4 ranks' parts in another order.
    grad_tol = sum_bound(BATCH + WIDTH)
    same = within("hsdp grad_gap", grad_gap, grad_tol)
    log(f"HSDP on a 2 x 2 mesh: gradients equal one process's: {same}")
    report(
        {
            "rank": rank,
            "world": world,
            "coords": {d: mesh.get_local_rank(d) for d in ("replicate", "shard")},
            "groups": groups,
            "psi": sum(p.numel() for p in ref.parameters()),
            "tensors": len(list(ref.parameters())),
            "single_param_bytes": sum(p.numel() * p.element_size() for p in ref.parameters()),
            "param_bytes": param_bytes,
            "placements": placements,
            "grad_gap": grad_gap,
            "grad_tol": grad_tol,
            "forward_comm": fwd.summary(),
            "backward_comm": bwd.summary(),
            "pss_bytes": psutil.Process().memory_full_info().pss,
            "seconds_in_script": time.perf_counter() - t0,
        }
    )
    teardown()


def shard(model: nn.Sequential, mesh) -> nn.Sequential:
    """HSDP: each Linear its own FSDP2 unit, the model the root, on a 2-D mesh. The mesh's
    first dimension replicates, its second shards: placements (Replicate(), Shard(0))."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


if __name__ == "__main__":
    main()
