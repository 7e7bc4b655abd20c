"""What FSDP1 (``FullyShardedDataParallel``, flat parameters) holds on each rank, counted.

    torchrun --nproc-per-node=2 tests/fit_fsdp1_ranks.py

``tests/test_fit_profiles.py`` launches it and compares what it counts with the calculator's
FSDP1 profile. The model: three Linear(256, 256) blocks, each its own FSDP unit, and in the
root unit, as a decoder's root holds its embedding and head, a stem (a Linear(256, 256) and a
1-parameter gain, so that the root's size is odd and FSDP pads it to the world size) and a
head Linear(256, 511, bias=False). Each rank takes two Adam steps on its own batch with
``FULL_SHARD``, ``SHARD_GRAD_OP``, ``HYBRID_SHARD`` (on one host: sharded over its ranks, one
replica) and ``FULL_SHARD`` with ``MixedPrecision(param_dtype=bfloat16)``, and counts, on the
second step, the bytes of the storages FSDP keeps:

- at rest: each unit's flat parameter shard, its sharded gradient, and Adam's moments of it;
- as each block starts its forward (a forward pre-hook, after FSDP gathered it): the gathered
  flat parameters (``_full_param_padded``);
- as each unit's unsharded flat gradient is made (a post-accumulate-grad hook, which runs
  before FSDP's own hook reshards the unit and reduce-scatters the gradient): the gathered
  flat parameters, that gradient, and the head's gradient still waiting in autograd.

Two more runs accumulate gradients over k = 2 micro-batches, ``FULL_SHARD`` in fp32 and in
bf16, the first micro-batch under ``model.no_sync()`` (as Lightning's ``no_backward_sync``
enters it for every micro-batch but the last). They count each unit's gradient as the no_sync
micro-batch leaves it (bytes, elements, dtype), and, at each gradient of the syncing
micro-batch, the same storages as above plus the gradient autograd just made (before it is
added to the kept one) and the other units' gradients, kept unsharded or reduce-scattered.

A last run is torchtune's LoRA wrapping (``lora_fsdp_wrap_policy`` at fef3ed10d): every
weight frozen but a low-rank adapter (A, B) beside each block's Linear, each adapter Linear its
own unit, the blocks units around them, the root frozen. A frozen flat parameter has no
gradient to hook, so FSDP reshards it from a hook on its unit's input activations, once their
gradient is made (``_register_post_backward_reshard_only_hook``, torch 2.1 on). At each adapter
gradient it counts which units' flat parameters are gathered: the root, the blocks, the
adapters.

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
from torch.multiprocessing.reductions import StorageWeakRef

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "notebooks" / "scripts"))
from common import report, teardown  # noqa: E402

WIDTH, BLOCKS, HEAD, STEPS, LORA_RANK = 256, 3, 511, 2, 8
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "FULL_SHARD bf16")
NO_SYNC = ("FULL_SHARD no_sync", "FULL_SHARD bf16 no_sync")  # k = 2, the first under no_sync


class Gain(nn.Module):
    """x times one learned scalar: one parameter, so that the root's flat parameter has an odd
    number of elements and FSDP pads it to a multiple of the 2 ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


def storage_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.untyped_storage().nbytes()


def grad_storages(f: nn.Parameter) -> dict[int, int]:
    """The storages holding a unit's gradient: ``.grad``, and the reduce-scattered shard FSDP
    keeps in ``_saved_grad_shard`` until the end of backward. By data pointer, counted once."""
    held = [f.grad, getattr(f, "_saved_grad_shard", None)]
    return {t.untyped_storage().data_ptr(): storage_bytes(t) for t in held if t is not None}


