"""Tensor parallelism of one transformer block, then sequence parallelism of its norms.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 tensor_parallel.py

The block is Megatron's: attention (q, k, v split by columns, so each rank computes its own
heads; the output projection split by rows) and an MLP (the first Linear split by columns, the
second by rows). ``parallelize_module`` does the splitting on a 1-D DeviceMesh of all ranks.
Each rank checks:

1. TP (``ColwiseParallel`` / ``RowwiseParallel``): the output and every gradient equal one
   process's, each rank holds half of every split weight, and ``CommDebugMode`` counts one
   all-reduce per sub-block in forward and one in backward.
2. TP + SP (``SequenceParallel`` on the norms, the block's input and output split along the
   sequence): the same equality; the all-reduces become all-gathers and reduce-scatters.
3. The activations autograd saves for backward, per rank, counted exactly (a saved-tensor hook
   books each storage once, parameters excluded, a DTensor by its local shard): without
   parallelism, with TP and with TP + SP; with the softmax written out (as Korthikanti et al.
   counted it) and with ``scaled_dot_product_attention`` (fused, as it runs today).
4. The bytes of gradients and of Adam's state each rank keeps (its shards), for the decision
   table of notebook 08.

The device and backend come from ``common.setup()``: NCCL with one GPU per process when there
are enough GPUs, gloo on the CPU otherwise.
"""

from __future__ import annotations

import math
import warnings

import torch
from common import log, report, setup, sum_bound, teardown, within
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

B, S, H, HEADS = 2, 64, 64, 4  # batch, sequence, hidden, heads
# The sums a block's output goes through, one after another: q, k, v (H products), the scores
# (H / HEADS), weights x values (S), o (H), the MLP (H, then 4 H), the norm (H): at most 9 H + S.
BLOCK_SUMS = 9 * H + S


def tolerances(blocks: int = 1) -> tuple[float, float]:
    """How far a split computation may be from one process's, relative to the largest value:
    the output goes through ``blocks`` chains of BLOCK_SUMS; a gradient goes back through them
    too, and adds up over the B x S positions."""
    return sum_bound(blocks * BLOCK_SUMS), sum_bound(2 * blocks * BLOCK_SUMS + B * S)


# PrepareModuleInput works through module hooks; when the block's input does not need a gradient
# (it is the data here, not another block's output) torch warns that such a hook fires with
# respect to the outputs only. True, and harmless here.
warnings.filterwarnings("ignore", message="Full backward hook is firing")


class Attention(nn.Module):
    def __init__(self, fused: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
        self.fused = fused  # scaled_dot_product_attention: no (s, s) matrix saved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = H // HEADS

        # -1: the heads this rank holds (all of them in one process, HEADS / t with TP)
        def heads(t):
            return t.view(b, s, -1, d).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if self.fused:
            out = nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            out = torch.softmax(scores, dim=-1) @ v
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, fused: bool = False) -> None:
        super().__init__()
        self.attn_norm, self.attn = nn.LayerNorm(H), Attention(fused)
        self.mlp_norm, self.mlp = nn.LayerNorm(H), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def build(seed: int = 0, fused: bool = False) -> Block:
    torch.manual_seed(seed)
    return Block(fused)


def plans() -> tuple[dict, dict, dict]:
    """The tensor-parallel plan, the same written per Linear, and the sequence-parallel plan."""
    tp = {
        # The input as one DTensor for q, k and v together: its gradient is then all-reduced once,
        # not once per Linear (``TP_PLAN_PER_LINEAR`` shows the difference).
        "attn": PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)
        ),
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(),
    }
    sp = {  # the same Linears; the norms on this rank's part of the sequence
        **tp,
        "attn_norm": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.o": RowwiseParallel(output_layouts=Shard(1)),  # reduce-scatter along the sequence
        "mlp_norm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
    }
    per_linear = {k: v for k, v in tp.items() if k != "attn"}
    return tp, per_linear, sp


