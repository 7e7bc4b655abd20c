"""Context parallelism by hand: causal ring attention over the ranks, forward and backward.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 ring_attention.py

The sequence of S positions is cut into W consecutive chunks, one per rank: rank r holds the
queries, keys and values of positions r*S/W to (r+1)*S/W. Attention needs every earlier key, so
the keys and values travel around the ring (rank r sends to r+1, receives from r-1) with
``batch_isend_irecv``; each rank attends to each block it receives and merges the partial results
with their log-sum-exp. After W-1 passes every query has seen every key it may see. The backward
pass sends the keys and values around again, with their gradients riding along, which come home
after one more pass. Each rank checks, against one process's ``scaled_dot_product_attention`` on
the whole sequence:

1. its rows of the output and of the gradients of q, k and v (within the rounding of the sums);
2. the bytes it sent, counted at ``batch_isend_irecv``, against the formulas.

It also tries PyTorch's own ``context_parallel`` on the CPU and reports what it raised.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import log, relative_gap, report, setup, sum_bound, teardown, within

B, H, S, DH = 2, 4, 64, 16  # batch, heads, sequence (whole), head size
SENT = {"forward": 0, "backward": 0}  # bytes this rank handed to isend, by pass
COMPUTED = [0]  # blocks of keys this rank attended to in forward (the others were masked)
PHASE = ["forward"]


def ring_pass(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Send ``tensors`` to the next rank and receive the previous rank's: one ring step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    got = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), (rank + 1) % world) for t in tensors]
    ops += [dist.P2POp(dist.irecv, g, (rank - 1) % world) for g in got]
    SENT[PHASE[0]] += sum(
        op.tensor.numel() * op.tensor.element_size() for op in ops[: len(tensors)]
    )
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return got


def scores(q, k, causal: bool) -> torch.Tensor:
    """q k^T / sqrt(Dh) for one block of queries and one of keys, (B, H, s, s); ``causal``: the
    diagonal block, where a query sees only the keys at or before it."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s


def merge(out_a, lse_a, out_b, lse_b):
    """Two partial attentions over disjoint keys made one: each was normalised by its own sum of
    exponentials (exp(lse)); weigh each by its share of the total."""
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over every rank's keys (contiguous chunks)."""

    @staticmethod
    def forward(ctx, q, k, v):
        rank, world = dist.get_rank(), dist.get_world_size()
        out = lse = None
        kv = [k, v]
        for step in range(world):
            src = (rank - step) % world  # whose keys this rank holds now
            if src <= rank:  # later chunks are masked out entirely: nothing to compute
                COMPUTED[0] += 1
                s = scores(q, kv[0], causal=src == rank)
                block_lse = torch.logsumexp(s, dim=-1, keepdim=True)
                block_out = torch.exp(s - block_lse) @ kv[1]
                if out is None:
                    out, lse = block_out, block_lse
                else:
                    out, lse = merge(out, lse, block_out, block_lse)
            if step < world - 1:
                kv = ring_pass(kv)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rank, world = dist.get_rank(), dist.get_world_size()
        delta = (dout * out).sum(-1, keepdim=True)  # softmax's backward term, one per query
        dq = torch.zeros_like(q)
        kb, vb, dk, dv = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for step in range(world):
            src = (rank - step) % world
            if src <= rank:
                p = torch.exp(scores(q, kb, causal=src == rank) - lse)  # the forward's weights
                dv = dv + p.transpose(-2, -1) @ dout
                ds = p * (dout @ vb.transpose(-2, -1) - delta)
                dq = dq + ds @ kb * q.shape[-1] ** -0.5
                dk = dk + ds.transpose(-2, -1) @ q * q.shape[-1] ** -0.5
            # keys, values and their gradients so far move on; after the last step only the
            # gradients move, one more hop, which brings each block's home
            kb, vb, dk, dv = (
                ring_pass([kb, vb, dk, dv]) if step < world - 1 else [kb, vb, *ring_pass([dk, dv])]
            )
        return dq, dk, dv


def try_context_parallel(q, k, v) -> str | None:
    """PyTorch's own context parallelism on this device: None when it ran, else its error."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh(q.device.type, (dist.get_world_size(),))
    q, k, v = (t.clone() for t in (q, k, v))  # context_parallel shards its buffers in place
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except Exception as exc:  # noqa: BLE001 (any refusal is the finding; it is reported)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def main() -> None:
    t0 = time.perf_counter()
    rank, world, device = setup()
    if S % world:
        raise SystemExit(
            f"ring_attention.py splits {S} positions evenly: use a world that divides it"
        )
    g = torch.Generator().manual_seed(0)
    q, k, v, target = (torch.randn(B, H, S, DH, generator=g) for _ in range(4))
    mine = slice(rank * S // world, (rank + 1) * S // world)

    ref = [t.clone().requires_grad_() for t in (q, k, v)]  # one process, the whole sequence
    ref_out = F.scaled_dot_product_attention(*ref, is_causal=True)
    (ref_out * target).sum().backward()

    local = [t[:, :, mine].clone().to(device).requires_grad_() for t in (q, k, v)]
    out = RingAttention.apply(*local)
    PHASE[0] = "backward"
    (out * target[:, :, mine].to(device)).sum().backward()

    forward_gap = relative_gap([out.cpu()], [ref_out[:, :, mine]])
    grad_gap = relative_gap([t.grad.cpu() for t in local], [t.grad[:, :, mine] for t in ref])
    # The scores are sums of DH products, each output and each gradient a sum over at most S
    # keys (or queries) of terms that carry those scores' rounding: two orders of these sums
    # differ by at most sum_bound(S + DH); a gradient chains two such sums.
    forward_tol, grad_tol = sum_bound(S + DH), sum_bound(2 * (S + DH))
    same = within("ring_attention forward_gap", forward_gap, forward_tol)
    same &= within("ring_attention grad_gap", grad_gap, grad_tol)
    log(f"ring attention on {world} ranks equals one process's SDPA: {same}")
    cp_error = try_context_parallel(q, k, v)
    log(f"context_parallel with SDPA on {device.type}: {cp_error or 'ran'}")
    report(
        {
            "rank": rank,
            "world": world,
            "B": B,
            "H": H,
            "S": S,
            "DH": DH,
            "elem": q.element_size(),
            "forward_gap": forward_gap,
            "grad_gap": grad_gap,
            "forward_tol": forward_tol,
            "grad_tol": grad_tol,
            "sent_forward": SENT["forward"],
            "sent_backward": SENT["backward"],
            "blocks_computed": COMPUTED[0],
            "context_parallel_error": cp_error,
            "seconds_in_script": time.perf_counter() - t0,
            "threads": os.environ.get("OMP_NUM_THREADS"),
        }
    )
    teardown()


if __name__ == "__main__":
    main()
