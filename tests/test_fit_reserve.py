"""fit.reserve_pairs and the allocator reserve in fit.headroom: every published pair checked
against the text it was read from, the rules applied as written, each pair's profile, and the
term built from what they count for each profile (a median and its band once 5 count; the
labelled assumption before that)."""

from __future__ import annotations

import dataclasses
import re
import statistics

import pytest

from tutorial_utils.fit import cli, headroom, reserve_pairs
from tutorial_utils.fit.peak import will_it_fit as answer
from tutorial_utils.fit.reserve_pairs import COUNTED, PAIRS, excluded_because, figures_in


def _labels_of(quote: str, figure: str) -> list[str]:
    """For each place ``figure`` is printed in ``quote``: the last label before it, or, for a
    table cell whose header names no peak, the first label after it (the text under the table
    that says which peak the column is)."""
    labels = []
    for match in re.finditer(rf"(?<![\d.]){re.escape(figure)}(?![\d.])", quote):
        before = re.findall(r"alloc|reserv|active", quote[: match.start()], flags=re.I)
        after = re.findall(r"alloc|reserv|active", quote[match.end() :], flags=re.I)
        label = before[-1] if before else (after[0] if after else "")
        labels.append(label.lower())
    return labels


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p.url.split('github.com/')[-1]}")
def test_each_figure_is_the_one_its_quote_prints(pair):
    printed = figures_in(pair.quote)
    assert pair.allocated in printed and pair.reserved in printed, (pair.quote, printed)
    assert pair.url.startswith("https://") and pair.date and pair.unit
    assert pair.hardware and pair.model and pair.recipe


@pytest.mark.parametrize("pair", COUNTED, ids=lambda p: p.url.split("github.com/")[-1])
def test_a_counted_pairs_figures_sit_under_their_own_labels(pair):
    assert "alloc" in _labels_of(pair.quote, pair.allocated)
    assert "reserv" in _labels_of(pair.quote, pair.reserved)


def test_the_rules_count_these_five_and_name_why_the_rest_do_not():
    assert [p.url for p in COUNTED] == [
        "https://github.com/meta-llama/llama-cookbook/pull/742",
        "https://github.com/meta-llama/llama-cookbook/pull/206",
        "https://github.com/linkedin/Liger-Kernel/pull/110",
        *2 * ["https://github.com/AnswerDotAI/fsdp_qlora/blob/4cd6923/benchmarks_03_2024.md"],
    ]
    for pair in PAIRS:
        if pair not in COUNTED:
            assert re.match(r"rule [1-7]: ", excluded_because(pair)), pair.url
    assert len(PAIRS) == 24  # every pair found, as test_fit_published's docstring counts them


def test_each_pair_says_how_its_profile_was_decided():
    """Rule 7: a profile read from the source's code or text (``profile_from``), one of
    ``PROFILES``; a pair whose source does not say is 'unknown' and cannot count."""
    for pair in PAIRS:
        assert pair.profile in reserve_pairs.PROFILES, pair.url
        assert bool(pair.profile_from) == (pair.profile != "unknown"), pair.url
    assert {p.profile for p in COUNTED} == {"fsdp1"}
    assert all("FullyShardedDataParallel" in p.profile_from for p in COUNTED)


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"device": "mps"}, "rule 1"),
        ({"moment": "init"}, "rule 2"),
        ({"eager": False}, "rule 3"),
        ({"counters": "active"}, "rule 4"),
        ({"family": "encoder"}, "rule 5"),
        ({"allocator": "expandable_segments"}, "rule 6"),
        ({"profile": "unknown"}, "rule 7"),
        ({"profile_from": ""}, "rule 7"),
    ],
)
def test_each_rule_excludes_a_pair_that_breaks_it(change, rule):
    pair = dataclasses.replace(COUNTED[0], **change)
    assert excluded_because(pair).startswith(rule)
    assert excluded_because(COUNTED[0]) == ""


def test_each_reserve_is_its_two_figures():
    liger, answerai = COUNTED[2], COUNTED[3]
    assert liger.reserve == pytest.approx(47172.0 / 26279.24 - 1, rel=1e-12)
    assert answerai.reserve == pytest.approx(10.24 / 8.28 - 1, rel=1e-12)
    median, low, high = reserve_pairs.summary()
    ordered = sorted(p.reserve for p in COUNTED)
    assert (low, median, high) == (ordered[0], ordered[2], ordered[-1])


def test_fsdp1s_reserve_is_the_median_of_its_five_pairs_with_their_band():
    term = headroom.RESERVES["fsdp1"]
    reserves = [p.reserve for p in reserve_pairs.counted("fsdp1")]
    assert len(reserves) == reserve_pairs.MIN_PAIRS == 5
    assert term.fraction == statistics.median(reserves) == pytest.approx(30 / 21 - 1)
    assert term.band == (min(reserves), max(reserves))
    assert "under FSDP1: the median of 5 published pairs" in term.source
    assert "ASSUMED" not in term.source
    assert f"range {min(reserves):+.0%} to {max(reserves):+.0%}" in term.source


@pytest.mark.parametrize("profile", ["single", "ddp", "fsdp2", "zero"])
def test_every_other_profile_keeps_the_labelled_assumption(profile):
    term = headroom.RESERVES[profile]
    assert reserve_pairs.counted(profile) == ()
    assert term.fraction == headroom.ASSUMED_RESERVE == 0.05 and term.band is None
    assert term.source.startswith("an ASSUMED 5% of the tensors' peak")
    said = f"no published pair counts for {reserve_pairs.PROFILES[profile]}"
    assert said in term.source and "the 5 that count ran FSDP1" in term.source


