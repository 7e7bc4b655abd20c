"""Pipeline a model over 2 processes with torch.distributed.pipelining: GPipe, then 1F1B.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 pipeline_gpipe.py

Rank 0 holds the first half of the layers (stage 0), rank 1 the second half (stage 1). The
batch is cut into micro-batches: while stage 1 works on micro-batch i, stage 0 already works
on micro-batch i+1. Each rank checks its stage's gradients against one process doing the
whole batch. (Timing a pipeline is pipeline_by_hand.py's job: its timeline shows where the time
goes.)

Then the same stages run ``ScheduleGPipe`` (every forward, then every backward) and
``Schedule1F1B`` (after a warm-up, one forward then one backward) side by side, and each rank
records the order of its stage's forwards and backwards and the bytes of activations autograd
holds for them at the worst moment (a saved-tensor hook books each storage while some backward
still needs it), next to the bytes one micro-batch leaves on this stage, measured on its own
outside any schedule. torch.distributed.pipelining is an alpha API: its names may still change.
"""

from __future__ import annotations

import argparse
import weakref

import torch
import torch.distributed as dist
from common import log, relative_gap, report, setup, sum_bound, teardown, within
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

WIDTH, DEPTH, BATCH = 512, 8, 256


def grad_tolerance(rows: int = BATCH) -> float:
    """How far a stage's gradients may be from one process's, relative to their largest value:
    each is a chain of DEPTH sums of WIDTH products and a sum over the batch of ``rows``, added up
    in another order (per micro-batch, then over micro-batches)."""
    return sum_bound(DEPTH * WIDTH + rows)


def build_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


def stage_layers(model: nn.Sequential, stage: int, n_stages: int) -> nn.Sequential:
    """Stage ``stage`` of ``n_stages`` equal slices of the layers."""
    per = len(model) // n_stages
    return model[stage * per : (stage + 1) * per]


def batch(seed: int = 1, rows: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, WIDTH, generator=g), torch.randn(rows, WIDTH, generator=g)


class HeldActivations:
    """Bytes of the tensors autograd saves for backward that are still held, and their peak.

    Each saved tensor is wrapped in a small ``Saved`` object; autograd drops it when the backward
    that needed it has run, and a weak-reference finalizer then un-books it. A tensor saved by
    two operators (a Linear's input is the output the Tanh before it saves) is booked once, by
    its own bytes (a micro-batch is a view into the batch's storage). Parameters (saved by
    Linear for the input's gradient) are not activations and are left out.
    """

    def __init__(self, params) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.count: dict[tuple[int, int], int] = {}
        self.nbytes: dict[tuple[int, int], int] = {}
        self.live = self.peak = 0

    class Saved:
        __slots__ = ("tensor", "__weakref__")

        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

    def _release(self, ptr: tuple[int, int]) -> None:
        self.count[ptr] -= 1
        if self.count[ptr] == 0:
            self.live -= self.nbytes.pop(ptr)
            del self.count[ptr]

    def pack(self, tensor: torch.Tensor):
        if tensor.untyped_storage().data_ptr() in self.params:
            return tensor
        ptr = (tensor.data_ptr(), tensor.numel())
        if ptr not in self.count:
            self.count[ptr] = 0
            self.nbytes[ptr] = tensor.numel() * tensor.element_size()
            self.live += self.nbytes[ptr]
            self.peak = max(self.peak, self.live)
        self.count[ptr] += 1
        saved = self.Saved(tensor)
        weakref.finalize(saved, self._release, ptr)
        return saved

    @staticmethod
    def unpack(saved):
        return saved.tensor if isinstance(saved, HeldActivations.Saved) else saved

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def make_schedule(part: nn.Module, rank: int, world: int, device, m: int, cls=ScheduleGPipe):
    """This rank's stage of the pipeline, and a schedule that runs m micro-batches through it."""
    stage = PipelineStage(part, stage_index=rank, num_stages=world, device=device)
    return cls(stage, n_microbatches=m, loss_fn=nn.functional.mse_loss)


