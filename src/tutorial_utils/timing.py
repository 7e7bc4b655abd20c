"""Time PyTorch code correctly on GPUs and CPUs, and compare several versions in a table.

Why this exists: CUDA runs kernels *asynchronously*. ``start = time.perf_counter(); y = x @ w;
stop = time.perf_counter()`` on a GPU measures how long it took Python to *queue* the matmul,
not how long the GPU took to run it. A correct timer must

1. warm up first (the first call pays for CUDA context creation, cuBLAS handles, allocator
   growth, lazy module loading),
2. wait for the device to finish before reading the clock (``torch.cuda.synchronize()``), or
   use CUDA events, which the GPU itself timestamps as it reaches them in its stream,
3. repeat, and report the median (one slow sample from another process should not decide).

``time_it`` does all three and returns a ``Timing`` value; ``compare`` times several functions
the same way and shows a table with ratios against a baseline::

    >>> from tutorial_utils.timing import time_it, compare
    >>> x = torch.randn(256, 256)
    >>> t = time_it(lambda: x @ x, repeat=5)
    >>> t.median > 0
    True
    >>> table = compare({"matmul": lambda: x @ x, "add": lambda: x + x}, repeat=5)
    >>> table.names
    ('matmul', 'add')

Methods (``method=``):

* ``"events"`` (default on CUDA): ``torch.cuda.Event(enable_timing=True)`` recorded before and
  after the calls; the GPU's own clock, no idle gap from Python in the measurement.
* ``"sync"``: ``synchronize()`` before starting the clock and after the calls, then
  ``time.perf_counter``. Includes the Python overhead of launching; what a user waits for.
* ``"perf_counter"`` (the only choice on CPU): the wall clock; CPU ops are synchronous.

``time_with_benchmark`` wraps ``torch.utils.benchmark.Timer`` (which synchronizes the
accelerator itself and picks how many calls to run) and returns the same ``Timing`` type.
"""

from __future__ import annotations

import html
import math
import numbers
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import devices
from .units import format_bytes

__all__ = [
    "Comparison",
    "Rounds",
    "Timing",
    "compare",
    "format_seconds",
    "time_it",
    "time_with_benchmark",
]

_METHODS = ("auto", "events", "sync", "perf_counter")
_MAX_NUMBER = 1_000_000  # calls per sample when calibrating; a safety cap


def format_seconds(seconds: float) -> str:
    """``format_seconds(0.00123) == '1.23 ms'``: s, ms, us or ns with three significant digits."""
    if seconds is None:
        return "n/a"
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(f"format_seconds needs a number of seconds, not {seconds!r}")
    try:
        seconds = float(seconds)
    except OverflowError:  # an int beyond any float: longer than the universe has existed
        return f"{'-' if seconds < 0 else ''}over 1e308 s"
    if math.isnan(seconds):
        return "n/a"
    value = abs(seconds)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if value >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


