"""Expert parallelism: a mixture of experts whose experts live on different ranks.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 expert_parallel.py

A router picks one expert per token (top-1, the token's output scaled by the router's
probability, as in the Switch Transformer). E experts, E/W on each rank: rank r keeps experts
r*E/W to (r+1)*E/W - 1. Each rank routes its own T tokens, then:

1. **dispatch**: sorts them by expert and sends each rank the tokens of its experts with one
   ``all_to_all_single`` whose split sizes differ per rank (uneven: the router decides them);
2. runs its experts on the tokens it received;
3. **combine**: sends the outputs back with the reverse ``all_to_all_single``.

Both exchanges go through ``torch.distributed.nn.functional.all_to_all_single``, which autograd
differentiates (its backward is the reverse exchange). Each rank checks against one process's MoE
on every rank's tokens: its output rows, its experts' gradients, the router's (all-reduced);
and the bytes each ``all_to_all_single`` carried to other ranks against the routing. It also
shows that the list form ``all_to_all`` refuses uneven chunks, and runs the same dispatch padded
to a fixed capacity, as a fixed-shape exchange needs, counting what the padding costs.
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from common import log, relative_gap, report, setup, sum_bound, teardown, within
from torch import nn

# torch 2.13 deprecates this module's all_to_all_single for the functional collectives' (whose
# autograd twin is all_to_all_single_autograd); it is kept here because it goes through
# dist.all_to_all_single, where this script counts the bytes.
warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_to_all_single")

D, FF, E, T = 8, 16, 4, 24  # model width, expert hidden width, experts, tokens per rank
COUNTED: dict[str, int] = {}  # bytes each phase's all_to_all_single sent to other ranks
PHASE = ["counts"]
RECEIVED: list[list[int]] = [[]]  # rows this rank received from each rank in the dispatch
_all_to_all_single = dist.all_to_all_single


def counted_all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, **kw):
    """``dist.all_to_all_single``, booking the bytes it sends to other ranks (not to itself)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    splits = input_split_sizes or [input.shape[0] // world] * world
    row = input[0].numel() * input.element_size() if input.shape[0] else 0
    off_rank = sum(n for i, n in enumerate(splits) if i != rank)
    COUNTED[PHASE[0]] = COUNTED.get(PHASE[0], 0) + off_rank * row
    return _all_to_all_single(output, input, output_split_sizes, input_split_sizes, **kw)


dist.all_to_all_single = counted_all_to_all_single  # autograd's backward calls it through dist


class MoE(nn.Module):
    """A router and E experts (each a small MLP); the same weights on every rank (seeded)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.router = nn.Linear(D, E)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(D, FF), nn.GELU(), nn.Linear(FF, D)) for _ in range(E)
        )

    def route(self, x):
        """(expert of each token, its probability): top-1 of the router's softmax."""
        prob = self.router(x).softmax(-1)
        gate, expert = prob.max(-1)
        return expert, gate

    def forward(self, x):  # one process: every expert here
        expert, gate = self.route(x)
        out = torch.zeros_like(x)
        for e in range(E):
            chosen = expert == e
            out[chosen] = self.experts[e](x[chosen])
        return out * gate[:, None]


def expert_parallel(moe: MoE, x: torch.Tensor, rank: int, world: int):
    """This rank's tokens through the experts of every rank: dispatch, compute, combine."""
    per_rank = E // world
    expert, gate = moe.route(x)
    order = torch.argsort(expert, stable=True)  # tokens grouped by expert, so by rank
    per_expert = torch.bincount(expert, minlength=E)  # tokens this rank sends each expert
    send = per_expert.view(world, per_rank).sum(1).tolist()  # ... and each rank
    PHASE[0] = "counts"  # first tell every rank how many rows of each of its experts to expect
    got_per_expert = torch.empty_like(per_expert)
    dist.all_to_all_single(got_per_expert, per_expert)
    got = got_per_expert.view(world, per_rank)  # [source rank, my expert]: rows
    recv = got.sum(1).tolist()
    RECEIVED[0] = recv

    PHASE[0] = "dispatch"
    rows = dist_fn.all_to_all_single(
        x.new_empty(sum(recv), D), x[order], output_split_sizes=recv, input_split_sizes=send
    )
    mine = torch.arange(per_rank).repeat(world).repeat_interleave(got.flatten())  # local expert
    y = torch.zeros_like(rows)
    for e in range(per_rank):
        chosen = mine == e
        y[chosen] = moe.experts[e](rows[chosen])  # this rank's e-th expert
    PHASE[0] = "combine"
    back = dist_fn.all_to_all_single(
        x.new_empty(T, D), y, output_split_sizes=send, input_split_sizes=recv
    )
    out = torch.empty_like(back)
    out[order] = back  # undo the sort
    return out * gate[:, None], expert


def list_form_error(world: int) -> str | None:
    """The list form ``dist.all_to_all`` with uneven chunks, as a dispatch would give it: chunk i
    has i + 1 rows on every rank, so every rank refuses before anything is sent (a rank whose
    chunks happened to be even would enter the collective and wait for ever)."""
    chunks = [torch.zeros(i + 1, D) for i in range(world)]
    out = [torch.empty(dist.get_rank() + 1, D) for _ in range(world)]
    try:
        dist.all_to_all(out, chunks)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


def padded(x: torch.Tensor, send: list[int], world: int) -> tuple[torch.Tensor, int, int]:
    """The dispatch with every chunk padded to a capacity (the largest chunk any rank sends), as
    a fixed-shape exchange needs (the list form ``all_to_all``, a compiled graph): the rows
    received (padding dropped), the capacity, and the bytes sent to other ranks."""
    rank = dist.get_rank()
    chunks = list(torch.split(x, send))
    capacity = torch.tensor(max(send))
    dist.all_reduce(capacity, op=dist.ReduceOp.MAX)
    cap = int(capacity)
    sizes = torch.tensor(send)
    got_sizes = torch.empty_like(sizes)
    _all_to_all_single(got_sizes, sizes)  # how many rows of each padded chunk are real
    full = [torch.cat([c, c.new_zeros(cap - len(c), D)]) for c in chunks]
    out = [torch.empty_like(f) for f in full]
    dist.all_to_all(out, full)
    sent = sum(f.numel() * f.element_size() for i, f in enumerate(full) if i != rank)
    return torch.cat([o[:n] for o, n in zip(out, got_sizes.tolist(), strict=True)]), cap, sent


def main() -> None:
    t0 = time.perf_counter()
    rank, world, device = setup()
    if E % world:
        raise SystemExit(f"expert_parallel.py places {E} experts evenly: use 1, 2 or 4 ranks")
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(world * T, D, generator=g)  # every rank's tokens, rank after rank
    target = torch.randn(world * T, D, generator=g)
    mine = slice(rank * T, (rank + 1) * T)

    ref = MoE()  # one process, every token, every expert
    x_ref = x_all.clone().requires_grad_()  # as if a layer before needed its gradient
    ref_out = ref(x_ref)
    (ref_out * target).sum().backward()

    moe = MoE()
    per_rank = E // world
    moe.experts = moe.experts[rank * per_rank : (rank + 1) * per_rank]  # only this rank's experts
    x = x_all[mine].clone().requires_grad_()
    out, expert = expert_parallel(moe, x, rank, world)
    PHASE[0] = "backward"
    (out * target[mine]).sum().backward()
    for p in moe.router.parameters():  # the router is replicated: add up its gradients
        dist.all_reduce(p.grad)

    off_rank = int((expert // per_rank != rank).sum())  # tokens whose expert lives elsewhere
    mine_experts = range(rank * per_rank, (rank + 1) * per_rank)
    got = [p.grad for e in range(per_rank) for p in moe.experts[e].parameters()]
    want = [p.grad for e in mine_experts for p in ref.experts[e].parameters()]
    got += [p.grad for p in moe.router.parameters()] + [x.grad]
    want += [p.grad for p in ref.router.parameters()] + [x_ref.grad[mine]]
    forward_gap = relative_gap([out], [ref_out[mine]])
    grad_gap = relative_gap(got, want)
    # An output row is the same two matmuls in both runs (sums of D and FF products), done in
    # another batch; a gradient adds up to all world * T tokens' terms, in another order.
    forward_tol, grad_tol = sum_bound(D + FF), sum_bound(world * T + D + FF)
    same = within("expert_parallel forward_gap", forward_gap, forward_tol)
    same &= within("expert_parallel grad_gap", grad_gap, grad_tol)
    log(f"expert-parallel MoE on {world} ranks equals one process's: {same}")

    send = torch.bincount(expert, minlength=E).view(world, per_rank).sum(1).tolist()
    x_sorted = x_all[mine][torch.argsort(expert, stable=True)]
    exact = torch.empty(sum(RECEIVED[0]), D)
    _all_to_all_single(exact, x_sorted, RECEIVED[0], send)
    list_error = list_form_error(world)
    rows_padded, capacity, padded_bytes = padded(x_sorted, send, world)
    padded_same = torch.equal(rows_padded, exact)
    report(
        {
            "rank": rank,
            "world": world,
            "D": D,
            "E": E,
            "T": T,
            "elem": x_all.element_size(),
            "tokens_per_expert": torch.bincount(expert, minlength=E).tolist(),
            "param_bytes": sum(p.numel() * p.element_size() for p in moe.parameters()),
            "router_numel": sum(p.numel() for p in ref.router.parameters()),
            "expert_numel": sum(p.numel() for p in ref.experts[0].parameters()),
            "send_splits": send,
            "recv_splits": RECEIVED[0],
            "off_rank_tokens": off_rank,
            "counted": dict(COUNTED),
            "forward_gap": forward_gap,
            "grad_gap": grad_gap,
            "forward_tol": forward_tol,
            "grad_tol": grad_tol,
            "list_form_error": list_error,
            "capacity": capacity,
            "padded_bytes": padded_bytes,
            "padded_same": padded_same,
            "seconds_in_script": time.perf_counter() - t0,
        }
    )
    teardown()


if __name__ == "__main__":
    main()
