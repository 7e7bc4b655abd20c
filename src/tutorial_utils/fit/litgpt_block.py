"""litgpt's block: the tensors litgpt 8641822's Llama block saves for backward, re-created.

One job: the calculator's ``block="litgpt"``. litgpt's resource tables (and its FSDP1 LoRA
rows) ran ``lit_gpt.lora.Block`` at commit 8641822, which saves other tensors for backward than
the course's block (``decoder.Block``, what torchtune's and torchtitan's blocks save). This
module is not litgpt's code: it is the smallest block whose operators allocate and save the
same tensors, each with the lines of litgpt it stands for (files at 8641822). Listed with
``saved_tensors_hooks`` on a small Llama shape (LoRA on q and v, bf16), in units of one
(tokens x d_model) bf16 tensor, litgpt's block saves against the course's:

- +2: q and k after RoPE. ``lit_gpt/model.py`` 201-220: q, k and v are views of the fused
  output (``permute``d per query group; ``reshape`` copies them only under grouped queries, k
  and v ``expand``ed to every head); RoPE (339-345) runs in fp32 (the cache is fp32:
  ``model.max_seq_length = longest_seq_length``, ``finetune/lora.py`` 176, rebuilds it with the
  default dtype) and is cast back, then ``torch.cat`` makes new q and k that SDPA saves, while
  its v, a view, keeps the whole fused output alive: the course's SDPA saves only that output.
- +2 (LoRA on q and v): ``zero_pad`` (``lit_gpt/lora.py`` 256-296): the adapters' output,
  reshaped (a copy), is ``index_copy``'d into ``new_zeros`` of the full q/k/v width, and
  ``index_copy``'s backward saves that source (and the index, made at every call); where the
  course concatenates zeros for k. Before it (351-386) one dropout, ``lora_A`` for every
  adapted part at once and ``conv1d`` with ``groups`` (298-331; a conv per part when their
  widths differ).
- +1 and -4: the norms. ``lit_gpt/rmsnorm.py`` 17-21 is unfused in bf16 (``x * x``, ``mean``,
  ``rsqrt``, ``x * rsqrt``, ``weight * x_normed``): it saves the residual and a bf16
  ``rsqrt``, where torch's ``rms_norm`` on a CPU saves an fp32 copy of each norm's input.
- +1 under QLoRA (the fake-tensor totals: one more than on a bf16 base): SDPA's output takes
  q's layout, contiguous per head here, so ``y.reshape(B, T, C)`` (229) copies it, and
  bitsandbytes' ``MatMul4Bit`` saves that copy as the projection's input (a frozen bf16
  linear saves no input).
- ``lit_gpt/model.py`` 157-170 and 301-305: the block's own lifetimes (``n_1`` and the
  attention's output live until it returns, ``fc_1`` and ``fc_2`` before the product) set its
  forward peak; ``LoRALinear`` (``lit_gpt/lora.py`` 143-150) on the projection and the MLP for
  the ``attention`` and ``all`` targets.

``tests/test_fit_litgpt_block.py`` holds it to the bytes litgpt's own block saved at that commit
(``tools/litgpt_block_bytes.py`` ran it, on fake tensors, with the calculator's books).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..decoder_config import DecoderConfig
from .activation_formulas import check_block
from .states import Lora

__all__ = ["COMMIT", "LitgptBlock"]

COMMIT = "8641822"  # Lightning-AI/litgpt, the resource tables' "LitGPT 8641822"
SCALING = 2.0  # alpha / r: finetune/lora.py's 16 / 8 (no byte depends on it)


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.empty(size)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # rmsnorm.py 19-21, no upcast
        return self.weight * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps))


def _dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """nn.Dropout as CUDA runs it: the fused kernel, a bool mask (see ``_LoraLinear``)."""
    return torch.native_dropout(x, p, True)[0] if p else x


class _QKV(nn.Module):
    """The fused q/k/v linear and, with LoRA, ``LoRAQKVLinear``'s adapters."""

    def __init__(self, cfg: DecoderConfig, lora: Lora | None):
        super().__init__()
        kv = cfg.kv_heads * cfg.head_dim
        self.linear = nn.Linear(cfg.d_model, cfg.q_dim + 2 * kv, bias=False)
        self.lora = lora
        if lora is None:
            return
        on = (True, lora.targets != "qv", True)
        self.widths = [w for w, o in zip((cfg.q_dim, kv, kv), on, strict=True) if o]
        self.grouped = cfg.kv_heads != cfg.n_heads
        self.lora_A = nn.Parameter(torch.empty(lora.rank * len(self.widths), cfg.d_model))
        self.lora_B = nn.Parameter(torch.empty(sum(self.widths), lora.rank))
        starts = (0, cfg.q_dim, cfg.q_dim + kv)
        index = [
            range(s, s + w) for s, w, o in zip(starts, (cfg.q_dim, kv, kv), on, strict=True) if o
        ]
        self.index = [j for r in index for j in r]  # lora.py 247-253

    def _zero_pad(self, x: torch.Tensor, width: int) -> torch.Tensor:
        if len(self.widths) == 3:
            return x
        x = x.transpose(0, 1)  # lora.py 290-296: the adapters' output scattered into zeros
        padded = x.new_zeros(*x.shape[:-1], width).view(-1, width)
        index = torch.tensor(self.index, device=x.device)  # made at every call
        padded = padded.index_copy(1, index, x.reshape(-1, sum(self.widths)))
        return padded.view(*x.shape[:-1], width).transpose(0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        if self.lora is None:
            return out
        after_a = F.linear(_dropout(x, self.lora.dropout), self.lora_A)
        low, weight = after_a.transpose(-2, -1), self.lora_B.unsqueeze(-1)
        if self.grouped:  # lora.py 319-331: a conv per part
            parts = zip(low.chunk(len(self.widths), 1), weight.split(self.widths), strict=True)
            after_b = torch.cat([F.conv1d(a, b) for a, b in parts], dim=1)
        else:
            after_b = F.conv1d(low, weight, groups=len(self.widths))
        after_b = after_b.transpose(-2, -1)  # (B, T, adapted widths): alive until the return
        lora = self._zero_pad(after_b, out.shape[-1]) * SCALING
        return out + lora


class _Linear(nn.Module):
    """``LoRALinear``: a frozen linear, plus ``dropout(x) @ A.T @ B.T * scaling`` with LoRA."""

    def __init__(self, n_in: int, n_out: int, lora: Lora | None):
        super().__init__()
        self.linear, self.lora = nn.Linear(n_in, n_out, bias=False), lora
        if lora is not None:
            self.lora_A = nn.Parameter(torch.empty(lora.rank, n_in))
            self.lora_B = nn.Parameter(torch.empty(n_out, lora.rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        if self.lora is None:
            return out
        low = _dropout(x, self.lora.dropout) @ self.lora_A.transpose(0, 1)
        return out + (low @ self.lora_B.transpose(0, 1)) * SCALING


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2  # model.py 339-345: fp32 products, cast back to x's dtype
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return ((x * cos) + (rotated * sin)).type_as(x)


class LitgptBlock(nn.Module):
    """One litgpt Llama block (the LoRA targets as ``lora`` names them), called as ``block(x)``:
    the RoPE cache is the block's fp32 buffer here, a view of the model's in litgpt."""

    def __init__(self, cfg: DecoderConfig, lora: Lora | None = None, seq: int = 1):
        super().__init__()
        check_block(cfg, "litgpt")
        self.cfg = cfg
        adapt = lora if lora is not None and lora.targets != "qv" else None
        mlp = lora if lora is not None and lora.targets == "all" else None
        self.norm_1, self.norm_2 = _RMSNorm(cfg.d_model), _RMSNorm(cfg.d_model)
        self.qkv = _QKV(cfg, lora)
        self.proj = _Linear(cfg.q_dim, cfg.d_model, adapt)
        self.fc_1, self.fc_2 = (_Linear(cfg.d_model, cfg.ff, mlp) for _ in range(2))
        self.down = _Linear(cfg.ff, cfg.d_model, mlp)
        self.register_buffer("cos", torch.empty(seq, cfg.head_dim))
        self.register_buffer("sin", torch.empty(seq, cfg.head_dim))
        if lora is not None:
            self.requires_grad_(False)
            for name, p in self.named_parameters():
                p.requires_grad_("lora_" in name)  # lora.py 389-405: only the adapters train

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for name in ("cos", "sin"):  # the RoPE cache stays fp32 when the weights are cast
            self._buffers[name] = self._buffers[name].float()
        return self

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        groups, hd = cfg.kv_heads, cfg.head_dim
        per = cfg.n_heads // groups
        qkv = self.qkv(x).view(B, T, groups, per + 2, hd).permute(0, 2, 3, 1, 4)
        q, k, v = qkv.split((per, 1, 1), dim=2)
        if groups != 1:  # model.py 208-211
            k, v = (t.expand(B, groups, per, T, hd) for t in (k, v))
        q, k, v = (t.reshape(B, -1, T, hd) for t in (q, k, v))  # copies: permuted
        cos, sin = self.cos[:T], self.sin[:T]
        q_roped, k_roped = _rope(q, cos, sin), _rope(k, cos, sin)  # both before the cats
        q = torch.cat((q_roped, q[..., hd:]), dim=-1)
        k = torch.cat((k_roped, k[..., hd:]), dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(hd))
        return self.proj(y.transpose(1, 2).reshape(B, T, cfg.q_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n_1 = self.norm_1(x)
        h = self._attention(n_1)  # model.py 157-170: n_1 and h live until the block returns
        x = x + h
        n_2 = self.norm_2(x)
        x_fc_1, x_fc_2 = self.fc_1(n_2), self.fc_2(n_2)  # model.py 301-305, in this order
        return x + self.down(F.silu(x_fc_1) * x_fc_2)