@dataclass(frozen=True)
class Timing:
    """The result of timing one function: seconds per call, one entry per sample.

    ``samples`` holds seconds per call for each sample (a sample is ``number`` back-to-back
    calls divided by ``number``). Summary statistics are properties so they always agree with
    the samples. ``bandwidth(nbytes)`` turns the median into bytes per second.
    """

    name: str
    samples: tuple[float, ...]
    device: torch.device
    method: str
    number: int = 1  # calls per sample
    warmup: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def stdev(self) -> float:
        """Sample standard deviation in seconds (0.0 with a single sample)."""
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    @property
    def repeat(self) -> int:
        return len(self.samples)

    def bandwidth(self, nbytes: int) -> float:
        """Bytes per second when each call moves ``nbytes`` (uses the median time)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a whole number of bytes, 0 or more, got {nbytes!r}")
        if not self.median > 0:
            raise ValueError(
                f"the median time of {self.name or 'this timing'} is {self.median!r} s, so no "
                "bandwidth follows from it: time more calls per sample (number=...) or a "
                "bigger copy"
            )
        return nbytes / self.median

    def bandwidth_str(self, nbytes: int) -> str:
        """``bandwidth`` as text in binary units, e.g. ``'11.52 GiB/s'``."""
        return f"{format_bytes(self.bandwidth(nbytes))}/s"

    def __repr__(self) -> str:
        label = f"{self.name}: " if self.name else ""
        return (
            f"Timing({label}median {format_seconds(self.median)}, "
            f"min {format_seconds(self.min)}, max {format_seconds(self.max)}, "
            f"{self.repeat} samples x {self.number} calls on {self.device}, {self.method})"
        )


def _resolve_device(device: str | int | torch.device | None) -> torch.device:
    """The device whose queued work must finish before the clock is read.

    ``devices.resolve`` decides, as everywhere in the package: ``None`` honours
    ``TUTORIAL_DEVICE``, then prefers CUDA, MPS, the CPU. With ``None`` on CUDA the *current*
    CUDA device is the one synchronized (``torch.cuda.set_device`` moves it).
    """
    if device is not None and devices.parse_device(device).type == "meta":
        raise ValueError(
            "the 'meta' device runs no computation, so there is nothing to time: "
            "use 'cpu' or 'cuda'"
        )
    resolved = devices.resolve(device, allowed=("cuda", "mps", "cpu"), purpose="timing")
    if device is None and resolved.type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return resolved


def _synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits until ``device`` has finished all queued work."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


def _choose_method(method: str, device: torch.device) -> str:
    if method not in _METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, _METHODS))}, got {method!r}")
    if method == "auto":
        return (
            "events"
            if device.type == "cuda"
            else ("sync" if device.type == "mps" else "perf_counter")
        )
    if method == "events" and device.type != "cuda":
        raise ValueError(
            f"method='events' needs a CUDA device (CUDA events), but the device is {device}: "
            "use 'sync' or 'auto'"
        )
    return method


def _sample(fn: Callable[[], Any], number: int, method: str, device: torch.device) -> float:
    """Seconds per call for ``number`` back-to-back calls."""
    sync = _synchronizer(device)
    if method == "events":
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        sync()  # earlier work must not land inside this sample
        with torch.cuda.device(device):  # record on that device's current stream
            start.record()
            for _ in range(number):
                fn()
            stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / number  # elapsed_time is in milliseconds
    sync()
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return (time.perf_counter() - t0) / number


def _name_of(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", "")
    return "" if name == "<lambda>" else name


def _check_positive_int(value: Any, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number of at least {minimum}, got {value!r}")


def time_it(
    fn: Callable[[], Any],
    *,
    device: str | int | torch.device | None = None,
    warmup: int = 3,
    repeat: int = 10,
    number: int | None = None,
    min_time: float = 1e-3,
    method: str = "auto",
    name: str = "",
) -> Timing:
    """Time ``fn()`` (called with no arguments) and return a ``Timing`` in seconds per call.

    device: the device whose queued work must finish before the clock is read. ``None`` asks
        ``devices.resolve`` (``TUTORIAL_DEVICE`` if set, else the current CUDA device, then MPS,
        then the CPU), so GPU work is never under-counted. A device this machine lacks raises
        ``DeviceUnavailableError``; ``'meta'`` (which computes nothing) a ``ValueError``.
    warmup: calls made first and not measured (context creation, caches, lazy init).
    repeat: how many samples to take; the median of these is the headline number.
    number: calls per sample. ``None`` calibrates it: doubled until one sample lasts at least
        ``min_time`` seconds, so very fast functions are not lost in clock resolution.
    method: ``"auto"`` (CUDA events on CUDA, the wall clock elsewhere), ``"events"``, ``"sync"``
        or ``"perf_counter"``; see the module docstring.
    """
    if not callable(fn):
        raise TypeError(
            f"time_it needs a function to call with no arguments, e.g. lambda: x.to(device); "
            f"got a {type(fn).__name__}"
        )
    _check_positive_int(warmup, "warmup", 0)
    _check_positive_int(repeat, "repeat", 1)
    if number is not None:
        _check_positive_int(number, "number", 1)
    if isinstance(min_time, bool) or not isinstance(min_time, (int, float)) or not min_time >= 0:
        raise ValueError(f"min_time must be a number of seconds, 0 or more, got {min_time!r}")
    dev = _resolve_device(device)
    how = _choose_method(method, dev)
    if how != "perf_counter" and dev.type == "cpu":
        how = "perf_counter"  # nothing to synchronize on the CPU

    for _ in range(warmup):
        fn()
    _synchronizer(dev)()

    if number is None:
        number = 1
        while number < _MAX_NUMBER and _sample(fn, number, how, dev) * number < min_time:
            number *= 2

    samples = tuple(_sample(fn, number, how, dev) for _ in range(repeat))
    return Timing(
        name=name or _name_of(fn),
        samples=samples,
        device=dev,
        method=how,
        number=number,
        warmup=warmup,
    )


def time_with_benchmark(
    fn: Callable[[], Any],
    *,
    min_run_time: float = 0.2,
    device: str | int | torch.device | None = None,
    name: str = "",
) -> Timing:
    """Time ``fn()`` with ``torch.utils.benchmark.Timer.blocked_autorange`` and return a ``Timing``.

    The benchmark Timer synchronizes the accelerator around each block and picks the number of
    calls per block itself; it also warms up. Use it when you want PyTorch's own tool; the
    result has the same shape as ``time_it``'s so tables and plots work unchanged.
    """
    if not callable(fn):
        raise TypeError(f"time_with_benchmark needs a function to call, got a {type(fn).__name__}")
    if (
        isinstance(min_run_time, bool)
        or not isinstance(min_run_time, (int, float))
        or not min_run_time > 0
    ):
        raise ValueError(f"min_run_time must be a positive number of seconds, got {min_run_time!r}")
    from torch.utils import benchmark  # deferred: only this function needs torch's benchmark

    dev = _resolve_device(device)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(
        name=name or _name_of(fn),
        samples=tuple(float(t) for t in measurement.times),
        device=dev,
        method="torch.utils.benchmark",
        number=int(measurement.number_per_run),
        warmup=1,
    )


@dataclass(frozen=True)
class Comparison:
    """Several ``Timing`` results side by side, each with its ratio to the baseline's median.

    ``ratio(name)`` is ``median(name) / median(baseline)``: below 1 means faster than the
    baseline. ``speedup(name)`` is the inverse. Shown as a text table, an HTML table in a
    notebook, or a bar chart with ``plot()``.
    """

    timings: tuple[Timing, ...]
    baseline: str
    nbytes: int | None = None  # when set, the table adds a bandwidth column
    _index: dict[str, Timing] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {t.name: t for t in self.timings}
        if len(index) != len(self.timings):
            raise ValueError("every timing in a comparison needs a different name")
        if self.baseline not in index:
            raise ValueError(f"baseline {self.baseline!r} is not one of {', '.join(index)}")
        object.__setattr__(self, "_index", index)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.timings)

    def __getitem__(self, name: str) -> Timing:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(
                f"no timing named {name!r}; the names are {', '.join(self.names)}"
            ) from None

    def ratio(self, name: str) -> float:
        return self[name].median / self[self.baseline].median

    def speedup(self, name: str) -> float:
        return self[self.baseline].median / self[name].median

    def rows(self) -> list[dict[str, str]]:
        """The table as strings, one dict per timing, in insertion order."""
        out = []
        for t in self.timings:
            row = {
                "name": t.name,
                "median": format_seconds(t.median),
                "min": format_seconds(t.min),
                "max": format_seconds(t.max),
                "vs " + self.baseline: "baseline"
                if t.name == self.baseline
                else f"{self.ratio(t.name):.3g}x",
            }
            if self.nbytes is not None:
                row["bandwidth"] = t.bandwidth_str(self.nbytes)
            out.append(row)
        return out

    def __repr__(self) -> str:
        rows = self.rows()
        headers = list(rows[0])
        widths = [max(len(h), *(len(r[h]) for r in rows)) for h in headers]
        line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
        body = [
            "  ".join(r[h].ljust(w) for h, w in zip(headers, widths, strict=True)) for r in rows
        ]
        first = self.timings[0]
        foot = (
            f"({first.repeat} samples each on {first.device}, {first.method}; "
            "ratio = median / baseline median)"
        )
        return "\n".join([line, *body, foot])

    def _repr_html_(self) -> str:
        rows = self.rows()
        head = "".join(f"<th>{html.escape(h)}</th>" for h in rows[0])
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r.values()) + "</tr>"
            for r in rows
        )
        first = self.timings[0]
        caption = (
            f"{first.repeat} samples each on {html.escape(str(first.device))} "
            f"({html.escape(first.method)}); "
            "ratio = median / baseline median"
        )
        return (
            f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>"
        )

    def plot(self, ax: Any = None, title: str | None = None) -> Any:
        """Horizontal bars of the median per call (ms), whiskers from min to max.

        Returns the axes."""
        import matplotlib.pyplot as plt  # deferred: pyplot is slow to import; only plots need it

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * len(self.timings)))
        medians = [t.median * 1e3 for t in self.timings]
        low = [(t.median - t.min) * 1e3 for t in self.timings]
        high = [(t.max - t.median) * 1e3 for t in self.timings]
        y = list(range(len(self.timings)))
        ax.barh(y, medians, xerr=[low, high], color="#4c72b0", capsize=3)
        ax.set_yticks(y, labels=list(self.names))
        ax.invert_yaxis()
        ax.set_xlabel("time per call (ms): median, whiskers min to max")
        ax.set_title(title or f"Timing on {self.timings[0].device}")
        return ax


@dataclass(frozen=True)
class Rounds:
    """Variants timed in interleaved rounds: ``seconds[name]`` holds one time per round (every
    round ran every variant once, so a slow moment of the machine hits them all), and
    ``baselines[name]`` the variant it is compared with. Shown as a table: the median, the
    fastest and slowest rounds, the ratio of medians.

    ``verdict(name)`` says "faster" or "slower" than the baseline only where the two ranges of
    rounds do not overlap, else "ranges overlap": a sentence beside a timing is derived from
    the run, never assumed::

        >>> r = Rounds({"fp32": [2.0, 2.2], "bf16": [1.0, 1.1]}, {"fp32": "fp32", "bf16": "fp32"})
        >>> r.ratio("bf16"), r.verdict("bf16")
        (0.5, 'faster')
    """

    seconds: Mapping[str, list[float]]
    baselines: Mapping[str, str]

    def __post_init__(self) -> None:
        if not self.seconds or any(not times for times in self.seconds.values()):
            raise ValueError("Rounds needs at least one time per variant, e.g. {'fp32': [0.01]}")
        unknown = sorted(set(self.baselines.values()) - set(self.seconds))
        if set(self.baselines) != set(self.seconds) or unknown:
            raise ValueError(
                f"every variant needs a baseline among the variants; check {unknown or 'the names'}"
            )

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def ratio(self, name: str) -> float:
        """``median(name) / median(baseline)``: below 1 is faster than the baseline."""
        return self.median(name) / self.median(self.baselines[name])

    def verdict(self, name: str) -> str:
        mine, base = self.seconds[name], self.seconds[self.baselines[name]]
        if max(mine) < min(base):
            return "faster"
        return "slower" if min(mine) > max(base) else "ranges overlap"

    def __repr__(self) -> str:
        width = max(map(len, self.seconds))
        lines = []
        for name, times in self.seconds.items():
            spread = "..".join(format_seconds(t) for t in (min(times), max(times)))
            took, base = format_seconds(self.median(name)), self.baselines[name]
            lines.append(f"{name:{width}} {took:>9} ({spread})  {self.ratio(name):.2f}x {base}")
        return "\n".join(lines)


def compare(
    fns: Mapping[str, Callable[[], Any]],
    *,
    baseline: str | None = None,
    nbytes: int | None = None,
    **time_it_kwargs: Any,
) -> Comparison:
    """Time each function in ``fns`` with ``time_it`` (same settings) and tabulate them.

    baseline: the name the ratios are relative to (default: the first).
    nbytes: bytes each call moves; adds a bandwidth column (for copies and transfers).
    Other keyword arguments (``device``, ``warmup``, ``repeat``, ``number``, ``min_time``,
    ``method``) go to ``time_it`` unchanged.
    """
    if not isinstance(fns, Mapping) or not fns:
        raise TypeError(
            "compare needs a non-empty dict of {name: function}, e.g. {'pageable': f, 'pinned': g}"
        )
    if "name" in time_it_kwargs:
        raise TypeError("compare takes the names from the dict keys; do not pass name=")
    if nbytes is not None and (
        isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0
    ):
        raise ValueError(f"nbytes must be a whole number of bytes, 0 or more, got {nbytes!r}")
    names = [str(k) for k in fns]
    if baseline is None:
        baseline = names[0]
    elif baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the names: {', '.join(names)}")
    timings = tuple(time_it(fn, name=str(name), **time_it_kwargs) for name, fn in fns.items())
    return Comparison(timings=timings, baseline=baseline, nbytes=nbytes)
