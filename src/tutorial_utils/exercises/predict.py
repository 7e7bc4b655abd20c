"""Checkers for the notebook "Where memory goes: predict, measure, reconcile".

``check_parameter_count(cfg, answer)``: the learner writes the parameter count of a decoder
config by hand (a Llama-style one: RMSNorm, SwiGLU, grouped-query attention, untied head). The
checker compares with the model built on meta, and names the part an off answer misses.

``check_activation_bytes(cfg, batch, seq, answer)``: the bytes one block saves for backward,
predicted; checked against the saved-tensor hooks on a real block.

``check_saved_bytes(fn)``: the learner fixes a colleague's saved-tensor counter that adds up
every saved tensor's ``numel() * element_size()``: views of one storage (q, k and v are views of
one projection) are counted again and again. The checker runs it on fresh blocks and compares
with the distinct storages.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import formulas
from ..decoder import Decoder, DecoderConfig
from . import Feedback, checker
from .answers import describe, whole_number

__all__ = ["check_activation_bytes", "check_parameter_count", "check_saved_bytes", "saved_bytes"]


def saved_bytes(module: torch.nn.Module, x: torch.Tensor, weights: bool = False) -> int:
    """Bytes of the distinct storages ``module(x)`` saves for backward, its weights left out
    (``weights=True``: counted too, as a counter that forgets them does)."""
    weights = set() if weights else {p.untyped_storage()._cdata for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s._cdata not in weights:
            seen.setdefault(s._cdata, s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


@checker(answers=("answer",), zero=True)
def check_parameter_count(cfg: DecoderConfig, answer: int) -> Feedback:
    """Is ``answer`` the number of parameters of ``Decoder(cfg)``?"""
    if not isinstance(cfg, DecoderConfig):
        raise ValueError(f"check_parameter_count: cfg must be a DecoderConfig, not {cfg!r}")
    with torch.device("meta"):
        truth = sum(p.numel() for p in Decoder(cfg).parameters())
    fb = Feedback("the decoder's parameter count")
    fb.hint("count each Linear's weight (in x out) and bias, each norm's weights, the embeddings")
    fb.fix(f"tutorial_utils.formulas.decoder_parameters(cfg) == {truth:,}")
    value = whole_number(answer)
    fb.require(value is not None and value > 0, f"give a whole number, got {describe(answer)}")
    if value == truth:
        return fb
    h, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    misses = {
        "the output head (untied: a second vocab x h matrix)": 0 if cfg.tied else cfg.vocab * h,
        "the final norm": h if cfg.norm == "rms" else 2 * h,
        "grouped-query attention: k and v have n_kv_heads * head_dim columns, not h": -(
            cfg.n_layers * 2 * h * (h - kv)
        ),
        "SwiGLU's third matrix (gate, up and down)": cfg.n_layers * h * cfg.ff,
    }
    for what, size in misses.items():  # size > 0: a part left out; < 0: a part counted too big
        if size > 0 and value == truth - size:
            fb.fail(f"{value:,} misses {what}", brief="one part of the model is missing")
        if size < 0 and value == truth - size:
            fb.fail(f"{value:,} is {-size:,} too many: {what}", brief="one part is counted too big")
    fb.expect(False, f"{value:,} is off by {value - truth:+,}", brief="the count is wrong")
    return fb


@checker(answers=("answer",), zero=True)
def check_activation_bytes(cfg: DecoderConfig, batch: int, seq: int, answer: int) -> Feedback:
    """Is ``answer`` the bytes one fp32 ``Block(cfg)`` saves for backward at (batch, seq)?"""
    if not isinstance(cfg, DecoderConfig):
        raise ValueError(f"check_activation_bytes: cfg must be a DecoderConfig, not {cfg!r}")
    for name, size in (("batch", batch), ("seq", seq)):
        if whole_number(size) is None or size < 1:
            raise ValueError(
                f"check_activation_bytes: {name} must be a whole number of at least 1, not {size!r}"
            )
    batch, seq = whole_number(batch), whole_number(seq)
    with torch.random.fork_rng(devices=[]):  # the block's weights, without the learner's RNG
        torch.manual_seed(0)
        block = Decoder(cfg, n_layers=1).blocks[0]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, seq, cfg.d_model, requires_grad=True, generator=gen)
    truth = saved_bytes(block, x)
    fb = Feedback("one block's saved activations")
    fb.hint("list what each operator saves (the hook prints it), then count per token")
    fb.fix(f"formulas.block_activation_bytes(cfg, {batch}, {seq}) == {truth:,}")
    value = whole_number(answer)
    fb.require(value is not None and value > 0, f"give a whole number, got {describe(answer)}")
    if value == truth:
        return fb
    if value * 2 == truth:
        fb.fail("that is half: this block runs in fp32, 4 bytes per element, not 2")
    if value * 4 == truth:
        fb.fail("that counts elements, not bytes (4 bytes each in fp32)")
    if batch > 1 and value * batch == truth:
        fb.fail(
            f"that is one sequence's bytes; the batch holds {batch} sequences",
            brief="that counts one sequence, not the batch",
        )
    fb.expect(False, f"{value:,} is off by {value - truth:+,} bytes", brief="the number is wrong")
    return fb


@checker(answers=("fn",))
def check_saved_bytes(fn: Callable[[torch.nn.Module, torch.Tensor], int]) -> Feedback:
    """Does ``fn(module, x)`` return the distinct bytes ``module(x)`` saves for backward?"""
    fb = Feedback("a saved-tensor counter")
    fb.hint(
        "print what pack() is given (t.shape, t.untyped_storage().data_ptr()): which of those "
        "are not new memory that forward made?"
    )
    fb.fix("key a dict by t.untyped_storage()._cdata and add s.nbytes() once per storage")
    for cfg, b, s in ((DecoderConfig(d_model=32, n_heads=4), 2, 8), (DecoderConfig(), 1, 16)):
        with torch.random.fork_rng(devices=[]):  # the learner's RNG is left alone
            torch.manual_seed(0)
            block = Decoder(cfg, n_layers=1).blocks[0]
            x = torch.randn(b, s, cfg.d_model, requires_grad=True)
        truth = saved_bytes(block, x)
        with_weights = saved_bytes(block, x, weights=True)  # the weights the block saves, too
        got = whole_number(fb.run("your counter", fn, block, x, returns=(int,)))
        if got != truth and got in (
            with_weights,
            truth + sum(p.untyped_storage().nbytes() for p in block.parameters()),
        ):
            fb.fail(
                "that counts the weights too: they are parameters, not activations",
                brief="the count includes the weights",
            )
        fb.require(
            got == truth,
            f"on a block of width {cfg.d_model} at batch {b}, seq {s} it gives {got:,}; the "
            f"distinct storages saved hold {truth:,} bytes",
            brief="the count is wrong",
        )
    return fb


def _check_formula_is_exact() -> None:  # (used by the tests: the fix agrees with the formula)
    cfg = DecoderConfig(d_model=32, n_heads=4)
    block = Decoder(cfg, n_layers=1).blocks[0]
    x = torch.randn(2, 8, 32, requires_grad=True)
    assert saved_bytes(block, x) == formulas.block_activation_bytes(cfg, 2, 8)
