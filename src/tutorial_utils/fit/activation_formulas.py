"""Activations by formula, without torch: what the fake-tensor pass books, from the shape alone.

One job: answer ``activations.activations(...)`` (one block, and the embedding + head + loss)
without importing torch, which takes seconds. For a block family (RMSNorm + SwiGLU: Llama,
Mistral, Qwen2, Gemma; LayerNorm + GELU: GPT-2), a recipe's module dtype, a checkpointing mode
and a LoRA target set, every figure the pass books is a sum of whole-number multiples of the
shape's products (tokens x d_model, d_model x d_ff, vocab x d_model, ...), or the larger of 0
and such a sum less what the part already holds or its weight gradients (a moment that stays
under what is counted already). A backward's peak is the largest of several such sums, one per
moment (under checkpointing: while the block is recomputed, while its MLP's gradients are
made, ...): ``tools/fit_activation_terms.py`` finds each moment's sum from the pass's own
bookings on small shapes and writes them to ``activation_terms``;
``tests/test_fit_activation_terms.py`` runs the pass again on every preset family's real
shapes and asserts the formula equals it, to the byte.

Where no formula is written, the pass runs (torch is imported then): cross-entropy in chunks
(each chunk's size is rounded up), explicit attention (its s x s scores are not a multiple of
the tokens), any other block (a LayerNorm + SwiGLU block from ``--dims``), LoRA on an NF4 base
or with dropout, litgpt's block under grouped queries, and any case the tool could not solve
(``activation_terms.MISSING``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction

from ..decoder_config import DecoderConfig

__all__ = [
    "BF16_MODULE",
    "FEATURES",
    "Pass",
    "activations",
    "by_formula",
    "check_block",
    "same_module",
]

#: The recipes whose module itself is bf16 (its activations are bf16 too).
BF16_MODULE = ("bf16-master", "bf16-master-fp32-grads", "pure-bf16")


@dataclass(frozen=True)
class Pass:
    """One part's forward and backward on fake tensors, in bytes above what it started with.

    ``held``: kept at the end of forward (saved tensors and the output); ``forward_over``: the
    forward's peak above ``held``; ``backward_over``: backward's peak above ``held``, less the
    weight gradients (``grads``, a category of their own). By formula, a block's
    ``forward_over`` is None (no moment reads it).
    """

    held: int
    forward_over: int | None
    backward_over: int
    grads: int


def check_block(cfg: DecoderConfig, block: str) -> None:
    """litgpt's block (``fit.litgpt_block``) is its Llama block: RMSNorm, SwiGLU, no biases, the
    heads spanning d_model; one sentence for another shape."""
    if block != "litgpt":
        return
    if (cfg.norm, cfg.mlp, cfg.bias, cfg.qkv_bias) != ("rms", "swiglu", False, False):
        raise ValueError(
            "block='litgpt' re-creates litgpt 8641822's Llama block (RMSNorm, SwiGLU, no "
            "biases); this model is not one: use block='course'"
        )
    if cfg.q_dim != cfg.d_model:
        raise ValueError(
            "litgpt 8641822's attention projects back from d_model, so its heads must span it "
            "(head width x heads == d_model): use block='course' for this model"
        )


def same_module(precision: str) -> str:
    """The recipe whose activations ``precision``'s equal (one cache entry for the bf16 ones)."""
    return "bf16-master" if precision in BF16_MODULE else precision


#: The products a figure is a multiple of: T tokens (batch x seq), h d_model, q the queries'
#: width, kv the keys' (kv heads x head width), f d_ff, a heads, V vocab, P learned positions,
#: r LoRA's rank; ``t`` is 1 for a tied head, ``b`` 1 where q, k and v have biases, ``p`` 1
#: where positions are learned (their embedding is looked up once per sequence: s, not T).
FEATURES = (
    "1", "h", "q", "kv", "f", "a", "V", "r", "P", "t",
    "h*q", "h*kv", "h*f", "V*h", "P*h", "r*h", "r*q", "r*kv", "r*f", "t*V*h", "b*q", "b*kv",
    "T", "T*h", "T*q", "T*kv", "T*f", "T*a", "T*V", "T*r", "t*T", "t*T*h", "t*T*V",
    "p*s", "p*s*h",
)  # fmt: skip

#: The fields in the order they are computed (held and grads first: the others may use them).
#: A block's ``forward_over`` is read by no moment of the step (``peak``): not written, None.
FIELDS = (
    ("block", "held"),
    ("block", "grads"),
    ("block", "backward_over"),
    ("head", "held"),
    ("head", "grads"),
    ("head", "forward_over"),
    ("head", "backward_over"),
)


