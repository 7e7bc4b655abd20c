"""fit.scope: notebook 03's table of what the calculator models, held to the calculator itself.

Most rows are read from the package's constants; these tests pin the rest (the moments, the
knobs' words, QLoRA's miss), so a change to the calculator that the table does not follow fails
here instead of leaving the notebook's table stale.
"""

from __future__ import annotations

import inspect

from test_fit_published import MODELLED, difference

from tutorial_utils.decoder import DecoderConfig
from tutorial_utils.fit import inputs, scope
from tutorial_utils.fit.peak import will_it_fit

TOY = DecoderConfig(vocab=256, d_model=32, n_layers=2, n_heads=4)


def test_the_moments_are_the_ones_a_report_weighs():
    assert tuple(will_it_fit(TOY, batch=2, seq=16).peaks) == scope.MOMENTS
    fused = will_it_fit(TOY, batch=2, seq=16, optimizer_in_backward=True)
    assert tuple(fused.peaks) == scope.MOMENTS[:3], "in backward, no separate step"


def test_every_keyword_knob_has_its_words_and_no_words_are_left_over():
    params = inspect.signature(will_it_fit).parameters.values()
    knobs = {p.name for p in params if p.kind is p.KEYWORD_ONLY} - set(scope._NOT_KNOBS)
    assert knobs == set(scope.KNOB_WORDS), "name the new knob in scope.KNOB_WORDS"


def test_every_choice_of_the_calculator_is_in_the_table():
    shown = repr(scope.table())
    for name in (*inputs.SHARDING, *inputs.OPTIMIZERS, *inputs.CHECKPOINTING):
        assert name in shown, name
    assert all(words in shown for words in scope.KNOB_WORDS.values())


def test_the_compile_band_row_follows_the_band(monkeypatch):
    monkeypatch.setattr(scope, "COMPILE_BAND", (0.5, 0.6))
    assert "peaked at 50% to 60% of the same run in eager mode" in repr(scope.table())


def test_qloras_miss_is_the_published_rows_miss():
    """The rows tests/test_fit_published.py says miss are the NF4 ones, and the table's range is
    theirs, rounded to the percent it shows."""
    missed = [row for row in MODELLED if row.missing]
    assert missed and all(row.knobs.get("lora_base") == "nf4" for row in missed)
    gaps = [difference(row) for row in missed]
    assert (round(max(gaps), 2), round(min(gaps), 2)) == scope.QLORA_MISS
