"""The calculator widget: every knob reaches fit.will_it_fit, and the summary follows it."""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ipywidgets")

from tutorial_utils import fit  # noqa: E402
from tutorial_utils.calculator import Calculator  # noqa: E402


@pytest.fixture(autouse=True)
def _agg(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")


@pytest.mark.heavy
def test_turning_a_knob_updates_the_report_and_the_summary(capsys):
    calc = Calculator(preset="gpt2-124m", batch=1, seq=512, sharding="none", n_gpus=1)
    before, text, png = calc.report, calc.summary.value, calc.picture.value
    assert bytes(png).startswith(b"\x89PNG")
    calc.knobs["batch"].value = 16  # what moving the slider does
    assert bytes(calc.picture.value).startswith(b"\x89PNG") and calc.picture.value != png
    assert calc.report == fit.will_it_fit(
        "gpt2-124m", 16, 512, "bf16-master", "adamw", "every-second-matmul", "none", 1, gpu="H100"
    )
    assert calc.report.peak_bytes > before.peak_bytes
    assert (
        calc.summary.value != text
        and "fits on one H100 (81,559 MiB reported): needs" in calc.summary.value
    )
    assert "Headroom kept: CUDA context" in calc.summary.value
    assert len(calc.updates) == 2


@pytest.mark.heavy
def test_set_turns_several_knobs_with_one_update():
    calc = Calculator(preset="gpt2-124m", seq=512, sharding="none", n_gpus=1)
    report = calc.set(preset="llama-1b", seq=1024, sharding="zero2", n_gpus=4)
    assert len(calc.updates) == 2
    assert (report.preset, report.seq, report.sharding, report.n_gpus) == (
        "llama-1b",
        1024,
        "zero2",
        4,
    )


def test_zero_on_one_gpu_is_refused_in_the_summary_and_several_gpus_alone_are_ddp():
    calc = Calculator(preset="gpt2-124m", seq=512, sharding="zero1", n_gpus=8)
    assert calc.report.n_gpus == 8
    calc.set(n_gpus=1)
    assert calc.report is None and "does nothing on one" in calc.summary.value
    calc.set(sharding="none", n_gpus=4)
    assert "DDP over 4 GPUs" in repr(calc.report)


@pytest.mark.heavy
def test_an_impossible_choice_is_said_in_the_summary_not_raised():
    calc = Calculator(preset="llama-1b", seq=2048, sharding="none", n_gpus=1)
    old = calc.report
    assert calc.set(preset="gpt2-124m", seq=4096) is None  # GPT-2 has 1024 learned positions
    assert calc.report is None, "the old answer (llama-1b at 2048) is not shown as the new one"
    assert old.preset == "llama-1b" and "llama-1b" not in calc.summary.value
    assert calc.error and "1024 learned positions" in calc.summary.value
    assert bytes(calc.picture.value) == b"", "no bar for a question it cannot answer"
    assert "learned positions" in repr(calc)
    calc.set(seq=512)
    assert calc.error is None and calc.report.seq == 512


def test_bad_knobs_get_one_sentence():
    with pytest.raises(TypeError, match="has no knob bogus; it has: preset"):
        Calculator(bogus=1)
    with pytest.raises(ValueError, match="batch must be a whole number"):
        Calculator(batch=0)
    calc = Calculator(preset="gpt2-124m", seq=512, sharding="none", n_gpus=1)
    with pytest.raises(TypeError, match="no knob colour"):
        calc.set(colour="red")
    with pytest.raises(ValueError, match="precision 'fp8' is unknown: choose one of"):
        calc.set(precision="fp8")
    assert calc.knobs["precision"].value == "bf16-master", "a refused value moves no knob"


@pytest.mark.heavy
def test_a_value_beyond_a_slider_widens_it_and_says_so():
    calc = Calculator(preset="gpt2-124m", seq=512, sharding="none", n_gpus=1)
    report = calc.set(batch=4096)
    assert report.batch == 4096 and calc.knobs["batch"].value == 4096, "not clamped to 64"
    assert "the batch slider now goes to 4,096" in calc.summary.value
    calc.set(seq=768)
    assert calc.report.seq == 768 and "768 added to the seq choices" in calc.summary.value


@pytest.mark.heavy
def test_the_names_people_type_and_the_persons_question():
    calc = Calculator(
        preset="Llama-3-8B",
        precision="bf16",
        optimizer="adam",
        seq=4096,
        batch=4,
        sharding="none",
        n_gpus=1,
        checkpointing="none",
        gpu="80GB",
    )
    assert calc.report.fits is False and calc.report.preset == "llama-8b"
    assert "does not fit on one 80GB GPU" in calc.summary.value
    assert "no batch or checkpointing change helps" in calc.summary.value
    assert "zero3 on 4 GPUs or more" in calc.summary.value
    calc.set(batch=2)  # an update: a knob turned, the answer and the advice redrawn
    calc.set(sharding="zero3", n_gpus=4, checkpointing="full")
    assert calc.report.fits and "fits on each of 4 x 80GB GPU" in calc.summary.value


@pytest.mark.heavy
def test_an_update_answers_once_and_runs_fake_tensors_only_for_a_new_shape(monkeypatch):
    """What keeps a change quick, checked by what runs, not by the clock (issue 37: this test
    asserted each update < 2.0 s and stopped at 8.4 s on a loaded 2-core machine; the seconds
    are benchmarks/fit_times.py's). One answer per ``set()`` however many knobs turn; the
    activations by formula, or, where none is written, fake tensors for one block and the
    embedding + head, never the 32 layers, and only for a (batch, seq, recipe,
    checkpointing) not answered before, the advice's included."""
    import torch

    from tutorial_utils.decoder import Block

    answers, passes = [], []
    real_fit, real_pass = fit.will_it_fit, fit.activations._fake_pass

    def answer(**knobs):
        answers.append(knobs)
        return real_fit(**knobs)

    def fake_pass(build, *args):
        with torch.device("meta"):
            built = build()
        blocks = sum(isinstance(m, Block) for m in built.modules())
        passes.append(blocks)
        return real_pass(build, *args)

    monkeypatch.setattr(fit.widget, "will_it_fit", answer)  # the widget's own calls
    monkeypatch.setattr(fit.activations, "_fake_pass", fake_pass)  # every call, the advice's too
    fit.activations.activations.cache_clear()
    fit.activation_formulas.activations.cache_clear()

    def new_shapes() -> int:  # (batch, seq, recipe, checkpointing) answered for the first time
        return fit.activation_formulas.activations.cache_info().misses

    def on_fake_tensors() -> int:  # of those, the ones with no formula
        return fit.activations.activations.cache_info().misses

    person = {"preset": "llama-8b", "precision": "bf16", "optimizer": "adam", "seq": 4096}
    person |= {"sharding": "none", "n_gpus": 1, "checkpointing": "none", "gpu": "80GB"}
    calc = Calculator(**person, batch=4)  # it does not fit: the advice tries other shapes
    assert len(answers) == 2  # __init__ checks the knobs, then draws
    assert new_shapes() > 1 and passes == [1, 0] * on_fake_tensors()  # a block, then the head
    for knobs in (
        {"batch": 5},
        {"sharding": "zero3", "n_gpus": 4, "checkpointing": "full"},
        {"seq": 4095, "ce_chunks": 8},  # pieces of unequal length, no formula: fake tensors
    ):
        answers.clear(), passes.clear()
        seen, updates = on_fake_tensors(), len(calc.updates)
        calc.set(**knobs)  # one update, however many knobs turn
        assert len(answers) == 1 and len(calc.updates) == updates + 1
        assert passes == [1, 0] * (on_fake_tensors() - seen)
    assert passes, "seq 4095 in 8 pieces has no formula: the pass ran"
    answers.clear(), passes.clear()
    seen = new_shapes()
    again = dict(batch=4, seq=4096, sharding="none", n_gpus=1, checkpointing="none", ce_chunks=1)
    calc.set(**again)
    assert len(answers) == 1 and passes == [] and new_shapes() == seen, "answered twice"


def test_without_ipywidgets_it_says_what_to_use(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_widgets(name, *args, **kwargs):
        if name == "ipywidgets":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_widgets)
    with pytest.raises(ModuleNotFoundError, match="ipywidgets is not installed: use fit"):
        Calculator(preset="gpt2-124m", seq=512, sharding="none", n_gpus=1)


_CALC: list[Calculator] = []


def _one_calculator() -> Calculator:
    if not _CALC:
        _CALC.append(Calculator(preset="gpt2-124m", seq=512, sharding="none", n_gpus=1))
    return _CALC[0]


BAD_VALUES = {
    "preset": st.text(max_size=8).map(lambda t: t + "#") | st.none() | st.integers(),
    "precision": st.sampled_from(["fp8", "int4", "bf17"]) | st.none() | st.floats(),
    "optimizer": st.sampled_from(["lion", "adafactor"]) | st.integers(),
    "checkpointing": st.sampled_from(["some", "half"]) | st.booleans(),
    "sharding": st.sampled_from(["zero4", "tp"]) | st.none(),
    "batch": st.integers(max_value=0) | st.floats() | st.text(max_size=3) | st.booleans(),
    "seq": st.integers(max_value=0) | st.integers(min_value=2**31 + 1) | st.none(),
    "n_gpus": st.integers(max_value=0) | st.floats(),
    "gpu": st.sampled_from(["GTX 9090", "lots", "-1GB", "1e999GB"]) | st.integers(max_value=0),
    "headroom": st.integers() | st.text(max_size=3) | st.none(),
    "logits_kept": st.integers() | st.text(max_size=3) | st.none(),
    "nf4_double_quant": st.integers() | st.none(),
    "lora_dropout": st.floats(min_value=1) | st.floats(max_value=-1e-9) | st.booleans(),
    "lora_base": st.sampled_from(["nf4-bnb", "int4", "bitsandbytes"]) | st.none(),
    "pp_microbatches": st.integers(max_value=-1) | st.floats() | st.just(False),
    "block": st.sampled_from(["llama", "hf"]) | st.integers(),
    "gradient_sync": st.sampled_from(["first", "never"]) | st.booleans(),
}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(BAD_VALUES)).flatmap(lambda k: st.tuples(st.just(k), BAD_VALUES[k])))
def test_any_bad_value_is_one_sentence_and_moves_no_knob(knob_and_value):
    knob, value = knob_and_value
    calc = _one_calculator()
    before = calc.values()
    with pytest.raises((TypeError, ValueError)) as info:
        calc.set(**{knob: value})
    assert "\n" not in str(info.value) and type(info.value).__name__ != "TraitError"
    assert calc.values() == before


