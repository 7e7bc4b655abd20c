"""Tests for tutorial_utils.timing: statistics, calibration, errors, and GPU synchronization
(mocked)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tutorial_utils import devices, timing
from tutorial_utils.devices import DeviceUnavailableError
from tutorial_utils.timing import (
    Comparison,
    Timing,
    compare,
    format_seconds,
    time_it,
    time_with_benchmark,
)


def _cpu_timing(name: str, samples: tuple[float, ...]) -> Timing:
    return Timing(name=name, samples=samples, device=torch.device("cpu"), method="perf_counter")


def test_statistics_follow_samples():
    t = _cpu_timing("t", (0.003, 0.001, 0.002, 0.010))
    assert t.median == pytest.approx(0.0025)
    assert t.mean == pytest.approx(0.004)
    assert (t.min, t.max) == (0.001, 0.010)
    assert t.stdev == pytest.approx(0.004082, rel=1e-3)
    assert t.repeat == 4
    assert _cpu_timing("one", (0.5,)).stdev == 0.0


def test_repr_is_readable():
    t = _cpu_timing("copy", (0.00123, 0.00125, 0.0013))
    text = repr(t)
    assert "copy" in text and "median 1.25 ms" in text and "min 1.23 ms" in text
    assert "3 samples x 1 calls on cpu" in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (2.5, "2.5 s"),
        (0.00123, "1.23 ms"),
        (4.56e-5, "45.6 us"),
        (7e-9, "7 ns"),
        (float("nan"), "n/a"),
    ],
)
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def test_bandwidth_uses_median():
    t = _cpu_timing("t", (1.0, 2.0, 4.0))
    assert t.bandwidth(2**30) == 2**29
    assert t.bandwidth_str(2**30) == "512.00 MiB/s"
    with pytest.raises(ValueError, match="nbytes"):
        t.bandwidth(-1)


class _FakeClock:
    """``time.perf_counter`` that moves only when the timed function runs: each call takes
    ``call_s`` exactly, so a timer's arithmetic is checked without a wall clock (issue 37)."""

    def __init__(self, call_s: float) -> None:
        self.now, self.call_s, self.calls = 100.0, call_s, 0

    def perf_counter(self) -> float:
        return self.now

    def work(self) -> None:
        self.calls += 1
        self.now += self.call_s


def test_time_it_measures_what_each_call_takes_on_a_fake_clock(monkeypatch):
    # before issue 37: a real 2 ms sleep held to "median < 0.5 s"; the clock here is exact
    clock = _FakeClock(0.002)
    monkeypatch.setattr(timing, "time", clock)
    t = time_it(clock.work, device="cpu", warmup=1, repeat=3, number=4)
    assert t.device == torch.device("cpu") and t.method == "perf_counter"
    assert len(t.samples) == 3 and t.number == 4 and t.warmup == 1 and clock.calls == 1 + 3 * 4
    assert t.samples == pytest.approx((0.002,) * 3)  # per call, not per sample of 4 calls
    t = time_it(clock.work, device="cpu", warmup=0, repeat=5, min_time=0.01)  # calibrated
    assert t.number == 8 and t.median == pytest.approx(0.002)  # 2, 4, then 8 calls: 16 ms


def test_warmup_calls_are_not_measured():
    calls = []
    time_it(lambda: calls.append(1), warmup=4, repeat=2, number=3)
    assert len(calls) == 4 + 2 * 3


def test_calibration_reaches_min_time():
    t = time_it(lambda: None, warmup=0, repeat=2, min_time=1e-4)
    assert t.number > 1
    assert t.number <= timing._MAX_NUMBER


def test_name_defaults_to_function_name():
    def add_one():
        return 1 + 1

    assert time_it(add_one, repeat=1, number=1).name == "add_one"
    assert time_it(lambda: None, repeat=1, number=1).name == ""


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"repeat": 0}, ValueError, "repeat must be"),
        ({"repeat": 2.5}, ValueError, "repeat must be"),
        ({"warmup": -1}, ValueError, "warmup must be"),
        ({"number": 0}, ValueError, "number must be"),
        ({"min_time": -1}, ValueError, "min_time must be"),
        ({"method": "stopwatch"}, ValueError, "method must be one of"),
        ({"method": "events", "device": "cpu"}, ValueError, "needs a CUDA device"),
        ({"device": "tpu"}, ValueError, "not a device this course uses"),
        ({"device": "meta"}, ValueError, "nothing to time"),
    ],
)
def test_bad_input_gives_one_sentence(kwargs, error, match):
    with pytest.raises(error, match=match) as info:
        time_it(lambda: None, **kwargs)
    assert "\n" not in str(info.value)


