"""One model, five ways to train it on every process: DDP, ZeRO-1, -2, -3 and ZeRO-3 in bf16.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 zero_stages.py

Each setup takes the same two Adam steps on the same global batch (each rank its half) and is
checked against one process taking them on the whole batch. Each rank counts, exactly, the
bytes it holds by category (its own shards only: ``DTensor.to_local()``), the peak of tensor
memory during a step (on CPU the allocator's own events, read with ``torch.profiler``'s
``profile_memory``; on GPU the caching allocator's ``max_memory_allocated``), and every byte
each collective moves during a step: the collectives are wrapped where FSDP2, DDP's
communication hook and ``ZeroRedundancyOptimizer`` call them (``torch.distributed.all_reduce``,
``all_gather_single``, ``reduce_scatter_single``, ``broadcast``).

The device and backend come from ``common.setup()``: NCCL with one GPU per process when there
are enough GPUs, gloo on the CPU otherwise.

1. ``DDP``: everything replicated; gradients all-reduced in buckets.
2. ``ZeroRedundancyOptimizer`` over DDP (ZeRO-1): each rank keeps the Adam state of the
   parameters it owns, steps them, and broadcasts them to the others. It splits by whole
   parameter (largest first, to the rank with the least so far), so the split can be uneven.
3. FSDP2 ``fully_shard(reshard_after_forward=False)`` (ZeRO-2-like): parameters, gradients and
   state sharded at rest; each layer's full parameters, gathered in forward, stay until its
   backward, so backward needs no second all-gather.
4. FSDP2 default (ZeRO-3): a layer's full parameters exist only while it runs.
5. FSDP2 with ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: fp32
   shards, bf16 gathers and compute, fp32 gradients.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from common import (
    BF16_ROUNDING,
    local_bytes,
    log,
    mlp,
    relative_gap,
    report,
    setup,
    sum_bound,
    teardown,
    within,
)
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

# Kineto (the profiler's C++ side) prints a line each time it starts and stops unless told to be
# quiet; it reads this once, when the first profiler starts.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

WIDTH, LAYERS, PER_RANK, LR, STEPS = 256, 3, 16, 1e-3, 2
# FSDP2 calls dist.all_gather_single / reduce_scatter_single since torch 2.13; before, the older
# all_gather_into_tensor / reduce_scatter_tensor (same arguments). Wrap the ones this torch uses.
ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
REDUCE_SCATTER = (
    "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
)
COLLECTIVES = ("all_reduce", ALL_GATHER, REDUCE_SCATTER, "broadcast")


def build_model(seed: int = 0) -> nn.Sequential:
    return mlp(WIDTH, LAYERS, nn.Tanh, seed)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a collective for a DTensor: every rank must call it)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


class CommCounter:
    """Wrap the torch.distributed collectives and book (name, bytes) of each call while on.

    The bytes booked are the size of the whole tensor the collective is about: the gathered
    output of an all-gather, the input of a reduce-scatter, the tensor of an all-reduce or a
    broadcast. The Playbook counts an all-reduce as a reduce-scatter plus an all-gather, so it
    weighs 2 (``weight``).
    """

    weight = {"all_reduce": 2, ALL_GATHER: 1, REDUCE_SCATTER: 1, "broadcast": 1}

    def __init__(self) -> None:
        self.on = False
        self.calls: list[tuple[str, int]] = []
        self._originals = {name: getattr(dist, name) for name in COLLECTIVES}
        for name in COLLECTIVES:
            setattr(dist, name, self._wrap(name, self._originals[name]))

    def _wrap(self, name: str, fn: Callable) -> Callable:
        def counted(*args, **kwargs):
            if self.on:
                if name == ALL_GATHER:
                    tensor = args[0] if args else kwargs["output_tensor"]
                elif name == REDUCE_SCATTER:
                    tensor = args[1] if len(args) > 1 else kwargs["input"]
                else:
                    tensor = args[0] if args else kwargs["tensor"]
                self.calls.append((name, tensor.numel() * tensor.element_size()))
            return fn(*args, **kwargs)

        return counted

    def restore(self) -> None:
        for name, fn in self._originals.items():
            setattr(dist, name, fn)

    def summary(self) -> dict:
        by_name: dict[str, dict[str, int]] = {}
        for name, nbytes in self.calls:
            entry = by_name.setdefault(name, {"calls": 0, "bytes": 0})
            entry["calls"] += 1
            entry["bytes"] += nbytes
        weighted = sum(self.weight[name] * nbytes for name, nbytes in self.calls)
        return {"by_collective": by_name, "weighted_bytes": weighted}


class StepPeak:
    """Peak of tensor memory in a block, in bytes above its start, for each phase marked inside.

    CPU: PyTorch's CPU allocator reports every allocation and free to the profiler when
    ``profile_memory`` is on; the running sum of those events, in order, peaks where the block
    did. (A ``TorchDispatchMode`` counter does not fit here: it sees a DTensor as one tensor of
    its global size, not the shard a rank stores.) GPU: the caching allocator's counters.

    The profiler also books the free of a block allocated under an *earlier* profiler (the
    previous setup's window), as a negative size. The previous setup's model (FSDP2 and DDP
    modules hold reference cycles) is freed by Python's cyclic garbage collector, at whatever
    allocation triggers it: inside this window, its frees would pull this setup's peaks down
    by up to its whole size (notebook 09 once showed ZeRO-3's optimizer step at 0 B). So the
    garbage is collected before the window opens, and the collector is off while it is open.
    """

    PHASES = ("forward", "backward", "optimizer step")

    def __init__(self, device: torch.device):
        self.device = device
        self.peaks: dict[str, int] = {}

    @staticmethod
    def warm_up() -> None:
        """The CPU allocator warns, once per process and past Python (file descriptor 2), that a
        block allocated before profiling and freed during it has no known size: free one such
        block here, with fd 2 silenced, so the measured steps print nothing."""
        block = torch.empty(1)
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        try:
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            ):
                del block
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)

    def __enter__(self) -> StepPeak:
        gc.collect()  # the previous setups' garbage, freed now, outside the window
        gc.disable()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
            self._prof.__enter__()
        return self

    def phase(self, name: str):
        if self.device.type == "cuda":
            return self._cuda_phase(name)
        return torch.profiler.record_function("phase:" + name)

    @contextlib.contextmanager
    def _cuda_phase(self, name: str):
        """GPU: the allocator's peak counter, reset at the phase's start, read at its end."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - self._start
        self.peaks[name] = max(self.peaks.get(name, 0), peak)

    def __exit__(self, *exc) -> None:
        gc.enable()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            rest = torch.cuda.max_memory_allocated(self.device) - self._start
            self.peaks["step"] = max(rest, *self.peaks.values()) if self.peaks else rest
            return
        self._prof.__exit__(*exc)
        marks, allocations = [], []
        for e in self._prof.profiler.kineto_results.events():
            if e.name() == "[memory]":
                if e.device_type() == torch._C._autograd.DeviceType.CPU:
                    allocations.append((e.start_ns(), e.nbytes()))
            elif e.name().startswith("phase:"):
                marks.append((e.start_ns(), e.name().removeprefix("phase:")))
        marks.sort()
        allocations.sort(key=lambda a: a[0])  # stable: equal times keep the allocator's order
        running, i, phase = 0, 0, None
        self.peaks = {name: 0 for _, name in marks}
        for t, nbytes in allocations:
            while i < len(marks) and marks[i][0] <= t:
                phase = marks[i][1]
                self.peaks[phase] = max(self.peaks[phase], running)
                i += 1
            running += nbytes
            if phase is not None:
                self.peaks[phase] = max(self.peaks[phase], running)
        self.peaks["step"] = max(self.peaks.values(), default=0)


def ddp_wrap(model: nn.Module, device: torch.device) -> DDP:
    # gradient_as_bucket_view=True: each .grad is a view into DDP's all-reduce buckets. With the
    # default (False) DDP keeps the buckets besides the .grad tensors: 4 bytes more per parameter.
    ddp = DDP(
        model.to(device),
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
    )
    # The default hook, registered by hand so the all-reduce goes through dist.all_reduce (the
    # counter sees it); without a hook DDP's C++ reducer calls the process group directly.
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    return ddp


def fsdp_wrap(model: nn.Sequential, device: torch.device, mesh, **kwargs) -> nn.Module:
    model.to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **kwargs)  # each Linear its own unit
    fully_shard(model, mesh=mesh, **kwargs)  # the root (it holds no parameters of its own)
    return model


def opt_state_bytes(opt: torch.optim.Optimizer) -> int:
    if isinstance(opt, ZeroRedundancyOptimizer):
        opt = opt.optim  # the local optimizer: the state of this rank's parameters only
    return sum(local_bytes(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def run_setup(
    name: str,
    make: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
    counter: CommCounter,
    reference: list[torch.Tensor],
    ref_grads: list[torch.Tensor],
) -> dict:
    model, opt = make()
    shards = {id(p) for p in model.parameters()}  # what each rank keeps between steps
    out: dict = {"params_at_rest": sum(local_bytes(p) for p in model.parameters())}

    # Gathered parameters held as each Linear starts its forward: a point the code fixes (the
    # hook runs after FSDP's own pre-forward gathered the layer), unlike a peak of the whole
    # forward, which moves with the moment gloo's threads free a buffer.
    held_at_forward: list[int] = []

    def book_gathered(module: nn.Module, args: tuple) -> None:
        gathered = [p for p in model.parameters() if id(p) not in shards]
        held_at_forward.append(sum(p.untyped_storage().nbytes() for p in gathered))

    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            layer.register_forward_pre_hook(book_gathered)
    for step in range(STEPS):
        last = step == STEPS - 1  # measure and count the last step: the state exists by then
        opt.zero_grad(set_to_none=True)
        if last:  # free the previous step's output before the window, and let its work finish
            pred = None
            dist.barrier()
        counter.calls.clear()
        counter.on = last
        with StepPeak(device) if last else contextlib.nullcontext() as peak:
            with peak.phase("forward") if last else contextlib.nullcontext():
                pred = model(x)
            out["compute_dtype"] = str(pred.dtype)
            if last:
                # Between forward and backward: the shards (the optimizer holds them, so they
                # live all the time) plus any full parameters FSDP gathered and still keeps.
                gathered = [p for p in model.parameters() if id(p) not in shards]
                out["gathered_between_fwd_bwd"] = sum(local_bytes(p) for p in gathered)
            with peak.phase("backward") if last else contextlib.nullcontext():
                nn.functional.mse_loss(pred.float(), y).backward()
            if last:
                out["grads"] = sum(local_bytes(p.grad) for p in model.parameters())
            else:  # the first step's gradients against one process's, each relative to its max
                grads = [full(p.grad) for p in model.parameters()]
                out["grad_rel_gap"] = relative_gap(grads, ref_grads)
            with peak.phase("optimizer step") if last else contextlib.nullcontext():
                opt.step()
        counter.on = False
    out["gathered_at_forward"] = held_at_forward[-LAYERS:]  # the last step's, layer by layer
    out["comm"] = counter.summary()
    out["optimizer_state"] = opt_state_bytes(opt)
    out["peak"] = peak.peaks
    out["grad_dtype"] = str(next(model.parameters()).grad.dtype)
    out["max_diff"] = max(
        (full(p.detach()) - r).abs().max().item()
        for p, r in zip(model.parameters(), reference, strict=True)
    )
    if isinstance(opt, ZeroRedundancyOptimizer):
        owned = [p for g in opt.optim.param_groups for p in g["params"]]
        names = {id(p): n for n, p in model.module.named_parameters()}
        out["owned"] = sorted(names[id(p)] for p in owned)
        out["owned_numel"] = sum(p.numel() for p in owned)
        out["owned_tensors"] = len(owned)
    if out["compute_dtype"] == "torch.bfloat16":
        # bf16 against fp32: 6 bf16 roundings per layer (input, weight and output in forward,
        # the output gradient and the two products in backward), one after another.
        tol = 6 * LAYERS * BF16_ROUNDING
    else:
        # fp32 in another order: a chain of LAYERS sums of WIDTH products, and the batch's sum.
        tol = sum_bound(LAYERS * WIDTH + PER_RANK * dist.get_world_size())
    # Adam moves a weight by at most about lr per step (Kingma and Ba, 2015, section 2.1), in
    # each run: after STEPS steps two correct runs are less than 2 * STEPS * lr apart. Closer is
    # not promised: Adam divides by |g|, so where |g| is near eps, rounding moves a weight by a
    # visible part of lr (the gradients above carry the tight check).
    # In bf16 that happens all over (a bf16 rounding flips the sign of a small gradient): its
    # weights are not compared, its gradients are.
    out["grad_tol"], out["weight_tol"] = tol, 2 * STEPS * LR
    same = within(f"zero_stages {name} grad_gap", out["grad_rel_gap"], tol)
    if out["compute_dtype"] != "torch.bfloat16":
        same &= within(f"zero_stages {name} weight_gap", out["max_diff"], out["weight_tol"])
    log(f"{name}: gradients within {tol:.0e} of one process's (fp32: weights too): {same}")
    return out


def main() -> None:
    rank, world, device = setup()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(PER_RANK * world, WIDTH, generator=g)  # the global batch
    y = torch.randn(PER_RANK * world, WIDTH, generator=g)
    mine = slice(PER_RANK * rank, PER_RANK * (rank + 1))  # this rank's half

    # The reference: one process, the whole batch, the same steps.
    ref = build_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
    for step in range(STEPS):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        if step == 0:
            ref_grads = [p.grad.detach().clone().to(device) for p in ref.parameters()]
        ref_opt.step()
    reference = [p.detach().to(device) for p in ref.parameters()]
    x, y = x[mine].to(device), y[mine].to(device)

    mesh = init_device_mesh(device.type, (world,))
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def adam(model: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, torch.optim.Adam(model.parameters(), lr=LR)

    def zero1() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = ddp_wrap(build_model(), device)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
        return model, opt

    setups = {
        "DDP": lambda: adam(ddp_wrap(build_model(), device)),
        "ZeRO-1": zero1,
        "ZeRO-2": lambda: adam(fsdp_wrap(build_model(), device, mesh, reshard_after_forward=False)),
        "ZeRO-3": lambda: adam(fsdp_wrap(build_model(), device, mesh)),
        "ZeRO-3 bf16": lambda: adam(fsdp_wrap(build_model(), device, mesh, mp_policy=bf16)),
    }
    if device.type == "cpu":
        StepPeak.warm_up()
    counter = CommCounter()
    try:
        results = {
            name: run_setup(name, make, x, y, device, counter, reference, ref_grads)
            for name, make in setups.items()
        }
    finally:
        counter.restore()
    model = build_model()
    report(
        {
            "rank": rank,
            "world": world,
            "backend": dist.get_backend(),
            "psi": sum(p.numel() for p in model.parameters()),
            "tensors": len(list(model.parameters())),
            "names": [n for n, _ in model.named_parameters()],
            "numel": [p.numel() for p in model.parameters()],
            "results": results,
        }
    )
    teardown()


if __name__ == "__main__":
    main()