def features(cfg: DecoderConfig, batch: int, seq: int, rank: int) -> tuple[int, ...]:
    """Each of ``FEATURES`` for a shape, a batch, a sequence length and a LoRA rank (0: none)."""
    h, q, kv, f = cfg.d_model, cfg.q_dim, cfg.kv_heads * cfg.head_dim, cfg.ff
    a, V, P, r, T, s = cfg.n_heads, cfg.vocab, cfg.max_positions, rank, batch * seq, seq
    t, b, p = int(cfg.tied), int(cfg.bias or cfg.qkv_bias), int(cfg.max_positions > 0)
    return (
        1, h, q, kv, f, a, V, r, P, t,
        h * q, h * kv, h * f, V * h, P * h, r * h, r * q, r * kv, r * f, t * V * h, b * q, b * kv,
        T, T * h, T * q, T * kv, T * f, T * a, T * V, T * r, t * T, t * T * h, t * T * V,
        p * s, p * s * h,
    )  # fmt: skip


def subtracted(part: Pass | dict, less: str) -> int:
    """What a figure's sum is compared with: nothing, the part's grads, held, or both."""
    get = part.get if isinstance(part, dict) else lambda name: getattr(part, name)
    return {
        "nothing": 0,
        "grads": get("grads"),
        "held": get("held"),
        "held+grads": get("held") + get("grads"),
    }[less]


def evaluate(terms, less: str, feats: tuple[int, ...], known) -> int:
    """``sum(multiple x feature)`` (the largest such sum, given several), or
    ``max(0, that - subtracted(known, less))``."""
    where = dict(zip(FEATURES, feats, strict=True))
    sums = []
    for one in terms if isinstance(terms, list) else [terms]:
        total = sum(Fraction(m) * where[name] for name, m in one.items())
        if total.denominator != 1:
            raise ArithmeticError(f"the terms {one} give a fraction of a byte: regenerate them")
        sums.append(int(total))
    total = max(sums)
    return total if less == "nothing" else max(0, total - subtracted(known, less))


def _case(
    cfg: DecoderConfig,
    precision: str,
    checkpointing: str,
    lora,
    ce_chunks: int,
    block: str = "course",
):
    """The key of ``activation_terms.TERMS`` for this question, or None (no formula). litgpt's
    block is a family of its own (``rms-swiglu-litgpt``)."""
    family = {("rms", "swiglu", False): "rms-swiglu", ("layer", "gelu", True): "layer-gelu"}
    name = family.get((cfg.norm, cfg.mlp, cfg.bias))
    if name is None or cfg.attention != "sdpa" or ce_chunks != 1:
        return None
    if block == "litgpt":  # solved for one kv head per query head: GQA's reshapes copy
        if cfg.kv_heads != cfg.n_heads:
            return None
        name += "-litgpt"
    if lora is not None and (lora.base != "bf16" or getattr(lora, "dropout", 0)):
        return None  # solved for adapters on a bf16 base without dropout only
    if precision == "fp32":
        recipe = "fp32"
    elif precision.startswith("autocast"):
        recipe = "autocast"  # the pass autocasts to bf16 for fp16 too: the same sizes
    elif precision in BF16_MODULE:
        recipe = "bf16-module"
    else:
        return None
    head = "tied" if cfg.tied else "untied"
    return (name, head, recipe, checkpointing, "none" if lora is None else lora.targets)


def by_formula(
    cfg: DecoderConfig,
    batch: int,
    seq: int,
    precision: str,
    checkpointing: str,
    lora=None,
    ce_chunks: int = 1,
    block: str = "course",
) -> tuple[Pass, Pass] | None:
    """(one block, the embedding + head + loss) by formula, or None where none is written."""
    from .activation_terms import TERMS

    key = _case(cfg, precision, checkpointing, lora, ce_chunks, block)
    if key not in TERMS:
        return None
    feats = features(cfg, batch, seq, 0 if lora is None else lora.rank)
    parts: dict[str, dict] = {"block": {"forward_over": None}, "head": {}}
    for part, field in FIELDS:
        terms, less = TERMS[key][f"{part}.{field}"]
        parts[part][field] = evaluate(terms, less, feats, parts[part])
    return Pass(**parts["block"]), Pass(**parts["head"])


@functools.lru_cache(maxsize=256)
def activations(
    cfg: DecoderConfig,
    batch: int,
    seq: int,
    precision: str,
    checkpointing: str,
    lora=None,
    ce_chunks: int = 1,
    block: str = "course",
) -> tuple[Pass, Pass]:
    """(one block, the embedding + head + loss): by formula where one is written, otherwise
    on fake tensors (``activations.activations``, which imports torch). ``block``: the
    course's, or ``"litgpt"`` (``fit.litgpt_block``)."""
    check_block(cfg, block)
    found = by_formula(cfg, batch, seq, precision, checkpointing, lora, ce_chunks, block)
    if found is not None:
        return found
    from . import activations as fake

    return fake.activations(cfg, batch, seq, precision, checkpointing, lora, ce_chunks, block)
