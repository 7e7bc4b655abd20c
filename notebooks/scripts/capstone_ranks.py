"""Capstone 2 (notebook 11): run a plan for real on every rank, and measure what it did.

  torchrun --nproc-per-node=2 --master-port=29500 capstone_ranks.py --plan plan.json --step step.py

``plan.json`` says how to shard the model: ``{"shard": "zero3", "micro_batches": 4,
"checkpointing": true}``, with ``shard`` one of ``replicate`` (a whole model per rank, the step
averages the gradients itself), ``ddp``, ``shard_grad_op`` (FSDP2
``reshard_after_forward=False``: gradients and Adam's state sharded, each block's parameters
sharded at rest but kept gathered from its forward to its backward; FSDP1 called it
``SHARD_GRAD_OP``) and ``zero3`` (FSDP2's default, ``FULL_SHARD``); ``"gradient_sync": "last"``
(optional; ``"every"`` by default) reduces the gradients only in the last micro-batch's backward
(FSDP2's ``set_requires_gradient_sync(False)``, DDP's ``no_sync()``, before each of the others),
each rank keeping whole gradients until then. ``step.py`` defines
``train_step(model, optimizer, x, y, micro_batches)``: the learner's step, which the notebook
writes there.

Each rank, in this order:

1. The reference, before any of the learner's code runs: one process's gradients on the whole
   global batch, from a fresh model and its own copy of the batch. Only this rank's part of them
   is kept, as numpy arrays (no tensor: nothing of it counts against the rank's memory).
2. The model, built the way the plan says (each block checkpointed when it says so).
3. ``STEPS`` calls of the learner's step on this rank's part of the batch, each inside
   ``memory.measure`` (the package's accountant on a CPU, the caching allocator on a GPU), with
   every collective counted: ``all_reduce``, ``all_gather`` and ``reduce_scatter`` (FSDP2's and
   DDP's calls and the learner's own) and ``broadcast``, by the bytes of the whole tensor each is
   about (``zero_stages.CommCounter``). Before each call after the first, outside the measured
   and counted part, the reference again: one process's gradients at the weights that call
   starts from (gathered whole, before the learner's code runs again). The gradients handed to
   every ``optimizer.step()`` are kept (this rank's shard).
4. A report: each call's peak, the bytes of each collective per call, each call's gradients
   against its reference (the largest gap relative to the largest value, the norm ratio, the
   cosine, and the gap once the previous call's gradients are taken away: what a step that
   never clears ``p.grad`` leaves), how often ``optimizer.step()`` ran in each call, and the
   state this rank holds at rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist
from common import local_bytes, log, report, setup, teardown
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from zero_stages import ALL_GATHER, REDUCE_SCATTER, CommCounter, ddp_wrap

from tutorial_utils import memory

WIDTH, BLOCKS, GLOBAL_BATCH, LR, STEPS = 256, 4, 1024, 1e-3, 2
SHARDS = ("replicate", "ddp", "shard_grad_op", "zero3")
# the learner's names for the collectives, whatever this torch calls them
NAMES = {ALL_GATHER: "all_gather", REDUCE_SCATTER: "reduce_scatter"}


class Block(nn.Module):
    """A transformer's MLP: Linear to 4x the width, GELU, Linear back. Without checkpointing
    it keeps its input, the wide pre-activation and the GELU's output for backward (9 values
    per row and width); with ``checkpointed`` only its input (1), and backward runs it again."""

    def __init__(self, width: int, checkpointed: bool = False):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.checkpointed = checkpointed

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(self.run, x, use_reentrant=False)
        return self.run(x)


def build_model(checkpointed: bool = False) -> nn.Sequential:
    """The same seeded weights on every rank and in the reference. The seed is set inside
    ``fork_rng``: the caller's random state (the notebook's, which imports this) is left as
    it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(*(Block(WIDTH, checkpointed) for _ in range(BLOCKS)))


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(GLOBAL_BATCH, WIDTH, generator=g), torch.randn(
        GLOBAL_BATCH, WIDTH, generator=g
    )


def reference(
    rank: int, world: int, sharded: bool, weights: list[np.ndarray] | None = None
) -> list[np.ndarray]:
    """One process's gradients on the whole batch, at the initial weights or at ``weights``;
    this rank's shard of each when ``sharded`` (FSDP2 keeps row block ``rank`` of
    ``torch.chunk(world)``)."""
    model = build_model()
    if weights is not None:
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights, strict=True):
                p.copy_(torch.from_numpy(w))
    x, y = global_batch()
    nn.functional.mse_loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    if sharded:
        grads = [g.chunk(world, dim=0)[rank] for g in grads]
    return [g.detach().numpy().copy() for g in grads]


