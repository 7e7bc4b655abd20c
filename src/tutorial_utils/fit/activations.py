"""Activations: what one block, and the embedding + head + loss, hold for backward.

One job: run ONE block forward and backward on fake tensors (``FakeTensorMode``, the same books
as ``memory.estimate``) at the real batch and sequence length, under the recipe's autocast and
checkpointing, and book what it holds; the same for the embedding, final norm, output head and
loss (the logits upcast to fp32 for the cross-entropy, ``logits.float()``, as training code
does; with ``ce_chunks`` the upcast and the loss go chunk by chunk, as torchtune's
``CEWithChunkedOutputLoss``). Every block is the same code on the same shapes, so the moments
multiply the block's figures by the number of layers. Nothing is allocated, at any size; each
answer is cached per shape.

With LoRA the block's linears are frozen and each adapted one gains A and B (``_LoraLinear``,
torchtune's LoRALinear, with its dropout when the recipe has one): what autograd saves then is
what a LoRA step saves. Under QLoRA each frozen linear stores its weight in NF4 and makes a bf16
copy for every matmul, forward and backward (``_Nf4Linear``), the way the recipe's library does.
With ``block="litgpt"`` the block is ``litgpt_block.LitgptBlock``: what litgpt 8641822's saves.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
from torch import nn
from torch.nn import functional as F

from ..decoder import Block, Decoder, DecoderConfig
from .activation_formulas import BF16_MODULE, Pass, same_module
from .states import Lora

__all__ = [
    "BF16_MODULE",
    "Pass",
    "activations",
    "cross_entropy",
    "same_module",
    "stream_dtype",
    "with_lora",
]


def _matmul_policy(every: int):
    """Save attention's output and every ``every``-th matmul's; recompute the rest.

    ``every=1`` keeps every matmul (norms, activation functions and adds are recomputed).
    ``every=2`` is torchtitan's selective op policy (``torchtitan/distributed/
    activation_checkpoint.py``, ``_get_custom_policy``: "Save all compute/comm ops, except
    every second mm/linear"), its count restarting in each block. torchtitan counts ``aten.mm``
    (its Llama has no biases); this counts ``addmm`` too, so a GPT-2 block is treated the same.
    The course's block computes q, k and v in one matmul where torchtitan's has three, so here
    the saved matmuls are qkv, the MLP's gate and its down projection (torchtitan's: q, v, w1,
    w2): 1024 more values per token for Llama 8B, under 4 % of the block.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    matmuls = {aten.mm.default, aten.addmm.default, aten.bmm.default}
    attention = {
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
    }
    count = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs):
        if op in attention:
            return CheckpointPolicy.MUST_SAVE
        if op in matmuls:
            mode = "recompute" if ctx.is_recompute else "forward"
            count[mode] += 1
            if (count[mode] - 1) % every == 0:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _run(module: nn.Module, x: torch.Tensor, checkpointing: str) -> torch.Tensor:
    if checkpointing == "none":
        return module(x)
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    if checkpointing == "full":
        return checkpoint(module, x, use_reentrant=False)
    every = 1 if checkpointing == "every-matmul" else 2

    def contexts():  # a fresh policy (and count) for each call, as torchtitan makes one
        return create_selective_checkpoint_contexts(_matmul_policy(every))

    return checkpoint(module, x, use_reentrant=False, context_fn=contexts)


