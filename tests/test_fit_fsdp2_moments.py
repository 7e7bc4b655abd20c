"""The FSDP2 profile against FSDP2 itself, at every moment of the step, counted on fake tensors.

``fit_cpu_offload_fake.py --profile`` (its docstring says how) takes two steps of the course's
decoder under ``fully_shard`` (each block, then the root, as torchtitan) as rank 0 of the fake
process group, and counts with PyTorch's ``FSDPMemTracker`` what the device holds after every
operator of the second: the most held while the loss is made (the end of forward), in each of
three parts of backward (the head's, until the last block's output gradient is made; the later
blocks'; the first block's and the embedding's) and in the optimizer step. It does so for
three shapes (2 or 3 blocks, over 4 or 2 ranks: a term per block or per rank that is wrong
cannot hide) and five recipes: one batch in fp32; two micro-batches; the optimizer step in
backward; ``reshard_after_forward=False``; ``MixedPrecisionPolicy(bf16, fp32)``.

``will_it_fit(..., sharding="fsdp2", headroom=False)`` is asked the same questions. What the
profile adds, moment by moment (``profiles._fsdp2``: the root kept gathered, a block gathered,
the next prefetched, one reduce-scatter input kept, the gradient shards, no 16-bit copy of the
fp32 shards), is held to the byte:

- at the end of forward and at the optimizer step, the whole count is the calculator's;
- in each part of backward, what the calculator leaves out is the same for every shape (2 or
  3 blocks, 4 or 2 ranks) of a recipe: no term per block or per rank is missing or wrong. It
  is the activation side, which the block's and the head's passes (``activations.Pass``) do
  not split into these parts: at the start, the loss's and the head's backward above the
  head pass's ``backward_over`` (clamped at 0: its peak comes with the embedding's gradient,
  which FSDP2's root makes last); in the middle and at the end, what the head side still
  holds (the logits, which the script's loop keeps, as the head pass) and a block's backward
  above its weight gradients. The test prints them; the report says how large they are.

Beside these, the calculator does not model, and the count is corrected for:

- the batch's token ids (``batch x seq x 8`` bytes, there at every moment): no profile counts
  the inputs;
- in bf16, each block's output (``batch x seq x d_model x 2``): the next block's RMSNorm saves
  its fp32 upcast, not the output, so FSDP2's run frees it; the calculator's block pass
  (``activations._fake_pass``) keeps it, as it must in fp32 (where the upcast is the output
  itself). The calculator is high by one such tensor per block whose activations are held
  then (every block at the end of forward and the start of backward; in the middle, every
  block, or one fewer where the moment is the block before the last, whose reduce-scatter
  input is there; one at the end).

Not yet held: the vocabulary (here 8 x d_model). What the activation side leaves out grows
with the logits (batch x seq x vocab): with a vocabulary of 4096 instead of 256 (2 blocks, 2
ranks, fp32; ``fit_cpu_offload_fake.SHAPES``' note) it is 486,788 bytes at the start of
backward, 544,520 in the middle and 926,600 at the end, where FSDP2's root makes its own
gradients and their reduce-scatter input last (not a moment of the profile yet). The head
pass's ``backward_over`` is measured above all of the root's weight gradients, the
embedding's included, which come last: the loss's and the head's backward before them (a
log-softmax gradient and the logits' gradient) is clamped away. Marked where FSDP2's hooks
fire (the root's pre-backward on the logits' gradient, the last block's output gradient), the
head pass gave the start of backward exactly on these shapes; that needs a field of its own in
``activations.Pass`` and in the formulas (``tools/fit_activation_terms.py``), as a typical
question must not import torch.

One child process that imports torch and runs 30 steps (about 60 s of CPU on a loaded
2-core machine): heavy.
"""

from __future__ import annotations

import fake_fsdp2_counts
import pytest
from fake_fsdp2_counts import BACKWARD, RECIPES, measured

from tutorial_utils import fit
from tutorial_utils.decoder_config import DecoderConfig
from tutorial_utils.fit.shapes import counts


@pytest.fixture(scope="module")
def grid() -> list[dict]:
    out = fake_fsdp2_counts.counts()  # one child for this file and test_fit_cpu_offload.py
    assert len(out["grid"]) >= 3
    return out["grid"]


def _cases(grid):
    for shape in grid:
        for recipe in RECIPES:
            yield shape, recipe


def _blocks_held(run: dict, moment: str, layers: int) -> int:
    """How many blocks' activations FSDP2's run holds at ``moment``'s peak."""
    if moment in ("end of forward", "start of backward"):
        return layers
    if moment == "end of backward":
        return 1
    at = run["at the peaks in backward"]["middle of backward"]
    return layers - 1 if "Reduce Scatter" in at else layers  # the block before the last, or it


@pytest.mark.heavy
def test_the_fsdp2_profile_holds_what_fsdp2_holds_at_every_moment(grid):
    left_out: dict = {}  # (recipe, moment): what the calculator leaves out, for each shape
    for shape, recipe in _cases(grid):
        cfg = DecoderConfig(**shape["config"])
        run = shape["runs"][recipe]
        calc = fit.will_it_fit(cfg, **fake_fsdp2_counts.question(shape, recipe))
        moments = {"end of forward", *BACKWARD, "optimizer step"}
        if "optimizer_in_backward" in RECIPES[recipe]:
            moments.remove("optimizer step")  # each parameter steps in backward
        assert set(calc.peaks) == moments, recipe
        for moment in calc.peaks:
            count = measured(run, moment) - run["tokens"]
            if recipe == "bf16 parameters" and moment != "optimizer step":
                output = shape["batch"] * shape["seq"] * cfg.d_model * 2
                count += output * _blocks_held(run, moment, cfg.n_layers)
            where = (cfg.n_layers, shape["world"], recipe, moment)
            if moment in BACKWARD:
                left_out.setdefault((recipe, moment), {})[where[:2]] = count - calc.peaks[moment]
            else:
                assert calc.peaks[moment] == count, where
    for (recipe, moment), by_shape in sorted(left_out.items()):
        print(f"{recipe}, {moment}: the calculator leaves out {by_shape}")
        assert len({layers for layers, _ in by_shape}) >= 2 and len({w for _, w in by_shape}) >= 2
        assert len(set(by_shape.values())) == 1, (recipe, moment, by_shape)


@pytest.mark.heavy
def test_backward_prefetches_one_block_and_keeps_one_reduce_scatter_input(grid):
    """What the profile's buffers stand for, by FSDPMemTracker's own names: from the start of
    backward one block's all-gather output (the root's pre-backward prefetch of the last
    block), and, in the first block's backward, the second's reduce-scatter input; with
    ``reshard_after_forward=False`` no all-gather at all (every block is still gathered)."""
    for shape in grid:
        cfg = DecoderConfig(**shape["config"])
        c = counts(cfg)
        for recipe, weight_bytes in (("one batch", 4), ("bf16 parameters", 2)):
            run = shape["runs"][recipe]
            start = run["at the peaks in backward"]["start of backward"]
            end = run["at the peaks in backward"]["end of backward"]
            assert start["Unsharded Param"] == weight_bytes * c.root, recipe
            if "All Gather" in start:  # after the root's pre-backward hook
                assert start["All Gather"] == weight_bytes * c.block, recipe
            assert end["Reduce Scatter"] == 4 * c.block, recipe  # reduce_dtype fp32
            assert end["Unsharded Param"] == weight_bytes * (c.root + c.block), recipe
        kept = shape["runs"]["reshard_after_forward=False"]
        assert all("All Gather" not in at for at in kept["at the peaks in backward"].values())
