"""QLoRA's terms, measured: the quantizer's scratch as the base loads, what an NF4 linear
saves and makes in a step, its storage with and without double quantization, and what a loop
that keeps its logits carries into the next forward (litgpt's, with bitsandbytes' inputs kept
on the graph), each against the course's accountant on the CPU.

Neither torchao nor bitsandbytes is a dependency of the course, so each mechanism is replayed in
PyTorch's own ops, as the library's source reads (cited beside each), and measured with
``memory.measure("cpu")``, which counts every tensor storage exactly: the calculator's term must
equal what the replay holds, to the byte. One published GPU measurement checks the quantizer's
term from outside (pytorch/ao#315).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tutorial_utils import fit, memory
from tutorial_utils.decoder import Decoder
from tutorial_utils.decoder_config import DecoderConfig
from tutorial_utils.fit.activations import _Nf4Linear, with_lora
from tutorial_utils.fit.kept_graph import kept_graph_bytes
from tutorial_utils.fit.states import Lora, nf4_bytes, nf4_quantize_bytes


def _to_nf4_indices(weight: torch.Tensor, chunk: int) -> torch.Tensor:
    """torchao's ``NF4Tensor.convert_to_norm_float_weight`` (0.1; 0.2 on with ``chunk``), op for
    op: the absmax of each block of 64, the weights scaled by it, the nearest of the 16 codes
    by ``(value - nf4).abs().min(dim=-1)``, two indices packed into a byte."""
    n = weight.numel()
    codes = torch.linspace(-1, 1, 16, dtype=weight.dtype)  # (the values do not matter here)
    with memory.measure("cpu") as m:
        blocks = weight.flatten().view(n // 64, 64)
        scalers = blocks.abs().max(dim=1).values  # get_block_absmax
        scaled = (blocks / scalers.unsqueeze(-1).expand(n // 64, 64)).flatten()

        def nearest(value):  # quantize_tensor_nearest
            diff = (value.unsqueeze(-1) - codes).abs()
            return diff.min(dim=-1).indices

        if chunk == 0:  # torchao 0.1
            indices = nearest(scaled)
        else:  # torchao 0.2 on (pytorch/ao#196)
            indices = torch.empty(n, dtype=torch.uint8)
            for start in range(0, n, chunk):
                indices[start : start + chunk] = nearest(scaled[start : start + chunk]).to(
                    torch.uint8
                )
        packed = (indices[::2] << 4 | indices[1::2]).to(torch.uint8)
        del blocks, scalers, scaled, indices
    assert packed.numel() == n // 2
    return m.peak_above_start_bytes


@pytest.mark.parametrize("chunk", [0, 4096])
def test_the_quantizers_scratch_is_what_torchaos_ops_hold_to_the_byte(chunk):
    """The scratch term, beside the block scales (2 B per 64 weights, which the term leaves out:
    they are the NF4 tensor's own once it is made)."""
    n = 128 * 256
    weight = torch.randn(128, 256, dtype=torch.bfloat16)
    measured = _to_nf4_indices(weight, chunk)
    assert measured == nf4_quantize_bytes(n, chunk) + 2 * (n // 64)


def test_chunking_is_what_bounds_the_scratch():
    """So that the test above can fail for either version: whole, 66 B a weight; chunked, 3 B a
    weight and 64 B per weight of one chunk."""
    n = 45_088_768  # Llama 2 7B's MLP weight, 4096 x 11008
    assert nf4_quantize_bytes(n, 0) == 66 * n
    assert nf4_quantize_bytes(n, 2**20) == 3 * n + 64 * 2**20 < nf4_quantize_bytes(n, 0) // 10


def test_the_quantizers_scratch_agrees_with_a_published_gpu_measurement():
    """pytorch/ao#315 (2024-06-04) quantized Llama 3 8B's head, an fp32 ``nn.Linear(4096,
    128256)`` on the GPU, with ``to_nf4`` and printed torchtune's memory stats: peak allocated
    2.101346304 GB before, 37.865276416 GB after. The 35.76 GB between are 68.08 B a weight:
    torchao 0.1's ``to_nf4`` (torchtune's pin then, unchunked) first makes a bf16 copy
    (``tensor.to(torch.bfloat16)``, 2 B), then the scratch (66), as ``nf4_load_bytes`` counts
    them. Tolerance: what neither counts, the block scales and the NF4 output (under 0.6 B of
    68, 0.9 %)."""
    n = 4096 * 128256
    published = 37.865276416e9 - 2.101346304e9
    assert abs((2 * n + nf4_quantize_bytes(n, 0)) / published - 1) < 0.009


def _step(layer: nn.Module, d_in: int) -> tuple[int, int, int]:
    """(held after forward, forward's peak above its start, the input's bytes) for one NF4
    linear fed a fresh activation, the caller keeping only the output."""
    x = torch.randn(2, 8, d_in, dtype=torch.bfloat16, requires_grad=True)
    layer = layer.to(torch.bfloat16)
    with memory.measure("cpu") as m:
        h = x * 1  # an activation only this linear might keep
        y = layer(h)
        nbytes = h.untyped_storage().nbytes()
        del h
    held = m.delta_bytes - y.untyped_storage().nbytes()
    y.sum().backward()
    return held, m.peak_above_start_bytes, nbytes


def test_bitsandbytes_keeps_the_frozen_linears_input_and_torchao_does_not():
    """bitsandbytes 0.41.1's ``MatMul4Bit.forward``: ``ctx.tensors = (A, B)`` whenever an input
    needs a gradient; torchao's ``LinearNF4`` saves only the NF4 weight. The weight is frozen
    either way, so a bf16 ``nn.Linear`` would keep nothing."""
    bnb, _, nbytes = _step(_Nf4Linear(nn.Linear(64, 128, bias=False), "bnb"), 64)
    torchao, _, _ = _step(_Nf4Linear(nn.Linear(64, 128, bias=False), "torchao"), 64)
    plain, _, _ = _step(nn.Linear(64, 128, bias=False).requires_grad_(False), 64)
    assert (bnb, torchao, plain) == (nbytes, 0, 0)


def test_bitsandbytes_dequantizes_into_an_fp16_and_a_bf16_copy():
    """``F.dequantize_4bit(B, state).to(A.dtype)``: the fp16 copy (Lightning quantized from fp16)
    and the bf16 one exist together, 4 B a weight, above the input."""
    n = 64 * 128
    _, peak, nbytes = _step(_Nf4Linear(nn.Linear(64, 128, bias=False), "bnb"), 64)
    assert peak == nbytes + 4 * n


def test_the_calculator_has_a_loading_moment_only_where_the_base_is_quantized():
    """torchtune at 0914d5cfb (torchao 0.1, a whole tensor at once) peaks as the base loads;
    today's torchao (2**20 weights at a time) peaks in the step; plain LoRA has no such moment."""
    ask = dict(preset="llama-2-7b", batch=2, seq=1304, precision="pure-bf16", checkpointing="full")
    whole = fit.will_it_fit(**ask, lora_rank=8, lora_base="nf4", nf4_chunk=0)
    chunked = fit.will_it_fit(**ask, lora_rank=8, lora_base="nf4")
    plain = fit.will_it_fit(**ask, lora_rank=8)
    assert whole.peak_moment == "loading the base" != chunked.peak_moment
    assert "loading the base" not in plain.peaks
    assert whole.peak_bytes - chunked.peaks["loading the base"] == 45_088_768 * 63 - 64 * 2**20


def test_bad_nf4_knobs_get_one_sentence():
    with pytest.raises(ValueError, match="lora_base must be"):
        fit.will_it_fit("llama-2-7b", lora_rank=8, lora_base="nf8")
    with pytest.raises(ValueError, match="lora_dropout must be"):
        fit.will_it_fit("llama-2-7b", lora_rank=8, lora_dropout=1.5)
    with pytest.raises(ValueError, match="nf4_chunk"):
        fit.will_it_fit("llama-2-7b", lora_rank=8, lora_base="nf4", nf4_chunk=-1)
    with pytest.raises(ValueError, match="multiple of 64"):
        _Nf4Linear(nn.Linear(3, 5), "torchao")


class _MatMul4Bit(torch.autograd.Function):
    """bitsandbytes 0.42.0's ``MatMul4Bit`` (``autograd/_functions.py``; 0.41.0 the same) where
    memory is concerned: the weight dequantized for the matmul in forward and again in
    backward, and ``ctx.tensors = (A, B)`` when an input needs a gradient, else ``(None,
    None)``: attributes of ``ctx``, not ``save_for_backward``, so backward does not free them."""

    @staticmethod
    def forward(ctx, A, layer):
        ctx.layer = layer
        output = F.linear(A, layer.dequantized(A.dtype))
        ctx.tensors = (A, layer.packed) if any(ctx.needs_input_grad[:2]) else (None, None)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output @ ctx.layer.dequantized(grad_output.dtype), None


#: A small Llama-shaped decoder (GQA, SwiGLU, untied head): every linear a multiple of 64.
_SMALL = DecoderConfig(
    vocab=96,
    d_model=64,
    n_layers=3,
    n_heads=4,
    n_kv_heads=2,
    d_ff=160,
    norm="rms",
    mlp="swiglu",
    bias=False,
    tied=False,
    max_positions=0,
)


def _litgpt_model(monkeypatch, base: str) -> Decoder:
    """The small decoder as litgpt's LoRA fine-tune has it: frozen, LoRA on q and v; under
    ``bnb-nf4`` every linear (the head too) bitsandbytes' NF4 linear with ``_MatMul4Bit``."""
    lora = Lora(4, "qv", base, 0.05, double_quant=base != "bnb-nf4")
    if base == "bnb-nf4":
        monkeypatch.setattr(_Nf4Linear, "forward", lambda self, x: _MatMul4Bit.apply(x, self))
    model = Decoder(_SMALL).requires_grad_(False)
    for block in model.blocks:
        with_lora(block, _SMALL, lora)
    if base == "bnb-nf4":
        model.head = _Nf4Linear(model.head, "bnb")
    return model.to(torch.bfloat16), lora


def _litgpt_iteration(model, tokens, keep_logits: bool):
    """litgpt's loop body (``litgpt/finetune/lora.py`` at 4a9b7e62): ``logits = model(...)``,
    which Fabric's ``convert_output`` hands back in torch's default dtype, the loss, backward,
    and ``loss = running_loss.compute().item()``; the logits stay bound unless told."""
    logits = model(tokens).to(torch.get_default_dtype())
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    loss = loss.item()
    return logits if keep_logits else None


@pytest.mark.parametrize("base", ["bnb-nf4", "nf4", "bf16"])
def test_the_kept_logits_hold_the_graph_and_bitsandbytes_inputs_to_the_byte(monkeypatch, base):
    """Two iterations of litgpt's loop: the second forward's peak is higher, when the first
    iteration's logits are still bound, by what ``kept_graph_bytes`` counts: the fp32 logits,
    and under bitsandbytes every NF4 linear's input kept by ``MatMul4Bit``'s ``ctx``, but the
    first block's q/k/v input (a frozen embedding and norm feed it: no input needs a gradient,
    ``(None, None)``); torchao's NF4 and a bf16 base keep only the logits. Either replay
    saving with ``save_for_backward``, or the logits counted in bf16, would fail this."""
    batch, seq = 2, 16
    tokens = torch.randint(0, _SMALL.vocab, (batch, seq))
    peaks = {}
    for keep in (True, False):
        model, lora = _litgpt_model(monkeypatch, base)
        with memory.measure("cpu"):
            previous = _litgpt_iteration(model, tokens, keep)
            with memory.measure("cpu") as second:
                logits = model(tokens).to(torch.get_default_dtype())
            del logits, previous
        peaks[keep] = second.peak_bytes
    assert peaks[True] - peaks[False] == kept_graph_bytes(_SMALL, batch, seq, lora)


def _quantize_4bit_storage(n: int, compress_statistics: bool) -> int:
    """What bitsandbytes 0.42.0's ``quantize_4bit`` (``functional.py``) leaves allocated for
    ``n`` weights, replayed: the packed codes, two to a byte, and an fp32 absmax per block of
    64; with ``compress_statistics`` (double quantization) the absmax less its mean is
    quantized by ``quantize_blockwise(absmax, blocksize=256)`` into a byte each and an fp32
    absmax per 256, the mean (``offset``) kept, the fp32 absmax deleted. The NF4 code (16 fp32)
    and the blockwise code table (shared, cached in ``name2qmap``) are left out."""
    blocks = -(-n // 64)
    with memory.measure("cpu") as m:
        absmax = torch.zeros(blocks, dtype=torch.float32)
        out = torch.zeros((n + 1) // 2, 1, dtype=torch.uint8)
        state = [out, absmax]
        if compress_statistics:
            offset = absmax.mean()
            absmax -= offset
            qabsmax = torch.zeros(blocks, dtype=torch.uint8)  # quantize_blockwise's out
            absmax2 = torch.zeros(-(-blocks // 256), dtype=torch.float32)  # and its absmax
            state = [out, qabsmax, offset, absmax2]
            del absmax
    assert len(state) in (2, 4)
    return m.delta_bytes


@pytest.mark.parametrize("double_quant", [True, False])
def test_nf4_bytes_with_and_without_double_quantization(double_quant):
    """litgpt's ``--quantize bnb.nf4`` (Lightning's ``_NF4Linear``: ``compress_statistics=
    False``) keeps an fp32 absmax per 64 weights, 0.0625 B a weight; ``bnb.nf4-dq`` a byte
    per 64 and an fp32 per 16,384, 0.0159 B. Tolerance: the offset (4 B) left out of
    ``nf4_bytes``, of tens of kilobytes."""
    n = 64 * 256 * 3 + 64 * 5  # blocks not a multiple of 256
    measured = _quantize_4bit_storage(n, double_quant)
    assert 0 <= measured - nf4_bytes(n, double_quant) <= (4 if double_quant else 0)
    assert nf4_bytes(n, False) - nf4_bytes(n, True) > 0.046 * n


def test_the_calculator_adds_the_kept_graph_where_it_is_alive():
    """The previous micro-batch's graph through this one's forward (its end, not the start of
    backward: litgpt rebinds ``logits`` before the loss), this one's at the step; under
    bitsandbytes without double quantization, as litgpt's ``--quantize bnb.nf4``."""
    ask = dict(
        preset=_SMALL,
        batch=2,
        seq=16,
        precision="pure-bf16",
        lora_rank=4,
        lora_targets="qv",
        lora_base="bnb-nf4",
        nf4_double_quant=False,
    )
    kept = fit.will_it_fit(**ask, logits_kept=True).peaks
    plain = fit.will_it_fit(**ask).peaks
    lora = Lora(4, "qv", "bnb-nf4", double_quant=False)
    term = kept_graph_bytes(_SMALL, 2, 16, lora)
    assert kept["end of forward"] - plain["end of forward"] == term
    assert kept["optimizer step"] - plain["optimizer step"] == term
    assert kept["start of backward"] == plain["start of backward"]
    with pytest.raises(ValueError, match="double quantization"):
        fit.will_it_fit(**(ask | dict(lora_base="nf4")))
