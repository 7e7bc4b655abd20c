"""What FSDP1 (``FullyShardedDataParallel``, flat parameters) holds on each rank, counted.

    torchrun --nproc-per-node=2 tests/fit_fsdp1_ranks.py

``tests/test_fit_profiles.py`` launches it and compares what it counts with the calculator's
FSDP1 profile. The model: three Linear(256, 256) blocks, each its own FSDP unit, and a head
Linear(256, 3) left to the root unit (771 parameters: odd, so FSDP pads it to the world size).
Each rank takes two Adam steps on its own batch with ``FULL_SHARD``, ``SHARD_GRAD_OP``,
``HYBRID_SHARD`` (on one host: sharded over its ranks, one replica) and ``FULL_SHARD`` with
``MixedPrecision(param_dtype=bfloat16)``, and counts, on the second step, the bytes of the
storages FSDP keeps:

- at rest: each unit's flat parameter shard, its sharded gradient, and Adam's moments of it;
- as each block starts its forward (a forward pre-hook, after FSDP gathered it), and as each
  unit's gradient is reduce-scattered (``dist.reduce_scatter_single`` wrapped, the moment a
  unit's unsharded gradient and the gathered weights around it are all alive): the gathered
  flat parameters (``_full_param_padded``) and the unsharded gradient being reduced.

Counting storages FSDP names, at points its code fixes, not a peak: a peak also holds the
activations, and on the CPU the moment gloo frees a buffer moves with thread timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "notebooks" / "scripts"))
from common import report, teardown  # noqa: E402

WIDTH, BLOCKS, HEAD, STEPS = 256, 3, 3, 2
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "FULL_SHARD bf16")


def storage_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.untyped_storage().nbytes()


def run(strategy: str, device: torch.device, x: torch.Tensor, world: int) -> dict:
    torch.manual_seed(0)
    blocks = [nn.Linear(WIDTH, WIDTH) for _ in range(BLOCKS)]
    layers: list[nn.Module] = []
    for block in blocks:
        layers += [block, nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, HEAD))
    model = FSDP(
        model,
        auto_wrap_policy=lambda module, recurse, **_: recurse or module in blocks,
        device_id=device,
        sharding_strategy=getattr(ShardingStrategy, strategy.split()[0]),
        # bf16: gathered and computed in bf16, fp32 shards, gradients reduced in bf16 (the default)
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16) if "bf16" in strategy else None,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,  # the default, said
        # HYBRID_SHARD: shard over the mesh's last dimension, replicate over its first. Without a
        # mesh FSDP1 takes a node's GPUs as the shard group, and on CPU ranks falls to NO_SHARD.
        device_mesh=init_device_mesh("cpu", (1, world)) if strategy == "HYBRID_SHARD" else None,
    )
    units = [m for m in FSDP.fsdp_modules(model) if m._handle is not None]
    flats = [m._handle.flat_param for m in units]  # the root's first, then the blocks'

    def gathered() -> int:
        return sum(storage_bytes(getattr(f, "_full_param_padded", None)) for f in flats)

    at_forward: list[int] = []
    at_gradient: list[dict] = []
    at_reduce: list[dict] = []
    for block in blocks:
        block.register_forward_pre_hook(lambda *_: at_forward.append(gathered()))
    for flat in flats:  # runs as the unit's gradient is made, before FSDP's own hook reshards
        flat.register_post_accumulate_grad_hook(
            lambda f: at_gradient.append(
                {"gathered": gathered(), "unsharded_grad": storage_bytes(f.grad)}
            )
        )
    reduce_scatter = dist.reduce_scatter_single

    def counted(output, input, *args, **kwargs):
        at_reduce.append({"gathered": gathered(), "unsharded_grad": storage_bytes(input)})
        return reduce_scatter(output, input, *args, **kwargs)

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    dist.reduce_scatter_single = counted
    try:
        for _ in range(STEPS):
            at_forward.clear()
            at_gradient.clear()
            at_reduce.clear()
            opt.zero_grad(set_to_none=True)
            model(x).float().pow(2).mean().backward()
            opt.step()
    finally:
        dist.reduce_scatter_single = reduce_scatter
    moments = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    return {
        "unit_numel": [f._unpadded_unsharded_size.numel() for f in flats],
        "shards": [storage_bytes(f) for f in flats],
        "grads": [storage_bytes(f.grad) for f in flats],
        "optimizer_state": sum(storage_bytes(v) for v in moments),
        "gathered_at_forward": at_forward,
        "at_gradient": at_gradient,
        "at_reduce_scatter": at_reduce,
    }


def main() -> None:
    # gloo on the CPU even where GPUs are: the counts are the storages', the same on a GPU
    dist.init_process_group("gloo")
    rank, world, device = dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(rank))
    results = {name: run(name, device, x, world) for name in STRATEGIES}
    report({"rank": rank, "world": world, "results": results})
    teardown()


if __name__ == "__main__":
    main()