TP_PLAN, TP_PLAN_PER_LINEAR, SP_PLAN = plans()


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def param_bytes(model: nn.Module) -> int:
    return sum(local(p).numel() * local(p).element_size() for p in model.parameters())


def saved_activation_bytes(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Run forward and count, once per storage, the bytes autograd saves for backward."""
    params = {local(p).untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = local(t).untyped_storage()
        if storage.data_ptr() not in params:  # a weight saved for backward is not an activation
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    return out, sum(seen.values())


def adam_state_bytes(params: list[torch.Tensor]) -> int:
    """One Adam step on these parameters; the bytes of state it keeps on this rank (its shards)."""
    opt = torch.optim.Adam(params, lr=1e-3)
    opt.step()
    return sum(
        local(v).numel() * local(v).element_size() for s in opt.state.values() for v in s.values()
    )


def comm_counts(mode: CommDebugMode) -> dict[str, int]:
    """The collectives a CommDebugMode block saw, by name (all_reduce, ...), and how many."""
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


def main() -> None:
    rank, world, device = setup()
    mesh = init_device_mesh(device.type, (world,))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, S, H, generator=g).to(device)
    mine = slice(S // world * rank, S // world * (rank + 1))  # this rank's part of the sequence

    ref = build().to(device)  # one process, the whole block
    ref_out, ref_saved = saved_activation_bytes(ref, x)
    ref_out.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    saved_fused = saved_activation_bytes(build(fused=True).to(device), x)[1]
    out = {
        "world": world,
        "single": {"params": param_bytes(ref), "saved": ref_saved, "saved_fused": saved_fused},
    }

    setups = (
        ("TP", TP_PLAN, x),
        ("TP, q k v each", TP_PLAN_PER_LINEAR, x),
        ("TP+SP", SP_PLAN, x[:, mine].contiguous()),
    )
    forward_tol, grad_tol = tolerances()
    for name, plan, inp in setups:
        model = parallelize_module(build().to(device), mesh, plan)
        y, saved = saved_activation_bytes(model, inp)
        fused = parallelize_module(build(fused=True).to(device), mesh, plan)
        saved_fused = saved_activation_bytes(fused, inp)[1]
        want = ref_out[:, mine] if name == "TP+SP" else ref_out  # SP: this rank's part only
        forward_gap = (local(y) - want).abs().max().item() / want.abs().max().item()
        with CommDebugMode() as fwd_mode:
            y2 = model(inp)
        with CommDebugMode() as bwd_mode:
            y2.sum().backward()
        # Relative to the largest gradient of the block, not of each parameter: k's bias has a
        # zero gradient in exact arithmetic (softmax ignores a shift shared by every key), so
        # its own scale is rounding noise.
        grad_gap = max(
            (full(p.grad) - ref_grads[n]).abs().max().item() for n, p in model.named_parameters()
        ) / max(g.abs().max().item() for g in ref_grads.values())
        params = list(model.parameters())
        split = [
            n
            for n, p in model.named_parameters()
            if isinstance(p, DTensor) and p.placements[0].is_shard()
        ]
        out[name] = {
            "params": param_bytes(model),
            "split_params": sorted(split),
            "split_numel": sum(ref.get_parameter(n).numel() for n in split),
            "saved": saved,
            "saved_fused": saved_fused,
            "forward_gap": forward_gap,
            "grad_gap": grad_gap,
            "forward_tol": forward_tol,
            "grad_tol": grad_tol,
            "forward_comm": comm_counts(fwd_mode),
            "backward_comm": comm_counts(bwd_mode),
            "grads": sum(local(p.grad).numel() * local(p.grad).element_size() for p in params),
            "optimizer_state": adam_state_bytes(params),
        }
        same = within(f"tensor_parallel {name} forward_gap", forward_gap, forward_tol)
        same &= within(f"tensor_parallel {name} grad_gap", grad_gap, grad_tol)
        log(f"{name}: forward and gradients equal one process's: {same}")
    report({"rank": rank, "B": B, "S": S, "H": H, "heads": HEADS, **out})
    teardown()


if __name__ == "__main__":
    main()
