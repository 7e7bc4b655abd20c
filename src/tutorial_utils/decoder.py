"""The course's decoder: one small config-driven GPT-2 / Llama-style language model.

One job: a decoder-only transformer whose shape comes from a ``DecoderConfig``, so that the
same code is a 60-thousand-parameter toy on a CPU and, built on the ``meta`` device, a
Llama-3.1-8B-shaped model with no weights at all (``PRESETS``). The "predict, measure,
reconcile" notebook counts its parameters by formula, measures its activations, and the "will
it fit" calculator (``tutorial_utils.fit``) runs it on fake tensors.

Read top to bottom like nanoGPT's ``model.py``: the config, the norm, attention, the MLP, a
block, the model. Two things are left out on purpose, and neither changes a byte of memory:

- Rotary position embeddings (Llama) have no weights, and ``scaled_dot_product_attention``
  saves the rotated ``q`` and ``k`` where it would save ``q`` and ``k``: the same bytes.
- Dropout: modern LLM recipes train without it (Llama, and GPT-2 fine-tunes usually). With
  dropout each mask costs one more byte per element (Korthikanti et al.'s formula counts them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from .models import _check, _initialised_with

__all__ = ["PRESETS", "Block", "Decoder", "DecoderConfig", "preset"]


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a decoder. The defaults are a toy that trains on a CPU in milliseconds."""

    vocab: int = 1000
    d_model: int = 64  # h
    n_layers: int = 2  # L
    n_heads: int = 4  # a
    n_kv_heads: int | None = None  # None: one key/value head per query head; fewer: GQA (Llama)
    d_ff: int | None = None  # the MLP's hidden width; None: 4 * d_model
    norm: str = "layer"  # "layer" (GPT-2: weight and bias) or "rms" (Llama: weight only)
    mlp: str = "gelu"  # "gelu" (two matrices, GPT-2) or "swiglu" (three, Llama)
    bias: bool = True  # biases in every Linear but the output head (GPT-2 yes, Llama no)
    tied: bool = True  # the output head shares the embedding's weight
    max_positions: int = 1024  # learned position embeddings (GPT-2); 0 for none (Llama: RoPE)
    attention: str = "sdpa"  # "sdpa" (F.scaled_dot_product_attention) or "explicit"
    d_head: int | None = None  # each head's width; None: d_model // n_heads (Gemma: 256)
    qkv_bias: bool = False  # biases on q, k and v even when ``bias`` is False (Qwen2)

    def __post_init__(self) -> None:
        # The smallest each size may be: no layers is an embedding alone (fit.py counts the
        # head that way), no positions is RoPE's; None is "the default" where the field allows.
        smallest = {"vocab": 1, "d_model": 1, "n_layers": 0, "n_heads": 1}
        smallest |= {"n_kv_heads": 1, "d_ff": 1, "max_positions": 0}
        for name, low in smallest.items():
            value = getattr(self, name)
            if value is None and name in ("n_kv_heads", "d_ff"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(
                    f"DecoderConfig.{name} must be a whole number >= {low}, not {value!r}"
                )
        if self.d_head is not None and (
            not isinstance(self.d_head, int) or isinstance(self.d_head, bool) or self.d_head < 1
        ):
            raise ValueError(
                f"DecoderConfig.d_head must be a whole number >= 1, not {self.d_head!r}"
            )
        if self.d_head is None and (self.n_heads < 1 or self.d_model % self.n_heads):
            raise ValueError(
                f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads}): "
                "each head gets d_model / n_heads dimensions"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})"
            )
        choices = {"norm": ("layer", "rms"), "mlp": ("gelu", "swiglu")}
        choices["attention"] = ("sdpa", "explicit")
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"DecoderConfig.{name} must be one of {allowed}, not {getattr(self, name)!r}"
                )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def q_dim(self) -> int:
        """The width of the queries (and of attention's output): d_model unless ``d_head``."""
        return self.n_heads * self.head_dim

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model


