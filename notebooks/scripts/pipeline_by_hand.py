"""A two-stage pipeline written by hand: each process is one stage, micro-batches go by send/recv.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 pipeline_by_hand.py

Rank 0 runs the first half of the layers, rank 1 the second half and the loss. GPipe order:
every micro-batch forward (rank 0 sends each activation as soon as it has it, so rank 1 can
start while rank 0 computes the next one), then every backward (rank 1 sends each input
gradient back). Each rank records when it computed what (wall clock, shared by the processes
of one machine), for the timeline in notebook 08, and checks its gradients against one
process doing the whole batch.

Timing: a first round of steps warms up (not kept), then ``--repeats`` rounds, each running
every micro-batch count once in turn (interleaved: a busy moment of the machine hits every m,
not one). Every step starts after a barrier. The ranks run with one thread each (torchrun's
OMP_NUM_THREADS=1), so on two free cores they really compute at the same time. The batch has
ROWS rows, so that 8 micro-batches still have 64 rows each: on one CPU thread, products of
32 rows took 1.4x to 1.8x the time per row of products of 256 where this was written (notebook 08
times it on your machine), which would eat the gain.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from common import log, relative_gap, report, setup, teardown, within
from pipeline_gpipe import batch, build_model, grad_tolerance, stage_layers
from torch import nn
from torch.nn import functional as F

ROWS = 512  # the batch: twice pipeline_gpipe.py's, so micro-batches stay big enough


def now(device: torch.device) -> float:
    """Wall-clock time once the device has finished its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.time()


@contextmanager
def timed(events: list, kind: str, i: int, device: torch.device):
    """Record (kind, micro-batch, start, end, cpu): wall-clock start and end, and the CPU seconds
    this thread spent in between (less than end - start while another process held the core)."""
    start, cpu0 = now(device), time.thread_time()
    yield
    events.append((kind, i, start, now(device), time.thread_time() - cpu0))


def gpipe_step(part: nn.Module, rank: int, x: torch.Tensor, y: torch.Tensor, m: int) -> list:
    """One training step in m micro-batches, GPipe order; returns the recorded events."""
    events, saved, sends = [], [], []
    for i, xm in enumerate(x.chunk(m)):
        if rank == 0:
            inp = xm
        else:
            inp = torch.empty(xm.shape[0], part[0].in_features, device=xm.device)
            dist.recv(inp, src=0)  # waits for stage 0's activation (idle time)
            inp.requires_grad_()
        with timed(events, "F", i, x.device):
            out = part(inp)
        if rank == 0:
            sends.append(dist.isend(out.detach(), dst=1))  # do not wait: start the next one
        saved.append((inp, out))
    for i, (inp, out) in enumerate(saved):
        if rank == 1:
            with timed(events, "B", i, x.device):  # mean of m means = the full-batch mean
                (F.mse_loss(out, y.chunk(m)[i]) / m).backward()
            sends.append(dist.isend(inp.grad, dst=0))
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=1)  # waits for stage 1's gradient (idle time)
            with timed(events, "B", i, x.device):
                out.backward(grad)
    for s in sends:
        s.wait()
    return events


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds after the warm-up")
    args = parser.parse_args()
    rank, world, device = setup()
    assert world == 2, "this hand-written pipeline has exactly 2 stages"
    x, y = (t.to(device) for t in batch(rows=ROWS))

    full = build_model().to(device)  # the reference: one process, whole model, whole batch
    F.mse_loss(full(x), y).backward()
    ref_grads = [p.grad for p in stage_layers(full, rank, world).parameters()]

    part = stage_layers(build_model(), rank, world).to(device)
    runs = {m: {"steps": []} for m in args.microbatches}
    for round_ in range(1 + args.repeats):  # round 0 warms up: not kept
        for m in args.microbatches:  # interleaved: each round runs every m once
            part.zero_grad()  # each step leaves exactly its own gradients
            dist.barrier()  # both stages start together
            events = gpipe_step(part, rank, x, y, m)
            if round_ > 0:
                runs[m]["steps"].append(events)
            if round_ == args.repeats:  # the last step of each m: its gradients
                diff = relative_gap([p.grad for p in part.parameters()], ref_grads)
                runs[m].update(max_grad_diff=diff, grad_tol=grad_tolerance(ROWS))
                same = within("pipeline_by_hand grad_gap", diff, grad_tolerance(ROWS))
                log(f"by hand, {m} micro-batch(es): stage 0 gradients equal one process's: {same}")
    report({"rank": rank, "runs": runs, "device": device.type, "threads": torch.get_num_threads()})
    teardown()


if __name__ == "__main__":
    main()