def pipeline_step(schedule, rank: int, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step: the schedule sends activations forward and gradients back."""
    if rank == 0:
        schedule.step(x)  # stage 0 feeds the input
    else:
        schedule.step(target=y)  # the last stage computes the loss of each micro-batch


def one_microbatch_bytes(part: nn.Module, rank: int, world: int, x, y, m: int) -> int:
    """Bytes autograd saves for one micro-batch on this stage, measured outside any schedule:
    the stage's forward (and, on the last stage, the loss that the schedule computes there)."""
    xm, ym = x.chunk(m)[0], y.chunk(m)[0]
    if rank == 0:
        inp = xm  # stage 0 is fed a slice of the batch
    else:  # later stages receive an activation into a buffer that needs a gradient
        inp = torch.randn(len(xm), WIDTH, device=xm.device, requires_grad=True)
    held = HeldActivations(part.parameters())
    with held.hooks():
        out = part(inp)
        if rank == world - 1:
            out = nn.functional.mse_loss(out, ym)
    return held.peak


def schedules(part: nn.Module, rank: int, world: int, device, x, y, m: int, ref_grads) -> dict:
    """GPipe and 1F1B with ``m`` micro-batches: order of work and peak activations per stage."""
    out = {"one_microbatch_bytes": one_microbatch_bytes(part, rank, world, x, y, m)}
    for name, cls in (("GPipe", ScheduleGPipe), ("1F1B", Schedule1F1B)):
        schedule = make_schedule(part, rank, world, device, m, cls)
        order: list[str] = []

        def record(mod, args, output, order=order):
            i = sum(e.startswith("F") for e in order)
            order.append(f"F{i}")
            # the gradient of this output is the first thing the stage's backward computes
            output.register_hook(lambda grad, i=i: order.append(f"B{i}"))

        def step(schedule=schedule) -> None:
            part.zero_grad()
            dist.barrier()
            pipeline_step(schedule, rank, x, y)

        step()  # the first step also works out the shapes to send: not recorded
        handle = part.register_forward_hook(record)
        held = HeldActivations(part.parameters())
        with held.hooks():
            step()
        handle.remove()
        diff = relative_gap([p.grad for p in part.parameters()], ref_grads)
        within(f"pipeline_gpipe {name} grad_gap", diff, grad_tolerance())
        out[name] = {
            "order": order,
            "peak_bytes": held.peak,
            "left_bytes": held.live,
            "max_grad_diff": diff,
            "grad_tol": grad_tolerance(),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--compare", type=int, default=8, help="micro-batches for GPipe vs 1F1B")
    args = parser.parse_args()
    rank, world, device = setup()
    x, y = (t.to(device) for t in batch())

    # The reference: one process, the whole model, the whole batch.
    full = build_model().to(device)
    nn.functional.mse_loss(full(x), y).backward()
    ref_grads = [p.grad for p in stage_layers(full, rank, world).parameters()]

    part = stage_layers(build_model(), rank, world).to(device)  # this rank's stage only

    runs = {}
    for m in args.microbatches:
        # A fresh stage per micro-batch count: a stage works out the shapes of the activations
        # it sends on its first step and keeps them, so a stage reused with another micro-batch
        # size fails with PipeliningShapeError (seen on torch 2.11).
        schedule = make_schedule(part, rank, world, device, m)
        part.zero_grad()
        dist.barrier()
        pipeline_step(schedule, rank, x, y)
        diff = relative_gap([p.grad for p in part.parameters()], ref_grads)
        runs[m] = {"max_grad_diff": diff, "grad_tol": grad_tolerance()}
        same = within("pipeline_gpipe grad_gap", diff, grad_tolerance())
        log(f"GPipe, {m} micro-batch(es): stage 0 gradients equal one process's: {same}")
    compared = schedules(part, rank, world, device, x, y, args.compare, ref_grads)
    log(f"GPipe and 1F1B, {args.compare} micro-batches: ran, activations counted on each stage")
    report({"rank": rank, "world": world, "runs": runs, "compare": compared, "m": args.compare})
    teardown()


if __name__ == "__main__":
    main()
