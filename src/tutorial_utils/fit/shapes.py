"""The model's shapes: a ``DecoderConfig`` for a preset or a config.json, and its counts.

One job: from what ``presets`` read, the course's decoder config, and the parameter counts the
terms need (the whole model, one block, the root that FSDP wraps last, the weights LoRA adapts),
each read from the shape by formula (``decoder.Decoder``'s parameters in the order it makes
them; ``tests/test_fit_activation_terms.py`` checks them against a model built on ``meta``),
with no torch, and cached per shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..decoder_config import PRESETS as DECODER_PRESETS
from ..decoder_config import DecoderConfig
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


def _norm(cfg: DecoderConfig) -> list[int]:
    return [cfg.d_model] * (2 if cfg.norm == "layer" else 1)  # weight (and LayerNorm's bias)


def _linear(fan_in: int, fan_out: int, bias: bool) -> list[int]:
    return [fan_out * fan_in] + ([fan_out] if bias else [])


@functools.cache
def counts(cfg: DecoderConfig) -> Counts:
    """The counts of ``cfg``: each parameter of ``decoder.Decoder`` in the order it makes them
    (norm1, attention's qkv and proj, norm2, the MLP's up, gate and down; the embedding,
    positions, final norm and an untied head around the blocks)."""
    h, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    block = [*_norm(cfg), *_linear(h, cfg.q_dim + 2 * kv, cfg.bias or cfg.qkv_bias)]
    block += [*_linear(cfg.q_dim, h, cfg.bias), *_norm(cfg), *_linear(h, cfg.ff, cfg.bias)]
    if cfg.mlp == "swiglu":
        block += _linear(h, cfg.ff, cfg.bias)
    block += _linear(cfg.ff, h, cfg.bias)
    root = [cfg.vocab * h] + ([cfg.max_positions * h] if cfg.max_positions else [])
    root += _norm(cfg) + ([] if cfg.tied else [cfg.vocab * h])
    total = sum(root) + cfg.n_layers * sum(block)
    largest = max(root + block)
    return Counts(total, sum(block), largest, tuple(block), tuple(root), cfg.n_layers)


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