@pytest.mark.heavy
def test_the_new_knobs_move_the_answer_and_the_bar_and_verdict_agree():
    """The widget shows the knobs the calculator gained (the optimizer's implementation, LoRA,
    gradient accumulation, TP), says it is updating while it works, and never shows a bar of
    one answer under the verdict of another: the bar is cleared first and drawn before the
    verdict."""
    calc = Calculator(preset="llama-8b", batch=2, seq=1024, sharding="none", n_gpus=1)
    shown = []
    calc.summary.observe(lambda c: shown.append(("summary", c["new"])), names="value")
    calc.picture.observe(lambda c: shown.append(("picture", c["new"])), names="value")
    foreach = calc.report
    calc.set(optimizer_impl="fused")
    assert calc.report.peaks["optimizer step"] < foreach.peaks["optimizer step"]
    assert shown[0] == ("summary", "<i>updating...</i>") and shown[1] == ("picture", b"")
    assert [kind for kind, _ in shown[2:]] == ["picture", "summary"], "bar first, then verdict"
    calc.set(lora_rank=16, grad_accumulation=4, tp=1)
    assert calc.report.n_parameters == foreach.n_parameters
    assert calc.report.model_states["gradients"] < foreach.model_states["gradients"] / 100
    assert "LoRA rank 16" in repr(calc.report) and calc.report.verdict in calc.summary.value
    calc.set(lora_rank=128)  # a rank the dropdown lacks widens it, as a slider widens
    assert 128 in calc.knobs["lora_rank"].options and "128 added" in calc.notes[0]


