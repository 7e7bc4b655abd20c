"""A 2-D mesh: tensor parallelism inside each data-parallel group, FSDP2 across the groups.

    torchrun --nproc-per-node=4 --master-addr=127.0.0.1 --master-port=29500 mesh_2d.py

Four ranks form a 2 x 2 ``DeviceMesh`` with named dimensions ``("dp", "tp")``::

            tp=0  tp=1
    dp=0  [ r0    r1 ]    r0 and r1 split every layer between them (TP) and see the same data
    dp=1  [ r2    r3 ]    r0 and r2 hold different shards of the same slice (FSDP2) and see
                          different halves of the batch

Two transformer blocks of ``tensor_parallel.py``, one after the other: each is split with its
``TP_PLAN`` on ``mesh["tp"]`` (``parallelize_module``), then sharded with ``fully_shard`` on
``mesh["dp"]`` (each block its own FSDP unit). Each weight that TP split by columns or rows is
cut again along dim 0 by FSDP2, so a rank stores a quarter of it; a weight TP replicates (the
norms, the biases of the row-split Linears) is cut in two by FSDP2.
Each rank checks, against one process on the whole batch:

1. its output rows and every gradient (``full_tensor()`` of each 2-D DTensor gradient);
2. the parameter bytes it stores (``to_local()``: its own piece only);
3. the collectives of one step, counted by ``CommDebugMode`` (extended here to book the bytes of
   the whole tensor each collective is about) and split by the mesh dimension they ran on:
   TP's all-reduces of activations inside the ``tp`` group, FSDP2's all-gathers of parameters and
   reduce-scatters of gradients inside the ``dp`` group.

The model is tiny and the run short: 4 processes share whatever cores the machine has.
The device and backend come from ``common.setup()``: NCCL with one GPU per process when there
are enough GPUs, gloo on the CPU otherwise.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections import defaultdict

import torch
import torch.distributed as dist
from common import log, report, setup, teardown, within
from tensor_parallel import HEADS, TP_PLAN, H, build, tolerances
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._pytree import tree_leaves

B, S, BLOCKS = 4, 16, 2  # global batch (each dp group takes half), sequence, blocks
warnings.filterwarnings("ignore", message="Full backward hook is firing")
# The model's output is a view (TP hands back the local tensor of a DTensor); FSDP2 warns that an
# in-place op on it would skip its backward hook. True; nothing here changes the output in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
# full_tensor() of a 2-D gradient warns (through logging) that it takes two all-gathers, one per
# mesh dimension: true, and only the check below does it.
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


class CommBytes(CommDebugMode):
    """``CommDebugMode`` that also books, for each collective it counts, the bytes of the largest
    tensor the collective touches (the gathered output of an all-gather, the input of a
    reduce-scatter, the tensor of an all-reduce) and the mesh dimension it ran on (its process
    group's ranks, compared with this rank's group on each dimension)."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        super().__init__()
        self.groups = groups  # mesh dimension -> the ranks of this rank's group on it
        self.calls: list[tuple[str, str, int]] = []  # (mesh dimension, collective, bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = sum(self.comm_counts.values())
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and sum(self.comm_counts.values()) > before:
            leaves = tree_leaves((args, kwargs, out))
            nbytes = max(t.numel() * t.element_size() for t in leaves if torch.is_tensor(t))
            name = str(func._overloadpacket).split(".")[-1].strip("_")
            self.calls.append((self._dimension(leaves), name, nbytes))
        return out

    def _dimension(self, leaves: list) -> str:
        """The mesh dimension whose group this collective ran on: functional collectives (TP's
        DTensors) name their group, c10d ops (FSDP2's) pass the group object itself."""
        for a in leaves:
            if isinstance(a, torch.ScriptObject):
                pg = dist.ProcessGroup.unbox(a)
            elif isinstance(a, str):  # a group's name, or another string argument ("sum")
                try:
                    pg = dist.distributed_c10d._resolve_process_group(a)
                except (ValueError, RuntimeError):
                    continue
            else:
                continue
            ranks = dist.get_process_group_ranks(pg)
            return next((d for d, r in self.groups.items() if r == ranks), str(ranks))
        return "?"

    def summary(self) -> dict:
        """{"tp all_reduce": {"calls": n, "bytes": total}, ...}"""
        by: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "bytes": 0})
        for dim, name, nbytes in self.calls:
            by[f"{dim} {name}"]["calls"] += 1
            by[f"{dim} {name}"]["bytes"] += nbytes
        return dict(by)


def build_model() -> nn.Sequential:
    """Two blocks of tensor_parallel.py, one after the other (the same weights every time)."""
    return nn.Sequential(*[build(seed=i) for i in range(BLOCKS)])