def test_fewer_than_five_pairs_keep_the_assumption_and_say_what_they_found():
    three = reserve_pairs.counted("fsdp1")[:3]
    term = headroom.reserve_term(three, "fsdp1")
    _, low, high = reserve_pairs.summary(three)
    assert term.fraction == 0.05 and term.band is None
    assert "only 3 published training pairs count for FSDP1" in term.source
    assert f"range {low:+.0%} to {high:+.0%}" in term.source


@pytest.mark.parametrize(
    ("sharding", "n_gpus", "profile"),
    [
        ("none", 1, "single"),
        ("none", 4, "ddp"),
        ("zero1", 2, "zero"),
        ("zero3", 8, "zero"),
        ("fsdp1", 2, "fsdp1"),
        ("fsdp1-grad-op", 2, "fsdp1"),
        ("fsdp2", 2, "fsdp2"),
    ],
)
def test_each_sharding_keeps_its_profiles_reserve(sharding, n_gpus, profile):
    assert headroom.profile_of(sharding, n_gpus) == profile
    r = answer("gpt2", batch=1, seq=128, sharding=sharding, n_gpus=n_gpus)
    fraction = headroom.RESERVES[profile].fraction
    assert r.headroom["allocator reserve"] == int(fraction * r.peak_bytes)
    assert headroom.headroom_for(sharding, n_gpus)[1] is headroom.RESERVES[profile]


def test_the_cli_prints_fsdp1s_band(capsys):
    argv = ["gpt2", "--seq", "128", "--batch", "1", "--sharding", "fsdp1", "--gpus", "2"]
    assert cli.main(argv) == 0
    r = answer("gpt2", batch=1, seq=128, sharding="fsdp1", n_gpus=2)
    low, high = (f * r.peak_bytes / 2**30 for f in headroom.RESERVES["fsdp1"].band)
    out = capsys.readouterr().out
    assert f"published pairs put the allocator reserve at {low:.1f}-{high:.1f} GiB" in out
    assert "under FSDP1: the median of 5 published pairs" in out


@pytest.mark.parametrize(("sharding", "gpus"), [("none", "1"), ("fsdp2", "2")])
def test_no_band_is_printed_for_the_assumption(capsys, sharding, gpus):
    argv = ["gpt2", "--seq", "128", "--batch", "1", "--sharding", sharding, "--gpus", gpus]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "published pairs put" not in out and "an ASSUMED 5%" in out


def test_the_docstrings_state_what_the_pairs_show():
    shown = [f"{100 * p.reserve:+.1f}" for p in sorted(COUNTED, key=lambda p: p.reserve)]
    assert shown == ["+11.6", "+23.7", "+42.9", "+55.6", "+79.5"]
    said = f"{len(COUNTED)} pairs count, all FSDP1"
    for doc in (reserve_pairs.__doc__, headroom.__doc__):
        text = " ".join(doc.split())
        assert said in text, doc
    text = " ".join(reserve_pairs.__doc__.split())
    assert all(s in text for s in shown) and "their median, +42.9 %" in text
    truncated = [p for p in COUNTED if p.unit == "GiB, truncated"]
    a, r = (float(truncated[0].allocated), float(truncated[0].reserved))
    b, s = (float(truncated[1].allocated), float(truncated[1].reserved))
    bounds = [r / (a + 1) - 1, (r + 1) / a - 1, s / (b + 1) - 1, (s + 1) / b - 1]
    low1, high1, low2, high2 = (f"{100 * x:.0f}" for x in bounds)
    assert f"+{low1} to +{high1} % and +{low2} to +{high2} %" in text


def test_the_mechanism_fit_headroom_cites_is_in_the_installed_torch():
    """fit.headroom's reason for FSDP1's own reserve, read in torch's code (so a torch that
    changes it fails here): FSDP1 allocates each gathered unit under its unshard stream and
    frees it with record_stream; FSDP2's and DDP's code call no record_stream; and on the CPU
    FSDP1's record_stream helper returns at once (so no gloo rank can show the effect)."""
    import inspect

    import torch.distributed.fsdp._flat_param as flat
    import torch.distributed.fsdp._runtime_utils as runtime
    import torch.nn.parallel.distributed as ddp
    from torch.distributed.fsdp import _common_utils
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group

    unshard = inspect.getsource(runtime._unshard)
    assert re.search(
        r"with state\._device_handle\.stream\(unshard_stream\):\s+handle\.unshard\(\)", unshard
    )
    free = inspect.getsource(flat.FlatParamHandle._free_unsharded_flat_param)
    assert free.index("_no_dispatch_record_stream(") < free.index(
        "_free_storage(unsharded_flat_param)"
    )
    post_backward = inspect.getsource(runtime._post_backward_hook)
    grad = r"_no_dispatch_record_stream\(\s*autograd_computed_grad,\s*state\._post_backward_stream"
    assert re.search(grad, post_backward)

    def calls_record_stream(module) -> bool:
        code = "\n".join(line.split("#")[0] for line in inspect.getsource(module).splitlines())
        return bool(re.search(r"(?<![\"'`\w])(_no_dispatch_)?record_stream\(", code))

    assert calls_record_stream(runtime) and calls_record_stream(flat)
    for module in (_fsdp_collectives, _fsdp_param_group, ddp):
        assert not calls_record_stream(module), module.__name__
    helper = inspect.getsource(_common_utils._no_dispatch_record_stream)
    assert '"cuda",' in helper and "return" in helper.split("is_torchdynamo_compiling")[0]