def _agrees(calc: Calculator) -> None:
    """The bar, its title and the verdict on show all come from ``calc.report``."""
    if calc.report is None:  # refused: no bar, the reason
        assert calc.picture.value == b"" and calc.drawn is None
        assert calc.summary.value.startswith("<b>Cannot answer:</b>")
        return
    assert calc.drawn is calc.report
    assert calc.report.verdict in calc.summary.value
    word = {True: "fits:", False: "does not fit:", None: "needs"}[calc.report.fits]
    assert word in calc.chart_title and calc.report.preset in calc.chart_title
    assert bytes(calc.picture.value) == fit.widget._png(calc.report)[0]
    assert calc.picture.tooltip == calc.chart_title, "the title a browser reads on hover"


@pytest.mark.heavy
def test_every_knob_is_shown_and_the_verdict_and_the_chart_never_disagree():
    """Each knob the calculator models is a widget in the layout; after any ``set()`` (one that
    fits, one that does not, one refused) the verdict and the chart derive from one report."""
    calc = Calculator(preset="llama-1b", seq=1024, sharding="none", n_gpus=1, gpu="24GB")
    shown = {id(k) for row in calc.widget.children[:-2] for k in row.children}
    assert {id(k) for k in calc.knobs.values()} == shown, "a knob is not in the layout"
    for knob in ("ce_chunks", "activation_offload", "cpu_offload", "optimizer_in_backward"):
        assert knob in calc.knobs
    for knob in ("lora_base", "pp", "cp", "reshard_after_forward", "reduce_dtype"):
        assert knob in calc.knobs
    learners = set(inspect.signature(fit.will_it_fit).parameters) - {"nf4_chunk"}
    assert learners == set(calc.knobs), "every knob but torchao's chunk is a control"
    _agrees(calc)
    for knobs in (
        {"batch": 64},  # does not fit on 24 GB
        {"batch": 1, "optimizer": "adamw8bit", "ce_chunks": 8},
        {"lora_rank": 16, "lora_base": "nf4", "lora_targets": "all"},
        {"sharding": "fsdp2", "n_gpus": 8, "cpu_offload": True, "reduce_dtype": "fp32"},
        {"n_gpus": 1},  # refused: FSDP on one GPU
        {"sharding": "none", "cpu_offload": False, "tp": 2, "pp": 2, "cp": 2, "n_gpus": 8},
        {"activation_offload": True, "optimizer_in_backward": True, "tp": 1, "pp": 1, "cp": 1},
    ):
        calc.set(**knobs)
        _agrees(calc)
        assert (calc.report is None) == ("n_gpus" in knobs and knobs["n_gpus"] == 1), calc.error
    assert calc.report.arguments["optimizer_in_backward"] is True
    assert "activations offloaded" in calc.summary.value