#: Real models' shapes (no weights): GPT-2 small and XL as OpenAI released them, Llama 3.2 1B,
#: Llama 3.1 8B and 70B as Meta's config.json files give them.
PRESETS: dict[str, DecoderConfig] = {
    "gpt2-124m": DecoderConfig(vocab=50257, d_model=768, n_layers=12, n_heads=12),
    "gpt2-1.5b": DecoderConfig(vocab=50257, d_model=1600, n_layers=48, n_heads=25),
    **{
        name: DecoderConfig(
            vocab=128256,
            d_model=h,
            n_layers=layers,
            n_heads=heads,
            n_kv_heads=8,
            d_ff=ff,
            norm="rms",
            mlp="swiglu",
            bias=False,
            tied=tied,
            max_positions=0,
        )
        for name, h, layers, heads, ff, tied in (
            ("llama-1b", 2048, 16, 32, 8192, True),
            ("llama-8b", 4096, 32, 32, 14336, False),
            ("llama-70b", 8192, 80, 64, 28672, False),
        )
    },
}


def preset(name: str, **changes) -> DecoderConfig:
    """A preset's config, with any field changed: ``preset("llama-8b", n_layers=1)``."""
    if name not in PRESETS:
        raise ValueError(f"no preset named {name!r}; choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **changes)


def _norm(cfg: DecoderConfig) -> nn.Module:
    if cfg.norm == "rms":
        return nn.RMSNorm(cfg.d_model, eps=1e-5)
    return nn.LayerNorm(cfg.d_model)


class Attention(nn.Module):
    """Causal self-attention; grouped-query when ``n_kv_heads < n_heads``."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        kv = cfg.kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, cfg.q_dim + 2 * kv, bias=cfg.bias or cfg.qkv_bias)
        self.proj = nn.Linear(cfg.q_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, h) -> (B, T, h)
        cfg = self.cfg
        B, T, _ = x.shape
        kv, h = cfg.kv_heads * cfg.head_dim, cfg.q_dim
        q, k, v = self.qkv(x).split([h, kv, kv], dim=-1)
        q = q.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (B, a, T, hd)
        k = k.view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)  # (B, a_kv, T, hd)
        v = v.view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        if cfg.attention == "sdpa":
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=cfg.kv_heads != cfg.n_heads
            )
        else:  # softmax(q k^T / sqrt(hd)) v, written out: the (B, a, T, T) scores are saved
            if cfg.kv_heads != cfg.n_heads:
                k = k.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
                v = v.repeat_interleave(cfg.n_heads // cfg.kv_heads, dim=1)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(cfg.head_dim))  # (B, a, T, T)
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, h))


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.up = nn.Linear(cfg.d_model, cfg.ff, bias=cfg.bias)
        if self.swiglu:
            self.gate = nn.Linear(cfg.d_model, cfg.ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, h) -> (B, T, h)
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.norm1 = _norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = _norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    """Token ids (B, T) -> logits (B, T, vocab). ``Decoder(preset("gpt2-124m"))`` on meta."""

    def __init__(self, cfg: DecoderConfig | None = None, seed: int = 0, **fields):
        super().__init__()
        if cfg is None:
            cfg = DecoderConfig(**fields)
        elif fields:
            cfg = replace(cfg, **fields)
        self.cfg = cfg
        _check("Decoder", seed=seed)
        with _initialised_with(seed):
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            self.positions = (
                nn.Embedding(cfg.max_positions, cfg.d_model) if cfg.max_positions else None
            )
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
            self.norm = _norm(cfg)
            self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
            if cfg.tied:
                self.head.weight = self.embed.weight  # one Parameter, counted once

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        x = self.embed(tokens)
        if self.positions is not None:
            if tokens.shape[1] > self.cfg.max_positions:
                raise ValueError(
                    f"sequences of {tokens.shape[1]} tokens are longer than this decoder's "
                    f"{self.cfg.max_positions} learned positions; use a shorter sequence"
                )
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
