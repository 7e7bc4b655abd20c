"""fit: the "will it fit" calculator, its exact parts against whole-model runs (issues 21, 33)."""

from __future__ import annotations

import pytest
import torch

from tutorial_utils import fit, formulas
from tutorial_utils.decoder import PRESETS, Decoder, DecoderConfig

TOY = DecoderConfig(vocab=300, d_model=32, n_layers=3, n_heads=4, max_positions=64)


N_8B = 8_030_261_248  # Llama 3.1 8B as released


def test_model_states_are_bytes_per_parameter_times_the_count():
    r = fit.will_it_fit("llama-8b", batch=1, seq=256, precision="fp32", optimizer="adamw")
    assert r.n_parameters == N_8B
    s = r.model_states
    assert (s["weights"], s["gradients"]) == (4 * N_8B, 4 * N_8B)
    assert s["optimizer state"] == 8 * N_8B and s["master weights"] == 0
    m = fit.will_it_fit("llama-8b", seq=256, precision="bf16-master", optimizer="sgd").model_states
    assert (m["weights"], m["master weights"], m["optimizer state"]) == (2 * N_8B, 4 * N_8B, 0)


@pytest.mark.parametrize(
    "recipe, per_parameter",
    [("pure-bf16", 8), ("bf16-master", 16), ("bf16-master-fp32-grads", 20), ("fp32", 16)],
)
def test_each_recipe_costs_what_it_says_per_parameter(recipe, per_parameter):
    r = fit.will_it_fit("llama-8b", seq=256, precision=recipe, optimizer="adam")
    assert sum(r.model_states.values()) == per_parameter * N_8B
    assert r.states_bytes == per_parameter * N_8B  # one GPU: nothing gathered, no buckets


