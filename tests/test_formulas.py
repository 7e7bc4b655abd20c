"""formulas: each closed form against what the course's models really hold (issues 21, 31)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

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
    explicit = formulas.korthikanti_bytes(s, b, h, a, attention="explicit")
    assert explicit - 34 * s * b * h == 5 * a * s * s * b
    assert formulas.korthikanti_bytes(s, b, h, a) - 34 * s * b * h == 4 * a * s * b  # fused


def _attention_saved(b, a, s, d, dtype, attention):
    """What autograd saves for attention, from the q/k/v projection's output to the output
    projection (whose weight is left out), each storage once: the course's saved-tensor count."""
    import math

    from torch.nn import functional as F

    qkv = torch.randn(b, s, 3 * a * d, dtype=dtype, requires_grad=True)
    proj = torch.nn.Linear(a * d, a * d, dtype=dtype)
    weights = {p.untyped_storage()._cdata for p in proj.parameters()}
    seen, grad_fns = {}, []

    def pack(t):
        st = t.untyped_storage()
        if st._cdata not in weights:
            seen.setdefault(st._cdata, st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = qkv * 1  # a new storage, as the projection's output is: q, k, v are views of it
        q, k, v = (t.view(b, s, a, d).transpose(1, 2) for t in h.split(a * d, dim=-1))
        if attention == "fused":
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            o = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v
        grad_fns.append(type(o.grad_fn).__name__)
        proj(o.transpose(1, 2).reshape(b, s, a * d))
    return sum(seen.values()), grad_fns[0]


@pytest.mark.parametrize("attention", formulas.ATTENTION_KINDS)
@pytest.mark.parametrize(
    "b,a,s,d,dtype", [(2, 4, 512, 32, torch.float32), (1, 2, 40, 8, torch.bfloat16)]
)
def test_attention_formula_is_what_autograd_saves_on_a_cpu(attention, b, a, s, d, dtype):
    saved, grad_fn = _attention_saved(b, a, s, d, dtype, attention)
    e = torch.finfo(dtype).bits // 8
    want = formulas.attention_saved_bytes(s, b, a * d, a, e, attention=attention, dropout=False)
    assert saved == want
    if attention == "fused":  # the CPU's SDPA is a flash kernel, not the math fallback
        assert grad_fn == "ScaledDotProductFlashAttentionForCpuBackward0"


def test_attention_at_issue_38s_shape():
    # b=2, h=4 heads, s=512, d=32, fp32: q, k, v and the output (4 x 512 KiB) and a 16 KiB
    # log-sum-exp, against the same four and the 8 MiB of (s, s) probabilities
    fused = formulas.attention_saved_bytes(512, 2, 128, 4, 4, dropout=False)
    explicit = formulas.attention_saved_bytes(
        512, 2, 128, 4, 4, attention="explicit", dropout=False
    )
    assert (fused, explicit) == (2_113_536, 10_485_760)
    assert _attention_saved(2, 4, 512, 32, torch.float32, "fused")[0] == fused


def test_korthikanti_is_26_sbh_and_attention_either_way():
    s, b, h, a = 2048, 1, 4096, 32
    for kind in formulas.ATTENTION_KINDS:
        core = formulas.attention_saved_bytes(s, b, h, a, attention=kind)
        assert formulas.korthikanti_bytes(s, b, h, a, attention=kind) == 26 * s * b * h + core
    with pytest.raises(ValueError, match="attention must be one of"):
        formulas.korthikanti_bytes(s, b, h, a, attention="flash")


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


# Bad values, as property tests: every public formula refuses a count that is not a whole
# number (TypeError) or is below its smallest sensible value (ValueError), in one sentence.
NOT_WHOLE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.booleans(),
    st.none(),
    st.decimals(allow_nan=True).filter(lambda d: not d.is_finite() or d != int(d)),
)
BELOW_ONE = st.integers(max_value=0)
CFG = PRESETS["gpt2-124m"]

CALLS = {
    "model_state_bytes": lambda v: formulas.model_state_bytes(v),
    "model_state_bytes n_tensors": lambda v: formulas.model_state_bytes(10, n_tensors=v),
    "korthikanti seq": lambda v: formulas.korthikanti_bytes(v, 1, 8, 2),
    "korthikanti batch": lambda v: formulas.korthikanti_bytes(8, v, 8, 2),
    "korthikanti d_model": lambda v: formulas.korthikanti_bytes(8, 1, v, 2),
    "korthikanti n_heads": lambda v: formulas.korthikanti_bytes(8, 1, 8, v),
    "attention seq": lambda v: formulas.attention_saved_bytes(v, 1, 8, 2),
    "attention batch": lambda v: formulas.attention_saved_bytes(8, v, 8, 2),
    "block batch": lambda v: formulas.block_activation_bytes(CFG, v, 8),
    "block seq": lambda v: formulas.block_activation_bytes(CFG, 1, v),
    "playbook d_model": lambda v: formulas.playbook_parameters(v, 100, 2),
    "tiny d_model": lambda v: formulas.tiny_transformer_parameters(100, v, 2, 2),
}
#: These accept 0 (an empty model has no bytes); everything else needs at least 1.
ZERO_ALLOWED = {"model_state_bytes", "model_state_bytes n_tensors"}


