"""Profiles: what each way of spreading a step over GPUs keeps on one of them.

One job: from the whole model's states (``states``) and counts (``shapes``), one GPU's share
and what the profile adds at its compute moments, for

- **DDP** (``none`` over several GPUs): everything on every GPU, plus DDP's gradient buckets,
  which equal the gradients unless ``gradient_as_bucket_view=True`` (DDP's docstring).
- **ZeRO-1/2/3** (Rajbhandari et al., 2020): stage 1 divides the optimizer state and the fp32
  master weights, 2 also the gradients, 3 also the weights, over the data-parallel GPUs.
  ZeRO-3 gathers one unit at a time, its weights and their unsharded gradients; the wrapping
  is torchtitan's (``fully_shard`` on each block, then on the root: embedding, final norm and
  head), so the largest unit is the root for Llama 8B and a block for GPT-2. ``fsdp`` has
  always meant this here.
- **FSDP2** (``fully_shard``, per-parameter DTensor shards, wrapped as torchtitan wraps it):
  ZeRO-3's states, and moment by moment what FSDP2's own code keeps (``_fsdp2`` cites the
  lines): the root gathered from its forward to the end of backward, a block for its forward
  (or, with ``reshard_after_forward=False``, to its gradient), in backward the block before
  prefetched and the last block's reduce-scatter input (in ``reduce_dtype``) kept until the
  next unit's; with bf16 parameters the fp32 shards are the only copy of the weights.
  ``tests/test_fit_profiles.py`` holds its states and gathered units to what 2 gloo ranks
  measure, ``tests/test_fit_fsdp2_moments.py`` what it adds at every moment of a decoder's
  step to what FSDP2 holds on the fake process group.
- **FSDP1** (``FullyShardedDataParallel``, flat parameters): each unit's parameters are one
  flat tensor, padded to a multiple of the ranks, each rank keeping 1/ranks of it (the padding
  is stored, stepped and gathered too). The root unit (embedding, final norm, head) is not
  resharded after forward: it stays gathered until its gradient is made, at the end of
  backward. ``FULL_SHARD`` (and ``HYBRID_SHARD`` over its shard group) gathers a block for its
  forward, and in backward, with the default ``BackwardPrefetch.BACKWARD_PRE``, gathers the
  next block before this one's gradient is made: root, two blocks, one block's unsharded
  flat gradient and the head's gradient (made first, it waits in autograd for the root's
  flat parameter) at once; or, at the end, the root and its unsharded gradient.
  A unit of frozen weights (a LoRA block's base) has no gradient to hook: FSDP1 reshards it
  once its input's gradient is made (``_register_post_backward_reshard_only_hook``, torch 2.1
  on), so under LoRA too the base is never gathered whole.
  ``SHARD_GRAD_OP`` keeps every unit gathered from its forward until its gradient is made.
  Under ``no_sync()`` (gradient accumulation that syncs on the last micro-batch only, as
  Lightning's ``no_backward_sync``) each rank keeps every unit's gradient unsharded, in the
  compute dtype, from the first micro-batch until the syncing one reduce-scatters it, and for
  the whole flat parameter of a unit that holds any trainable weight (a LoRA block: its frozen
  weights too); the syncing micro-batch's first gradient is made beside all of them.
  ``tests/test_fit_profiles.py`` holds all three, and the frozen base's resharding under
  torchtune's LoRA wrapping, to what 2 gloo ranks count (``fit_fsdp1_ranks.py``).
- **TP (with sequence parallelism), PP and CP** as degrees of a device mesh (torchtitan's):
  TP divides every block's and the embedding's and head's weights by its degree, and with
  PyTorch's SP plan every activation but two: the inputs of attention's and the MLP's first
  (column-parallel) Linears are all-gathered along the sequence, and each Linear saves the
  whole gathered input on every rank (``tp_block_held``; notebook 10 measures both shares to
  the byte; Megatron-LM, which gathers them again in backward instead, keeps none). PP keeps
  L/pp blocks per stage, and the largest root part (embedding or head), while 1F1B keeps
  min(pp, micro-batches) micro-batches in flight on the first stage (notebook 08); CP divides
  the sequence (ring attention saves what attention on the rank's chunk saves: notebook 12's
  ``RingAttention``, counted in ``tests/fit_cp_ranks.py``). The data-parallel degree is what
  is left: gpus / (tp x pp x cp), and the FSDP/ZeRO profiles shard over data x context ranks,
  as torchtitan does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..formulas import pipeline_in_flight
from .shapes import Counts

__all__ = ["SHARDED_BY_STAGE", "Mesh", "Spread", "shard_model_states", "spread", "tp_block_held"]

#: What each profile divides by the number of data-parallel GPUs.
SHARDED_BY_STAGE: dict[str, tuple[str, ...]] = {
    "none": (),
    "zero1": ("master weights", "optimizer state"),
    "zero2": ("master weights", "optimizer state", "gradients"),
    "zero3": ("master weights", "optimizer state", "gradients", "weights"),
    "fsdp1": ("master weights", "optimizer state", "gradients", "weights"),
    "fsdp1-grad-op": ("master weights", "optimizer state", "gradients", "weights"),
    "fsdp2": ("master weights", "optimizer state", "gradients", "weights"),
}


def shard_model_states(states: dict[str, int], sharding: str, n_gpus: int) -> dict[str, int]:
    """One GPU's share of the model states: the categories ``sharding`` divides, over ``n_gpus``.

    ``states`` holds the unsharded bytes by category (``weights``, ``gradients``, ``master
    weights``, ``optimizer state``); the others pass through whole.

    >>> shard_model_states({"weights": 8, "gradients": 8, "optimizer state": 16}, "zero2", 2)
    {'weights': 8, 'gradients': 4, 'optimizer state': 8}
    """
    if sharding not in SHARDED_BY_STAGE:
        raise ValueError(f"sharding must be one of {tuple(SHARDED_BY_STAGE)}, not {sharding!r}")
    if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
        raise ValueError(f"n_gpus must be a whole number >= 1, not {n_gpus!r}")
    divided = SHARDED_BY_STAGE[sharding]
    return {k: v // n_gpus if k in divided else v for k, v in states.items()}


def tp_block_held(
    held: int, batch: int, local_seq: int, d_model: int, linear_bytes: int, tp: int, kept: bool
) -> int:
    """One TP rank's share of what a block keeps for backward, under PyTorch's TP + SP plan.

    ``held``: the whole block's (one GPU, ``local_seq`` tokens); ``linear_bytes``: the element
    size the Linears compute in (4 in fp32, 2 in bf16 or autocast); ``kept``: whether the
    Linears' inputs are saved (no checkpointing) or recomputed. SP splits every activation
    along the sequence except the two all-gathered inputs of the column-parallel Linears
    (q/k/v share one, the MLP's up and gate the other), which each rank saves whole.

    >>> tp_block_held(528384, 2, 64, 64, 4, 2, True)  # notebook 10's block, fp32: 32,768 B more
    296960
    """
    if tp == 1:
        return held
    gathered = 2 * batch * local_seq * d_model * linear_bytes if kept else 0
    return (held - gathered) // tp + gathered


@dataclass(frozen=True)
class Mesh:
    """The degrees of a device mesh; ``dp`` is what is left of the GPUs."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    microbatches: int = 0  # PP's micro-batches per step (0: as many as stages)

    def dp(self, n_gpus: int) -> int:
        return n_gpus // (self.tp * self.pp * self.cp)

    @property
    def in_flight(self) -> int:
        """Micro-batches whose activations the first stage holds at once under 1F1B
        (``formulas.pipeline_in_flight``, which notebook 08 measures)."""
        return pipeline_in_flight("1F1B", self.microbatches or self.pp, self.pp, 0)


@dataclass(frozen=True)
class Spread:
    """One GPU's share under a profile and mesh."""

    states: dict[str, int]  # this GPU's model states, by category
    fraction: float  # the share of the model's parameters this GPU's stage and TP rank hold
    gathered: int  # bytes a unit adds while it is computed (ZeRO-3/FSDP), 0 otherwise
    kept_gathered: int  # bytes of gathered weights kept from forward to backward
    buckets: int  # DDP's gradient buckets
    unit: str  # what the largest unit is, said in words
    unit_weights: int = 0  # of ``gathered``: the unit's gathered weights alone
    unsharded_grads: int = 0  # FSDP1 under no_sync: every unit's gradient, kept unsharded
    at: dict[str, int] | None = None  # FSDP2: gathered and in flight at each moment
    moment_shards: dict[str, int] | None = None  # FSDP2: blocks' gradient shards then
    block_shard: int = 0  # FSDP2: one block's gradient shard
    block_grads: int = 0  # FSDP2: one block's unsharded gradients


def spread(
    whole: dict[str, int],
    c: Counts,
    weight_bytes: int,
    grad_bytes: int,
    sharding: str,
    n_gpus: int,
    mesh: Mesh,
    *,
    reshard_after_forward: bool = True,
    reduce_fp32: bool = False,
    trainable_fraction: float = 1.0,
    no_sync: bool = False,
    frozen_root: bool = False,
) -> Spread:
    """One GPU's share (see the module's docstring). ``trainable_fraction``: the share of the
    parameters that have gradients (LoRA: only the adapters); ``no_sync``: FSDP1 accumulates
    under ``no_sync()``; ``frozen_root``: the root unit holds no trainable weight (LoRA on the
    blocks), so it keeps no gradient."""
    blocks = c.n_layers * c.block
    if mesh.pp > 1:
        stage_n = blocks / mesh.pp + max(c.root_tensors)
    else:
        stage_n = blocks + c.root
    fraction = stage_n / c.total / mesh.tp
    local = {k: int(v * fraction) for k, v in whole.items()}
    ranks = mesh.dp(n_gpus) * mesh.cp  # FSDP shards over data x context ranks
    shared = shard_model_states(local, sharding, ranks) if ranks > 1 else local
    buckets = shared["gradients"] if sharding == "none" and mesh.dp(n_gpus) > 1 else 0
    if sharding not in ("zero3", "fsdp1", "fsdp1-grad-op", "fsdp2") or ranks == 1:
        return Spread(shared, fraction, 0, 0, buckets, "")
    if sharding in ("fsdp1", "fsdp1-grad-op"):
        return _fsdp1(
            sharding,
            shared,
            local,
            fraction,
            c,
            mesh,
            ranks,
            weight_bytes,
            grad_bytes,
            trainable_fraction,
            no_sync and not frozen_root,
            no_sync and trainable_fraction > 0,
        )
    if sharding == "fsdp2":
        return _fsdp2(
            shared, fraction, c, mesh, stage_n, weight_bytes, grad_bytes,
            4 if reduce_fp32 else grad_bytes, trainable_fraction, reshard_after_forward,
        )  # fmt: skip
    unit_n, name = max(
        (c.root, "the root (embedding, final norm, output head)"), (c.block, "one block")
    )
    unit_n = unit_n // mesh.tp
    words = f"{name}, {unit_n / 1e6:,.0f} M parameters"
    grads = int(grad_bytes * unit_n * trainable_fraction)
    w = weight_bytes * unit_n
    return Spread(shared, fraction, w + grads, 0, 0, words, w)


def _fsdp2(
    shared: dict[str, int],
    fraction: float,
    c: Counts,
    mesh: Mesh,
    stage_n: float,
    weight_bytes: int,
    grad_bytes: int,
    reduce_bytes: int,
    trainable_fraction: float,
    reshard_after_forward: bool,
) -> Spread:
    """FSDP2's share, unit by unit, as ``fully_shard`` on each block and then the root keeps it
    (torch 2.13.0, ``torch/distributed/fsdp/_fully_shard/``, git cf30153c; ``tests/
    fit_cpu_offload_fake.py --profile`` counts each moment, ``test_fit_fsdp2_moments.py``):

    - the root is not resharded after forward (``_fsdp_state.py`` 203-207: its
      ``post_forward_mesh_info`` is None), so its gathered weights stay from its forward to its
      gradient, at the very end of backward; a block is gathered for its forward and resharded
      after it (``_fsdp_param_group.py`` ``post_forward`` 556-566), or, with
      ``reshard_after_forward=False``, kept until its own gradient is made (``post_backward``
      606-609 reshards it then: ``reshard_after_backward`` is True);
    - no gradient buffer exists before backward: the end of forward holds the kept weights only;
    - each unit's ``pre_backward`` all-gathers the unit that ran before it in forward
      (``_backward_prefetch``, ``_fsdp_param_group.py`` 795-831; the root's, from
      ``_fsdp_state.py`` ``_pre_backward`` 381-391): from the start of backward one more block
      is on the device, as its all-gather output, until its own backward copies it out (a
      no-op where it is still gathered: ``unshard``, 376-377);
    - a block's unsharded gradients (the parameters' dtype) are copied into a reduce-scatter
      input in ``reduce_dtype`` (``foreach_reduce``, ``_fsdp_collectives.py`` 597), which is kept
      until the next unit's ``post_backward`` (``reduce_scatter_max_input_buffers`` = 1,
      ``_fsdp_param_group.py`` 112 and 640-659), beside the new gradient shard;
    - with bf16 parameters (``MixedPrecisionPolicy(param_dtype=bf16)``) the shards stay in fp32
      and are the only copy (cast as they are gathered), and each gradient shard is cast back to
      fp32 (``_fsdp_collectives.py`` 696): the mixed recipe's 16-bit weights and gradients are
      fp32 gradient shards, with no 16-bit copy of the weights.

    ``at``: the bytes gathered or in flight at each moment, besides the gradient shards; with
    ``moment_shards``: how many blocks' gradient shards exist then (``block_shard`` each).
    """
    states = dict(shared)
    if states.get("master weights") and weight_bytes < 4:  # the shards are the fp32 copy
        states["gradients"] += states["weights"]
        states["weights"] = 0
    root = (c.root if mesh.pp == 1 else max(c.root_tensors, default=0)) // mesh.tp
    block, layers = c.block // mesh.tp, -(-c.n_layers // mesh.pp)
    root_w, block_w = weight_bytes * root, weight_bytes * block
    block_g = int(grad_bytes * block * trainable_fraction)  # a block's unsharded gradients
    rs = int(reduce_bytes * block * trainable_fraction)  # their reduce-scatter input
    if reshard_after_forward:
        kept = root_w

        def gathered(k):  # at block k's backward: the root, block k, block k - 1 prefetched
            return root_w + block_w + (block_w if k > 0 else 0)

        prefetched = block_w if layers else 0  # the root's pre-backward prefetches the last block
    else:
        kept = root_w + layers * block_w

        def gathered(k):  # blocks after k resharded by their post_backward
            return root_w + (k + 1) * block_w

        prefetched = 0  # every block still gathered: its unshard is a no-op
    # the start (with the root's prefetch of the last block), the last block (no reduce-scatter
    # input yet), the one before it (the last's input and shard kept),
    # and the first (every later block's shard); a block's unsharded gradients (``block_g``)
    # are there in its backward
    last = layers - 1
    at = {
        "end of forward": kept,
        "start of backward": kept + prefetched,
        "last block": gathered(last),
        "block before": gathered(last - 1) + rs if layers > 1 else 0,
        "end of backward": gathered(0) + (rs if layers > 1 else 0),
    }
    shards = {"last block": 0, "block before": 1, "end of backward": max(layers - 1, 0)}
    n_local = root + layers * block
    block_shard = states["gradients"] * block // n_local if n_local else 0
    words = (
        f"the root, {root / 1e6:,.0f} M parameters, kept gathered, and one block, "
        f"{block / 1e6:,.0f} M, with the next prefetched"
    )
    biggest = max(v for k, v in at.items())
    return Spread(
        states, fraction, biggest - kept, kept, 0, words, root_w + block_w,
        at=at, moment_shards=shards, block_shard=block_shard, block_grads=block_g,
    )  # fmt: skip


def _fsdp1(
    sharding: str,
    shared: dict[str, int],
    local: dict[str, int],
    fraction: float,
    c: Counts,
    mesh: Mesh,
    ranks: int,
    weight_bytes: int,
    grad_bytes: int,
    trainable_fraction: float,
    root_unsynced: bool,
    blocks_unsynced: bool,
) -> Spread:
    """FSDP1's share (see the module's docstring): flat units padded to a multiple of the
    ranks, the root gathered from its forward to its gradient, the moment a unit's gradient is
    made, and the gradients ``no_sync()`` keeps unsharded: each unit's (the root's, the
    blocks') whole, unpadded, where it holds a trainable weight (``tests/fit_fsdp1_ranks.py``
    counts each of these)."""

    def padded(n: int) -> int:
        return -(-n // ranks) * ranks

    root = (c.root if mesh.pp == 1 else max(c.root_tensors, default=0)) // mesh.tp
    block, layers = c.block // mesh.tp, -(-c.n_layers // mesh.pp)
    unpadded = root + layers * block
    units = (padded(root) if root else 0) + layers * padded(block)
    states = dict(shared)
    for k in SHARDED_BY_STAGE[sharding]:  # each sharded category stores the padding too
        if k in local:
            states[k] = local[k] * units // unpadded // ranks
    root_w = weight_bytes * padded(root) if root else 0
    block_w = weight_bytes * padded(block)
    # A unit's unsharded gradient: a block's fills its padded flat tensor; the root's is made
    # unpadded (its padded copy for the reduce-scatter comes after the root is resharded)
    block_g = int(grad_bytes * padded(block) * trainable_fraction)
    root_g = int(grad_bytes * root * trainable_fraction)
    # The head's gradient (the largest root tensor's), made first in backward, waits in autograd
    # for the root's flat parameter until the end: a view of it made before any block ran,
    # whose node autograd runs last (it runs the latest-made ready node first)
    head_g = int(grad_bytes * max(c.root_tensors, default=0) // mesh.tp * trainable_fraction)
    unsharded = grad_bytes * (root * root_unsynced + layers * block * blocks_unsynced)
    if sharding == "fsdp1-grad-op":  # every unit stays gathered through backward
        every_unit = root_w + layers * block_w
        words = "every unit, kept gathered"
        # the last block's gradient with every unit still gathered, or the root's alone with
        # the blocks resharded by then
        gathered = max(block_g + head_g, root_w + root_g - every_unit)
        return Spread(states, fraction, gathered, every_unit, 0, words, block_w, unsharded)
    # FULL_SHARD: the root kept from forward on; as a block's gradient is made, this block and
    # the next (prefetched: the root, already gathered, for the last) with its gradient and the
    # head's waiting; at the end the root's gradient
    this_and_next = (2 if layers > 1 else 1) * block_w
    gathered = max(this_and_next + block_g + head_g, root_g)
    words = (
        f"one block, {block / 1e6:,.0f} M parameters, and the next, prefetched, "
        f"beside the root, {root / 1e6:,.0f} M, kept gathered"
    )
    return Spread(states, fraction, gathered, root_w, 0, words, root_w + block_w, unsharded)
