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
from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F

from .decoder_config import PRESETS, DecoderConfig, preset
from .models import _check, _initialised_with

__all__ = ["PRESETS", "Block", "Decoder", "DecoderConfig", "preset"]


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