@pytest.mark.heavy  # bitsandbytes' NF4 base and LoRA dropout have no formula: fake tensors
def test_the_knobs_of_litgpt_s_recipe_each_move_the_answer_that_will_it_fit_gives():
    """Each control added for litgpt's rows (its block, the kept logits, bitsandbytes' NF4
    without double quantization, LoRA's dropout), FSDP1's gradient sync and PP's micro-batches
    turns the answer ``will_it_fit`` gives for the same knobs, and the verdict and the chart on
    show agree after each; a combination it refuses is said, not raised."""
    calc = Calculator(preset="llama-2-7b", seq=512, precision="pure-bf16", sharding="none")
    calc.set(n_gpus=1, gpu="A10G", grad_accumulation=4)
    for knobs in (
        {"block": "litgpt"},
        {"logits_kept": True},
        {"lora_rank": 8, "lora_targets": "qv", "optimizer": "paged-adamw"},
        {"lora_base": "bnb-nf4"},
        {"nf4_double_quant": False},
        {"lora_dropout": 0.05},
        {"sharding": "fsdp1", "n_gpus": 4, "gradient_sync": "last"},
        {"sharding": "none", "gradient_sync": "every", "logits_kept": False, "pp": 4},
        {"pp_microbatches": 2},  # fewer than the 4 stages: 2 in flight (1F1B), not 4
    ):
        before = calc.report
        calc.set(**knobs)
        _agrees(calc)
        asked = {k: v for k, v in calc.values().items()} | {"gpu": "A10G"}
        assert calc.report == fit.will_it_fit(**asked), knobs
        assert calc.report.peaks != before.peaks, f"{knobs} left the answer as it was"
    calc.set(lora_base="nf4")  # torchao's NF4 always has double quantization
    _agrees(calc)
    assert calc.report is None and "nf4_double_quant=False is bitsandbytes'" in calc.error
    assert calc.knobs["pp_microbatches"].options[0] == ("as pp", 0)
