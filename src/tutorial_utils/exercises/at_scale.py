"""Checkers for notebook 12 (long context and experts: ring attention, expert parallelism, HSDP).

* ``check_ring_bytes``: the learner's ``ring_bytes(world, batch, heads, seq, head_dim, elem)``,
  the bytes one rank sends in the forward and the backward pass of causal ring attention (the
  sequence cut into ``world`` chunks; keys and values go around the ring in forward; in
  backward they go around again with their gradients, which take one more hop home), against
  the formulas on a grid of shapes.
* ``check_send_splits``: the learner's ``send_splits(expert_of_token, experts, world)``, the
  number of tokens one rank sends to each rank when experts are placed in contiguous blocks
  (rank r keeps experts r*E/W to (r+1)*E/W - 1): the ``input_split_sizes`` of the dispatch's
  ``all_to_all_single``.
* ``check_merge``: the bug hunt. ``merge(out_a, lse_a, out_b, lse_b)`` must combine two partial
  attentions over disjoint keys, each normalised by its own sum of exponentials, into the
  attention over all their keys (and its log-sum-exp).

Each reference is computed by the checker from its own inputs before the learner's code runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import Feedback, checker
from .answers import Given, describe, finite_number, number_problem, whole_number

__all__ = ["check_merge", "check_ring_bytes", "check_send_splits", "ring_reference"]


# ---------------------------------------------------------------------------------------------
# Bytes of ring attention


def ring_reference(world: int, batch: int, heads: int, seq: int, head_dim: int, elem: int):
    """(forward, backward) bytes one rank sends: a block of keys (or values) is
    batch * heads * seq / world * head_dim elements; forward passes k and v world - 1 times;
    backward passes k, v, dk, dv world - 1 times, then dk and dv once more."""
    block = batch * heads * (seq // world) * head_dim * elem
    return (world - 1) * 2 * block, ((world - 1) * 4 + 2) * block


_RING_GRID = [
    (world, batch, heads, seq, head_dim, elem)
    for world in (2, 4, 8)
    for batch, heads, seq, head_dim in ((2, 4, 64, 16), (1, 32, 131072, 128))
    for elem in (4, 2)
]


@checker(answers=("ring_bytes",))
def check_ring_bytes(ring_bytes: Callable[..., tuple]) -> Feedback:
    """``ring_bytes(world, batch, heads, seq, head_dim, elem)`` returns ``(forward, backward)``:
    the bytes one rank hands to ``isend`` in each pass of causal ring attention over ``world``
    ranks (section 1's ``RingAttention``), for ``elem``-byte elements."""
    fb = Feedback(
        "ring_bytes gives the bytes a rank sends in ring attention's forward and backward"
    )
    fb.hint(
        "count one block first: the keys of seq / world positions for every batch row and head. "
        "Then: how many blocks leave a rank at each ring step, and how many steps pass a block on?"
    )
    fb.fix(
        "block = batch * heads * (seq // world) * head_dim * elem; forward = (world - 1) * 2 * "
        "block (k and v, world - 1 hops); backward = ((world - 1) * 4 + 2) * block (k, v, dk, "
        "dv for world - 1 hops, then dk and dv one more hop home)"
    )
    wrong: list[str] = []
    off = {"forward": 0, "backward": 0}
    for shape in _RING_GRID:
        want = ring_reference(*shape)
        call = "ring_bytes({}, {}, {}, {:,}, {}, {})".format(*shape)
        got = fb.run(call, ring_bytes, *shape, returns=tuple)
        fb.require(
            len(got) == 2,
            f"{call} returned {len(got)} values: return (forward_bytes, backward_bytes)",
            brief="ring_bytes does not return two numbers",
        )
        values = [finite_number(v) for v in got]
        bad = next((i for i, v in enumerate(values) if v is None), None)
        fb.require(
            bad is None,
            number_problem(f"{call}[{bad}]", got[bad] if bad is not None else None)
            + " (a number of bytes)",
            brief="ring_bytes does not return numbers",
        )
        for name, value, expected in zip(("forward", "backward"), values, want, strict=True):
            if abs(value - expected) > 0.5:
                off[name] += 1
                wrong.append(f"{call}: {name} {value:,.0f}, expected {expected:,.0f}")
    if off["forward"]:
        fb.expect(
            False,
            "the forward bytes are wrong: which tensors travel, and how many hops do they make?",
            brief="the forward bytes are wrong",
        )
    if off["backward"]:
        fb.expect(
            False,
            "the backward bytes are wrong: besides k and v, what else travels, and does it stop "
            "where the keys stop?",
            brief="the backward bytes are wrong",
        )
    fb.expect(
        not wrong,
        "; ".join(wrong[:3]) + (" ..." if len(wrong) > 3 else ""),
        brief=f"{len(wrong)} of {2 * len(_RING_GRID)} values are wrong",
    )
    return fb


# ---------------------------------------------------------------------------------------------
# Split sizes of the dispatch


def _splits_reference(expert: list[int], experts: int, world: int) -> list[int]:
    per_rank = experts // world
    out = [0] * world
    for e in expert:
        out[e // per_rank] += 1
    return out


def _routings() -> list[tuple[torch.Tensor, int, int]]:
    g = torch.Generator().manual_seed(12)
    cases = [(torch.tensor([0, 3, 1, 2, 3, 3, 0, 1]), 4, 2)]  # the notebook's shape, small
    for experts, world, tokens in ((8, 2, 40), (8, 4, 33), (16, 4, 64), (6, 3, 17)):
        routing = torch.randint(0, experts, (tokens,), generator=g)
        routing[: tokens // 3] = experts - 1  # one hot expert: uneven on purpose
        cases.append((routing[torch.randperm(tokens, generator=g)], experts, world))
    cases.append((torch.zeros(0, dtype=torch.long), 4, 2))  # a rank with no tokens at all
    return cases


@checker(answers=("send_splits",))
def check_send_splits(send_splits: Callable[..., object]) -> Feedback:
    """``send_splits(expert_of_token, experts, world)``: a list of ``world`` whole numbers, how
    many of this rank's tokens go to each rank, experts placed in contiguous blocks of
    ``experts // world`` (rank r keeps experts r * experts // world onward)."""
    fb = Feedback("send_splits counts the tokens this rank sends each rank in the dispatch")
    fb.hint(
        "the split sizes count tokens per destination rank, not per expert: which rank keeps "
        "expert e, when each rank keeps a contiguous block of experts // world experts?"
    )
    fb.fix(
        "per_rank = experts // world; return torch.bincount(expert_of_token // per_rank, "
        "minlength=world).tolist()"
    )
    for routing, experts, world in _routings():
        want = _splits_reference(routing.tolist(), experts, world)  # before the learner's code
        call = f"send_splits({describe(routing.tolist())}, experts={experts}, world={world})"
        got = fb.run(call, send_splits, Given("expert_of_token", routing), experts, world)
        if isinstance(got, torch.Tensor):
            got = got.tolist() if got.dim() == 1 else got
        fb.require(
            isinstance(got, list | tuple),
            f"{call} returned {describe(got)}: return a list of {world} numbers, one per rank",
            brief="send_splits does not return a list",
        )
        numbers = [whole_number(v) for v in got]
        fb.require(
            all(n is not None for n in numbers),
            f"{call} returned {describe(list(got))}: give whole numbers of tokens",
            brief="send_splits does not return whole numbers",
        )
        if len(numbers) == experts and len(numbers) != world:
            fb.expect(
                False,
                f"{call} returned {len(numbers)} numbers, one per expert: all_to_all_single "
                f"wants one per rank ({world})",
                brief="the splits are per expert, not per rank",
            )
            break
        fb.require(
            len(numbers) == world,
            f"{call} returned {len(numbers)} numbers: return one per rank ({world})",
            brief="send_splits returns the wrong number of splits",
        )
        if numbers != want:
            modulo = [0] * world
            for e in routing.tolist():
                modulo[e % world] += 1
            if numbers == modulo and modulo != want:
                fb.expect(
                    False,
                    f"{call} returned {numbers}, expected {want}: experts sit in contiguous "
                    "blocks (rank 0 keeps experts 0 and 1 of 4 on 2 ranks), not round robin",
                    brief="the experts are placed round robin, not in contiguous blocks",
                )
            elif sum(numbers) != len(routing):
                fb.expect(
                    False,
                    f"{call} returned {numbers}, which adds up to {sum(numbers)}: every one of "
                    f"the {len(routing)} tokens goes to exactly one rank (expected {want})",
                    brief="the splits do not add up to the tokens",
                )
            else:
                fb.expect(
                    False,
                    f"{call} returned {numbers}, expected {want}",
                    brief="some tokens go to the wrong rank",
                )
            break
    return fb


# ---------------------------------------------------------------------------------------------
# The bug hunt: merging two partial attentions

_MERGE_TITLE = "merge combines two partial attentions into the attention over all their keys"


def _partial(q, k, v):
    s = q @ k.transpose(-2, -1)
    lse = torch.logsumexp(s, -1, keepdim=True)
    return torch.exp(s - lse) @ v, lse


def check_merge(merge: Callable[..., tuple]) -> Feedback:
    """``merge(out_a, lse_a, out_b, lse_b)`` returns ``(out, lse)``: the attention over the keys
    of both halves and its log-sum-exp, from each half's output (normalised by its own softmax)
    and log-sum-exp. The colleague's code as shipped is not an answer yet."""
    return _check_merge(merge)


@checker(shipped_hint="try it: split the keys of one attention in two and merge the halves back")
def _check_merge(merge: Callable[..., tuple]) -> Feedback:
    fb = Feedback(_MERGE_TITLE)
    fb.hint(
        "each half was divided by its own sum of exponentials, exp(lse_a) or exp(lse_b); the "
        "whole is divided by their sum. What share of the whole does each half carry?"
    )
    fb.fix(
        "lse = torch.logaddexp(lse_a, lse_b); out = torch.exp(lse_a - lse) * out_a + "
        "torch.exp(lse_b - lse) * out_b; return out, lse"
    )
    g = torch.Generator().manual_seed(40)
    for scale, split in (
        (1.0, 5),
        (300.0, 12),
        (1.0, 1),
    ):  # scores in the thousands: exp(lse) overflows
        q = torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64) * scale
        k = torch.randn(2, 3, 16, 8, generator=g, dtype=torch.float64)
        v = torch.randn(2, 3, 16, 8, generator=g, dtype=torch.float64)
        want, want_lse = _partial(q, k, v)  # the reference first: all 16 keys at once
        out_a, lse_a = _partial(q, k[:, :, :split], v[:, :, :split])
        out_b, lse_b = _partial(q, k[:, :, split:], v[:, :, split:])
        call = f"merge(...) of keys 0-{split - 1} and {split}-15 (scores up to {scale:g}x)"
        got = fb.run(
            call,
            merge,
            Given("out_a", out_a),
            Given("lse_a", lse_a),
            Given("out_b", out_b),
            Given("lse_b", lse_b),
            returns=tuple,
        )
        fb.require(
            len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got),
            f"{call} returned {describe(got)}: return (out, lse), two tensors",
            brief="merge does not return (out, lse)",
        )
        out, lse = got
        fb.require(
            out.shape == want.shape and lse.shape == want_lse.shape,
            f"{call} returned shapes {tuple(out.shape)} and {tuple(lse.shape)}: out keeps "
            f"out_a's shape {tuple(want.shape)}, lse keeps lse_a's {tuple(want_lse.shape)}",
            brief="merge returns the wrong shapes",
        )
        finite = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
        fb.require(
            finite,
            f"{call} returned inf or NaN: exp of a large log-sum-exp overflows; weigh each half "
            "by exp(lse_a - lse), a number between 0 and 1",
            brief="merge overflows on large scores",
        )
        # float64 throughout: both sides are the same sums to about 1e-15; 1e-9 leaves room
        gap = (out.double() - want).abs().max().item()
        lse_gap = (lse.double() - want_lse).abs().max().item()
        fb.expect(
            lse_gap < 1e-9,
            f"{call}: lse is off by {lse_gap:.3g} from the log-sum-exp over all keys",
            brief="the merged log-sum-exp is wrong",
        )
        fb.require(
            gap < 1e-9,
            f"{call}: out is off by {gap:.3g} from the attention over all keys",
            brief="the merged output is not the attention over all keys",
        )
    return fb
