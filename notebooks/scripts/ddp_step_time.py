"""From bytes to time: gloo's all-reduce bandwidth, and a DDP step with and without its all-reduce.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 ddp_step_time.py

Every rank measures, with a barrier before each timed call so the ranks start together:
1. the all-reduce of a fixed 32 MiB fp32 tensor (not the model's size: the notebook predicts the
   model's all-reduce from this bandwidth);
2. one DDP step (forward and backward) of a 4-layer Linear(1024) MLP on 64 rows, in two
   variants interleaved: as usual, and under ``no_sync()``, where DDP skips the all-reduce. The
   gradients (16 MiB) fit one bucket (``bucket_cap_mb=64``), so its all-reduce starts when
   backward has finished: nothing overlaps, and the difference of the two is the communication
   (and the wait for the slower rank).
3. The bytes DDP hands its all-reduce: a communication hook (``register_comm_hook``) books the
   size of each bucket, then passes it to PyTorch's own ``allreduce_hook``. One step's buckets
   hold every gradient once: 4 bytes per parameter in fp32.
Each time is the fastest of REPEATS after WARMUP untimed runs: what the machine does when
nothing else takes the core (the median moves with the load of a shared machine). The
optimizer's update (work of the order of the parameter count, not 6x it per row) is left out.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from common import log, mlp, report, setup, teardown
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, LAYERS, ROWS, BUCKET_MB = 1024, 4, 64, 64
MESSAGE_BYTES = 32 * 2**20
WARMUP, REPEATS = 2, 11


def timed(fn) -> float:
    """Seconds for one call of ``fn``, every rank starting together."""
    dist.barrier()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():  # on GPUs the work is queued: wait for it to finish
        torch.cuda.synchronize()
    return time.perf_counter() - start


def allreduce_seconds(device: torch.device) -> float:
    """Fastest of REPEATS all-reduces of MESSAGE_BYTES (fp32), on this rank."""
    buf = torch.ones(MESSAGE_BYTES // 4, device=device)
    times = [timed(lambda: dist.all_reduce(buf)) for _ in range(WARMUP + REPEATS)]
    return min(times[WARMUP:])


def counting_hook(sizes: list[int]):
    """PyTorch's all-reduce hook, booking in ``sizes`` the bytes of each bucket it is handed."""

    def hook(state, bucket):
        buffer = bucket.buffer()  # the bucket's gradients, flattened into one tensor
        sizes.append(buffer.numel() * buffer.element_size())
        return default_hooks.allreduce_hook(state, bucket)

    return hook


def step_seconds(device: torch.device, rank: int) -> dict:
    """Fastest time of a DDP step with its all-reduce ("sync") and without it ("no_sync"), and
    the bytes of each bucket one step all-reduces ("bucket_bytes")."""
    model = mlp(WIDTH, LAYERS, nn.ReLU)
    ids = [device.index] if device.type == "cuda" else None
    model = DDP(model.to(device), device_ids=ids, bucket_cap_mb=BUCKET_MB)
    sizes: list[int] = []
    model.register_comm_hook(None, counting_hook(sizes))  # None: the default process group
    x = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(rank)).to(device)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    def step_no_sync():
        with model.no_sync():
            step()

    times: dict[str, list[float]] = {"sync": [], "no_sync": []}
    for i in range(WARMUP + REPEATS):  # the two variants interleaved
        for name, fn in (("sync", step), ("no_sync", step_no_sync)):
            t = timed(fn)
            if i >= WARMUP:
                times[name].append(t)
    sizes.clear()
    step()  # one more step, counted alone
    buckets = model._get_ddp_logging_data().get("bucket_sizes", "")
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "buckets": len(str(buckets).split(",")) if buckets else 0,
        "bucket_bytes": list(sizes),
        **{name: min(ts) for name, ts in times.items()},
    }


def measure(rank: int, world: int, device: torch.device) -> dict:
    """Both measurements on this rank (every rank calls it: the all-reduces are collective)."""
    return {
        "world": world,
        "rows_per_rank": ROWS,
        "message_bytes": MESSAGE_BYTES,
        "allreduce_s": allreduce_seconds(device),
        **step_seconds(device, rank),
        "threads": torch.get_num_threads(),
        "repeats": REPEATS,
    }


def main() -> None:
    rank, world, device = setup()
    result = measure(rank, world, device)
    log(
        f"{world} ranks, {result['threads']} thread(s) each: all-reduce of 32 MiB "
        f"{result['allreduce_s'] * 1e3:.1f} ms; DDP step {result['sync'] * 1e3:.1f} ms, "
        f"under no_sync {result['no_sync'] * 1e3:.1f} ms (fastest of {REPEATS}); buckets of "
        f"{result['bucket_bytes']} B"
    )
    report(result)
    teardown()


if __name__ == "__main__":
    main()
