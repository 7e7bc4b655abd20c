"""fit.reserve_pairs and the allocator reserve in fit.headroom: every published pair checked
against the text it was read from, the rules applied as written, and the term built from
what they count (a median once 5 count; the labelled assumption before that)."""

from __future__ import annotations

import dataclasses
import re
import statistics

import pytest

from tutorial_utils.fit import cli, headroom, peak, reserve_pairs
from tutorial_utils.fit.peak import will_it_fit as answer
from tutorial_utils.fit.reserve_pairs import COUNTED, PAIRS, excluded_because, figures_in


def _label_before(quote: str, figure: str) -> list[str]:
    """For each place ``figure`` is printed in ``quote``: the last label before it."""
    labels = []
    for match in re.finditer(rf"(?<![\d.]){re.escape(figure)}(?![\d.])", quote):
        before = re.findall(r"alloc|reserv|active", quote[: match.start()], flags=re.I)
        labels.append(before[-1].lower() if before else "")
    return labels


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p.url.split('github.com/')[-1]}")
def test_each_figure_is_the_one_its_quote_prints(pair):
    printed = figures_in(pair.quote)
    assert pair.allocated in printed and pair.reserved in printed, (pair.quote, printed)
    assert pair.url.startswith("https://") and pair.date and pair.unit
    assert pair.hardware and pair.model and pair.recipe


@pytest.mark.parametrize("pair", COUNTED, ids=lambda p: p.url.split("github.com/")[-1])
def test_a_counted_pairs_figures_sit_under_their_own_labels(pair):
    assert "alloc" in _label_before(pair.quote, pair.allocated)
    assert "reserv" in _label_before(pair.quote, pair.reserved)


def test_the_rules_count_these_three_and_name_why_the_rest_do_not():
    assert [p.url for p in COUNTED] == [
        "https://github.com/meta-llama/llama-cookbook/pull/742",
        "https://github.com/meta-llama/llama-cookbook/pull/206",
        "https://github.com/linkedin/Liger-Kernel/pull/110",
    ]
    for pair in PAIRS:
        if pair not in COUNTED:
            assert re.match(r"rule [1-6]: ", excluded_because(pair)), pair.url
    assert len(PAIRS) == 22  # every pair found, as test_fit_published's docstring counts them


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"device": "mps"}, "rule 1"),
        ({"moment": "init"}, "rule 2"),
        ({"eager": False}, "rule 3"),
        ({"counters": "active"}, "rule 4"),
        ({"family": "encoder"}, "rule 5"),
        ({"allocator": "expandable_segments"}, "rule 6"),
    ],
)
def test_each_rule_excludes_a_pair_that_breaks_it(change, rule):
    pair = dataclasses.replace(COUNTED[0], **change)
    assert excluded_because(pair).startswith(rule)
    assert excluded_because(COUNTED[0]) == ""


def test_each_reserve_is_its_two_figures():
    liger = COUNTED[2]
    assert liger.reserve == pytest.approx(47172.0 / 26279.24 - 1, rel=1e-12)
    median, low, high = reserve_pairs.summary()
    assert (low, median, high) == tuple(sorted(p.reserve for p in COUNTED))


def test_while_fewer_than_five_count_the_reserve_is_the_labelled_assumption():
    context, reserve = headroom.HEADROOM
    assert len(COUNTED) < reserve_pairs.MIN_PAIRS
    assert reserve.fraction == headroom.ASSUMED_RESERVE == 0.05 and reserve.band is None
    _, low, high = reserve_pairs.summary()
    assert reserve.source.startswith("an ASSUMED 5% of the tensors' peak")
    assert f"only {len(COUNTED)} published training pairs count" in reserve.source
    assert f"range {low:+.0%} to {high:+.0%}" in reserve.source
    assert headroom.reserve_term(()).fraction == 0.05


def _five() -> tuple:
    """Five pairs: the three that count and two more, made from the first with new figures."""
    more = (
        dataclasses.replace(COUNTED[0], allocated="40", reserved="44", quote="alloc 40 reserv 44"),
        dataclasses.replace(COUNTED[0], allocated="10", reserved="11", quote="alloc 10 reserv 11"),
    )
    return (*COUNTED, *more)


def test_five_counted_pairs_make_a_sourced_term_with_its_band():
    five = _five()
    term = headroom.reserve_term(five)
    reserves = [p.reserve for p in five]
    assert term.fraction == statistics.median(reserves) == pytest.approx(0.4285714285714286)
    assert term.band == (min(reserves), max(reserves))
    assert "the median of 5 published pairs" in term.source and "ASSUMED" not in term.source
    assert f"range {min(reserves):+.0%} to {max(reserves):+.0%}" in term.source


def test_the_cli_prints_the_band_once_the_term_has_one(monkeypatch, capsys):
    term = headroom.reserve_term(_five())
    monkeypatch.setattr(headroom, "HEADROOM", (headroom.HEADROOM[0], term))
    answers = []

    def recorded(*args, **kwargs):
        answers.append(answer(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(peak, "will_it_fit", recorded)
    assert cli.main(["gpt2", "--seq", "128", "--batch", "1"]) == 0
    low, high = (f * answers[0].peak_bytes / 2**30 for f in term.band)
    out = capsys.readouterr().out
    assert f"published pairs put the allocator reserve at {low:.1f}-{high:.1f} GiB" in out


def test_no_band_is_printed_for_the_assumption(capsys):
    assert cli.main(["gpt2", "--seq", "128", "--batch", "1"]) == 0
    assert "published pairs put" not in capsys.readouterr().out


def test_the_docstrings_state_what_the_pairs_show():
    shown = [f"{100 * p.reserve:+.1f}" for p in sorted(COUNTED, key=lambda p: p.reserve)]
    assert shown == ["+42.9", "+55.6", "+79.5"]
    said = f"{len(COUNTED)} pairs count"
    for doc in (reserve_pairs.__doc__, headroom.__doc__):
        text = " ".join(doc.split())
        assert said in text and all(s.lstrip("+") in text for s in shown), doc
    truncated = [p for p in COUNTED if p.unit == "GiB, truncated"]
    a, r = (float(truncated[0].allocated), float(truncated[0].reserved))
    b, s = (float(truncated[1].allocated), float(truncated[1].reserved))
    bounds = [r / (a + 1) - 1, (r + 1) / a - 1, s / (b + 1) - 1, (s + 1) / b - 1]
    low1, high1, low2, high2 = (f"{100 * x:.0f}" for x in bounds)
    text = " ".join(reserve_pairs.__doc__.split())
    assert f"+{low1} to +{high1} % and +{low2} to +{high2} %" in text