def test_non_callable_is_rejected():
    with pytest.raises(TypeError, match="needs a function to call"):
        time_it(torch.ones(3))  # type: ignore[arg-type]


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_missing_gpu_says_so():
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
        time_it(lambda: None, device="cuda")


@pytest.fixture
def cuda_clock(fake_allocator, monkeypatch):
    """A CUDA machine (conftest's fake allocator, found by the public resolver); ``log`` records
    every synchronize and event call in order."""
    log = fake_allocator.log

    class FakeEvent:
        def __init__(self, enable_timing: bool = False):
            assert enable_timing, "timing events need enable_timing=True"
            self.t = None

        def record(self, stream=None):
            log.append("record")
            self.t = len(log)

        def synchronize(self):
            log.append("event-sync")

        def elapsed_time(self, other):
            return 4.0  # milliseconds, like CUDA events

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", mock.MagicMock())
    return log


def test_sync_method_synchronizes_around_every_sample(cuda_clock):
    log = cuda_clock

    def work():
        log.append("call")

    t = time_it(work, device="cuda", warmup=1, repeat=2, number=2, method="sync")
    assert t.method == "sync" and t.device == torch.device("cuda", 0)
    # warm-up, sync, then each sample is wrapped: sync, call, call, sync
    assert log == ["call", "sync"] + ["sync", "call", "call", "sync"] * 2


def test_events_method_records_and_waits(cuda_clock):
    log = cuda_clock
    t = time_it(lambda: log.append("call"), device="cuda", warmup=0, repeat=1, number=2)
    assert t.method == "events"  # the default on CUDA
    assert log == ["sync", "sync", "record", "call", "call", "record", "event-sync"]
    assert t.samples == (pytest.approx(4.0 / 1e3 / 2),)  # ms -> s, per call


def test_compare_ratios_and_table():
    c = Comparison(
        timings=(_cpu_timing("slow", (0.004, 0.004)), _cpu_timing("fast", (0.001, 0.001))),
        baseline="slow",
        nbytes=2**20,
    )
    assert c.ratio("fast") == pytest.approx(0.25)
    assert c.speedup("fast") == pytest.approx(4.0)
    text = repr(c)
    assert "baseline" in text and "0.25x" in text and "vs slow" in text and "MiB/s" in text
    html = c._repr_html_()
    assert html.startswith("<table>") and html.count("<tr>") == 3
    with pytest.raises(KeyError, match="no timing named"):
        c["medium"]


def test_compare_runs_each_function():
    counts = {"a": 0, "b": 0}

    def make(key):
        def fn():
            counts[key] += 1

        return fn

    c = compare({"a": make("a"), "b": make("b")}, warmup=0, repeat=3, number=2)
    assert c.names == ("a", "b") and c.baseline == "a"
    assert counts == {"a": 6, "b": 6}
    assert (
        compare({"a": make("a"), "b": make("b")}, baseline="b", repeat=1, number=1).baseline == "b"
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (({},), {}, TypeError, "non-empty dict"),
        (({"a": lambda: None},), {"baseline": "z"}, ValueError, "baseline 'z'"),
        (({"a": lambda: None},), {"name": "x"}, TypeError, "dict keys"),
        (({"a": lambda: None},), {"nbytes": -5}, ValueError, "nbytes"),
    ],
)
def test_compare_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        compare(*args, **kwargs)


def test_plot_has_labels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = Comparison(timings=(_cpu_timing("a", (0.002,)), _cpu_timing("b", (0.001,))), baseline="a")
    ax = c.plot(title="demo")
    assert ax.get_title() == "demo"
    assert "ms" in ax.get_xlabel()
    assert [label.get_text() for label in ax.get_yticklabels()] == ["a", "b"]
    plt.close(ax.figure)


def test_time_with_benchmark_returns_a_timing():
    t = time_with_benchmark(lambda: torch.ones(8) + 1, min_run_time=0.02, name="add")
    assert isinstance(t, Timing) and t.name == "add"
    assert t.method == "torch.utils.benchmark" and t.number >= 1
    assert all(s > 0 for s in t.samples)
    with pytest.raises(ValueError, match="min_run_time"):
        time_with_benchmark(lambda: None, min_run_time=0)


def test_default_device_is_the_gpu_when_there_is_one(fake_allocator):
    """With CUDA present (mocked by conftest), device=None must synchronize the current GPU."""
    fake_allocator.current = 1
    t = time_it(lambda: None, warmup=0, repeat=3, number=1, method="sync")
    assert t.device == torch.device("cuda", 1)
    # after warm-up, then before and after each sample; always the current GPU
    assert fake_allocator.synced == [1] * (1 + 2 * 3)