class _Nf4Dequantized(torch.autograd.Function):
    """``x @ W.T`` for an NF4 weight: a bf16 copy of W is made for the matmul and dropped after
    it, in forward and again in backward. ``layer.saves_input``: bitsandbytes' ``MatMul4Bit``
    keeps its input for backward (``ctx.tensors = (A, B)``) although the frozen weight needs no
    gradient; torchao's ``LinearNF4`` keeps only the NF4 weight."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.layer = layer
        if layer.saves_input:
            ctx.save_for_backward(x)
        return F.linear(x, layer.dequantized(x.dtype))

    @staticmethod
    def backward(ctx, grad):
        return grad @ ctx.layer.dequantized(grad.dtype), None


class _Nf4Linear(nn.Module):
    """A frozen linear whose weight is stored in NF4 (QLoRA), as the recipe's library stores it.

    ``"torchao"`` (torchtune's QLoRA): 4-bit codes two to a byte, an int8 scale per 64 weights
    and a factor per 256 scales; ``weight.to(dtype)`` runs ``NF4Tensor.get_original_weight``,
    replayed op for op in ``_torchao_weight`` (the same in torchao 0.1 and 0.18: int64 indices,
    a codebook lookup per half, the scales repeated, the halves interleaved by ``torch.stack``).
    ``"bnb"`` (bitsandbytes 0.41.1 under Lightning's ``BitsandbytesPrecision``, litgpt's QLoRA):
    ``dequantize_4bit`` writes the weight in the dtype it was quantized from (fp16: Lightning
    quantizes an fp16 copy) after an fp32 copy of the block scales, then ``.to(A.dtype)`` makes
    the bf16 copy the matmul uses; and ``MatMul4Bit`` saves its input.
    """

    def __init__(self, base: nn.Linear, library: str):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.library, self.saves_input = library, library == "bnb"
        n = self.in_features * self.out_features
        if n % 64:  # (torchao asserts it too)
            raise ValueError(
                f"NF4 quantizes blocks of 64 weights: a {self.in_features} x "
                f"{self.out_features} linear has {n:,}, not a multiple of 64"
            )
        n_scales = n // 64
        n_factors = math.gcd(n_scales, max(n_scales // 256, 1))  # one per 256 scales
        self.register_buffer("packed", torch.empty(n // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.empty(n_scales, dtype=torch.int8))
        self.register_buffer("factors", torch.empty(n_factors))
        self.register_buffer("codes", torch.empty(16))
        self.register_buffer("mean", torch.empty(()))

    def _torchao_weight(self) -> torch.Tensor:
        first = (self.packed >> 4).to(torch.long)
        second = (self.packed & 0b1111).to(torch.long)
        first_values, second_values = self.codes[first], self.codes[second]
        scales = self.scales.view(self.factors.numel(), -1)
        scales = (scales / self.factors.unsqueeze(-1)).flatten().to(self.codes.dtype) + self.mean
        repeated = scales.unsqueeze(-1).expand(scales.numel(), 32)  # 64 weights: 32 bytes
        first_scaled = first_values * repeated.flatten()
        second_scaled = second_values * repeated.flatten()
        halves = [first_scaled.unsqueeze(-1).T, second_scaled.unsqueeze(-1).T]
        return torch.stack(halves, dim=-1).reshape(self.out_features, self.in_features)

    def _bnb_weight(self) -> torch.Tensor:
        scales = torch.empty(self.scales.shape, dtype=torch.float32, device=self.packed.device)
        return torch.empty(
            self.out_features, self.in_features, dtype=torch.float16, device=scales.device
        )

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        w = self._bnb_weight() if self.library == "bnb" else self._torchao_weight()
        return w.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Nf4Dequantized.apply(x, self)


#: ``Lora.base`` -> the library whose NF4 linear ``_Nf4Linear`` plays.
NF4_LIBRARY = {"nf4": "torchao", "bnb-nf4": "bnb"}


class _LoraLinear(nn.Module):
    """A frozen linear plus B(A(dropout(x))) for each of its output ``parts`` (torchtune's
    LoRALinear): the course's fused q/k/v matmul gets three adapters, as torchtune's separate
    q, k and v projections do, behind one dropout, as litgpt's fused ``LoRAQKVLinear``."""

    def __init__(self, base: nn.Module, rank: int, parts=(), adapted=(), dropout: float = 0.0):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.parts = tuple(parts) or (base.out_features,)
        self.adapted = tuple(adapted) or (True,) * len(self.parts)
        self.p = dropout
        wanted = [n for n, on in zip(self.parts, self.adapted, strict=True) if on]
        self.a = nn.ModuleList(nn.Linear(base.in_features, rank, bias=False) for _ in wanted)
        self.b = nn.ModuleList(nn.Linear(rank, n, bias=False) for n in wanted)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # CUDA's dropout kernel (a bool mask); on the CPU F.dropout would keep a mask in x's dtype
        dropped = torch.native_dropout(x, self.p, True)[0] if self.p else x
        low = iter([b(a(dropped)) for a, b in zip(self.a, self.b, strict=True)])
        parts = [
            next(low) if on else x.new_zeros(*x.shape[:-1], n)  # k unadapted: no adapter
            for n, on in zip(self.parts, self.adapted, strict=True)
        ]
        return self.base(x) + (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1))


def with_lora(block: Block, cfg: DecoderConfig, lora: Lora) -> Block:
    """``block`` frozen, its linears in NF4 under QLoRA, with LoRA adapters on the linears
    ``lora.targets`` names."""
    block.requires_grad_(False)
    attn, mlp = block.attn, block.mlp
    if lora.base in NF4_LIBRARY:
        for parent in (attn, mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, _Nf4Linear(child, NF4_LIBRARY[lora.base]))
    kv = cfg.kv_heads * cfg.head_dim
    adapted = (True, False, True) if lora.targets == "qv" else (True, True, True)
    attn.qkv = _LoraLinear(attn.qkv, lora.rank, (cfg.q_dim, kv, kv), adapted, lora.dropout)
    if lora.targets != "qv":
        attn.proj = _LoraLinear(attn.proj, lora.rank, dropout=lora.dropout)
    if lora.targets == "all":
        for name in ("up", "gate", "down"):
            if hasattr(mlp, name):
                setattr(mlp, name, _LoraLinear(getattr(mlp, name), lora.rank, dropout=lora.dropout))
    return block


