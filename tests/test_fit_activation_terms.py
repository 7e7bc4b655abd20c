"""The calculator's formulas against the fake-tensor pass they stand in for, to the byte.

``fit.activation_formulas`` answers without torch from multiples that
``tools/fit_activation_terms.py`` solved for on small random shapes; here the pass runs again on
each preset family's real shapes (Llama 3.1 8B, Llama 3.2 1B with its tied head, Mistral 7B,
Qwen2.5 0.5B and 7B with q/k/v biases, Gemma 2B with 256-wide heads, GPT-2 with learned
positions), at the batches and sequences people ask about, and every figure a moment of the
step reads must be equal. The parameter counts (``fit.shapes.counts``, by formula) are checked
against a model built on ``meta`` the same way.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from tutorial_utils.decoder import Decoder  # noqa: E402
from tutorial_utils.fit import activation_formulas as af  # noqa: E402
from tutorial_utils.fit import activations as fake  # noqa: E402
from tutorial_utils.fit import presets, shapes  # noqa: E402
from tutorial_utils.fit.activation_terms import MISSING, TERMS  # noqa: E402
from tutorial_utils.fit.states import Lora  # noqa: E402

#: One preset per family and head: (name, batch, seq) shapes people ask about.
FAMILIES = {
    "llama-8b": ((1, 2048), (2, 8192)),  # Llama 3.1 8B: GQA 32/8, untied
    "llama-1b": ((4, 4096),),  # Llama 3.2 1B: a tied head
    "mistral-7b": ((1, 4096),),
    "qwen2.5-0.5b": ((8, 1024),),  # q/k/v biases, a tied head, 14 heads over 2 kv heads
    "qwen2.5-7b": ((1, 4096),),
    "gemma-2b": ((2, 2048),),  # d_head 256: the queries' width is not d_model
    "gpt2-124m": ((8, 1024), (1, 512)),  # LayerNorm, GELU, biases, learned positions
    "gpt2-1.5b untied": ((2, 1024),),  # GPT-2 XL's shape with its own head (as --dims gives)
}


def _config(name: str):
    if name.endswith(" untied"):
        return dataclasses.replace(shapes.config(name.removesuffix(" untied"))[1], tied=False)
    return shapes.config(name)[1]


#: The knobs each shape is asked under: the CLI's default, the widget's, LoRA, and the rest.
CASES = (
    ("autocast-bf16", "none", None),
    ("bf16-master", "every-second-matmul", None),
    ("autocast-bf16", "none", Lora(16, "attention")),
    ("bf16-master", "full", None),
    ("autocast-bf16", "full", None),  # the advice's first try
    ("autocast-bf16", "full", Lora(16, "attention")),
    ("autocast-bf16", "every-matmul", None),
    ("pure-bf16", "none", Lora(8, "qv")),
    ("bf16-master", "none", Lora(16, "attention")),
    ("fp32", "none", None),
)


def _moments(block: af.Pass, head: af.Pass) -> tuple[int, ...]:
    """The figures ``peak`` reads (a block's forward_over is read by no moment)."""
    return (block.held, block.grads, block.backward_over, *vars(head).values())


@pytest.mark.heavy
@pytest.mark.parametrize("name", FAMILIES)
def test_the_formula_equals_the_fake_tensor_pass_on_real_shapes(name):
    cfg = _config(name)
    answered = 0
    for batch, seq in FAMILIES[name]:
        for precision, ckpt, lora in CASES:
            formula = af.by_formula(cfg, batch, seq, precision, ckpt, lora)
            if formula is None:  # no formula for this case: the calculator runs the pass
                continue
            fake.activations.cache_clear()
            truth = fake.activations(cfg, batch, seq, af.same_module(precision), ckpt, lora)
            assert _moments(*formula) == _moments(*truth), (name, batch, seq, precision, ckpt)
            answered += 1
    kind = ("rms-swiglu" if cfg.norm == "rms" else "layer-gelu", "tied" if cfg.tied else "untied")
    if kind in {key[:2] for key in TERMS}:  # the others answer on fake tensors (the CLI's test)
        assert answered >= len(FAMILIES[name]), f"{name}: no case was checked"


@pytest.mark.heavy
def test_litgpts_block_by_formula_equals_its_pass():
    """``block="litgpt"`` (the ``rms-swiglu-litgpt`` family, solved for one kv head per query
    head) on Llama 2 7B and 13B, the shapes litgpt's resource tables ran, to the byte."""
    answered = 0
    for name, batch, seq in (("llama-2-7b", 1, 1304), ("llama-2-13b", 2, 512)):
        cfg = shapes.config(name)[1]
        for precision, ckpt, lora in (
            ("pure-bf16", "none", Lora(8, "qv")),
            ("pure-bf16", "full", Lora(8, "qv")),
            ("bf16-master", "none", None),
            ("bf16-master", "every-second-matmul", Lora(16, "all")),
            ("autocast-bf16", "none", None),  # the CLI's default recipe
            ("autocast-bf16", "full", Lora(16, "attention")),
        ):
            formula = af.by_formula(cfg, batch, seq, precision, ckpt, lora, block="litgpt")
            if formula is None:  # no formula for this case: the calculator runs the pass
                continue
            fake.activations.cache_clear()
            truth = fake.activations(
                cfg, batch, seq, af.same_module(precision), ckpt, lora, block="litgpt"
            )
            assert _moments(*formula) == _moments(*truth), (name, batch, seq, precision, ckpt)
            answered += 1
    if any(key[0] == "rms-swiglu-litgpt" for key in TERMS):
        assert answered, "no litgpt case was checked"


def test_the_common_questions_have_a_formula():
    """The CLI's default recipe (autocast) and bf16 weights, under every checkpointing mode the
    advice tries, for the Llama-style heads, untied (Llama 3.1 8B/70B/405B, Llama 2, Mistral,
    Qwen2.5 7B+) and tied (Llama 3.2 1B/3B, Gemma, small Qwen2.5); the widget's default (bf16
    weights, every second matmul); LoRA under autocast and on bf16 weights; GPT-2's untied
    block: answered without torch (tests/test_fit_cli.py relies on it). The cases with no
    formula are listed in ``activation_terms.MISSING``."""
    for head in ("untied", "tied"):
        for recipe in ("autocast", "bf16-module"):
            for ckpt in ("none", "full", "every-matmul", "every-second-matmul"):
                assert ("rms-swiglu", head, recipe, ckpt, "none") in TERMS, (head, recipe, ckpt)
        for ckpt in ("none", "full"):
            assert ("rms-swiglu", head, "autocast", ckpt, "attention") in TERMS, (head, ckpt)
        assert ("rms-swiglu", head, "bf16-module", "none", "attention") in TERMS, head
    assert ("layer-gelu", "untied", "autocast", "none", "none") in TERMS
    for recipe in ("autocast", "bf16-module"):  # litgpt's block (block="litgpt")
        for targets in ("none", "qv"):
            assert ("rms-swiglu-litgpt", "untied", recipe, "none", targets) in TERMS
    assert not set(TERMS) & {tuple(m[:5]) for m in MISSING}


def test_no_formula_where_the_pass_decides():
    """QLoRA, explicit attention, cross-entropy in chunks and a LayerNorm + SwiGLU block: the
    pass."""
    _, cfg = shapes.config("llama-1b")
    qlora = Lora(16, "attention", "nf4")  # its frozen linears dequantize: not solved for
    assert af.by_formula(cfg, 1, 512, "bf16-master", "none", qlora) is None
    assert af.by_formula(cfg, 1, 512, "bf16-master", "none", Lora(16, "attention")) is not None
    assert af.by_formula(cfg, 1, 512, "autocast-bf16", "none", ce_chunks=8) is None
    assert af._case(dataclasses.replace(cfg, attention="explicit"), "fp32", "none", None, 1) is None
    odd = dataclasses.replace(cfg, norm="layer")
    assert af.by_formula(odd, 1, 512, "autocast-bf16", "none") is None
    # litgpt's block under grouped queries (Llama 3.2 1B: 32 query heads over 8): its reshapes copy
    assert af.by_formula(cfg, 1, 512, "bf16-master", "none", block="litgpt") is None


@pytest.mark.parametrize("name", presets.PRESETS)
def test_parameter_counts_by_formula_equal_a_model_on_meta(name):
    _, cfg = shapes.config(name)
    with torch.device("meta"):
        model = Decoder(cfg, n_layers=1)
    block = tuple(p.numel() for p in model.blocks[0].parameters())
    inside = {id(p) for p in model.blocks[0].parameters()}
    root = tuple(p.numel() for p in model.parameters() if id(p) not in inside)
    c = shapes.counts(cfg)
    assert (c.block_tensors, c.root_tensors) == (block, root)
    assert c.largest_tensor == max(p.numel() for p in model.parameters())
    assert c.total == sum(root) + cfg.n_layers * sum(block)
