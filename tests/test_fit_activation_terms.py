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
    for tying in ("untied", "tied"):
        if name.endswith(f" {tying}"):
            base = shapes.config(name.removesuffix(f" {tying}"))[1]
            return dataclasses.replace(base, tied=tying == "tied")
    return shapes.config(name)[1]


#: The knobs each shape is asked under: the CLI's default, the widget's, LoRA, QLoRA,
#: cross-entropy in chunks (torchtune's 8), fp32, and the rest.
CASES = (
    ("autocast-bf16", "none", None, 1),
    ("bf16-master", "every-second-matmul", None, 1),
    ("autocast-bf16", "none", Lora(16, "attention"), 1),
    ("bf16-master", "full", None, 1),
    ("autocast-bf16", "full", None, 1),  # the advice's first try
    ("autocast-bf16", "full", Lora(16, "attention"), 1),
    ("autocast-bf16", "every-matmul", None, 1),
    ("pure-bf16", "none", Lora(8, "qv"), 1),
    ("bf16-master", "none", Lora(16, "attention"), 1),
    ("fp32", "none", None, 1),
    ("fp32", "full", None, 1),
    ("autocast-bf16", "none", Lora(16, "attention", "nf4"), 1),  # the CLI's --qlora
    ("bf16-master", "full", Lora(16, "attention", "nf4"), 1),
    ("bf16-master", "none", Lora(8, "qv", "nf4"), 1),
    ("autocast-bf16", "none", None, 8),
    ("bf16-master", "every-second-matmul", None, 8),
    ("bf16-master", "none", Lora(16, "attention"), 8),
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
        for precision, ckpt, lora, chunks in CASES:
            formula = af.by_formula(cfg, batch, seq, precision, ckpt, lora, chunks)
            if formula is None:  # no formula for this case: the calculator runs the pass
                continue
            fake.activations.cache_clear()
            truth = fake.activations(cfg, batch, seq, af.same_module(precision), ckpt, lora, chunks)
            case = (name, batch, seq, precision, ckpt, lora, chunks)
            assert _moments(*formula) == _moments(*truth), case
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


#: One real shape per family and head, for every solved case.
EVERY_CASE_SHAPE = {
    ("rms-swiglu", "untied"): "qwen2.5-7b",  # GQA 28/4, q/k/v biases
    ("rms-swiglu", "tied"): "llama-1b",
    ("layer-gelu", "tied"): "gpt2-124m",
    ("layer-gelu", "untied"): "gpt2-1.5b untied",
    ("rms-swiglu-litgpt", "untied"): "llama-2-7b",  # one kv head per query head, as solved
    ("rms-swiglu-litgpt", "tied"): "llama-2-7b tied",
}
_RECIPE_OF = {"autocast": "autocast-bf16", "bf16-module": "bf16-master", "fp32": "fp32"}


def _question(key: tuple) -> tuple:
    """(precision, checkpointing, lora, ce_chunks) that asks for ``key``'s case."""
    family, head, recipe, ckpt, words = key
    chunks = 1
    if ckpt.startswith(af.CHUNKED):  # a head-only case: asked with its unchunked block
        chunks = int(ckpt.rpartition("-")[2]) if ckpt != af.CHUNKED else 8
        ckpt, words = "none", {"none": "none", "lora": "attention"}.get(words, "attention+bnb-nf4")
    targets, _, base = words.partition("+")
    lora = None if targets == "none" else Lora(16, targets, base or "bf16")
    return _RECIPE_OF[recipe], ckpt, lora, chunks


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(TERMS), ids=lambda key: "/".join(key))
def test_every_solved_case_equals_the_pass_on_a_real_shape(key):
    """Every case in ``activation_terms.TERMS`` (not only ``CASES``), at batch 1 x 1024 tokens of
    its family's real shape: the formula's figures equal the pass's, to the byte (where the
    case's other part has no formula, the question has none: nothing to compare).

    293 cases, about 30 s of CPU: ``slow`` (``make test-all``, and after every run of
    ``tools/fit_activation_terms.py``, which is the only way the table changes); ``make test``
    holds a sample of them on real shapes (``test_the_formula_equals_the_fake_tensor_pass_on_
    real_shapes`` and the tests below)."""
    cfg = _config(EVERY_CASE_SHAPE[key[:2]])
    precision, ckpt, lora, chunks = _question(key)
    block = "litgpt" if key[0].endswith("-litgpt") else "course"
    formula = af.by_formula(cfg, 1, 1024, precision, ckpt, lora, chunks, block)
    if formula is None:
        assert key[3].startswith(af.CHUNKED), key  # the block of this frozen head is unsolved
        pytest.skip(f"{key}: its block has no formula, so no question uses this head alone")
    fake.activations.cache_clear()
    truth = fake.activations(cfg, 1, 1024, af.same_module(precision), ckpt, lora, chunks, block)
    assert _moments(*formula) == _moments(*truth), key


