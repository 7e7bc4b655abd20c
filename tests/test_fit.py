"""fit: the "will it fit" calculator, its exact parts against whole-model runs (issue 21)."""

from __future__ import annotations

import pytest
import torch

from tutorial_utils import fit, formulas
from tutorial_utils.decoder import PRESETS, Decoder, DecoderConfig

TOY = DecoderConfig(vocab=300, d_model=32, n_layers=3, n_heads=4, max_positions=64)


def test_model_states_are_bytes_per_parameter_times_the_count():
    r = fit.will_it_fit("llama-8b", batch=1, seq=256, precision="fp32", optimizer="adamw")
    n = 8_030_261_248
    assert r.n_parameters == n
    assert (r.categories["weights"], r.categories["gradients"]) == (4 * n, 4 * n)
    assert r.categories["optimizer state"] == 8 * n and r.categories["master weights"] == 0
    m = fit.will_it_fit("llama-8b", batch=1, seq=256, precision="bf16-master", optimizer="sgd")
    assert (m.categories["weights"], m.categories["master weights"]) == (2 * n, 4 * n)
    assert m.categories["optimizer state"] == 0


@pytest.mark.parametrize("sharding", ["zero1", "zero2", "zero3"])
def test_sharding_divides_what_each_stage_says(sharding):
    one = fit.will_it_fit("llama-1b", seq=256, precision="bf16-master")
    eight = fit.will_it_fit(
        "llama-1b", seq=256, precision="bf16-master", sharding=sharding, n_gpus=8
    )
    c1, c8 = one.categories, eight.categories
    assert c8["optimizer state"] == c1["optimizer state"] // 8
    assert c8["master weights"] == c1["master weights"] // 8
    assert c8["gradients"] == (c1["gradients"] // 8 if sharding != "zero1" else c1["gradients"])
    assert c8["weights"] == (c1["weights"] // 8 if sharding == "zero3" else c1["weights"])
    assert c8["activations"] == c1["activations"], "each GPU runs its own micro-batch"


@pytest.mark.parametrize("precision", ["fp32", "autocast-bf16", "bf16-master"])
@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_one_block_times_layers_is_the_whole_model(precision, checkpointing):
    """The calculator runs one block and multiplies: a whole fake model holds the same."""
    b, s = 2, 16
    block, _, head, _ = fit._activations(TOY, b, s, precision, checkpointing)
    targets = torch.zeros(b * s, dtype=torch.long)

    def tokens():
        return torch.zeros(b, s, dtype=torch.long)

    class Checkpointed(torch.nn.Module):  # the whole model, each block under `checkpointing`
        def __init__(self):
            super().__init__()
            self.inner = Decoder(TOY)

        def forward(self, t):
            m = self.inner
            x = m.embed(t) + m.positions(torch.arange(t.shape[1]))
            for blk in m.blocks:
                x = fit._run(blk, x, checkpointing)
            return m.head(m.norm(x))

    whole, _ = fit._fake_pass(Checkpointed, tokens, fit._cross_entropy(targets), precision, "none")
    assert whole == TOY.n_layers * block + head


def test_fake_block_matches_a_real_block_and_the_formula():
    b, s = 2, 16
    block, _, _, _ = fit._activations(TOY, b, s, "fp32", "none")
    real = Decoder(TOY).blocks[0]
    x = torch.randn(b, s, TOY.d_model, requires_grad=True)
    from tutorial_utils import memory

    with memory.measure("cpu") as m:
        y = real(x)
    # held = what the block saved + its output, less its input (booked before): the formula
    out = y.untyped_storage().nbytes()
    assert block == m.delta_bytes
    assert block == formulas.block_activation_bytes(TOY, b, s) + out - x.untyped_storage().nbytes()


def test_full_checkpointing_keeps_only_each_block_input():
    b, s = 2, 16
    none, _, _, _ = fit._activations(TOY, b, s, "fp32", "none")
    full, over, _, _ = fit._activations(TOY, b, s, "fp32", "full")
    sel, _, _, _ = fit._activations(TOY, b, s, "fp32", "selective")
    assert full == b * s * TOY.d_model * 4, "the output (next block's input) only"
    assert full < sel < none
    assert over >= none - full, "backward recomputes the block's activations"


def test_report_verdict_and_text_form():
    small = fit.will_it_fit("gpt2-124m", batch=1, seq=128, precision="bf16-master")
    assert small.fits_on == tuple(fit.GPUS) and small.verdict.startswith("fits on T4")
    huge = fit.will_it_fit("llama-70b", batch=1, seq=128, precision="fp32")
    assert huge.fits_on == () and "fits on none" in huge.verdict
    text = fit.text_form(preset="gpt2-124m", batch=1, seq=128)
    assert "total (exact)" in text and "total (formula)" in text and "fits on" in text


@pytest.mark.parametrize("preset", ["gpt2-124m", "llama-8b"])
@pytest.mark.parametrize("precision", ["fp32", "autocast-bf16", "bf16-master"])
def test_formula_total_is_near_exact(preset, precision):
    """The formula has no transient: without it the two agree to a few percent."""
    r = fit.will_it_fit(preset, batch=2, seq=512, precision=precision, optimizer="adamw")
    held = r.total - r.categories["transient"]
    assert abs(r.formula_total - held) / held < 0.03, (r.formula_total, held)


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"preset": "llama-9b"}, "preset must be one of"),
        ({"precision": "fp8"}, "precision must be one of"),
        ({"optimizer": "lion"}, "optimizer must be one of"),
        ({"checkpointing": "some"}, "checkpointing must be one of"),
        ({"sharding": "zero4"}, "sharding must be one of"),
        ({"batch": 0}, "batch must be a whole number"),
        ({"n_gpus": 4}, "needs a sharding stage"),
        ({"preset": "gpt2-124m", "seq": 4096}, "learned positions"),
    ],
)
def test_bad_knobs_say_what_to_do(knobs, message):
    with pytest.raises(ValueError, match=message):
        fit.will_it_fit(**knobs)