def tp_split() -> list[str]:
    """The parameters TP_PLAN splits: the weights of every column- or row-split Linear, and the
    biases of the column-split ones (a row-split Linear adds its bias, whole, after the
    all-reduce)."""
    names = []
    for prefix, style in TP_PLAN.items():
        if isinstance(style, ColwiseParallel | RowwiseParallel):
            names.append(f"{prefix}.weight")
            if isinstance(style, ColwiseParallel):
                names.append(f"{prefix}.bias")
    return sorted(f"{i}.{n}" for i in range(BLOCKS) for n in names)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def main() -> None:
    t0 = time.perf_counter()
    world = int(os.environ.get("WORLD_SIZE", 1))  # checked before joining: nothing to clean up
    if world != 4:
        raise SystemExit(
            f"mesh_2d.py needs 4 ranks (a 2 x 2 mesh), not {world}: run it with --nproc-per-node=4"
        )
    rank, world, device = setup()
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh.get_local_rank("dp")
    groups = {d: dist.get_process_group_ranks(mesh.get_group(d)) for d in ("dp", "tp")}

    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, S, H, generator=g)
    mine = slice(B // 2 * dp_rank, B // 2 * (dp_rank + 1))  # this dp group's half of the batch

    ref = build_model()  # one process, the whole batch
    ref_out = ref(x)
    ref_out.pow(2).mean().backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    ref_bytes = sum(p.numel() * p.element_size() for p in ref.parameters())

    model = parallelize_and_shard(build_model().to(device), mesh)
    placements = {n: str(p.placements) for n, p in model.named_parameters()}
    # the same, as data: the mesh dimension of each placement and its kind (Shard, Replicate...)
    layout = {
        n: [
            [d, type(pl).__name__]
            for d, pl in zip(p.device_mesh.mesh_dim_names, p.placements, strict=True)
        ]
        for n, p in model.named_parameters()
    }
    param_bytes = sum(local(p).numel() * local(p).element_size() for p in model.parameters())

    with CommBytes(groups) as fwd:
        out = model(x[mine].to(device))
    loss = out.pow(2).mean()  # FSDP2 averages over dp: the mean of the halves' means
    with CommBytes(groups) as bwd:
        loss.backward()
    forward_gap = (local(out).cpu() - ref_out[mine]).abs().max().item() / ref_out.abs().max().item()
    scale = max(g.abs().max().item() for g in ref_grads.values())
    grad_gap = (
        max(
            (full(p.grad).cpu() - ref_grads[n]).abs().max().item()
            for n, p in model.named_parameters()
        )
        / scale
    )
    grad_bytes = sum(
        local(p.grad).numel() * local(p.grad).element_size() for p in model.parameters()
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with CommBytes(groups) as step:
        opt.step()  # each rank steps its own pieces: no collective expected
    state_bytes = sum(
        local(v).numel() * local(v).element_size()
        for s in opt.state.values()
        for v in s.values()
        if torch.is_tensor(v)
    )
    forward_tol, grad_tol = tolerances(BLOCKS)  # relative to the largest output, gradient
    same = within("mesh_2d forward_gap", forward_gap, forward_tol)
    same &= within("mesh_2d grad_gap", grad_gap, grad_tol)
    log(f"2-D (dp=2 x tp=2): forward and gradients equal one process's: {same}")
    report(
        {
            "rank": rank,
            "world": world,
            "coords": {"dp": dp_rank, "tp": mesh.get_local_rank("tp")},
            "groups": groups,
            "B": B,
            "S": S,
            "H": H,
            "heads": HEADS,
            "single_param_bytes": ref_bytes,
            "param_numel": {n: p.numel() for n, p in ref.named_parameters()},
            "param_shapes": {n: list(p.shape) for n, p in ref.named_parameters()},
            "tp_split": tp_split(),
            "param_bytes": param_bytes,
            "grad_bytes": grad_bytes,
            "state_bytes": state_bytes,
            "tensors": len(list(model.parameters())),
            "placements": placements,
            "layout": layout,
            "forward_gap": forward_gap,
            "grad_gap": grad_gap,
            "forward_tol": forward_tol,
            "grad_tol": grad_tol,
            "forward_comm": fwd.summary(),
            "backward_comm": bwd.summary(),
            "step_comm": step.summary(),
            "seconds_in_script": time.perf_counter() - t0,
        }
    )
    teardown()


def parallelize_and_shard(model: nn.Sequential, mesh) -> nn.Sequential:
    """Each block: TP on the mesh's ``tp`` dimension first, then FSDP2 on its ``dp`` dimension,
    the order torchtitan uses (FSDP2 shards the DTensors TP made, along dim 0). Each block is
    its own FSDP unit, and the whole model the root."""
    for block in model:
        parallelize_module(block, mesh["tp"], TP_PLAN)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


if __name__ == "__main__":
    main()