CHUNKED_CFG = {"untied": _config("llama-8b"), "tied": _config("llama-1b")}
RECIPES = {"autocast": "autocast-bf16", "bf16-module": "bf16-master"}


def test_the_common_questions_have_a_formula():
    """The CLI's default recipe (autocast) and bf16 weights, under every checkpointing mode the
    advice tries, for the Llama-style heads, untied (Llama 3.1 8B/70B/405B, Llama 2, Mistral,
    Qwen2.5 7B+) and tied (Llama 3.2 1B/3B, Gemma, small Qwen2.5); the widget's default (bf16
    weights, every second matmul); LoRA under autocast and on bf16 weights; GPT-2's untied
    block; QLoRA (``--qlora``) under autocast and on bf16 weights, the widget's too; fp32
    training under every checkpointing mode; cross-entropy in chunks for the Llama-style and
    GPT-2 heads, trained or frozen under LoRA: answered without torch (tests/test_fit_cli.py
    relies on it). The cases the tool tried and could not solve are listed in
    ``activation_terms.MISSING``."""
    for head in ("untied", "tied"):
        for recipe in ("autocast", "bf16-module"):
            for ckpt in ("none", "full", "every-matmul", "every-second-matmul"):
                assert ("rms-swiglu", head, recipe, ckpt, "none") in TERMS, (head, recipe, ckpt)
        for ckpt in ("none", "full"):
            assert ("rms-swiglu", head, "autocast", ckpt, "attention") in TERMS, (head, ckpt)
        assert ("rms-swiglu", head, "bf16-module", "none", "attention") in TERMS, head
        for recipe in ("autocast", "bf16-module"):
            assert ("rms-swiglu", head, recipe, "none", "attention+nf4") in TERMS, (head, recipe)
            assert ("rms-swiglu", head, recipe, af.CHUNKED, "lora") in TERMS, (head, recipe)
            cfg = CHUNKED_CFG[head]  # in 8 chunks (per count of chunks for a tied head)
            assert af.by_formula(cfg, 1, 4096, RECIPES[recipe], "none", None, 8), (head, recipe)
        qlora = ("rms-swiglu", head, "bf16-module", "every-second-matmul", "attention+nf4")
        assert qlora in TERMS, head  # the widget's default, with its QLoRA switch
        for ckpt in ("none", "full", "every-matmul", "every-second-matmul"):
            assert ("rms-swiglu", head, "fp32", ckpt, "none") in TERMS, (head, ckpt)
    assert ("layer-gelu", "untied", "autocast", "none", "none") in TERMS
    for recipe in ("autocast", "bf16-module"):  # litgpt's block (block="litgpt")
        for targets in ("none", "qv"):
            assert ("rms-swiglu-litgpt", "untied", recipe, "none", targets) in TERMS
    for name in ("gpt2-124m", "gpt2-1.5b untied"):  # GPT-2's head, tied and untied
        assert af.by_formula(_config(name), 1, 1024, "autocast-bf16", "none", None, 8), name
    assert not set(TERMS) & {tuple(m[:5]) for m in MISSING}


def test_no_formula_where_the_pass_decides():
    """LoRA dropout, cross-entropy in pieces of unequal length, explicit attention and a
    LayerNorm + SwiGLU block (``--dims norm=layer``): the pass. QLoRA and cross-entropy in equal
    pieces have formulas."""
    _, cfg = shapes.config("llama-8b")
    dropped = Lora(16, "attention", dropout=0.05)  # a dropout mask per adapter: not solved for
    assert af.by_formula(cfg, 1, 512, "bf16-master", "none", dropped) is None
    assert af.by_formula(cfg, 1, 512, "bf16-master", "none", Lora(16, "attention")) is not None
    qlora = Lora(16, "attention", "nf4")
    assert af.by_formula(cfg, 1, 512, "autocast-bf16", "none", qlora) is not None
    assert af.by_formula(cfg, 1, 512, "autocast-bf16", "none", ce_chunks=8) is not None
    assert af.pieces(511, 8) is None  # 8 pieces of 64 but the last of 63: another moment
    assert af.by_formula(cfg, 1, 511, "autocast-bf16", "none", ce_chunks=8) is None
    assert af._case(dataclasses.replace(cfg, attention="explicit"), "fp32", "none", None, 1) is None
    odd = dataclasses.replace(cfg, norm="layer", bias=True)
    assert af.by_formula(odd, 1, 512, "autocast-bf16", "none") is None
    # litgpt's block under grouped queries (Llama 3.2 1B: 32 query heads over 8): its reshapes copy
    assert af.by_formula(cfg, 1, 512, "bf16-master", "none", block="litgpt") is None
    gpt2 = _config("gpt2-124m")  # its formulas were solved with a k and v head per query head
    assert af.by_formula(gpt2, 1, 512, "fp32", "none") is not None
    assert af.by_formula(dataclasses.replace(gpt2, n_kv_heads=4), 1, 512, "fp32", "none") is None


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
