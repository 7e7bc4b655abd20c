"""The model's shapes: a ``DecoderConfig`` for a preset or a config.json, and its counts.

One job: from what ``presets`` read, the course's decoder config, and the parameter counts the
terms need (the whole model, one block, the root that FSDP wraps last, the weights LoRA adapts),
counted on a one-block model built on ``meta`` (nothing allocated) and cached per shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..decoder import PRESETS as DECODER_PRESETS
from ..decoder import Decoder, DecoderConfig
from . import presets

__all__ = ["Counts", "config", "counts", "lora_counts"]


def config(name_or_fields: str | dict | DecoderConfig) -> tuple[str, DecoderConfig]:
    """(a label, the config) for a preset name (read by ``presets.model``), the fields of a
    config.json (``presets.from_config_json``) or a ``DecoderConfig`` of your own."""
    if isinstance(name_or_fields, DecoderConfig):
        return "custom decoder", name_or_fields
    if isinstance(name_or_fields, dict):
        try:
            return "custom decoder", DecoderConfig(**name_or_fields)
        except (TypeError, ValueError) as err:
            raise ValueError(f"these dimensions make no decoder: {err}") from None
    label = presets.model(name_or_fields)
    if label in DECODER_PRESETS:
        return label, DECODER_PRESETS[label]
    return label, DecoderConfig(**presets.PRESETS[label].fields)


@dataclass(frozen=True)
class Counts:
    """Parameter counts of one shape (elements, not bytes)."""

    total: int
    block: int  # one block's
    largest_tensor: int  # the largest single parameter (the embedding, usually)
    block_tensors: tuple[int, ...]  # each of one block's parameters
    root_tensors: tuple[int, ...]  # each parameter outside the blocks (embedding, norm, head)
    n_layers: int

    @property
    def root(self) -> int:
        """What is not in a block: embedding, positions, final norm, untied head."""
        return sum(self.root_tensors)

    def tensors(self) -> list[int]:
        """Every parameter's element count, the root's first."""
        return [*self.root_tensors, *self.block_tensors * self.n_layers]


@functools.cache
def counts(cfg: DecoderConfig) -> Counts:
    """The counts of ``cfg``, from a one-block model built on meta."""
    with torch.device("meta"):
        model = Decoder(cfg, n_layers=1)
    block = tuple(p.numel() for p in model.blocks[0].parameters())
    inside = {id(p) for p in model.blocks[0].parameters()}
    root = tuple(p.numel() for p in model.parameters() if id(p) not in inside)
    total = sum(root) + cfg.n_layers * sum(block)
    largest = max(p.numel() for p in model.parameters())
    return Counts(total, sum(block), largest, block, root, cfg.n_layers)


#: The linear layers of one block each LoRA target adapts, as (in, out) features.
def _lora_shapes(cfg: DecoderConfig, targets: str) -> list[tuple[int, int]]:
    h, kv, q, f = cfg.d_model, cfg.kv_heads * cfg.head_dim, cfg.q_dim, cfg.ff
    if targets == "qv":
        return [(h, q), (h, kv)]
    shapes = [(h, q), (h, kv), (h, kv), (q, h)]  # q, k, v, output projections
    if targets == "all":
        shapes += [(h, f), (f, h)] + ([(h, f)] if cfg.mlp == "swiglu" else [])
    return shapes


def lora_counts(cfg: DecoderConfig, rank: int, targets: str) -> tuple[int, tuple[int, ...]]:
    """(LoRA's trainable parameters, each adapter matrix's numel in one block): A (r x in)
    and B (out x r) for every adapted linear of every block (torchtune's LoRALinear)."""
    one = []
    for fan_in, fan_out in _lora_shapes(cfg, targets):
        one += [rank * fan_in, fan_out * rank]
    return cfg.n_layers * sum(one), tuple(one)
