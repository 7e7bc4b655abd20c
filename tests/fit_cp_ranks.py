"""What one rank of causal ring attention (context parallelism) saves for backward, counted.

    torchrun --nproc-per-node=2 tests/fit_cp_ranks.py

``tests/test_fit_profiles.py`` launches it. Each rank runs notebook 12's ``RingAttention``
(``notebooks/scripts/ring_attention.py``) on its S/W positions and counts, once per storage,
the bytes autograd saves (a saved-tensor hook), then the same for ``scaled_dot_product_attention``
on S/W positions in one process: the calculator's context-parallel term is a block on seq/cp
tokens, so the two must be equal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "notebooks" / "scripts"))
from common import report, teardown  # noqa: E402
from ring_attention import DH, B, H, RingAttention, S  # noqa: E402


def saved_bytes(attend, q, k, v) -> int:
    """Run ``attend`` and count, once per storage, what autograd saves (q, k, v included)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = attend(q, k, v)
    out.sum().backward()  # the saved tensors are used: the count was of real inputs
    return sum(seen.values())


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    local = [torch.randn(B, H, S // world, DH, generator=g, requires_grad=True) for _ in "qkv"]
    ring = saved_bytes(RingAttention.apply, *local)
    sdpa = saved_bytes(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), *local
    )
    report(
        {"rank": rank, "world": world, "B": B, "H": H, "S": S, "DH": DH, "ring": ring, "sdpa": sdpa}
    )
    teardown()


if __name__ == "__main__":
    main()