@pytest.mark.parametrize("name", CALLS)
@given(value=NOT_WHOLE)
def test_a_count_that_is_not_a_whole_number_is_a_type_error(name, value):
    with pytest.raises(TypeError, match=r"must be a whole number such as 8, not") as info:
        CALLS[name](value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", CALLS)
@given(value=BELOW_ONE)
def test_a_count_below_its_least_value_is_a_value_error(name, value):
    if name in ZERO_ALLOWED and value == 0:
        CALLS[name](value)  # fine: nothing to count
        return
    with pytest.raises(ValueError, match=r"must be a whole number >= [01], not -?\d+") as info:
        CALLS[name](value)
    assert "\n" not in str(info.value)


@given(n=st.integers(min_value=0, max_value=10**15), recipe=st.sampled_from(formulas.PRECISIONS))
def test_any_good_count_gives_bytes_that_are_whole_and_not_negative(n, recipe):
    states = formulas.model_state_bytes(n, recipe, "adamw")
    assert all(isinstance(v, int) and v >= 0 for v in vars(states).values())
    per = {"pure-bf16": 8, "bf16-master-fp32-grads": 20}.get(recipe, 16)
    assert states.total == per * n


def test_a_config_that_is_not_a_decoder_config_is_named():
    with pytest.raises(TypeError, match="cfg must be a decoder.DecoderConfig, not dict"):
        formulas.block_activation_bytes({"d_model": 8}, 1, 8)
    with pytest.raises(ValueError, match="element_bytes must be 1, 2, 4 or 8"):
        formulas.block_activation_bytes(CFG, 1, 8, 3)
    with pytest.raises(TypeError, match="fp32_grads must be True or False"):
        formulas.model_state_bytes(10, "bf16-master", fp32_grads="yes")


def test_zero_rank_bytes_is_the_playbooks_table_in_fp32():
    psi, n = 1200, 4
    ddp, z1, z2, z3 = (formulas.zero_rank_bytes(s, psi, n) for s in formulas.ZERO_SETUPS[:4])
    assert (ddp["params"], ddp["grads"], ddp["state"]) == (4 * psi, 4 * psi, 8 * psi)
    assert (z1["params"], z1["grads"], z1["state"]) == (4 * psi, 4 * psi, 8 * psi // n)
    for z in (z2, z3):
        assert (z["params"], z["grads"], z["state"]) == (psi, psi, 2 * psi)  # 16Ψ/N in all
    assert [z["gathered"] for z in (ddp, z1, z2, z3)] == [0, 0, 4 * psi, 0]
    assert [z["moved"] // (4 * psi) for z in (ddp, z1, z2, z3)] == [2, 3, 2, 3]
    assert formulas.zero_rank_bytes("ZeRO-3 bf16", psi, n)["moved"] == 8 * psi


def test_zero_rank_bytes_counts_adams_step_per_tensor_and_an_uneven_split():
    # notebook 09's MLP: 3 Linear(256, 256), rank 0 of 2 owns the two 65,536-element weights
    psi, tensors = 3 * (256 * 256 + 256), 6
    z1 = formulas.zero_rank_bytes("ZeRO-1", psi, 2, tensors=tensors, owned=(131_072, 2))
    assert z1["state"] == 8 * 131_072 + 4 * 2 == 1_048_584  # what 09 measured on rank 0
    assert formulas.zero_rank_bytes("ZeRO-3", psi, 2, tensors=tensors)["state"] == 789_528


def test_pipeline_in_flight_is_m_for_gpipe_and_p_minus_stage_for_1f1b():
    assert [formulas.pipeline_in_flight("GPipe", 8, 2, s) for s in (0, 1)] == [8, 8]
    assert [formulas.pipeline_in_flight("1F1B", 8, 2, s) for s in (0, 1)] == [2, 1]
    assert formulas.pipeline_in_flight("1F1B", 2, 4, 0) == 2  # never more than m


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: formulas.zero_rank_bytes("ZeRO-4", 10, 2), "setup must be one of"),
        (lambda: formulas.zero_rank_bytes("DDP", 10, 0), "n must be a whole number >= 1"),
        (lambda: formulas.pipeline_in_flight("GPipe", 4, 2, 2), "stage must be 0 to p - 1"),
        (lambda: formulas.pipeline_in_flight("interleaved", 4, 2, 0), "schedule must be one"),
    ],
)
def test_zero_and_pipeline_formulas_refuse_bad_input_in_one_sentence(call, words):
    with pytest.raises(ValueError, match=words):
        call()
