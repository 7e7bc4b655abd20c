"""Fewer bytes per step: DDP's communication hooks, an FP8 all-gather, loss parallelism.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 fewer_bytes.py

Each rank checks, against one process doing the whole batch:

1. DDP's gradients with no hook (fp32), with ``fp16_compress_hook``, with bf16 through
   ``_compress_hook`` (``bf16_compress_hook`` refuses gloo), and with ``powerSGD_hook`` at rank 1:
   the bytes each rank hands to ``all_reduce`` per step (counted by wrapping it), the gradients
   (fp32: one process's to rounding; fp16 and bf16: exactly one process's rounded the hook's
   way), and PowerSGD's error feedback over steps with the weights held still, so each step's
   true gradient G is the same: the mean of what it applied after T steps is G minus the error
   it still holds, divided by T.
2. An FP8 all-gather as FSDP2 does it with torchao's float8 all-gather: one all-reduce of the
   shards' amax gives every rank the same scale, then each rank's float8 shard travels as 1 byte
   an element; what arrives equals one process's cast of the whole weight, bit for bit.
3. ``loss_parallel``: the output layer split by vocabulary columns (``ColwiseParallel``), the
   cross-entropy computed on the sharded logits; the loss and gradients equal one process's,
   and the collectives move a few numbers per token instead of the gathered logits.

The ranks run on the CPU with gloo, even on a machine with GPUs: what gloo accepts and refuses is
part of the lesson (notebook 13 says what NCCL changes).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import log, relative_gap, report, sum_bound, teardown, within
from mesh_2d import CommBytes
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, ROWS = 256, 32  # two Linear(256, 256); ROWS samples per rank
STEPS = 16  # PowerSGD steps after its two plain ones
RANK = 1  # PowerSGD's matrix_approximation_rank
B, S, H, VOCAB = 2, 16, 32, 128  # loss parallelism: batch, sequence, hidden, vocabulary
F8 = torch.float8_e4m3fn
warnings.filterwarnings("ignore", message=".*loss_parallel.*")


def build(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))


def batch(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch: ``ROWS`` rows per rank, rank r's rows r*ROWS..(r+1)*ROWS."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(world * ROWS, WIDTH, generator=g), torch.randn(
        world * ROWS, WIDTH, generator=g
    )


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


@contextlib.contextmanager
def counted(*names: str):
    """Book (collective, dtype, bytes handed to it) for each call of ``dist.<name>`` in the block:
    the hooks call ``dist.all_reduce`` by its module attribute, so wrapping it sees them all."""
    calls: list[tuple[str, str, int]] = []
    real = {name: getattr(dist, name) for name in names}

    def wrap(name):
        def call(*args, **kwargs):
            t = args[0] if name == "all_reduce" else args[1]  # all_gather(outputs, input)
            calls.append((name, str(t.dtype).removeprefix("torch."), t.numel() * t.element_size()))
            return real[name](*args, **kwargs)

        return call

    for name in names:
        setattr(dist, name, wrap(name))
    try:
        yield calls
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


def bf16_hook(state, bucket):
    """``bf16_compress_hook`` without its NCCL check: the same ``_compress_hook`` it calls."""
    return default_hooks._compress_hook(torch.bfloat16, state, bucket)


def ddp_hooks(rank: int, world: int) -> dict:
    """One step per hook; the bytes each rank hands to all_reduce, and the gradients."""
    x, y = batch(world)
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    one = build()
    loss_of(one, x, y).backward()  # one process, the whole batch
    g_one = [p.grad for p in one.parameters()]
    local = build()
    loss_of(local, x[rows], y[rows]).backward()  # this rank's gradient, before any averaging
    mine = [p.grad for p in local.parameters()]
    everyone = [[torch.empty_like(g) for _ in range(world)] for g in mine]
    for out, g in zip(everyone, mine, strict=True):
        dist.all_gather(out, g)  # every rank's local gradient, for the rounding it predicts

    out: dict = {"psi": sum(p.numel() for p in one.parameters())}
    model = DDP(build())
    try:
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        out["bf16_compress_hook"] = "registered"
    except TypeError as e:  # gloo: "... requires CUDA 11+ and NCCL 2.10+ ..."
        out["bf16_compress_hook"] = f"{type(e).__name__}: {e}"

    hooks = {
        "allreduce_hook (fp32)": (default_hooks.allreduce_hook, None),
        "fp16_compress_hook": (default_hooks.fp16_compress_hook, torch.float16),
        "bf16 (_compress_hook)": (bf16_hook, torch.bfloat16),
    }
    for name, (hook, dtype) in hooks.items():
        model = DDP(build())
        model.register_comm_hook(None, hook)
        with counted("all_reduce") as calls:
            loss_of(model, x[rows], y[rows]).backward()
        got = [p.grad for p in model.parameters()]
        row = {"calls": calls, "bytes": sum(c[2] for c in calls)}
        row["gap"] = relative_gap(got, g_one)  # from one process
        if dtype is None:
            row["tol"] = sum_bound(world * ROWS + WIDTH)  # the batch's sum, then one Linear's
            within(f"DDP {name}", row["gap"], row["tol"])
        else:
            # the hook's own arithmetic: cast to dtype, divide by world, sum in dtype, back to fp32
            rounded = [
                torch.stack([g.to(dtype).div_(world) for g in gs]).sum(0, dtype=dtype).float()
                for gs in everyone
            ]
            row["exact"] = all(torch.equal(a, b) for a, b in zip(got, rounded, strict=True))
            info = torch.finfo(dtype)
            u = info.eps / 2  # one rounding to dtype moves a value by at most u of it
            size = max(sum(g.abs() for g in gs).max().item() for gs in everyone) / world
            scale = max(g.abs().max().item() for g in g_one)
            # the cast of each g/world and the sum of world of them: world roundings at most,
            # each u of the sum of |g| / world; below the smallest normal, half a step instead
            row["bound"] = (
                world * u * (1 + u) * size + world * info.smallest_normal * u
            ) / scale + sum_bound(world * ROWS + WIDTH)
        out[name] = row
    # PowerSGD on one sample per rank: a gradient of rank 2 per matrix (the two samples' outer
    # products), which rank-1 compression sends one direction at a time
    firsts = slice(0, world * ROWS, ROWS)
    one = build()
    loss_of(one, x[firsts], y[firsts]).backward()
    out["powerSGD"] = power_sgd(rank, world, x[rank * ROWS][None], y[rank * ROWS][None], one)
    return out


def powersgd_ddp(order: list) -> tuple[DDP, powerSGD_hook.PowerSGDState]:
    """DDP whose gradients travel through ``powerSGD_hook`` at rank ``RANK``, error feedback on;
    ``order`` receives the parameters of each bucket the hook compresses."""
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=RANK,
        start_powerSGD_iter=2,  # the smallest allowed with error feedback: 2 plain steps first
        use_error_feedback=True,
        warm_start=True,
    )

    def hook(state, bucket):  # powerSGD_hook, and the order of the bucket's parameters
        order[:] = bucket.parameters()
        return powerSGD_hook.powerSGD_hook(state, bucket)

    model = DDP(build())
    model.register_comm_hook(state, hook)
    return model, state


def power_sgd(rank: int, world: int, x: torch.Tensor, y: torch.Tensor, one: nn.Module) -> dict:
    """PowerSGD at rank 1, weights held still (no optimizer step): every step's true gradient is
    G. With error feedback, step t applies G + e(t-1) - e(t), e being the ranks' mean error, so
    the mean applied over T steps is G - e(T) / T. ``one``: one process's model after its
    backward on every rank's sample."""
    g_one = [p.grad for p in one.parameters()]
    order: list = []  # the bucket's parameters, in the order of the flat error it keeps
    model, state = powersgd_ddp(order)
    params = list(model.parameters())
    applied = [torch.zeros_like(p) for p in params]
    steps = []
    for step in range(2 + STEPS):
        model.zero_grad()
        with counted("all_reduce") as calls:
            loss_of(model, x, y).backward()
        if step >= 2:
            for a, p in zip(applied, params, strict=True):
                a += p.grad
            mean = [a / (step - 1) for a in applied]
            steps.append(
                {
                    "bytes": sum(c[2] for c in calls),
                    "calls": len(calls),
                    "one_step_gap": relative_gap([p.grad for p in params], g_one),
                    "mean_gap": relative_gap(mean, g_one),
                }
            )
        else:
            steps.append({"bytes": sum(c[2] for c in calls), "calls": len(calls)})
    (error,) = state.error_dict.values()  # one bucket: this rank's error, flat in bucket order
    dist.all_reduce(error)
    error /= world  # the ranks' mean error e(T)
    pieces = dict(zip(map(id, order), error.split([p.numel() for p in order]), strict=True))
    e_t = [pieces[id(p)].view_as(p) for p in params]
    predicted = [g - e / STEPS for g, e in zip(g_one, e_t, strict=True)]
    mean = [a / STEPS for a in applied]
    gap = relative_gap(mean, predicted)
    # each step: + e(t-1) and - e(t) rounded, the sum of applied gradients rounded: 3 per step
    tol = sum_bound(3 * STEPS + world + WIDTH)
    within("PowerSGD: mean applied = G - e(T)/T", gap, tol)
    memory = {
        "error_bytes": error.numel() * error.element_size(),
        "pq_bytes": sum(
            t.numel() * t.element_size()
            for d in (state.p_memory_dict, state.q_memory_dict)
            for t in d.values()
        ),
    }
    return {
        "steps": steps,
        "feedback_gap": gap,
        "feedback_tol": tol,
        "error_scale": max(e.abs().max().item() for e in e_t)
        / max(g.abs().max().item() for g in g_one),
        "shapes": [list(p.shape) for p in params],
        **memory,
    }


