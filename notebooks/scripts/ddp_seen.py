"""DDP, seen from the inside: the all-reduces during backward, bucket views, unused parameters.

    torchrun --nnodes=1 --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 \
        ddp_seen.py --trace-dir DIR

1. One training step of a 6-layer MLP under ``torch.profiler``, exported per rank with
   ``export_chrome_trace`` to DIR/rank<R>.json (the notebook reads it back and draws it). DDP
   puts the gradients into buckets (``bucket_cap_mb``); when every gradient of a bucket is
   ready, the autograd hook launches that bucket's all-reduce (``c10d::allreduce_`` on the
   training thread) and backward goes on with the earlier layers while gloo's threads
   (``gloo:all_reduce``) move the bucket.
2. ``gradient_as_bucket_view``: with the default (False) each ``.grad`` is its own tensor and
   DDP copies the reduced bucket into it; with True each ``.grad`` is a view into the bucket,
   the same storage. A communication hook records the storage of each bucket it reduces, and
   each rank checks which ``.grad`` tensors live in one.
3. A model with a parameter its forward never uses: by default DDP waits for its gradient, the
   reduction of that step never finishes, and the next forward raises; with
   ``find_unused_parameters=True`` (a graph traversal after every forward) or
   ``static_graph=True`` (the traversal once, the first step) it trains like one process.
4. Buffers: DDP broadcasts rank 0's buffers (BatchNorm's running statistics) at the start of
   each forward. In PyTorch 2.13 ``forward_sync_buffers=False`` stops that runtime sync (rank
   0's buffers are still broadcast once when DDP is built), while the deprecated
   ``broadcast_buffers=False`` (a FutureWarning, the only name before 2.13) stops both.
5. ``SyncBatchNorm``: BatchNorm statistics over the global batch, not each rank's shard. It
   runs on GPUs only; on CPU ranks the same statistics are computed by hand with
   ``all_reduce`` (what SyncBatchNorm does inside), and the refusal is reported.

With ``--time-step`` the same processes then run ``ddp_step_time.py``'s measurement, last, and
report it as ``step_time``: notebook 07 reads its sections 4 and 5 from one launch, one start of
torch instead of two.

The device and backend come from ``common.setup()``: NCCL with one GPU per process when there
are enough GPUs, gloo on the CPU otherwise.
"""

from __future__ import annotations

import argparse
import inspect
import os
import warnings
from pathlib import Path

import ddp_step_time
import torch
import torch.distributed as dist
from common import (
    FP32_ROUNDING,
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
from torch.nn.parallel import DistributedDataParallel as DDP

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler's C++ side: no start/stop lines

WIDTH, LAYERS, PER_RANK, BUCKET_MB = 384, 6, 32, 1
# The switch for syncing buffers in forward: renamed in PyTorch 2.13 (the old name warns there).
BUFFER_SYNC = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else "broadcast_buffers"
)


def ddp(model: nn.Module, device: torch.device, **kwargs) -> DDP:
    ids = [device.index] if device.type == "cuda" else None
    return DDP(model.to(device), device_ids=ids, **kwargs)


def traced_step(device: torch.device, x: torch.Tensor, path: Path) -> dict:
    """Two warm-up steps (DDP rebuilds its buckets after the first), then one step profiled."""
    model = ddp(mlp(WIDTH, LAYERS, nn.ReLU), device, bucket_cap_mb=BUCKET_MB)
    for _ in range(2):
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    dist.barrier()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        model(x).sum().backward()
    prof.export_chrome_trace(str(path))
    data = model._get_ddp_logging_data()
    return {"trace": str(path), "bucket_sizes": data.get("bucket_sizes", ""), "layers": LAYERS}