@given(st.lists(st.floats(min_value=1e-9, max_value=1e3), min_size=1, max_size=50))
def test_summary_statistics_are_consistent(samples):
    t = _cpu_timing("t", tuple(samples))
    assert t.min <= t.median <= t.max
    assert t.min <= t.mean * (1 + 1e-12) and t.mean <= t.max * (1 + 1e-12)
    assert t.stdev >= 0
    assert format_seconds(t.median).split()[-1] in ("s", "ms", "us", "ns")


# ---------------------------------------------------------------- issue 16: one device resolver


def test_timing_asks_the_public_resolver_and_honours_tutorial_device(monkeypatch):
    asked = []

    def resolve(prefer=None, **kwargs):
        asked.append((prefer, kwargs.get("purpose")))
        return torch.device("cpu")

    monkeypatch.setattr(devices, "resolve", resolve)
    t = time_it(lambda: None, repeat=1, number=1, warmup=0)
    assert asked == [(None, "timing")] and t.device == torch.device("cpu")
    monkeypatch.undo()
    monkeypatch.setenv("TUTORIAL_DEVICE", "cpu")
    assert time_it(lambda: None, repeat=1, number=1).device == torch.device("cpu")


def test_timing_on_mps_synchronizes_it(monkeypatch):
    monkeypatch.delenv("TUTORIAL_DEVICE", raising=False)
    monkeypatch.setattr(devices, "has_gpu", lambda n=1: False)
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    synced = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: synced.append(1))
    t = time_it(lambda: None, repeat=2, number=1, warmup=0)
    assert t.device == torch.device("mps") and t.method == "sync"
    assert len(synced) >= 4, "each sample waits for MPS before and after"


# ---------------------------------------------------------------- issue 11: small validation gaps


@pytest.mark.parametrize("samples", [(0.0,), (0.0, 0.0, 1.0)])
def test_bandwidth_of_a_zero_median_is_one_sentence_not_zero_division(samples):
    with pytest.raises(ValueError, match="no bandwidth follows"):
        _cpu_timing("copy", samples).bandwidth(1024)


@pytest.mark.parametrize("nbytes", [-1, 1.5, True, "8"])
def test_bandwidth_refuses_bad_byte_counts(nbytes):
    with pytest.raises(ValueError, match="whole number of bytes"):
        _cpu_timing("copy", (0.5,)).bandwidth(nbytes)


def test_time_it_agrees_with_torch_utils_benchmark_on_the_same_work(monkeypatch):
    """Notebook 01 showed this once as a cell (issue 20 §5 cut it): the course's timer and
    PyTorch's own, written apart, measure the same work alike. A timer that counted its calls
    wrong, or missed one, would be off by 2x or more. Both read one fake clock that a call moves
    by 10 ms (issue 37: they timed a real sleep and held it to the wall clock; the real
    comparison is benchmarks/response_times.py's)."""
    from torch.utils import benchmark

    clock = _FakeClock(0.01)
    monkeypatch.setattr(timing, "time", clock)
    ours = time_it(clock.work, device="cpu", warmup=1, repeat=5, number=3)
    timer = benchmark.Timer(stmt="work()", globals={"work": clock.work}, timer=clock.perf_counter)
    theirs = timer.timeit(5)
    assert ours.median == pytest.approx(0.01) and theirs.median == pytest.approx(0.01)


def test_rounds_table_ratio_and_verdict():
    """Notebook 05's speed table: medians, ranges, ratios to each row's baseline, and a
    direction only where the ranges of rounds are apart."""
    rounds = timing.Rounds(
        {"fp32": [2.0, 2.2, 2.1], "bf16": [1.0, 1.2, 1.1], "fp16": [2.1, 1.9, 3.0], "conv": [1.0]},
        {"fp32": "fp32", "bf16": "fp32", "fp16": "fp32", "conv": "conv"},
    )
    assert rounds.median("fp16") == 2.1 and rounds.ratio("bf16") == pytest.approx(1.1 / 2.1)
    verdicts = [rounds.verdict(n) for n in ("bf16", "fp16", "fp32")]
    assert verdicts == ["faster", "ranges overlap", "ranges overlap"]
    assert timing.Rounds({"a": [1.0], "b": [2.0]}, {"a": "a", "b": "a"}).verdict("b") == "slower"
    table = repr(rounds).splitlines()
    assert table[1] == "bf16     1.1 s (1 s..1.2 s)  0.52x fp32" and len(table) == 4


def test_rounds_refuse_a_missing_baseline():
    with pytest.raises(ValueError, match="baseline among the variants"):
        timing.Rounds({"a": [1.0]}, {"a": "fp32"})
    with pytest.raises(ValueError, match="at least one time"):
        timing.Rounds({"a": []}, {"a": "a"})