def fp8_all_gather(rank: int, world: int) -> dict:
    """FSDP2's float8 all-gather on one weight: amax all-reduced, float8 shards gathered."""
    torch.manual_seed(2)
    weight = torch.randn(WIDTH, WIDTH) * 0.02  # the whole weight; each rank keeps its rows
    shard = weight.chunk(world)[rank]
    with counted("all_reduce", "all_gather") as calls:
        amax = shard.abs().max()
        dist.all_reduce(amax, op=dist.ReduceOp.MAX)  # one number: the same scale everywhere
        scale = torch.finfo(F8).max / amax
        mine = (shard * scale).to(F8)
        parts = [torch.empty_like(mine.view(torch.uint8)) for _ in range(world)]
        dist.all_gather(parts, mine.view(torch.uint8))  # gloo moves bytes: float8 as uint8
    gathered = torch.cat(parts).view(F8)
    alone = (weight * (torch.finfo(F8).max / weight.abs().max())).to(F8)
    return {
        "calls": calls,
        "numel": weight.numel(),
        "exact": torch.equal(gathered.view(torch.uint8), alone.view(torch.uint8)),
    }


def head(seed: int = 0) -> nn.Sequential:
    """A hidden layer and the output layer over the vocabulary."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(H, H), nn.Tanh(), nn.Linear(H, VOCAB))


def sharded_loss(x, labels, mesh, count):
    """The output layer split by vocabulary columns, its cross-entropy taken on the sharded
    logits under ``loss_parallel``; ``count()`` opens a counter of each pass's bytes."""
    sharded = parallelize_module(head(), mesh, {"2": ColwiseParallel(use_local_output=False)})
    with count() as forward:
        logits = sharded(x)  # a DTensor: this rank's columns of the vocabulary
        with loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    with count() as backward, loss_parallel():
        loss.backward()
    return sharded, logits, loss, forward, backward