def run(strategy: str, device: torch.device, x: torch.Tensor, world: int) -> dict:
    torch.manual_seed(0)
    blocks = [nn.Linear(WIDTH, WIDTH) for _ in range(BLOCKS)]
    layers: list[nn.Module] = []
    for block in blocks:
        layers += [block, nn.Tanh()]
    head = nn.Linear(WIDTH, HEAD, bias=False)
    stem = [nn.Linear(WIDTH, WIDTH), Gain()]
    model = nn.Sequential(*stem, *layers, head)  # the root: a stem and a head
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
    for block in blocks:
        block.register_forward_pre_hook(lambda *_: at_forward.append(gathered()))
    # The head's weight is a view of the root's flat parameter, made before the blocks ran: its
    # gradient, made first in backward, waits for that view's node, which autograd runs last
    # (it orders ready nodes by creation, latest first). Watched from the node that makes it.
    pending: list[tuple[StorageWeakRef, int]] = []  # the C++ storage's, not its Python wrapper's

    def waiting() -> int:
        return sum(nbytes for ref, nbytes in pending if not ref.expired())

    def watch_head_grad(module: nn.Module, args, out: torch.Tensor) -> None:
        def made(grads, _):
            for g in grads:
                if g is not None and g.numel() == module.weight.numel():
                    pending.append((StorageWeakRef(g.untyped_storage()), storage_bytes(g)))

        out.grad_fn.register_hook(made)

    head.register_forward_hook(watch_head_grad)
    accumulate = strategy in NO_SYNC
    made: dict[int, tuple[StorageWeakRef, int, int]] = {}  # unit: the gradient autograd made

    def keep_made(i: int, g: torch.Tensor) -> None:
        storage = g.untyped_storage()
        made[i] = (StorageWeakRef(storage), storage.data_ptr(), storage_bytes(g))

    def moment(i: int, f: nn.Parameter) -> dict:
        counted = {
            "gathered": gathered(),
            "unsharded_grad": storage_bytes(f.grad),
            "pending_head_grad": waiting(),
        }
        if accumulate:  # the kept gradients, and the one just made where it is a storage apart
            own = grad_storages(f)
            ref, ptr, nbytes = made[i]
            counted["made_grad"] = 0 if ref.expired() or ptr in own else nbytes
            others = {}
            for j, g in enumerate(flats):
                if j != i:
                    others.update(grad_storages(g))
            counted["other_grads"] = sum(others.values())
        return counted

    for i, flat in enumerate(flats):  # runs as the unit's gradient is made, before FSDP's own
        # hook reshards the unit; the tensor hook before that, as autograd hands the gradient
        flat.register_hook(lambda g, i=i: keep_made(i, g))
        flat.register_post_accumulate_grad_hook(lambda f, i=i: at_gradient.append(moment(i, f)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept: list[dict] = []
    for _ in range(STEPS):  # the second step is counted: the optimizer's state exists by then
        opt.zero_grad(set_to_none=True)
        if accumulate:  # the first micro-batch under no_sync, its gradients kept as it leaves them
            with model.no_sync():
                model(x).float().pow(2).mean().backward()
            kept = [
                {
                    "bytes": storage_bytes(f.grad),
                    "numel": 0 if f.grad is None else f.grad.numel(),
                    "dtype": str(f.grad.dtype).removeprefix("torch."),
                }
                for f in flats
            ]
        at_forward.clear()
        at_gradient.clear()
        pending.clear()
        model(x).float().pow(2).mean().backward()
        opt.step()
    moments = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    return {
        "kept_after_no_sync": kept,
        "unit_numel": [f._unpadded_unsharded_size.numel() for f in flats],
        "shards": [storage_bytes(f) for f in flats],
        "grads": [storage_bytes(f.grad) for f in flats],
        "optimizer_state": sum(storage_bytes(v) for v in moments),
        "gathered_at_forward": at_forward,
        "at_gradient": at_gradient,
    }


class LoraBlock(nn.Module):
    """A frozen Linear with a trainable low-rank adapter beside it, as torchtune's LoRALinear:
    tanh(W x + B(A(x)))."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(WIDTH, WIDTH)
        self.lora_a = nn.Linear(WIDTH, LORA_RANK, bias=False)
        self.lora_b = nn.Linear(LORA_RANK, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.base(x) + self.lora_b(self.lora_a(x)))


def lora_wrap_policy(module: nn.Module, recurse: bool, **_) -> bool:
    """torchtune's ``lora_fsdp_wrap_policy(modules_to_wrap={TransformerDecoderLayer})``
    (torchtune/utils/_distributed.py at fef3ed10d), with ``LoraBlock`` as the layer: a unit
    for each module whose weight is trainable (the adapters), and one for each block."""
    if recurse:
        return True
    if hasattr(module, "weight") and module.weight.requires_grad:
        return True
    return isinstance(module, LoraBlock)


def run_lora(device: torch.device, x: torch.Tensor) -> dict:
    torch.manual_seed(0)
    blocks = [LoraBlock() for _ in range(BLOCKS)]
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), Gain(), *blocks, nn.Linear(WIDTH, HEAD, False))
    for name, p in model.named_parameters():
        p.requires_grad = "lora_" in name  # before wrapping: a flat parameter is all one or other
    model = FSDP(
        model,
        auto_wrap_policy=lora_wrap_policy,
        device_id=device,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
    )
    units = [m for m in FSDP.fsdp_modules(model) if m._handle is not None]
    flats = [m._handle.flat_param for m in units]
    kinds = [
        "root" if m is model else "block" if isinstance(m.module, LoraBlock) else "adapter"
        for m in units
    ]

    def gathered() -> dict:
        each = [storage_bytes(getattr(f, "_full_param_padded", None)) for f in flats]
        return {
            "root": sum(b for b, k in zip(each, kinds, strict=True) if k == "root"),
            "blocks": [b for b, k in zip(each, kinds, strict=True) if k == "block"],
            "adapters": sum(b for b, k in zip(each, kinds, strict=True) if k == "adapter"),
        }

    at_gradient: list[dict] = []
    for flat in flats:
        if flat.requires_grad:  # the adapters': runs before FSDP's own hook reshards the unit
            flat.register_post_accumulate_grad_hook(lambda f: at_gradient.append(gathered()))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        at_gradient.clear()
        model(x).float().pow(2).mean().backward()
        opt.step()
    return {
        "kinds": kinds,
        "unit_numel": [f._unpadded_unsharded_size.numel() for f in flats],
        "at_adapter_gradient": at_gradient,
        "after_backward": gathered(),
    }


def main() -> None:
    # gloo on the CPU even where GPUs are: the counts are the storages', the same on a GPU
    dist.init_process_group("gloo")
    rank, world, device = dist.get_rank(), dist.get_world_size(), torch.device("cpu")
    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(rank))
    results = {name: run(name, device, x, world) for name in STRATEGIES + NO_SYNC}
    results["FULL_SHARD LoRA"] = run_lora(device, x)
    report({"rank": rank, "world": world, "results": results})
    teardown()


if __name__ == "__main__":
    main()
