"""fit_advice: the changes it offers each fit, are the smallest of their kind, and it says when
no batch or checkpointing change can help (issue 33)."""

from __future__ import annotations

import pytest

from tutorial_utils import fit, fit_advice


@pytest.mark.heavy
def test_the_largest_micro_batch_that_fits_keeps_the_batch_and_one_more_does_not_fit():
    r = fit.will_it_fit("gpt2", batch=512, seq=1024, precision="bf16-master", gpu="RTX 4090")
    advice = fit_advice.advise(r)
    assert not advice.fits and not advice.states_alone
    first = advice.changes[0]  # gradient accumulation comes before anything that changes the batch
    assert first.what.startswith("micro-batch ") and "accumulated" in first.what, advice
    micro, k = first.report.batch, first.report.arguments["grad_accumulation"]
    assert first.report.fits and micro < 512 and micro * k >= 512, "the batch is kept"
    assert "same effective batch" in first.cost
    more = fit.will_it_fit(
        "gpt2",
        batch=micro + 1,
        seq=1024,
        precision="bf16-master",
        gpu="RTX 4090",
        grad_accumulation=-(-512 // (micro + 1)),
    )
    assert not more.fits, "a larger micro-batch fits too: the offered one is not the largest"
    # a micro-batch change alone fits, so no change with more knobs is offered
    assert all(" and " not in c.what for c in advice.changes), advice
    assert all(c.cost for c in advice.changes), "every suggestion says what it costs"


@pytest.mark.heavy
def test_the_issue_s_example_is_offered_accumulation_before_batch_1():
    r = fit.will_it_fit("llama-3.2-1b", batch=8, seq=4096, gpu="RTX 4090")
    advice = fit_advice.advise(r)
    assert not advice.fits
    first = advice.changes[0]
    assert "accumulated" in first.what and first.report.arguments["grad_accumulation"] > 1
    assert not any(c.what.startswith("batch 1") for c in advice.changes), advice


def test_when_model_states_alone_exceed_the_card_it_says_so_and_what_would_help():
    r = fit.will_it_fit(
        "Llama-3-8B", batch=4, seq=4096, precision="bf16", optimizer="adam", gpu="80GB"
    )
    advice = fit_advice.advise(r)
    assert advice.states_alone.startswith("Model states alone are 119.66 GiB per GPU")
    assert "no batch or checkpointing change helps on one 80GB GPU" in advice.states_alone
    assert not any(c.what.startswith(("batch", "checkpointing")) for c in advice.changes)
    zero3 = next(c for c in advice.changes if c.what.startswith("zero3"))
    assert zero3.report.fits and zero3.report.sharding == "zero3"
    fewer = (
        fit.will_it_fit(
            "Llama-3-8B",
            batch=4,
            seq=4096,
            precision="bf16",
            optimizer="adam",
            gpu="80GB",
            sharding="zero3",
            n_gpus=zero3.report.n_gpus // 2,
            checkpointing=zero3.report.checkpointing,
        )
        if zero3.report.n_gpus > 2
        else None
    )
    assert fewer is None or not fewer.fits, "half as many GPUs fit too: not the fewest"
    for change in advice.changes:
        assert change.report.fits, change


def test_what_fits_needs_no_change_and_bad_calls_get_one_sentence():
    small = fit.will_it_fit("gpt2", seq=256, gpu="H100")
    assert fit_advice.advise(small).fits and repr(fit_advice.advise(small)) == (
        "It fits: nothing to change."
    )
    with pytest.raises(ValueError, match="advise needs to know the GPU"):
        fit_advice.advise(fit.will_it_fit("gpt2", seq=256))
    with pytest.raises(TypeError, match="advise takes a fit.FitReport, not dict"):
        fit_advice.advise({})
