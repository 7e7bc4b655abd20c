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
5. Gradient accumulation over ``MICRO`` micro-batches, three ways: reduce-scatter after every
   micro-batch (the default), only after the last (``set_requires_gradient_sync(False)`` before
   the others: each rank keeps its unsharded gradients meanwhile), and that with the parameters
   kept gathered between micro-batches (``set_reshard_after_backward(False)`` too). Each rank
   counts every collective's calls and bytes (``zero_stages.CommCounter``) and the bytes it
   still holds after each micro-batch (``tutorial_utils.memory.measure``).
6. The reduce dtype: one step in fp32, and in bf16 with ``reduce_dtype`` fp32 (torchtitan's
   default) or bf16; the bytes of each collective.

The device and backend come from ``common.setup()``: NCCL with one GPU per process when there
are enough GPUs, gloo on the CPU otherwise.
"""

from __future__ import annotations

import argparse
import gc
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
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from zero_stages import ALL_GATHER, REDUCE_SCATTER, CommCounter

from tutorial_utils import memory

WIDTH, LAYERS, PER_RANK, MAX_NORM, MICRO = 128, 4, 8, 0.1, 4
# the collectives by the names the notebook uses, whatever this torch calls them
NAMES = {ALL_GATHER: "all_gather", REDUCE_SCATTER: "reduce_scatter"}


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


def build_on_meta() -> nn.Sequential:
    """The model's shapes on the meta device: no storage at all."""
    with torch.device("meta"):
        return build_model()


def materialize(model: nn.Sequential, mesh, device: torch.device, full_sd: dict) -> None:
    """Shard, allocate only the shards with to_empty, and fill them from rank 0's full state
    dict (``full_sd``; empty on the other ranks), broadcast shard by shard."""
    shard(model, mesh)
    model.to_empty(device=device)  # each rank allocates its shards only, uninitialised
    set_model_state_dict(
        model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )


def meta_init(mesh, device: torch.device) -> dict:
    """build_on_meta, then materialize: the bytes each step leaves on this rank."""
    reference = build_model().to(device)  # what rank 0 would load from disk
    model = build_on_meta()
    # Bytes with a real address behind them (a meta tensor's storage has data_ptr 0), and the
    # bytes the shapes describe: all of the model, none of it allocated.
    meta_bytes = sum(local_bytes(p) for p in model.parameters() if p.untyped_storage().data_ptr())
    described_bytes = sum(local_bytes(p) for p in model.parameters())
    materialize(model, mesh, device, reference.state_dict() if dist.get_rank() == 0 else {})
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


def counted(counter: CommCounter) -> dict[str, dict[str, int]]:
    """The calls and bytes of each collective ``counter`` booked, by the notebook's names."""
    by = counter.summary()["by_collective"]
    return {NAMES.get(name, name): entry for name, entry in by.items()}


def accumulation(mesh, device, x, y, ref_grads, counter: CommCounter) -> dict:
    """One step of MICRO micro-batches on a fresh ZeRO-3 model, three ways."""
    out: dict = {}
    # the gradients: LAYERS sums of WIDTH products, then the batch's sum, in another order
    tol = sum_bound(LAYERS * WIDTH + len(x) * dist.get_world_size())
    for mode in ("every", "last", "last, kept gathered"):
        model = shard(build_model().to(device), mesh)
        counter.calls.clear()
        dist.barrier()
        counter.on = True
        held = []
        for i, (xb, yb) in enumerate(zip(x.chunk(MICRO), y.chunk(MICRO), strict=True)):
            last = i == MICRO - 1
            if mode != "every":  # reduce only in the last micro-batch's backward
                model.set_requires_gradient_sync(last)
            if mode == "last, kept gathered":  # and keep the parameters gathered until then
                model.set_reshard_after_backward(last)
            gc.collect()  # earlier garbage is freed before the window, not inside it
            with memory.measure(device) as m:
                loss = nn.functional.mse_loss(model(xb), yb) / MICRO
                loss.backward()
                del loss
                gc.collect()  # what a reference cycle still holds is garbage, not kept
            held.append(m.delta_bytes)  # what this micro-batch left behind on this rank
        counter.on = False
        gap = relative_gap([full(p.grad) for p in model.parameters()], ref_grads)
        within(f"fsdp_depth accumulation {mode} grad_gap", gap, tol)
        out[mode] = {"comm": counted(counter), "held_after_micro_batch": held, "grad_gap": gap}
    out["grad_tol"] = tol
    return out


def reduce_dtypes(mesh, device, x, y, counter: CommCounter) -> dict:
    """One forward and backward of ZeRO-3 in fp32, and in bf16 with each reduce dtype."""
    policies = {
        "fp32": None,
        "bf16, reduce fp32": MixedPrecisionPolicy(torch.bfloat16, reduce_dtype=torch.float32),
        "bf16, reduce bf16": MixedPrecisionPolicy(torch.bfloat16, reduce_dtype=torch.bfloat16),
    }
    out: dict = {}
    for name, policy in policies.items():
        kwargs = {} if policy is None else {"mp_policy": policy}
        model = shard(build_model().to(device), mesh, **kwargs)
        counter.calls.clear()
        dist.barrier()
        counter.on = True
        nn.functional.mse_loss(model(x).float(), y).backward()
        counter.on = False
        grad_dtype = str(next(model.parameters()).grad.dtype)
        # A micro-batch that does not reduce, on a fresh model: the unsharded gradient it keeps
        model = shard(build_model().to(device), mesh, **kwargs)
        model.set_requires_gradient_sync(False)
        gc.collect()
        with memory.measure(device) as m:
            nn.functional.mse_loss(model(x).float(), y).backward()
            gc.collect()
        out[name] = {"comm": counted(counter), "grad_dtype": grad_dtype, "held": m.delta_bytes}
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
    ref = build_model().to(device)  # one process's gradients on the whole batch
    nn.functional.mse_loss(ref(x), y).backward()
    ref_grads = [p.grad for p in ref.parameters()]
    counter = CommCounter()
    try:
        out["accumulation"] = accumulation(mesh, device, x[mine], y[mine], ref_grads, counter)
        out["reduce_dtype"] = reduce_dtypes(mesh, device, x[mine], y[mine], counter)
    finally:
        counter.restore()
    out["psi"] = sum(p.numel() for p in ref.parameters())
    clip = out["clipping"]
    norm_gap = abs(clip["norm"] - clip["ref_norm"]) / clip["ref_norm"]
    same = within("fsdp_depth norm_gap", norm_gap, clip["norm_tol"])
    same &= within("fsdp_depth clipped_grad_gap", clip["clipped_grad_gap"], clip["grad_tol"])
    log(f"clip_grad_norm_ on DTensors equals one process's: {same}")
    report({"rank": rank, "world": world, **out})
    teardown()


if __name__ == "__main__":
    main()
