"""fit.scope: notebook 03's table of what the calculator models, held to the calculator itself.

Most rows are read from the package's constants; these tests pin the rest (the moments, the
knobs' words, the QLoRA misses), so a change to the calculator that the table does not follow
fails here instead of leaving the notebook's table stale.
"""

from __future__ import annotations

import inspect

import pytest
from test_fit_published import BEFORE_HELD_OUT_2, TOLERANCE, _not_its_recipe, difference

from tutorial_utils.decoder import DecoderConfig
from tutorial_utils.fit import inputs, scope
from tutorial_utils.fit.peak import will_it_fit

TOY = DecoderConfig(vocab=256, d_model=32, n_layers=2, n_heads=4)


@pytest.mark.heavy  # every published row asked: 0.3 s of CPU or more
def test_every_moment_a_report_weighs_is_in_the_table():
    shown = repr(scope.table())
    for knobs in (
        {},
        {"optimizer_in_backward": True},
        {"precision": "pure-bf16", "lora_rank": 4, "lora_base": "nf4"},
        {"sharding": "zero3", "n_gpus": 4},
    ):
        for moment in will_it_fit(TOY, batch=2, seq=16, **knobs).peaks:
            assert moment in shown, (knobs, moment)
    every, _ = scope.moments()
    assert every[-1] == "optimizer step" and len(every) == 4, every


def test_every_keyword_knob_has_its_words():
    params = inspect.signature(will_it_fit).parameters.values()
    knobs = {p.name for p in params if p.kind is p.KEYWORD_ONLY} - set(scope._NOT_KNOBS)
    assert knobs <= set(scope.KNOB_WORDS), "name the new knob in scope.KNOB_WORDS"


def test_every_choice_of_the_calculator_is_in_the_table():
    shown = repr(scope.table())
    for name in (*inputs.SHARDING, *inputs.OPTIMIZERS, *inputs.CHECKPOINTING):
        assert name in shown, name
    params = inspect.signature(will_it_fit).parameters
    assert all(words in shown for knob, words in scope.KNOB_WORDS.items() if knob in params)


def test_the_compile_band_row_follows_the_band(monkeypatch):
    monkeypatch.setattr(scope, "COMPILE_BAND", (0.5, 0.6))
    assert "peaked at 50% to 60% of the same run in eager mode" in repr(scope.table())


@pytest.mark.heavy  # every published row asked: 0.3 s of CPU or more
def test_the_misses_are_qlora_runs_under_and_fsdp1_runs_over():
    """The table's row "some QLoRA and FSDP1 runs": the rows tests/test_fit_published.py says
    miss are, on FSDP1, reserved peaks more than 10 % below the answer (FSDP1's reserve, the
    median of its published pairs, is more than those runs kept); elsewhere QLoRA's (an NF4
    base) or one whose missing term is the allocator's reserve (the table's own row), each more
    than 10 % above it. Two held-out rows are left out: their published peak is below their
    recipe's model states (test_the_rows_that_cannot_be_their_recipe_hold_less_than_its_states),
    so what they show is a published figure that is not its recipe's, not a term the calculator
    lacks; so is torchtune's README single-GPU LoRA, whose figure its own history shows to be an
    older config's (its ``missing`` says which). The row was written about the 55 rows before
    the second held-out set; that set's one miss (LLMs-from-scratch's step 7, +52 %: a loss on
    bf16 logits, which the calculator always upcasts) is neither, and the table does not name it
    yet."""
    missed = [row for row in BEFORE_HELD_OUT_2 if row.missing and not _not_its_recipe(row)]
    fsdp1 = [row for row in missed if row.knobs.get("sharding") == "fsdp1"]
    under = [row for row in missed if row not in fsdp1]

    def named(row) -> bool:
        return "nf4" in row.knobs.get("lora_base", "") or row.missing.startswith("a reserve beyond")

    assert fsdp1 and all(r.compares == "reserved" for r in fsdp1)
    assert all(difference(row) > TOLERANCE for row in fsdp1)
    assert under and all(named(row) for row in under)
    assert all(difference(row) < -TOLERANCE for row in under)
    shown = repr(scope.table())
    assert "QLoRA's above it; FSDP1's reserved peaks below it" in shown
