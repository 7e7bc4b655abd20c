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
- **FSDP2** (``fully_shard``, per-parameter DTensor shards): ZeRO-3's states and units, plus
  ``reshard_after_forward=False`` (every block's gathered weights kept from forward to
  backward, in storage of their own beside the shards) and
  ``MixedPrecisionPolicy(reduce_dtype=float32)`` over 16-bit parameters (each unit's gradients
  cast to fp32 before the reduce-scatter: 4 more bytes per unit parameter).
  ``tests/test_fit_profiles.py`` holds DDP, ZeRO-1 and FSDP2 to what 2 gloo ranks measure.
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
    unit_n, name = max(
        (c.root, "the root (embedding, final norm, output head)"), (c.block, "one block")
    )
    unit_n = unit_n // mesh.tp
    words = f"{name}, {unit_n / 1e6:,.0f} M parameters"
    grads = int(grad_bytes * unit_n * trainable_fraction)
    w = weight_bytes * unit_n
    # Gathered weights live in their own storage, beside the shards (zero_stages.py measures it)
    every_unit = int(weight_bytes * stage_n / mesh.tp)
    extra = 4 * unit_n if sharding == "fsdp2" and reduce_fp32 and grad_bytes < 4 else 0
    if sharding == "fsdp2" and not reshard_after_forward:  # every unit kept from forward on
        return Spread(shared, fraction, grads + extra, every_unit, 0, words, w)
    return Spread(shared, fraction, w + grads + extra, 0, 0, words, w)


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
