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
torchtune's LoRALinear without dropout): what autograd saves then is what a LoRA step saves.
"""

from __future__ import annotations

import contextlib
import functools

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


class _LoraLinear(nn.Module):
    """A frozen linear plus B(A(x)) for each of its output ``parts`` (torchtune's LoRALinear,
    dropout 0 as its configs): the course's fused q/k/v matmul gets three adapters, as
    torchtune's separate q, k and v projections do."""

    def __init__(self, base: nn.Linear, rank: int, parts=(), adapted=()):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.parts = tuple(parts) or (base.out_features,)
        self.adapted = tuple(adapted) or (True,) * len(self.parts)
        wanted = [n for n, on in zip(self.parts, self.adapted, strict=True) if on]
        self.a = nn.ModuleList(nn.Linear(base.in_features, rank, bias=False) for _ in wanted)
        self.b = nn.ModuleList(nn.Linear(rank, n, bias=False) for n in wanted)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = iter([b(a(x)) for a, b in zip(self.a, self.b, strict=True)])
        parts = [
            next(low) if on else x.new_zeros(*x.shape[:-1], n)  # k unadapted: no adapter
            for n, on in zip(self.parts, self.adapted, strict=True)
        ]
        return self.base(x) + (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1))


def with_lora(block: Block, cfg: DecoderConfig, lora: Lora) -> Block:
    """``block`` frozen, with LoRA adapters on the linears ``lora.targets`` names."""
    block.requires_grad_(False)
    attn, mlp = block.attn, block.mlp
    kv = cfg.kv_heads * cfg.head_dim
    adapted = (True, False, True) if lora.targets == "qv" else (True, True, True)
    attn.qkv = _LoraLinear(attn.qkv, lora.rank, (cfg.q_dim, kv, kv), adapted)
    if lora.targets != "qv":
        attn.proj = _LoraLinear(attn.proj, lora.rank)
    if lora.targets == "all":
        for name in ("up", "gate", "down"):
            if hasattr(mlp, name):
                setattr(mlp, name, _LoraLinear(getattr(mlp, name), lora.rank))
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
        acc.book([*module.parameters(), x])
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
) -> tuple[Pass, Pass]:
    """(one block, the embedding + head + loss), exact on fake tensors. The bf16-module recipes
    hold the same activations whatever the optimizer's copies: ask with ``same_module(...)``
    so that they share one cache entry."""
    stream = stream_dtype(precision)

    def block_input():
        return torch.empty(batch, seq, cfg.d_model, dtype=stream, requires_grad=True)

    def build_block():
        block = Block(cfg)
        return with_lora(block, cfg, lora) if lora is not None else block

    block = _fake_pass(build_block, block_input, lambda y: y.sum(), precision, checkpointing)

    def tokens():
        return torch.zeros(batch, seq, dtype=torch.long)

    def build_head():
        head = Decoder(cfg, n_layers=0)
        if lora is not None:  # frozen, but fed by blocks whose adapters train
            head.requires_grad_(False)
            head.embed.register_forward_hook(lambda m, i, out: out.detach().requires_grad_())
        return head

    def loss(y):
        return cross_entropy(y, ce_chunks)

    head = _fake_pass(build_head, tokens, loss, precision, "none")
    return block, head
