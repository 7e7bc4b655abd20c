"""formulas: each closed form against what the course's models really hold (issue 21)."""

from __future__ import annotations

import pytest
import torch

from tutorial_utils import formulas, models
from tutorial_utils.decoder import PRESETS, Decoder, DecoderConfig
from tutorial_utils.exercises.predict import saved_bytes


@pytest.mark.parametrize(
    "h,layers,vocab,classes", [(16, 1, 50, 3), (64, 2, 1000, 5), (96, 3, 7, 2)]
)
def test_tiny_transformer_count_is_exact(h, layers, vocab, classes):
    model = models.TinyTransformer(
        vocab=vocab, d_model=h, n_heads=4, n_layers=layers, n_classes=classes
    )
    n = sum(p.numel() for p in model.parameters())
    assert formulas.tiny_transformer_parameters(vocab, h, layers, classes) == n


def test_playbook_count_differs_by_the_head_and_the_final_norm():
    h, layers, vocab, classes = 64, 2, 1000, 5
    exact = formulas.tiny_transformer_parameters(vocab, h, layers, classes)
    assert exact - formulas.playbook_parameters(h, vocab, layers) == h * classes + classes - 2 * h


# The counts these models were released with (GPT-2 small and XL, Llama 3.2 1B, Llama 3.1 8B
# and 70B): our decoder at their shapes has exactly as many parameters.
RELEASED = {
    "gpt2-124m": 124_439_808,
    "gpt2-1.5b": 1_557_611_200,
    "llama-1b": 1_235_814_400,
    "llama-8b": 8_030_261_248,
    "llama-70b": 70_553_706_496,
}


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_decoder_count_matches_formula_and_release(name):
    with torch.device("meta"):
        model = Decoder(PRESETS[name])
    n = sum(p.numel() for p in model.parameters())
    assert n == formulas.decoder_parameters(PRESETS[name]) == RELEASED[name]


def test_gpt2_is_the_playbook_plus_positions():
    cfg = PRESETS["gpt2-124m"]
    playbook = formulas.playbook_parameters(cfg.d_model, cfg.vocab, cfg.n_layers)
    assert formulas.decoder_parameters(cfg) - playbook == cfg.max_positions * cfg.d_model


SHAPES = {
    "gpt2 sdpa": {},
    "gpt2 explicit": {"attention": "explicit"},
    "llama sdpa": {"norm": "rms", "mlp": "swiglu", "bias": False, "n_kv_heads": 2, "d_ff": 80},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,s", [(1, 8), (2, 8), (3, 20)])
def test_block_activation_formula_is_exact(shape, dtype, b, s):
    cfg = DecoderConfig(d_model=32, n_heads=4, **SHAPES[shape])
    block = Decoder(cfg).blocks[0].to(dtype)
    x = torch.randn(b, s, 32, dtype=dtype, requires_grad=True)
    e = torch.finfo(dtype).bits // 8
    assert saved_bytes(block, x) == formulas.block_activation_bytes(cfg, b, s, e)


def test_explicit_grouped_query_attention_is_refused():
    cfg = DecoderConfig(d_model=32, n_heads=4, n_kv_heads=2, attention="explicit")
    with pytest.raises(ValueError, match="one key/value head per query head"):
        formulas.block_activation_bytes(cfg, 1, 8)


def test_gpt2_block_in_16_bit_is_korthikanti_without_dropout_masks():
    cfg = DecoderConfig(d_model=64, n_heads=4)
    s, b, h, a = 16, 2, 64, 4
    ours = formulas.block_activation_bytes(cfg, b, s, 2)
    # 34 sbh less the two 1-byte dropout masks, 4 fp32 norm statistics at 2 bytes, SDPA's
    # fp32 log-sum-exp instead of the 5as^2b of the explicit softmax and its dropout.
    assert ours == 32 * s * b * h + 2 * 2 * 2 * s * b + 4 * a * s * b
    assert formulas.korthikanti_bytes(s, b, h, a) - 34 * s * b * h == 5 * a * s * s * b


def test_model_states_per_recipe():
    n = 1000
    assert formulas.model_state_bytes(n, "fp32", "adam").per_parameter(n) == 16
    assert formulas.model_state_bytes(n, "bf16-master", "adam").per_parameter(n) == 16
    assert formulas.model_state_bytes(n, "bf16-master", "adam", fp32_grads=True).total == 20 * n
    assert formulas.model_state_bytes(n, "fp32", "sgd").total == 8 * n
    assert formulas.model_state_bytes(n, "fp32", "sgd-momentum").total == 12 * n
    steps = formulas.model_state_bytes(n, "fp32", "adam", n_tensors=3, step_counter_bytes=4)
    assert steps.optimizer_state == 8 * n + 12


def test_adam_state_matches_torch():
    model = models.MLP(d_in=8, d_hidden=16, d_out=2, depth=2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    state = sum(t.untyped_storage().nbytes() for s in opt.state.values() for t in s.values())
    n = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    expect = formulas.model_state_bytes(n, "fp32", "adam", n_tensors=tensors, step_counter_bytes=4)
    assert state == expect.optimizer_state


@pytest.mark.parametrize(
    "call",
    [
        lambda: formulas.model_state_bytes(10, "fp8"),
        lambda: formulas.model_state_bytes(10, "fp32", "lion"),
    ],
)
def test_bad_choices_say_what_to_choose(call):
    with pytest.raises(ValueError, match="must be one of"):
        call()