def _fake_pass(build, make_input, loss, precision: str, checkpointing: str) -> Pass:
    """Run ``loss(build()(make_input()))`` forward and backward on fake tensors and book it."""
    from ..anatomy import _booking_fake_mode_class, _fake_model, _FakeAccountant

    acc = _FakeAccountant(torch.device("cpu"))
    with torch.device("meta"):
        module = build()
    if precision in BF16_MODULE:
        module = module.to(torch.bfloat16)
    low = torch.bfloat16  # fp16 has the same sizes; CPU autocast takes bf16
    autocast = (
        torch.autocast("cpu", dtype=low)
        if precision.startswith("autocast")
        else contextlib.nullcontext()
    )
    with _booking_fake_mode_class()(acc):
        module = _fake_model(module, torch.device("cpu"), in_place=True)
        x = make_input()
        acc.book([*module.parameters(), *module.buffers(), x])  # (NF4 weights are buffers)
        with acc:
            before = acc.current
            forward = acc.open_window()
            with autocast:
                y = _run(module, x, checkpointing)  # kept: the next block's input, or the logits
                out = loss(y)
            held = acc.current - before - out.untyped_storage().nbytes()  # (not the scalar)
            forward_over = acc.window_peak(forward) - before - held
            acc.close_window(forward)
            window = acc.open_window()
            out.backward()
            grads = sum(
                p.grad.untyped_storage().nbytes() for p in module.parameters() if p.grad is not None
            )
            backward_over = acc.window_peak(window) - before - held - grads
            acc.close_window(window)
            del y
    return Pass(held, max(forward_over, 0), max(backward_over, 0), grads)


def stream_dtype(precision: str) -> torch.dtype:
    return (
        torch.float32
        if precision in ("fp32",) or precision.startswith("autocast")
        else (torch.bfloat16)
    )


def cross_entropy(logits: torch.Tensor, chunks: int = 1) -> torch.Tensor:
    """The step's loss: logits upcast to fp32 (``logits.float()``) as training code does, in
    ``chunks`` pieces along the tokens when asked; the labels are made where the logits are
    (fake, under the fake mode: nothing allocated)."""
    flat = logits.flatten(0, 1)
    total = None
    for piece in flat.chunk(chunks) if chunks > 1 else (flat,):
        targets = torch.zeros(piece.shape[0], dtype=torch.long, device=logits.device)
        part = F.cross_entropy(piece.float(), targets, reduction="sum")
        total = part if total is None else total + part
    return total / flat.shape[0]


@functools.lru_cache(maxsize=256)
def activations(
    cfg: DecoderConfig,
    batch: int,
    seq: int,
    precision: str,
    checkpointing: str,
    lora: Lora | None = None,
    ce_chunks: int = 1,
    block: str = "course",
) -> tuple[Pass, Pass]:
    """(one block, the embedding + head + loss), exact on fake tensors. The bf16-module recipes
    hold the same activations whatever the optimizer's copies: ask with ``same_module(...)``
    so that they share one cache entry. ``block``: the course's (``decoder.Block``) or
    ``"litgpt"`` (``litgpt_block.LitgptBlock``: what litgpt 8641822's block saves)."""
    stream = stream_dtype(precision)

    def block_input():
        return torch.empty(batch, seq, cfg.d_model, dtype=stream, requires_grad=True)

    def build_block():
        if block == "litgpt":
            return _litgpt_block(cfg, lora, seq)
        built = Block(cfg)
        return with_lora(built, cfg, lora) if lora is not None else built

    one = _fake_pass(build_block, block_input, lambda y: y.sum(), precision, checkpointing)

    def tokens():
        return torch.zeros(batch, seq, dtype=torch.long)

    def build_head():
        head = Decoder(cfg, n_layers=0)
        if lora is not None:  # frozen, but fed by blocks whose adapters train
            head.requires_grad_(False)
            head.embed.register_forward_hook(lambda m, i, out: out.detach().requires_grad_())
            if lora.base == "bnb-nf4" and not cfg.tied:  # Lightning replaces every nn.Linear
                head.head = _Nf4Linear(head.head, "bnb")
        return head

    def loss(y):
        return cross_entropy(y, ce_chunks)

    head = _fake_pass(build_head, tokens, loss, precision, "none")
    return one, head


def _litgpt_block(cfg: DecoderConfig, lora: Lora | None, seq: int) -> nn.Module:
    """litgpt's block; under QLoRA every frozen linear in NF4 (Lightning's
    ``BitsandbytesPrecision`` replaces every ``nn.Linear`` with bitsandbytes' ``Linear4bit``)."""
    from .litgpt_block import LitgptBlock

    built = LitgptBlock(cfg, lora, seq)
    if lora is not None and lora.base in NF4_LIBRARY:
        for parent in list(built.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, _Nf4Linear(child, NF4_LIBRARY[lora.base]))
    return built
