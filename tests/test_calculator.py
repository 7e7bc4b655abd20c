"""The calculator widget: every knob reaches fit.will_it_fit, and the summary follows it."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")

from tutorial_utils import fit  # noqa: E402
from tutorial_utils.calculator import Calculator  # noqa: E402


@pytest.fixture(autouse=True)
def _agg(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")


def test_turning_a_knob_updates_the_report_and_the_summary(capsys):
    calc = Calculator(preset="gpt2-124m", batch=1, seq=512, sharding="none", n_gpus=1)
    before, text, png = calc.report, calc.summary.value, calc.picture.value
    assert bytes(png).startswith(b"\x89PNG")
    calc.knobs["batch"].value = 16  # what moving the slider does
    assert bytes(calc.picture.value).startswith(b"\x89PNG") and calc.picture.value != png
    assert calc.report == fit.will_it_fit(
        "gpt2-124m", 16, 512, "bf16-master", "adamw", "selective", "none", 1
    )
    assert calc.report.categories["activations"] > before.categories["activations"]
    assert calc.summary.value != text and "per GPU exact" in calc.summary.value
    assert len(calc.updates) == 2


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


def test_no_sharding_means_one_gpu_and_a_disabled_gpu_slider():
    calc = Calculator(preset="gpt2-124m", seq=512, sharding="zero1", n_gpus=8)
    assert not calc.knobs["n_gpus"].disabled and calc.report.n_gpus == 8
    calc.set(sharding="none")
    assert calc.knobs["n_gpus"].disabled and calc.report.n_gpus == 1


def test_an_impossible_choice_is_said_in_the_summary_not_raised():
    calc = Calculator(preset="gpt2-124m", seq=1024, sharding="none", n_gpus=1)
    calc.set(seq=2048)  # GPT-2 has 1024 learned positions
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
