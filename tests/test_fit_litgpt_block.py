"""fit's ``block="litgpt"``: the re-creation saves, to the byte, what litgpt's own block saved.

``tools/litgpt_block_bytes.py`` ran ``lit_gpt.lora.Block`` (and ``lit_gpt.model.Block`` for a
full fine-tune) from Lightning-AI/litgpt at commit 8641822, the commit litgpt's resource
tables were measured at, once, on fake tensors with the calculator's own books
(``fit.activations._fake_pass``): LoRA r=8, dropout 0.05 (CUDA's fused kernel), bf16 weights,
an fp32 RoPE cache; under QLoRA every linear as ``fit.activations._Nf4Linear("bnb")``. Its
figures are written here, with the commit, because CI cannot import litgpt; the re-creation
(``fit.litgpt_block``) must give the same four figures on each shape: what the block keeps for
backward (``held``), its forward's and backward's peaks above that, and its weight gradients.

    python tools/litgpt_block_bytes.py /work/.mirror/Lightning-AI+litgpt/repo --commit 8641822
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tutorial_utils import fit  # noqa: E402
from tutorial_utils.fit import activations as fake  # noqa: E402
from tutorial_utils.fit import cli, shapes  # noqa: E402
from tutorial_utils.fit.activation_formulas import Pass  # noqa: E402
from tutorial_utils.fit.states import Lora  # noqa: E402

COMMIT = "8641822"

#: (preset, batch, seq, checkpointing, LoRA targets or None, base) -> litgpt 8641822's block,
#: as tools/litgpt_block_bytes.py printed it: the resource tables' single-GPU rows (Alpaca's
#: longest sample, 1304 tokens), their FSDP1 rows' checkpointed block, grouped queries (70B),
#: the other targets and a full fine-tune.
LITGPT_8641822 = {
    ("llama-2-7b", 1, 1304, "none", "qv", "bf16"): Pass(209253216, 60755968, 85864452, 262144),
    ("llama-2-7b", 1, 1304, "none", "qv", "bnb-nf4"): Pass(270009184, 180355072, 180092932, 262144),
    ("llama-2-13b", 2, 1304, "none", "qv", "bf16"): Pass(524029120, 152223744, 215990276, 327680),
    ("llama-2-13b", 1, 1304, "none", "qv", "bnb-nf4"): Pass(
        338167392, 283115520, 282787844, 327680
    ),
    ("llama-2-7b", 4, 1304, "full", "qv", "bf16"): Pass(42729472, 587530240, 1138331012, 262144),
    ("llama-2-70b", 1, 512, "none", "qv", "bf16"): Pass(160655360, 54525952, 87670788, 409600),
    ("llama-2-70b", 1, 512, "none", "all", "bf16"): Pass(232974336, 71303168, 42033156, 2588672),
    ("llama-2-7b", 2, 256, "none", "attention", "bnb-nf4"): Pass(
        103909376, 180355072, 179830788, 524288
    ),
    ("llama-2-7b", 2, 256, "none", None, "bf16"): Pass(99682304, 8388608, 0, 404766720),
}


@pytest.mark.parametrize("case", LITGPT_8641822, ids=lambda case: " ".join(map(str, case)))
def test_the_re_creation_saves_what_litgpts_block_saved(case):
    preset, batch, seq, ckpt, targets, base = case
    cfg = shapes.config(preset)[1]
    lora = Lora(8, targets, base, 0.05) if targets else None
    fake.activations.cache_clear()
    block, _ = fake.activations(cfg, batch, seq, "bf16-master", ckpt, lora, block="litgpt")
    assert block == LITGPT_8641822[case], f"litgpt {COMMIT}'s block: {LITGPT_8641822[case]}"


def test_litgpts_block_keeps_more_than_the_courses_on_the_resource_tables_shape():
    """The course's block is still the default, and it is not litgpt's: on the resource tables'
    Llama 2 7B QLoRA shape litgpt's keeps 21,425,056 B more a layer (two tokens x d_model bf16
    tensors, and the index litgpt's zero_pad makes: fit.litgpt_block's docstring)."""
    cfg = shapes.config("llama-2-7b")[1]
    lora = Lora(8, "qv", "bnb-nf4", 0.05)
    course = fit.activations.activations(cfg, 1, 1304, "bf16-master", "none", lora)[0]
    litgpt = fit.activations.activations(cfg, 1, 1304, "bf16-master", "none", lora, block="litgpt")[
        0
    ]
    assert litgpt.held - course.held == 21_425_056 == 2 * 1304 * 4096 * 2 + 8 * 8192 - 2 * 1304 * 2


def test_the_knob_moves_the_answer_by_the_blocks_difference():
    kw = dict(batch=1, seq=1304, precision="pure-bf16", lora_rank=8, lora_targets="qv")
    course = fit.will_it_fit("llama-2-7b", **kw)
    litgpt = fit.will_it_fit("llama-2-7b", **kw, block="litgpt")
    for r in (course, litgpt):  # a moment that holds every layer's activations
        assert max(r.peaks, key=r.peaks.get) in ("end of forward", "start of backward")
    more = litgpt.categories["activations"] - course.categories["activations"]
    assert more == 32 * (209253216 - 198510528)  # litgpt's block less the course's, per layer
    assert "litgpt 8641822's block" in litgpt.extras
    assert not any("litgpt" in said for said in course.extras)


def test_a_model_litgpts_llama_block_is_not_gets_one_sentence():
    with pytest.raises(ValueError, match="block='litgpt' re-creates litgpt 8641822's Llama"):
        fit.will_it_fit("gpt2-124m", seq=128, block="litgpt")
    with pytest.raises(ValueError, match="heads must span it"):
        fit.will_it_fit("gemma-7b", seq=128, block="litgpt")
    with pytest.raises(ValueError, match="did you mean 'litgpt'"):
        fit.will_it_fit("llama-2-7b", seq=128, block="litgtp")


def test_the_cli_takes_the_block(capsys):
    assert cli.main(["llama-2-7b", "--seq", "512", "--block", "litgpt"]) in (0, 1)
    assert "litgpt 8641822's block" in capsys.readouterr().out
