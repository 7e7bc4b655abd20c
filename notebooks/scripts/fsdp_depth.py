"""FSDP2 beyond the defaults: building on meta, prefetching, clipping, a checkpoint resharded,
offloading.

    torchrun --nproc-per-node=2 --master-port=29500 fsdp_depth.py --checkpoint-dir DIR

0. Building on the ``meta`` device: the model has shapes and no storage; ``fully_shard`` then
   ``to_empty`` allocates each rank's shards only, and ``set_model_state_dict(...,
   broadcast_from_rank0=True)`` fills them from rank 0's full weights.
1. Explicit prefetching: ``set_modules_to_forward_prefetch`` makes a layer's forward issue the
   next layer's all-gather too, so it is on its way while this layer computes. Each rank
   records the order in which all-gathers and layer forwards happen, with and without it.
2. ``clip_grad_norm_`` on DTensor gradients: each rank holds a shard of every gradient, so the
   norm must be reduced over the ranks; it equals one process's norm, and so do the clipped
   gradients.
3. Distributed checkpoint (``torch.distributed.checkpoint``): each rank saves its shards into
   DIR; the notebook loads them into one unsharded model in one process (2 shards -> 1).
4. ``CPUOffloadPolicy``: sharded parameters, gradients and optimizer state live in CPU memory
   and the optimizer steps there. Each rank reports where its shards are.

The device and backend come from ``common.setup()``: NCCL with one GPU per process when there
are enough GPUs, gloo on the CPU otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from common import (
    local_bytes,
    log,
    relative_gap,
    report,
    setup,
    sum_bound,
    teardown,
    within,
)
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

WIDTH, LAYERS, PER_RANK, MAX_NORM = 128, 4, 8, 0.1


def build_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def shard(model: nn.Sequential, mesh, **kwargs) -> nn.Sequential:
    for layer in model:
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def meta_init(mesh, device: torch.device) -> dict:
    """Build on the meta device (no storage at all), shard, then allocate only the shards with
    to_empty and fill them from rank 0's full state dict (broadcast shard by shard)."""
    reference = build_model().to(device)  # what rank 0 would load from disk
    with torch.device("meta"):
        model = build_model()
    # Bytes with a real address behind them (a meta tensor's storage has data_ptr 0), and the
    # bytes the shapes describe: all of the model, none of it allocated.
    meta_bytes = sum(local_bytes(p) for p in model.parameters() if p.untyped_storage().data_ptr())
    described_bytes = sum(local_bytes(p) for p in model.parameters())
    shard(model, mesh)
    model.to_empty(device=device)  # each rank allocates its shards only, uninitialised
    full_sd = reference.state_dict() if dist.get_rank() == 0 else {}
    set_model_state_dict(
        model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    diff = max(
        (p.full_tensor() - q).abs().max().item()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
    return {
        "bytes_before_to_empty": meta_bytes,
        "described_before_to_empty": described_bytes,
        "bytes_after_to_empty": sum(local_bytes(p) for p in model.parameters()),
        "full_bytes": sum(local_bytes(p) for p in reference.parameters()),
        "max_diff": diff,
    }


def event_order(model: nn.Sequential, x: torch.Tensor) -> list[str]:
    """'AG' for each all-gather FSDP issues, 'F<i>' when layer i's forward starts computing."""
    events: list[str] = []
    # FSDP2 calls dist.all_gather_single (torch 2.13+) or dist.all_gather_into_tensor (before)
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    original = getattr(dist, name)

    def counted(*args, **kwargs):
        events.append("AG")
        return original(*args, **kwargs)

    handles = [
        # registered after fully_shard's own hook, so it runs once FSDP has issued its gathers
        layer.register_forward_pre_hook(lambda mod, args, i=i: events.append(f"F{i}"))
        for i, layer in enumerate(model)
    ]
    setattr(dist, name, counted)
    try:
        model(x)
    finally:
        setattr(dist, name, original)
        for h in handles:
            h.remove()
    return events


def prefetching(mesh, device, x) -> dict:
    plain = shard(build_model().to(device), mesh)
    ahead = shard(build_model().to(device), mesh)
    for i in range(LAYERS - 1):  # each layer's forward also gathers the next layer
        ahead[i].set_modules_to_forward_prefetch([ahead[i + 1]])
    for i in range(1, LAYERS):  # and each backward the layer before, as FSDP2 does implicitly
        ahead[i].set_modules_to_backward_prefetch([ahead[i - 1]])
    return {"default": event_order(plain, x), "prefetch": event_order(ahead, x)}


def clipping(mesh, device, x_all, y_all, mine) -> dict:
    ref = build_model().to(device)
    nn.functional.mse_loss(ref(x_all), y_all).backward()
    ref_norm = nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM).item()
    model = shard(build_model().to(device), mesh)
    nn.functional.mse_loss(model(x_all[mine]), y_all[mine]).backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    gap = relative_gap(
        [full(p.grad) for p in model.parameters()], [q.grad for q in ref.parameters()]
    )
    after = torch.linalg.vector_norm(torch.stack([full(p.grad).norm() for p in model.parameters()]))
    # Each gradient: a chain of LAYERS sums of WIDTH products and the batch's sum, in another
    # order. The norm adds the squares of all of them: one more sum, of every element.
    grad_tol = sum_bound(LAYERS * WIDTH + len(x_all))
    norm_tol = grad_tol + sum_bound(sum(p.numel() for p in ref.parameters()))
    return {
        "grad_tol": grad_tol,
        "norm_tol": norm_tol,
        "norm_type": type(norm).__name__,
        "norm": full(norm).item(),  # the norm before clipping, over every rank's shards
        "ref_norm": ref_norm,
        "norm_after": after.item(),
        "max_norm": MAX_NORM,
        "clipped_grad_gap": gap,
    }


def checkpoint(mesh, device, x, y, folder: str) -> dict:
    model = shard(build_model().to(device), mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    dcp.save({"model": model.state_dict()}, checkpoint_id=folder)  # each rank its shards
    # What the one process that loads it must find: the full weights (a collective to gather).
    weights = {k: full(v).detach().cpu() for k, v in model.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save(weights, Path(folder) / "expected_full_weights.pt")
    return {"local_shape": list(next(model.parameters()).to_local().shape)}


def offload(mesh, device, x, y) -> dict:
    out: dict = {}
    try:  # the default pins the CPU shards (page-locked memory, for fast copies to a GPU)
        shard(build_model().to(device), mesh, offload_policy=CPUOffloadPolicy())
        out["default_error"] = None
    except RuntimeError as err:  # pinning needs an accelerator: refused on a CPU-only machine
        out["default_error"] = str(err).splitlines()[0]
    pin = device.type == "cuda"
    model = shard(build_model().to(device), mesh, offload_policy=CPUOffloadPolicy(pin_memory=pin))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    p = next(model.parameters())
    out.update(
        {
            "pin_memory": pin,
            "param_device": str(p.to_local().device),
            "grad_device": str(p.grad.to_local().device),
            "state_device": str(opt.state[p]["exp_avg"].to_local().device),
        }
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", required=True, help="a folder every rank can write")
    args = parser.parse_args()
    rank, world, device = setup()
    mesh = init_device_mesh(device.type, (world,))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(PER_RANK * world, WIDTH, generator=g).to(device)
    y = torch.randn(PER_RANK * world, WIDTH, generator=g).to(device)
    mine = slice(PER_RANK * rank, PER_RANK * (rank + 1))
    out = {
        "meta_init": meta_init(mesh, device),
        "prefetching": prefetching(mesh, device, x[mine]),
        "clipping": clipping(mesh, device, x, y, mine),
        "checkpoint": checkpoint(mesh, device, x[mine], y[mine], args.checkpoint_dir),
        "offload": offload(mesh, device, x[mine], y[mine]),
    }
    clip = out["clipping"]
    norm_gap = abs(clip["norm"] - clip["ref_norm"]) / clip["ref_norm"]
    same = within("fsdp_depth norm_gap", norm_gap, clip["norm_tol"])
    same &= within("fsdp_depth clipped_grad_gap", clip["clipped_grad_gap"], clip["grad_tol"])
    log(f"clip_grad_norm_ on DTensors equals one process's: {same}")
    report({"rank": rank, "world": world, **out})
    teardown()


if __name__ == "__main__":
    main()
