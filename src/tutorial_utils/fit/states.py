"""The model states: weights, gradients, master weights and optimizer state, whole.

One job: the bytes of each category for the whole model (no sharding: ``profiles`` divides
them), for a precision recipe, an optimizer, and LoRA or QLoRA when only adapters train.

- Full training: ``formulas.model_state_bytes`` (bytes per parameter of the recipe, the
  optimizer's fp32 moments; Adam's ``step`` counters stay on the CPU on a GPU).
- 8-bit AdamW (bitsandbytes ``AdamW8bit``, ``PagedAdamW8bit``): each moment one byte per
  element and one fp32 absmax per block of 256 elements (block-wise quantization), for each
  tensor of 4096 elements or more (``min_8bit_size``); smaller tensors keep fp32 moments.
  ``paged-adamw8bit`` allocates the same state as CUDA unified memory, outside PyTorch's
  caching allocator: it counts 0 in PyTorch's peak and the driver pages it out under pressure.
- LoRA (``lora_rank``): the base is frozen (its weights only, in the recipe's weight dtype, or
  NF4 under QLoRA) and the adapters train: A (r x in) and B (out x r) per adapted linear.
  NF4 (torchao's ``NF4Tensor``, as torchtune's QLoRA): 4 bits per weight, one int8 scale per
  block of 64 and one fp32 factor per 256 such scales: 0.5 + 1/64 + 1/4096 bytes per weight,
  for the blocks' linear weights; the embedding, norms and head stay in the recipe's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import formulas
from ..decoder_config import DecoderConfig
from .shapes import counts, lora_counts

__all__ = ["STATES", "Lora", "States", "model_states", "nf4_bytes"]

STATES = ("weights", "gradients", "master weights", "optimizer state")


@dataclass(frozen=True)
class Lora:
    """LoRA's knobs: the rank, which linears (``inputs.LORA_TARGETS``) and the frozen base's
    storage: ``"bf16"`` (the recipe's weight dtype) or ``"nf4"`` (QLoRA)."""

    rank: int
    targets: str = "attention"
    base: str = "bf16"


@dataclass(frozen=True)
class States:
    """The whole model's states by category, and the trainable tensors' element counts (what
    the optimizer steps and ``temporaries`` sizes)."""

    bytes: dict[str, int]
    trainable: tuple[int, ...]
    n_trainable: int


def nf4_bytes(n: int) -> int:
    """Bytes of ``n`` weights stored as NF4 (4 bits, an int8 scale per 64, fp32 per 256 scales)."""
    blocks = math.ceil(n / 64)
    return math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / 256)


def _adamw8bit(numels) -> int:
    total = 0
    for n in numels:
        total += 2 * n + 2 * 4 * math.ceil(n / 256) if n >= 4096 else 8 * n
    return total


def model_states(
    cfg: DecoderConfig, precision: str, optimizer: str, lora: Lora | None = None
) -> States:
    """The whole model's states (see the module's docstring)."""
    c = counts(cfg)
    per = formulas.BYTES_PER_PARAMETER[precision]
    if lora is None:
        trainable = tuple(c.tensors())
        frozen_bytes = 0
    else:
        n_lora, one_block = lora_counts(cfg, lora.rank, lora.targets)
        trainable = one_block * cfg.n_layers
        if lora.base == "nf4":  # the blocks' linear weights quantized, the rest as the recipe
            linear = sum(n for n in c.block_tensors if n > cfg.d_model) * cfg.n_layers
            frozen_bytes = nf4_bytes(linear) + per["weights"] * (c.total - linear)
        else:
            frozen_bytes = per["weights"] * c.total
    n = sum(trainable)
    base_optimizer = "adamw" if optimizer in ("adamw8bit", "paged-adamw8bit") else optimizer
    s = formulas.model_state_bytes(n, precision, base_optimizer)
    state = s.optimizer_state
    if optimizer == "adamw8bit":
        state = _adamw8bit(trainable)
    elif optimizer == "paged-adamw8bit":
        state = 0  # unified memory, outside PyTorch's allocator (see the docstring)
    whole = {
        "weights": s.weights + frozen_bytes,
        "gradients": s.gradients,
        "master weights": s.master,
        "optimizer state": state,
    }
    return States(whole, trainable, n)
