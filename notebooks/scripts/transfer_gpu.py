"""Notebook 01's GPU-only demos: pinning, the two non-blocking hazards, overlap, timing.

Each function needs a CUDA GPU, measures one thing and returns plain numbers; the notebook
asserts on them, so a check stays in the cell the learner reads. Run alone
(``python scripts/transfer_gpu.py``) it prints every result. On a machine without CUDA every
function raises one sentence saying so.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
import warnings

import torch

from tutorial_utils import timing

MiB = 2**20


def _in_turns(fns, nbytes: int, rounds: int = 5) -> timing.Comparison:
    """Time ``fns`` in turns: each round takes two warmed-up samples of every function, so a
    slow moment of the machine falls on all of them alike; the table compares the medians."""
    per_round = [timing.compare(fns, nbytes=nbytes, repeat=2) for _ in range(rounds)]
    merged = tuple(
        dataclasses.replace(runs[0], samples=tuple(s for t in runs for s in t.samples))
        for runs in zip(*(c.timings for c in per_round), strict=True)
    )
    return timing.Comparison(merged, baseline=per_round[0].baseline, nbytes=nbytes)


def _need_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            "these demos need a CUDA GPU (torch.cuda.is_available() is False here): "
            "run notebook 01 on a GPU runtime, e.g. Colab"
        )


def adam_state_after_move() -> tuple[bool, torch.device]:
    """Adam steps on the CPU, then the model moves: (same Parameter object, state's device)."""
    _need_cuda()
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    w = m.weight
    adam = torch.optim.Adam(m.parameters())
    m(torch.randn(4, 3)).sum().backward()
    adam.step()  # creates state on the CPU
    m.to("cuda")
    return m.weight is w, adam.state[m.weight]["exp_avg"].device


def pin_ways(n_bytes: int = 64 * MiB) -> timing.Comparison:
    """Four ways to get a batch to the GPU, timed with CUDA events."""
    _need_cuda()
    batch = torch.randn(n_bytes // 4)
    pinned_buffer = torch.empty_like(batch).pin_memory()  # pinned once, refilled per batch
    on_gpu = torch.empty(n_bytes // 4, device="cuda")
    return _in_turns(
        {
            "pageable .to(cuda)": lambda: on_gpu.copy_(batch),
            "pin_memory() every batch": lambda: on_gpu.copy_(batch.pin_memory(), non_blocking=True),
            "refill a buffer pinned once": lambda: on_gpu.copy_(
                pinned_buffer.copy_(batch), non_blocking=True
            ),
            "copy from the pinned buffer": lambda: on_gpu.copy_(pinned_buffer, non_blocking=True),
        },
        nbytes=n_bytes,
    )


def read_too_early() -> tuple[float, float]:
    """A device-to-host copy read before it is done: (sum read at once, sum after sync)."""
    _need_cuda()
    src = torch.ones(1_000_000, device="cuda")
    dst_host = torch.zeros(1_000_000, pin_memory=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU busy-wait, queued first
    dst_host.copy_(src, non_blocking=True)  # queued behind it; returns at once
    too_early = dst_host.sum().item()  # the CPU reads now: unsafe
    torch.cuda.synchronize()  # wait for the copy
    return too_early, dst_host.sum().item()


def send(staging: torch.Tensor, on_device: torch.Tensor, wait_before_reuse: bool) -> float:
    """Send batch +1 through a pinned staging buffer, then refill it with the next (-1)."""
    staging.fill_(1.0)  # this batch
    torch.cuda._sleep(200_000_000)  # the GPU is busy: the copy below waits its turn
    on_device.copy_(staging, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    if wait_before_reuse:
        copied.synchronize()  # the copy has read the buffer: safe to refill it
    staging.fill_(-1.0)  # the next batch arrives in the same buffer
    torch.cuda.synchronize()
    return on_device.mean().item()  # what the GPU received


def reuse_too_early() -> tuple[float, float]:
    """The mean the GPU received: (without waiting, with the event)."""
    _need_cuda()
    staging = torch.empty(1_000_000, pin_memory=True)
    on_device = torch.empty(1_000_000, device="cuda")
    return send(staging, on_device, False), send(staging, on_device, True)


def _elapsed_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def copy_while_computing(copy, compute, copy_stream: torch.cuda.Stream) -> None:
    """Run ``copy()`` on ``copy_stream`` while ``compute()`` runs on the current stream."""
    copy_stream.wait_stream(torch.cuda.current_stream())  # what the copy reads is ready
    with torch.cuda.stream(copy_stream):
        copy()
    compute()
    torch.cuda.current_stream().wait_stream(copy_stream)  # later work waits for the copy


def overlap() -> dict[str, float]:
    """A 256 MiB pinned copy and as much matmul time, in a row and then on two streams (ms)."""
    _need_cuda()
    copy_stream = torch.cuda.Stream()
    host_batch = torch.randn(64 * MiB).pin_memory()  # 256 MiB
    next_batch = torch.empty(64 * MiB, device="cuda")
    w = torch.randn(4096, 4096, device="cuda")

    def copy() -> None:
        next_batch.copy_(host_batch, non_blocking=True)

    def compute(k: int) -> None:
        for _ in range(k):
            w @ w

    _elapsed_ms(lambda: (compute(1), copy()))  # warm-up
    k = max(1, round(_elapsed_ms(copy) / _elapsed_ms(lambda: compute(1))))  # as long as the copy
    ms: dict[str, list[float]] = {"copy_ms": [], "compute_ms": [], "both_ms": []}
    for _ in range(5):  # in turns, so a slow moment falls on all three; medians compared
        ms["copy_ms"].append(_elapsed_ms(copy))
        ms["compute_ms"].append(_elapsed_ms(lambda: compute(k)))
        ms["both_ms"].append(
            _elapsed_ms(lambda: copy_while_computing(copy, lambda: compute(k), copy_stream))
        )
    return {name: statistics.median(times) for name, times in ms.items()}


def naive_timer() -> dict[str, float]:
    """One 4096x4096 matmul timed three ways, in seconds."""
    _need_cuda()
    big = torch.randn(4096, 4096, device="cuda")
    big @ big
    torch.cuda.synchronize()  # warm-up done
    t0 = time.perf_counter()
    big @ big
    naive = time.perf_counter() - t0  # only the launch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    big @ big
    torch.cuda.synchronize()
    synced = time.perf_counter() - t0  # the work
    events = _elapsed_ms(lambda: big @ big) / 1e3
    return {"naive": naive, "synchronized": synced, "CUDA events": events}


def hidden_syncs() -> dict[str, bool]:
    """Which operations make the CPU wait for the GPU, as set_sync_debug_mode("warn") sees it."""
    _need_cuda()
    g = torch.randn(1000, device="cuda")
    candidates = {
        "g.sum().item()": lambda: g.sum().item(),
        "g.cpu()": lambda: g.cpu(),
        "g.nonzero()": lambda: g.nonzero(),
        "bool(g.sum() > 0)": lambda: bool(g.sum() > 0),
        "g * 2": lambda: g * 2,
    }
    syncs = {}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for label, op in candidates.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                op()
            syncs[label] = any("synchroniz" in str(w.message) for w in caught)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return syncs


def main() -> int:
    """Run every demo and print what it measured; exit 1, with one sentence, without CUDA."""
    try:
        _need_cuda()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    for demo in (
        pin_ways,
        read_too_early,
        reuse_too_early,
        overlap,
        naive_timer,
        hidden_syncs,
    ):
        print(f"{demo.__name__}:", demo(), sep="\n" if demo is pin_ways else " ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