class Handed:
    """The optimizer, wrapped: keeps (numpy) the gradients handed to every ``step()``, this
    rank's shard of each; ``len(handed)`` is how often it ran."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self._optimizer, self.handed = optimizer, []

    def step(self, *args, **kwargs):
        params = [p for group in self._optimizer.param_groups for p in group["params"]]
        self.handed.append([None if p.grad is None else _local(p.grad) for p in params])
        return self._optimizer.step(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._optimizer, name)


def _local(t: torch.Tensor) -> np.ndarray:
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.detach().float().cpu().numpy().copy()


def _flat(arrays: list) -> np.ndarray | None:
    if any(a is None for a in arrays):
        return None
    return np.concatenate([a.ravel() for a in arrays]).astype(np.float64)


def compare(got: list, want: list[np.ndarray], previous: list | None = None) -> dict:
    """The largest gap relative to the largest reference value, the norm ratio, the cosine;
    with the gradients handed to the previous step, the gap of ``got - previous`` too (0 when
    the step added this step's gradients to the previous step's, within the rounding)."""
    if len(got) != len(want) or any(
        g is None or g.shape != w.shape for g, w in zip(got, want, strict=True)
    ):
        return {"gap": float("inf"), "ratio": 0.0, "cosine": 0.0, "missing": True}
    g, w = _flat(got), _flat(want)
    scale = np.abs(w).max()
    gap = float(np.abs(g - w).max() / scale)
    ratio = float(np.linalg.norm(g) / np.linalg.norm(w))
    cosine = float(g @ w / (np.linalg.norm(g) * np.linalg.norm(w) or 1.0))
    out = {"gap": gap, "ratio": ratio, "cosine": cosine, "missing": False}
    before = None if previous is None or len(previous) != len(got) else _flat(previous)
    if before is not None and before.shape == g.shape:
        out["gap_less_previous"] = float(np.abs(g - before - w).max() / scale)
    return out


def full_weights(model: nn.Module) -> list[np.ndarray]:
    """Every parameter whole, as numpy (a shard's DTensor gathered: a collective on every rank)."""
    with torch.no_grad():
        return [
            _local(p.full_tensor() if isinstance(p, DTensor) else p) for p in model.parameters()
        ]


def shard_model(plan: dict, device: torch.device) -> nn.Module:
    model = build_model(bool(plan["checkpointing"])).to(device)
    if plan["shard"] == "ddp":
        return ddp_wrap(model, device)  # its all-reduce goes through dist.all_reduce (counted)
    if plan["shard"] in ("shard_grad_op", "zero3"):
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        keep = plan["shard"] == "shard_grad_op"  # the gathered parameters stay until backward
        for block in model:
            fully_shard(block, mesh=mesh, reshard_after_forward=not keep)
        fully_shard(model, mesh=mesh, reshard_after_forward=not keep)
    return model


def sync_in_last_micro_batch(model: nn.Module, micro_batches: int) -> None:
    """Plan ``"gradient_sync": "last"``: before each forward, say whether its backward reduces
    the gradients: only in the last of every ``micro_batches`` forwards (FSDP2's
    ``set_requires_gradient_sync``, on every ``fully_shard`` module; DDP's flag, which
    ``no_sync()`` sets). Until then each rank adds into whole, unreduced gradients."""
    forwards = [0]

    def before_forward(module: nn.Module, args: tuple) -> None:
        last = forwards[0] % micro_batches == micro_batches - 1
        forwards[0] += 1
        if isinstance(module, DDP):
            module.require_backward_grad_sync = last
        else:
            module.set_requires_gradient_sync(last)

    model.register_forward_pre_hook(before_forward)


def load_step(path: str):
    spec = importlib.util.spec_from_file_location("learner_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.train_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True)
    parser.add_argument("--step", required=True)
    args = parser.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    rank, world, device = setup()
    sharded = plan["shard"] in ("shard_grad_op", "zero3")
    want = reference(rank, world, sharded)  # 1. first, before the learner's code
    x, y = (t.chunk(world)[rank].clone().to(device) for t in global_batch())
    train_step = load_step(args.step)
    model = shard_model(plan, device)  # 2.
    if plan.get("gradient_sync", "every") == "last":
        sync_in_last_micro_batch(model, int(plan["micro_batches"]))
    optimizer = Handed(torch.optim.Adam(model.parameters(), lr=LR))
    counter = CommCounter()
    out: dict = {"rank": rank, "world": world, "peaks": [], "comm": [], "losses": []}
    out.update({"optimizer_steps": [], "grads": []})
    previous = None  # the gradients handed to the last optimizer.step() of the previous call
    try:
        for call in range(STEPS):  # 3.
            if call:  # one process's gradients at the weights this call starts from
                want = reference(rank, world, sharded, full_weights(model))
            counter.calls.clear()
            dist.barrier()  # the previous call's collectives are done
            counter.on = True
            handed_before = len(optimizer.handed)
            with memory.measure(device) as m:
                loss = train_step(model, optimizer, x, y, int(plan["micro_batches"]))
            counter.on = False
            out["peaks"].append(m.peak_bytes)
            by_name: dict[str, int] = {}
            for name, nbytes in counter.calls:
                by_name[NAMES.get(name, name)] = by_name.get(NAMES.get(name, name), 0) + nbytes
            out["comm"].append(by_name)
            out["losses"].append(float(loss) if loss is not None else None)
            handed = optimizer.handed[handed_before:]
            out["optimizer_steps"].append(len(handed))
            out["grads"].append(compare(handed[0] if handed else [], want, previous))  # 4.
            previous = handed[-1] if handed else previous
    except Exception as err:  # the learner's step failed: say so, and leave
        out["error"] = "".join(traceback.format_exception_only(err)).strip()[-600:]
        log("train_step raised:", out["error"])
    finally:
        counter.restore()
    state = [p for p in model.parameters()]
    out["state_bytes"] = sum(local_bytes(p) + local_bytes(p.grad) for p in state) + sum(
        local_bytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
    )
    out["psi"] = sum(p.numel() for p in build_model().parameters())
    report(out)
    if "error" in out:  # the other ranks may wait in a collective: torchrun stops them
        sys.stdout.flush()
        os._exit(1)
    teardown()


if __name__ == "__main__":
    main()