def bucket_views(device: torch.device, x: torch.Tensor) -> dict:
    """For each setting, which .grad tensors share storage with a bucket the hook reduced."""
    out = {}
    for view in (False, True):
        model = ddp(
            mlp(WIDTH, LAYERS, nn.ReLU),
            device,
            gradient_as_bucket_view=view,
            bucket_cap_mb=BUCKET_MB,
        )
        buckets: set[int] = set()
        world = dist.get_world_size()

        def hook(state, bucket, buckets=buckets, world=world):
            buffer = bucket.buffer()
            buckets.add(buffer.untyped_storage().data_ptr())
            work = dist.all_reduce(buffer.div_(world), async_op=True)
            return work.get_future().then(lambda fut: fut.value()[0])

        model.register_comm_hook(None, hook)
        model(x).sum().backward()
        grads = [p.grad for p in model.parameters()]
        out[str(view)] = {
            "grads_in_a_bucket": sum(g.untyped_storage().data_ptr() in buckets for g in grads),
            "grads": len(grads),
            "buckets": len(buckets),
        }
    return out


class WithUnused(nn.Module):
    """One Linear used, one never used by forward (say a head only some steps need)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used, self.unused = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def unused_parameters(device: torch.device, x: torch.Tensor, x_all: torch.Tensor) -> dict:
    ref = WithUnused()
    ref(x_all).pow(2).mean().backward()
    ref_grad = ref.used.weight.grad
    # One Linear(16, 16): each output a sum of 16 products, each gradient a sum over the global
    # batch in another order (per rank, then the all-reduce): within sum_bound of one process's.
    # Unaveraged, it is off by far more.
    grad_tol = sum_bound(16 + len(x_all))
    out = {}
    settings = {
        "default": {},
        "find_unused_parameters=True": {"find_unused_parameters": True},
        "static_graph=True": {"static_graph": True},
    }
    for name, kwargs in settings.items():
        model = ddp(WithUnused(), device, **kwargs)
        entry: dict = {"error": None, "steps": 0, "grad_tol": grad_tol}
        try:
            for _ in range(3):
                model.zero_grad(set_to_none=True)
                model(x).pow(2).mean().backward()
                entry["steps"] += 1
                if entry["steps"] == 1:
                    got = model.module.used.weight.grad.cpu()
                    entry["first_grad_gap"] = relative_gap([got], [ref_grad])
        except RuntimeError as exc:  # the next forward refuses to start
            entry["error"] = str(exc).split(". ")[0] + "."
        entry["unused_grad_is_none"] = model.module.unused.weight.grad is None
        entry["unused_parameter_size"] = model._get_ddp_logging_data().get("unused_parameter_size")
        out[name] = entry
        if name != "default":  # the default is the mistake: its first step is not averaged
            within(f"ddp_seen {name} grad_gap", entry["first_grad_gap"], grad_tol)
        log(f"{name}: {entry['steps']} step(s) done, error: {entry['error']}")
    return out


def buffers(rank: int, device: torch.device) -> dict:
    """BatchNorm running means on each rank, with the buffer sync on (the default) and off."""
    out = {"argument": BUFFER_SYNC}
    for flag in (True, False):
        torch.manual_seed(0)
        bn = nn.BatchNorm1d(4)
        model = ddp(nn.Sequential(nn.Linear(4, 4), bn), device, **{BUFFER_SYNC: flag})
        g = torch.Generator().manual_seed(200 + rank)
        model(torch.randn(8, 4, generator=g).to(device) + rank)  # each rank updates its own stats
        after_first = bn.running_mean.tolist()
        bn.momentum = 0.0  # the next batch no longer changes the stats: only a broadcast can
        model(torch.randn(8, 4, generator=g).to(device))
        out[str(flag)] = {"after_first": after_first, "after_second": bn.running_mean.tolist()}
    # At construction: each rank's own running mean going in, what it holds once DDP is built.
    out["at_init"] = {}
    for name in dict.fromkeys([BUFFER_SYNC, "broadcast_buffers"]):  # one name before 2.13
        bn = nn.BatchNorm1d(4)
        bn.running_mean.fill_(float(rank))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is deprecated
            ddp(nn.Sequential(nn.Linear(4, 4), bn), device, **{name: False})
        out["at_init"][f"{name}=False"] = bn.running_mean[0].item()
    return out


def sync_batchnorm(rank: int, world: int, device: torch.device) -> dict:
    """BatchNorm over the global batch: SyncBatchNorm on GPUs, its arithmetic by hand on CPU.

    Both are compared with one plain BatchNorm over every rank's samples together (the answer
    one process with the whole batch would give), and so is a plain BatchNorm on this rank alone.
    """
    g = torch.Generator().manual_seed(300 + rank)
    x = (torch.randn(8, 4, generator=g) + 2.0 * rank).to(device)  # ranks see different data
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x)
    full = nn.BatchNorm1d(4).to(device)  # one process, the whole global batch
    full_out = full(torch.cat(gathered))[rank * len(x) : (rank + 1) * len(x)]
    local = nn.BatchNorm1d(4).to(device)  # this rank's shard only: what plain BatchNorm does
    local_out = local(x)

    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(4))).to(device)
    layer = model[0]
    out = {"converted_to": type(layer).__name__, "refusal": None}
    try:
        sync_out = layer(x)  # on CPU ranks this raises: SyncBatchNorm needs GPU (or XPU) input
        mean, var, how = layer.running_mean, layer.running_var, "nn.SyncBatchNorm"
    except ValueError as err:
        out["refusal"] = str(err)
        # What SyncBatchNorm computes inside: every rank's sum, sum of squares and count, summed.
        stats = torch.stack([x.sum(0), (x * x).sum(0)])
        count = torch.tensor([float(len(x))], device=device)
        dist.all_reduce(stats)
        dist.all_reduce(count)
        global_mean = stats[0] / count
        biased_var = stats[1] / count - global_mean**2  # normalises this step's output
        sync_out = (x - global_mean) / torch.sqrt(biased_var + layer.eps)
        sync_out = sync_out * layer.weight + layer.bias
        m = layer.momentum  # the running statistics keep the unbiased variance, like BatchNorm
        mean = (1 - m) * layer.running_mean + m * global_mean
        var = (1 - m) * layer.running_var + m * biased_var * count / (count - 1)
        how = "all_reduce by hand, since SyncBatchNorm refuses CPU input"

    def gap(a: torch.Tensor, b: torch.Tensor) -> float:  # relative to the largest value
        return relative_gap([a], [b])

    # A mean and a variance over the global batch, in another order, then a few elementwise
    # roundings (subtract, square root, divide, scale, shift, the running averages).
    out["tol"] = sum_bound(2 * world * len(x)) + 8 * FP32_ROUNDING

    out.update(
        how=how,
        sync_vs_full={
            "running_mean": gap(mean, full.running_mean),
            "running_var": gap(var, full.running_var),
            "output": gap(sync_out, full_out),
        },
        local_vs_full={
            "running_mean": gap(local.running_mean, full.running_mean),
            "output": gap(local_out, full_out),
        },
    )
    for key, value in out["sync_vs_full"].items():
        within(f"ddp_seen sync_batchnorm {key}", value, out["tol"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--trace-dir", type=Path, required=True, help="where each rank's trace goes"
    )
    parser.add_argument(
        "--time-step",
        action="store_true",
        help="then run ddp_step_time.py's measurement in these processes",
    )
    args = parser.parse_args()
    rank, world, device = setup()
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(PER_RANK * world, WIDTH, generator=g)
    x = x_all[PER_RANK * rank : PER_RANK * (rank + 1)].to(device)
    u_all = torch.randn(4 * world, 16, generator=g)
    u = u_all[4 * rank : 4 * (rank + 1)].to(device)
    out = {
        "rank": rank,
        "world": world,
        "traced": traced_step(device, x, args.trace_dir / f"rank{rank}.json"),
        "bucket_views": bucket_views(device, x),
        "unused": unused_parameters(device, u, u_all),
        "buffers": buffers(rank, device),
        "sync_batchnorm": sync_batchnorm(rank, world, device),
    }
    if args.time_step:  # last, with every model above gone: notebook 07 §5 reads it
        out["step_time"] = ddp_step_time.measure(rank, world, device)
    report(out)
    teardown()


if __name__ == "__main__":
    main()