def parallel_loss(rank: int, world: int) -> dict:
    """Cross-entropy over vocabulary-sharded logits, against one process and against gathering."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, S, H, generator=g)
    labels = torch.randint(0, VOCAB, (B, S), generator=g)
    one = head()
    loss_one = F.cross_entropy(one(x).flatten(0, 1), labels.flatten())
    loss_one.backward()

    mesh = init_device_mesh("cpu", (world,))
    groups = {"tp": list(range(world))}
    sharded, logits, loss, forward, backward = sharded_loss(
        x, labels, mesh, lambda: CommBytes(groups)
    )
    grads = [
        p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        for p in sharded.parameters()
    ]
    loss_value = loss.full_tensor().item() if isinstance(loss, DTensor) else loss.item()

    gathered = parallelize_module(head(), mesh, {"2": ColwiseParallel(output_layouts=Replicate())})
    with CommBytes(groups) as gather:
        F.cross_entropy(gathered(x).flatten(0, 1), labels.flatten())
    # the loss: a mean of B*S log-softmaxes over VOCAB; gradients add up B*S rows of H products
    loss_tol, grad_tol = sum_bound(B * S + VOCAB), sum_bound(B * S + VOCAB + H)
    loss_gap = abs(loss_value - loss_one.item()) / abs(loss_one.item())
    grad_gap = relative_gap(grads, [p.grad for p in one.parameters()])
    within("loss_parallel: loss", loss_gap, loss_tol)
    within("loss_parallel: gradients", grad_gap, grad_tol)
    return {
        "local_logits": list(logits.to_local().shape),
        "placements": str(logits.placements),
        "forward": forward.summary(),
        "backward": backward.summary(),
        "gather": gather.summary(),
        "loss_gap": loss_gap,
        "loss_tol": loss_tol,
        "grad_gap": grad_gap,
        "grad_tol": grad_tol,
    }


def main() -> None:
    dist.init_process_group("gloo")  # on the CPU even beside GPUs: gloo's hooks are the lesson
    rank, world = dist.get_rank(), dist.get_world_size()
    result = {"world": world, "hooks": ddp_hooks(rank, world)}
    result["fp8"] = fp8_all_gather(rank, world)
    result["loss_parallel"] = parallel_loss(rank, world)
    log(f"{world} ranks: hooks, FP8 all-gather and loss_parallel measured")
    report(result)
    teardown()


if __name__ == "__main__":
    main()