def test_presets_build_on_meta_without_memory():
    for cfg in PRESETS.values():
        with torch.device("meta"):
            model = Decoder(cfg, n_layers=1)
        assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("args", [["llama-8b", "--batch", "-3"], ["gpt2-124m", "--n-gpus", "0"]])
def test_the_command_line_says_what_is_wrong_in_one_sentence(args, capsys):
    assert fit.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("fit: ") and err.count("\n") == 1 and "Traceback" not in err


def test_shard_model_states_divides_what_each_stage_says_and_refuses_bad_input():
    import doctest

    states = {"weights": 80, "gradients": 80, "master weights": 160, "optimizer state": 320}
    assert fit.shard_model_states(states, "none", 1) == states
    assert fit.shard_model_states(states, "zero1", 4) == {
        "weights": 80,
        "gradients": 80,
        "master weights": 40,
        "optimizer state": 80,
    }
    assert fit.shard_model_states(states, "zero3", 4) == {k: v // 4 for k, v in states.items()}
    with pytest.raises(ValueError, match="sharding must be one of"):
        fit.shard_model_states(states, "zero4", 2)
    with pytest.raises(ValueError, match="n_gpus must be a whole number"):
        fit.shard_model_states(states, "zero1", 0)
    result = doctest.testmod(fit)
    assert result.attempted >= 1 and result.failed == 0


def test_the_picture_ends_near_the_bar_and_merges_gpus_of_one_size():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    small = fit.will_it_fit("gpt2-124m", batch=1, seq=512, precision="bf16-master")
    ax = small.plot()
    t4 = fit.GPUS["T4 (15 GiB)"] / fit.GiB
    assert ax.get_xlim() == pytest.approx((0, 1.08 * t4))  # the first GPU that holds it
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["T4 (15 GiB)"]
    plt.close(ax.figure)

    huge = fit.will_it_fit("llama-70b", batch=1, seq=2048, precision="bf16-master")
    ax = huge.plot()
    biggest = max(huge.total, huge.formula_total) / fit.GiB
    assert not huge.fits_on and ax.get_xlim()[1] == pytest.approx(1.15 * biggest)
    labels = [t.get_text() for t in ax.texts]
    assert "A100 80GB / H100 80GB" in labels and len(labels) == len(set(fit.GPUS.values()))
    plt.close(ax.figure)