@pytest.mark.parametrize("sharding", ["zero1", "zero2", "zero3"])
def test_sharding_divides_what_each_stage_says(sharding):
    one = fit.will_it_fit("llama-1b", seq=256, precision="bf16-master")
    eight = fit.will_it_fit(
        "llama-1b", seq=256, precision="bf16-master", sharding=sharding, n_gpus=8
    )
    c1, c8 = one.model_states, eight.model_states
    assert c8["optimizer state"] == c1["optimizer state"] // 8
    assert c8["master weights"] == c1["master weights"] // 8
    assert c8["gradients"] == (c1["gradients"] // 8 if sharding != "zero1" else c1["gradients"])
    assert c8["weights"] == (c1["weights"] // 8 if sharding == "zero3" else c1["weights"])

    def activations_at_end_of_forward(r):
        fixed = r.states_bytes - r.model_states["gradients"]
        return r.peaks["end of forward"] - fixed

    assert activations_at_end_of_forward(eight) == activations_at_end_of_forward(one), (
        "each GPU runs its own micro-batch"
    )


def test_zero3_gathers_the_largest_unit_the_root_for_llama_8b_a_block_for_gpt2():
    llama = fit.will_it_fit(
        "llama-8b", seq=256, precision="bf16-master", sharding="zero3", n_gpus=8
    )
    root = 2 * 128256 * 4096 + 4096  # embedding and head (untied), final norm
    assert llama.categories["gathered unit"] == 4 * root  # bf16 weights and their gradients
    assert llama.gathered_unit.startswith("the root")
    gpt2 = fit.will_it_fit("gpt2", seq=256, precision="bf16-master", sharding="zero3", n_gpus=8)
    n, block_n = (
        fit.shapes.counts(PRESETS["gpt2-124m"]).total,
        fit.shapes.counts(PRESETS["gpt2-124m"]).block,
    )
    root_n = n - 12 * block_n  # tied embedding, positions, final norm: 39 M < a block's 7 M?
    assert gpt2.categories["gathered unit"] == 4 * max(root_n, block_n)


def test_the_peak_is_the_largest_moment_not_the_sum():
    r = fit.will_it_fit("llama-1b", batch=2, seq=1024, precision="bf16-master")
    assert r.peak_bytes == max(r.peaks.values()) == r.peaks[r.peak_moment]
    block, head = fit.activations.activations(PRESETS["llama-1b"], 2, 1024, "bf16-master", "none")
    everything_at_once = (
        sum(r.model_states.values())
        + 16 * block.held
        + head.held
        + max(head.forward_over, head.backward_over, block.backward_over)
    )
    assert r.peak_bytes < everything_at_once, "gradients and every activation never coexist"
    # Each moment is made of its own parts: forward holds no gradients, the end of backward
    # holds every gradient and one block's activations
    fixed = r.peaks["end of backward"] - r.model_states["gradients"] - block.held
    assert fixed - block.backward_over == r.states_bytes - r.model_states["gradients"]


@pytest.mark.parametrize("precision", ["fp32", "autocast-bf16", "bf16-master"])
@pytest.mark.parametrize("checkpointing", ["none", "every-matmul", "every-second-matmul", "full"])
def test_one_block_times_layers_is_the_whole_model(precision, checkpointing):
    """The calculator runs one block and multiplies: a whole fake model holds the same."""
    b, s = 2, 16
    block, head = fit.activations.activations(TOY, b, s, precision, checkpointing)

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
                x = fit.activations._run(blk, x, checkpointing)
            return m.head(m.norm(x))

    whole = fit.activations._fake_pass(
        Checkpointed, tokens, fit.activations.cross_entropy, precision, "none"
    )
    assert whole.held == TOY.n_layers * block.held + head.held


def test_fake_block_matches_a_real_block_and_the_formula():
    b, s = 2, 16
    block = fit.activations.activations(TOY, b, s, "fp32", "none")[0].held
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
    none = fit.activations.activations(TOY, b, s, "fp32", "none")[0]
    full = fit.activations.activations(TOY, b, s, "fp32", "full")[0]
    every = fit.activations.activations(TOY, b, s, "fp32", "every-matmul")[0]
    second = fit.activations.activations(TOY, b, s, "fp32", "every-second-matmul")[0]
    assert full.held == b * s * TOY.d_model * 4, "the output (next block's input) only"
    assert full.held < second.held < every.held < none.held
    # backward recomputes the block: its peak rises above what the plain block's backward needs
    assert full.backward_over > none.backward_over + (none.held - full.held) // 2


@pytest.mark.heavy
def test_report_verdict_names_the_number_and_the_headroom():
    small = fit.will_it_fit("gpt2", batch=1, seq=128, precision="bf16-master", gpu="T4")
    assert small.fits and small.verdict.startswith("fits on one T4 (16 GB, spec sheet): needs ")
    assert small.total == small.peak_bytes + sum(small.headroom.values())
    assert set(small.headroom) == {"CUDA context", "allocator reserve"}
    assert "+ headroom" in small.verdict
    raw = fit.will_it_fit("gpt2", batch=1, seq=128, precision="bf16-master", headroom=False)
    assert raw.total == raw.peak_bytes == small.peak_bytes and raw.headroom == {}
    assert "no headroom kept" in raw.verdict
    huge = fit.will_it_fit("llama-70b", batch=1, seq=128, precision="fp32", gpu="H200")
    assert huge.fits is False and huge.verdict.startswith("does not fit on one H200")
    text = fit.text_form(preset="gpt2-124m", batch=1, seq=128)
    assert "peak, at the" in text and "total" in text and "CUDA context" in text


@pytest.mark.parametrize(
    "name", ["llama-3-8b", "Llama-3.1-8B", "meta-llama/Llama-3.1-8B", "LLAMA 3 8B", "llama-8b"]
)
def test_the_names_people_type_are_one_model(name):
    assert fit.will_it_fit(name, seq=128).preset == "llama-8b"


@pytest.mark.parametrize("preset", ["gpt2-124m", "llama-8b"])
@pytest.mark.parametrize("precision", ["fp32", "autocast-bf16", "bf16-master"])
def test_formula_total_is_near_the_exact_sum(preset, precision):
    """The formula sums states, activations and logits; the exact parts summed the same way
    (end of forward, plus every gradient) agree to a few percent."""
    r = fit.will_it_fit(preset, batch=2, seq=512, precision=precision, optimizer="adamw")
    summed = r.peaks["end of forward"] + r.model_states["gradients"]
    block, head = fit.activations.activations(PRESETS[preset], 2, 512, precision, "none")
    summed -= head.forward_over  # the formula has no transient
    assert abs(r.formula_total - summed) / summed < 0.03, (r.formula_total, summed)


@pytest.mark.parametrize(
    "knobs, error, message",
    [
        (
            {"preset": "llama-9b"},
            ValueError,
            "model 'llama-9b' is unknown: did you mean 'llama-8b'\\? choose one of",
        ),
        ({"precision": "fp8"}, ValueError, "precision 'fp8' is unknown: choose one of"),
        ({"optimizer": "lion"}, ValueError, "optimizer 'lion' is unknown"),
        ({"checkpointing": "some"}, ValueError, "checkpointing 'some' is unknown"),
        ({"sharding": "zero4"}, ValueError, "sharding 'zero4' is unknown"),
        ({"batch": 0}, ValueError, "batch must be a whole number from 1"),
        ({"batch": 2.5}, TypeError, "batch must be a whole number such as 4"),
        (
            {"sharding": "zero3"},
            ValueError,
            "zero3 shards over several GPUs and does nothing on one",
        ),
        ({"preset": "gpt2-124m", "seq": 4096}, ValueError, "learned positions"),
        ({"gpu": "GTX 9090"}, ValueError, "GPU 'GTX 9090' is unknown: did you mean 'RTX 4090'"),
        ({"headroom": "yes"}, TypeError, "headroom must be True or False"),
        ({"batch": 10**7, "seq": 10**6}, ValueError, "more than any GPU has"),
    ],
)
def test_bad_knobs_say_what_to_do_in_one_sentence(knobs, error, message):
    with pytest.raises(error, match=message) as info:
        fit.will_it_fit(**({"seq": 256} | knobs))
    assert "\n" not in str(info.value)


def test_several_gpus_without_sharding_are_ddp_with_its_buckets():
    one = fit.will_it_fit("llama-1b", seq=256, precision="bf16-master")
    four = fit.will_it_fit("llama-1b", seq=256, precision="bf16-master", n_gpus=4)
    assert four.model_states == one.model_states
    assert four.categories["DDP buckets"] == one.model_states["gradients"]
    assert "DDP over 4 GPUs" in repr(four)


def test_a_huge_batch_allocates_nothing_and_answers_fast(monkeypatch):
    # issue 37: this also held the answer to < 20 s of wall clock; what makes it quick is what
    # runs: a formula (fit.activation_formulas), or where none is written one block and the
    # embedding + head on fake tensors, never the 12 layers (seconds: benchmarks/fit_times.py)
    import resource

    from tutorial_utils.decoder import Block

    passes, real_pass = [], fit.activations._fake_pass

    def fake_pass(build, *args):
        with torch.device("meta"):
            passes.append(sum(isinstance(m, Block) for m in build().modules()))
        return real_pass(build, *args)

    monkeypatch.setattr(fit.activations, "_fake_pass", fake_pass)
    fit.activations.activations.cache_clear()  # from scratch, not an earlier test's cache
    fit.activation_formulas.activations.cache_clear()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    big = fit.will_it_fit("mistral-7b", batch=10_000, seq=1024, precision="bf16-master")
    assert passes == [] and big.categories["activations"] > 100 * 2**30  # by formula
    r = fit.will_it_fit("gpt2", batch=100_001, seq=1023, precision="bf16-master", ce_chunks=8)
    assert passes == [1, 0], passes  # no formula (8 unequal pieces of loss): a block, the head
    assert r.categories["activations"] > 100 * 2**30  # hundreds of GiB, none of them real
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200 * 1024, f"the process grew by {grown_kib} KiB: something was real"


def test_presets_build_on_meta_without_memory():
    for cfg in PRESETS.values():
        with torch.device("meta"):
            model = Decoder(cfg, n_layers=1)
        assert all(p.is_meta for p in model.parameters())


def test_the_gpu_table_and_the_names_agree_with_the_presets():
    from tutorial_utils import fit_inputs
    from tutorial_utils.fit import presets

    assert set(PRESETS) <= set(fit_inputs.MODELS)  # the course's five, then the rest
    for name, cfg in PRESETS.items():  # decoder.PRESETS and the table give the same shapes
        assert DecoderConfig(**presets.PRESETS[name].fields) == cfg
    assert set(fit_inputs.RECIPES) == set(formulas.PRECISIONS) == set(fit.PRECISIONS)
    for name, gb in {"A10G": 24, "L40S": 48, "T4": 16}.items():  # no reported total found
        assert fit_inputs.gpu(name).memory_bytes == gb * 10**9
    for name, mib in {"RTX 3090": 24576, "RTX 4090": 24564, "L4": 23034, "A100": 81920}.items():
        card = fit_inputs.gpu(name)  # nvidia-smi's totals, each with its source
        assert card.memory_bytes == mib * 2**20 and f"{mib}MiB" in card.source


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
    result = doctest.testmod(fit.profiles)
    assert result.attempted >= 1 and result.failed == 0


@pytest.mark.heavy
def test_the_picture_ends_near_the_bar_and_its_title_fits():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    small = fit.will_it_fit("gpt2-124m", batch=1, seq=512, precision="bf16-master")
    ax = small.plot()
    t4 = fit.GPUS["T4"] / fit.cards.GiB
    assert ax.get_xlim() == pytest.approx((0, 1.08 * t4))  # the first GPU that holds it
    assert [t.get_text() for t in ax.texts] == ["T4 / V100-16GB"]
    plt.close(ax.figure)

    huge = fit.will_it_fit("llama-70b", batch=1, seq=2048, precision="bf16-master", gpu="H100")
    ax = huge.plot()
    assert ax.get_xlim()[1] == pytest.approx(1.15 * huge.total / fit.cards.GiB)
    assert [t.get_text() for t in ax.texts] == ["H100 (81,559 MiB reported)"]
    figure = ax.figure
    figure.canvas.draw()
    title = ax.title.get_window_extent(figure.canvas.get_renderer())
    assert 0 <= title.x0 and title.x1 <= figure.bbox.width, "the title is not clipped"
    assert "does not fit" in ax.get_title()
    plt.close(figure)
