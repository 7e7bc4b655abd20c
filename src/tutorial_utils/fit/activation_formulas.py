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

QLoRA's frozen base in NF4 is a LoRA key word of its own (``lora_word``: "attention+nf4"). Under
cross-entropy in chunks only the head changes: its figures come from a head-only case keyed by
``CHUNKED`` (which does not depend on checkpointing or on which block linears LoRA adapts), the
block's from the question's own key.

Where no formula is written, the pass runs (torch is imported then): cross-entropy in pieces of
unequal length (``pieces``), explicit attention (its s x s scores are not a multiple of the
tokens), any other block (a LayerNorm + SwiGLU block from ``--dims``), LoRA with dropout,
litgpt's block under grouped queries, and any
case the tool has not solved (``activation_terms.MISSING`` lists those it tried).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction

from ..decoder_config import DecoderConfig

__all__ = [
    "BF16_MODULE",
    "CHUNKED",
    "FEATURES",
    "Pass",
    "activations",
    "by_formula",
    "check_block",
    "lora_word",
    "pieces",
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
    "k", "m", "C", "L", "C*V", "L*V",
)  # fmt: skip
#: ``k``, ``C`` and ``L``: cross-entropy in chunks (``ce_chunks``) splits the T tokens with
#: ``Tensor.chunk`` into k pieces of C tokens, the last of L (``pieces``; k = 1 and C = L = T
#: without chunks: the same columns as T, which the tool solves with first); ``m`` is
#: min(k, 3), the fp32 scalars of the loss's running sum alive at once (the sum so far, the
#: piece's part, their new sum).

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


def pieces(tokens: int, chunks: int) -> tuple[int, int, int] | None:
    """(k, C, L): ``Tensor.chunk(chunks)`` over ``tokens`` gives k pieces of C = ceil(tokens /
    chunks), the last of L. The formulas are solved where the pieces are equal (tokens a
    multiple of the chunks: k = chunks, C = L); otherwise None and the pass answers (a shorter
    last piece moves the loss's peak to another piece, a moment of its own)."""
    if tokens % chunks:
        return None
    return chunks, tokens // chunks, tokens // chunks


def features(
    cfg: DecoderConfig, batch: int, seq: int, rank: int, ce_chunks: int = 1
) -> tuple[int, ...]:
    """Each of ``FEATURES`` for a shape, a batch, a sequence length, a LoRA rank (0: none) and
    the cross-entropy's chunks."""
    h, q, kv, f = cfg.d_model, cfg.q_dim, cfg.kv_heads * cfg.head_dim, cfg.ff
    a, V, P, r, T, s = cfg.n_heads, cfg.vocab, cfg.max_positions, rank, batch * seq, seq
    t, b, p = int(cfg.tied), int(cfg.bias or cfg.qkv_bias), int(cfg.max_positions > 0)
    k, C, L = pieces(T, ce_chunks) or (0, 0, 0)
    return (
        1, h, q, kv, f, a, V, r, P, t,
        h * q, h * kv, h * f, V * h, P * h, r * h, r * q, r * kv, r * f, t * V * h, b * q, b * kv,
        T, T * h, T * q, T * kv, T * f, T * a, T * V, T * r, t * T, t * T * h, t * T * V,
        p * s, p * s * h,
        k, min(k, 3), C, L, C * V, L * V,
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


def lora_word(lora) -> str:
    """A question's last key word: "none" without LoRA, else its targets, and "+" the frozen
    base's storage where it is not the recipe's own dtype (QLoRA: ``"attention+nf4"``)."""
    if lora is None:
        return "none"
    return lora.targets if lora.base == "bf16" else f"{lora.targets}+{lora.base}"


#: The head's key word in place of checkpointing under chunked cross-entropy (any count of
#: chunks; ``f"{CHUNKED}-{n}"`` where a formula holds for n chunks only).
CHUNKED = "ce-chunks"


def _frozen_head(cfg: DecoderConfig, lora) -> str:
    """The head's last key word under chunked cross-entropy: its pass does not depend on
    checkpointing (it runs none) or on which block linears LoRA adapts, only on whether the head
    is frozen and, for bitsandbytes, whether its own weight is in NF4 (an untied head:
    Lightning replaces every ``nn.Linear``)."""
    if lora is None:
        return "none"
    return "lora+bnb-nf4" if lora.base == "bnb-nf4" and not cfg.tied else "lora"


def _case(
    cfg: DecoderConfig,
    precision: str,
    checkpointing: str,
    lora,
    ce_chunks: int,
    block: str = "course",
):
    """The keys of ``activation_terms.TERMS`` whose block and head figures answer this question
    (one key, or the block's and the head's under chunked cross-entropy), or None (no formula).
    litgpt's block is a family of its own (``rms-swiglu-litgpt``)."""
    family = {("rms", "swiglu", False): "rms-swiglu", ("layer", "gelu", True): "layer-gelu"}
    name = family.get((cfg.norm, cfg.mlp, cfg.bias))
    if name is None or cfg.attention != "sdpa":
        return None
    if block == "litgpt":  # solved for one kv head per query head: GQA's reshapes copy
        if cfg.kv_heads != cfg.n_heads:
            return None
        name += "-litgpt"
    if name == "layer-gelu" and (cfg.kv_heads != cfg.n_heads or cfg.q_dim != cfg.d_model):
        return None  # solved on GPT-2's shapes only: a key and a value head per query head
    if lora is not None and getattr(lora, "dropout", 0):
        return None  # solved for adapters without dropout only
    if precision == "fp32":
        recipe = "fp32"
    elif precision.startswith("autocast"):
        recipe = "autocast"  # the pass autocasts to bf16 for fp16 too: the same sizes
    elif precision in BF16_MODULE:
        recipe = "bf16-module"
    else:
        return None
    head = "tied" if cfg.tied else "untied"
    block = (name, head, recipe, checkpointing, lora_word(lora))
    if ce_chunks == 1:
        return block, block
    return block, (name, head, recipe, CHUNKED, _frozen_head(cfg, lora))


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

    keys = _case(cfg, precision, checkpointing, lora, ce_chunks, block)
    if keys is not None and ce_chunks > 1 and keys[1] not in TERMS:  # solved for this count only
        keys = (keys[0], (*keys[1][:3], f"{CHUNKED}-{ce_chunks}", keys[1][4]))
    if keys is None or not all(key in TERMS for key in keys):
        return None
    if ce_chunks > 1 and pieces(batch * seq, ce_chunks) is None:
        return None
    feats = features(cfg, batch, seq, 0 if lora is None else lora.rank, ce_chunks)
    parts: dict[str, dict] = {"block": {"forward_over": None}, "head": {}}
    for part, field in FIELDS:
        entry = TERMS[keys[0] if part == "block" else keys[1]]
        if f"{part}.{field}" not in entry:
            return None
        terms, less = entry[f"{part}.{field}"]
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
