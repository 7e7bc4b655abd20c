"""``LiveGauge``: memory bars in the notebook, updated by one background thread.

Show it, start it, run the heavy code, stop it, look at the timeline::

    from tutorial_utils.gauges import LiveGauge

    gauge = LiveGauge()          # sources: torch allocator, NVML, psutil; every 200 ms
    gauge.start()                # returns the gauge: the last line of a cell displays it
    ...                          # heavy cells; the bars move while they run
    gauge.stop()
    gauge.plot();                # the recorded timeline, peak marked
    gauge.samples[-1]            # the data, one Sample per row per tick

or around one heavy cell (``display`` shows it while the cell runs)::

    with LiveGauge(period_s=0.1) as gauge:
        display(gauge)
        train(model, steps=200)
    gauge.plot();

One core ipywidget (``HTML``), so it draws in JupyterLab, Notebook 7,
VS Code and Colab.

Each row is one device (or the process / system for psutil): a bar filled to the used bytes
(dark) and the reserved bytes (light, torch on CUDA), a red marker at the peak, and the numbers
in binary units. The bar's full width is the device's total memory when the source knows it,
otherwise twice the row's highest value so far (doubled when outgrown), so it moves as memory
climbs.

How it behaves:

* One daemon thread samples every ``period_s`` seconds (default 0.2, from 0.02 to 3600) on a
  monotonic, drift-free schedule (``next += period``); ticks that come too late are skipped
  and counted in ``missed_ticks``, never bunched up. The widget is redrawn at most 10 times a
  second, as one message; faster sampling still records every sample and every peak.
* ``start()`` twice does not start a second thread; ``stop()`` joins it. The thread also ends
  when the gauge is garbage-collected or the kernel exits.
* At most ``MAX_RUNNING`` (16) gauges sample at once; starting one more is an error that
  says to stop one.
* A source this machine does not have (no NVIDIA driver on a CPU machine) says so in grey,
  ``not on this machine`` (the reason on hover), never in red. A source that fails (NVML
  failing mid-run, a broken ``nvidia-smi``, a psutil error, a reading that is not a list of
  well-formed ``Reading`` values) shows ``unavailable: <reason>`` in its row; the others keep
  going. Any other error in the thread -- even one that ends it -- shows at the top of the
  widget and in ``gauge.error``. The thread never prints: since ipykernel 7, a thread's
  prints land in
  whichever cell ran last.
* Headless (nbval, nbconvert): the text form of the display is constant
  (``LiveGauge(period 200 ms; sources torch, nvml, psutil)``), so strict comparison passes.

Cost: at 10 Hz the thread takes about 1% of one core (``benchmarks/monitor_cost.py``). On a
machine without CUDA the ``torch`` row keeps ``tutorial_utils.memory``'s exact accountant on
while the gauge runs, which adds tens of microseconds to every torch operator of the notebook;
``LiveGauge(sources=['psutil'])`` watches without it.

Any poller, this one included, sees memory only at its ticks: a spike shorter than the period
can fall between two samples. The torch allocator's peak counter (the red marker on the torch
rows) is updated at every allocation and never misses one.
"""

from __future__ import annotations

import atexit
import html
import math
import numbers
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as w

from .monitor import Reading, Source, SourceError, make_source
from .units import format_bytes

__all__ = [
    "LiveGauge",
    "Sample",
    "MIN_PERIOD_S",
    "MAX_PERIOD_S",
    "MAX_RUNNING",
    "DEFAULT_PERIOD_S",
]

DEFAULT_PERIOD_S = 0.2
MIN_PERIOD_S = 0.02
MAX_PERIOD_S = 3600.0  # an hour; a longer wait overflows the thread's timer
_REDRAW_MIN_S = 0.1  # widgets are redrawn at most 10 times a second
_JOIN_TIMEOUT_S = 5.0  # stop() waits this long (or 10 periods) for a read in progress
_DEFAULT_SOURCES = ("torch", "nvml", "psutil")
#: Gauges sampling at once. Each start opens every source and each tick reads them all: 1000
#: gauges at 50 ms took 31.7 s to start and slowed the whole kernel (issue 25).
MAX_RUNNING = 16


@dataclass(frozen=True)
class Sample:
    """One row at one tick. ``t_s`` is seconds since ``start()``; ``error`` is set when the row
    could not be read (its numbers are then ``None``)."""

    t_s: float
    source: str
    label: str
    used_bytes: int | None = None
    reserved_bytes: int | None = None
    total_bytes: int | None = None
    peak_bytes: int | None = None
    utilization_pct: float | None = None
    error: str = ""


class _Schedule:
    """Deadlines at ``t0 + k * period`` exactly: the time a tick takes never shifts later ticks."""

    def __init__(self, period_s: float, t0: float) -> None:
        self.period_s = period_s
        self.next = t0 + period_s
        self.missed = 0

    def advance(self, now: float) -> None:
        self.next += self.period_s
        if self.next <= now:  # late by one period or more: skip the ticks already due
            skipped = math.floor((now - self.next) / self.period_s) + 1
            self.next += skipped * self.period_s
            self.missed += skipped


@dataclass
class _Row:
    source: str
    label: str
    last: Reading | None = None
    error: str = ""
    peak_bytes: int = 0  # max over samples of used and of the allocator's peak
    bar: str = ""  # the row's HTML as last drawn
    text: str = ""
    absent: bool = False  # its source is not on this machine (see Source.absent)
    scale: int = 0  # full width of the bar, for a row without a total (see _bar_scale)


def _bar_html(used: float, reserved: float, peak: float, muted: bool = False) -> str:
    """A stacked bar: used (dark) over reserved (light), a red peak marker. Fractions of 1."""

    def pct(x: float) -> str:
        return f"{100.0 * min(max(x, 0.0), 1.0):.1f}%"

    dark, light = ("#9e9e9e", "#e0e0e0") if muted else ("#1f77b4", "#aec7e8")
    marker = (
        '<div class="tu-gauge-peak" title="peak" style="position:absolute;top:-3px;'
        f'left:{pct(peak)};width:2px;height:20px;background:#d62728"></div>'
        if peak > 0
        else ""
    )
    return (
        '<div class="tu-gauge-bar" style="position:relative;width:100%;height:14px;'
        'margin-top:6px;background:#f2f2f2;border:1px solid #ccc;border-radius:3px">'
        '<div class="tu-gauge-reserved" style="position:absolute;left:0;top:0;height:100%;'
        f'width:{pct(reserved)};background:{light}"></div>'
        '<div class="tu-gauge-used" style="position:absolute;left:0;top:0;height:100%;'
        f'width:{pct(used)};background:{dark}"></div>'
        f"{marker}</div>"
    )


def _bar_scale(row: _Row, reading: Reading) -> int:
    """The bytes a row's full bar stands for: the device's total when the source knows it.

    Otherwise (the exact CPU tensor count has no total) an auto-range: twice the highest value
    so far, doubled again whenever the row outgrows it. A scale of "the peak so far" kept the
    bar full the whole time memory climbed; this one moves with it.
    """
    if reading.total_bytes:
        return reading.total_bytes
    need = max(row.peak_bytes, reading.reserved_bytes or 0, reading.used_bytes or 0, 1)
    if row.scale < need:
        row.scale = 2 * need
    return row.scale


def _row_text(reading: Reading | None, peak: int, error: str, absent: bool = False) -> str:
    if error and absent:  # e.g. no NVIDIA driver on a CPU machine: normal, said in a word
        return (
            '<span class="tu-gauge-text" style="color:#777" '
            f'title="{html.escape(error)}">not on this machine</span>'
        )
    if error:
        return (
            '<span class="tu-gauge-text" style="color:#b00">'
            f"unavailable: {html.escape(error)}</span>"
        )
    if reading is None:
        return '<span class="tu-gauge-text">waiting for the first sample</span>'
    styles = {  # how each kind of number is drawn; the numbers come from Reading.parts
        "used": "<b>{}</b>",
        "peak": '<span style="color:#d62728">{}</span>',
    }
    parts = [
        styles.get(kind, "{}").format(html.escape(text))
        for kind, text in reading.parts(peak_bytes=peak)
    ]
    return f'<span class="tu-gauge-text">{" · ".join(parts)}</span>'


_BYTE_FIELDS = ("used_bytes", "reserved_bytes", "total_bytes", "peak_bytes")


def _checked(readings: object) -> list[Reading]:
    """A source's ``read()`` result if well formed; else ``SourceError`` saying what is wrong.

    A source written for a notebook can return anything; a bad value must become an error row,
    not a crash of the drawing code (or of ``stop()``) later.
    """
    if not isinstance(readings, (list, tuple)):
        raise SourceError(f"read() returned {type(readings).__name__}, not a list of Reading")
    for r in readings:
        if not isinstance(r, Reading):
            raise SourceError(f"read() returned a {type(r).__name__} in its list, not a Reading")
        if not isinstance(r.label, str):
            raise SourceError(f"a reading's label must be text, got {r.label!r}")
        for name in _BYTE_FIELDS:
            v = getattr(r, name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0
            ):
                raise SourceError(
                    f"malformed reading for {r.label!r}: "
                    f"{name}={v!r} is not a whole number of bytes"
                )
        u = r.utilization_pct
        if u is not None and (
            isinstance(u, bool) or not isinstance(u, numbers.Real) or not math.isfinite(u)
        ):
            raise SourceError(
                f"malformed reading for {r.label!r}: utilization_pct={u!r} is not a number"
            )
        if not isinstance(r.note, str) or not isinstance(r.utilization_of, str):
            raise SourceError(f"malformed reading for {r.label!r}: note={r.note!r} is not text")
    return list(readings)


def _changed_window(
    by_label: dict[str, list[Sample]], base: dict[str, int], period_s: float
) -> tuple[float, float]:
    """The time axis of a plot: from two periods before the first sample that differs from its
    row's first one (the time before the code ran, say reading the previous cell, is cut off)
    to the last sample. The whole recording when nothing changed."""
    first = min(ss[0].t_s for ss in by_label.values())
    last = max(ss[-1].t_s for ss in by_label.values())
    changes = [
        s.t_s
        for label, ss in by_label.items()
        for s in ss
        if (s.used_bytes or 0) != base[label] or (s.peak_bytes or 0) > base[label]
    ]
    start = max(first, min(changes) - 2 * period_s) if changes else first
    return start, max(last, start + period_s)


def _run(
    ref: weakref.ref,
    stop: threading.Event,
    schedule: _Schedule,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """The sampling thread. Holds the gauge only weakly, so a forgotten gauge ends its thread.
    ``clock``: the monotonic clock the schedule runs on (a test passes a fake one).

    Nothing escapes it: an error in a tick is shown and sampling goes on; an error anywhere else
    (the schedule, the clock) ends the thread and is shown too. A thread must never print.
    """
    try:
        while True:
            if stop.wait(max(0.0, schedule.next - clock())):
                return
            gauge = ref()
            if gauge is None:
                return
            try:
                gauge._tick()
            except Exception as exc:
                gauge._fault(exc)
            del gauge
            schedule.advance(clock())
    except BaseException as exc:
        gauge = ref()
        if gauge is not None:
            gauge._fault(exc, fatal=True)


def _close_sources(sources) -> None:
    for src in sources:
        try:
            src.close()
        except Exception:  # closing never raises out of stop() or a finalizer
            pass


class LiveGauge:
    """Live memory bars, one row per device, sampled by one background thread.

    Parameters
    ----------
    sources:
        names from ``tutorial_utils.monitor.SOURCE_NAMES`` (``'torch'``, ``'nvml'``, ``'gputil'``,
        ``'psutil'``) or ``Source`` objects. Default ``('torch', 'nvml', 'psutil')``. GPUtil is
        left out by default: each of its reads starts an ``nvidia-smi`` process.
    period_s:
        seconds between samples, at least 0.02 (default 0.2).
    max_samples:
        samples kept (oldest dropped first); the default holds hours at 200 ms.

    Example::

        gauge = LiveGauge(period_s=0.1)
        gauge.start()
        x = torch.randn(4096, 4096)   # the bars move
        gauge.stop()
        gauge.plot();
    """

    def __init__(
        self,
        sources: Iterable[str | Source] | None = None,
        period_s: float = DEFAULT_PERIOD_S,
        max_samples: int = 200_000,
    ) -> None:
        if (
            isinstance(period_s, bool)
            or not isinstance(period_s, (int, float))
            or not math.isfinite(period_s)
        ):
            raise ValueError(f"period_s must be a number of seconds, got {period_s!r}")
        if period_s < MIN_PERIOD_S:
            raise ValueError(
                f"period_s={period_s} is below the minimum of {MIN_PERIOD_S} s (20 ms): "
                "sampling faster costs CPU and shows nothing new; use period_s >= 0.02"
            )
        if period_s > MAX_PERIOD_S:
            raise ValueError(
                f"period_s={period_s!r} is above the maximum of {MAX_PERIOD_S:g} s (an hour): "
                "a gauge shows memory while code runs; sample at least once an hour"
            )
        if (
            isinstance(max_samples, bool)
            or not isinstance(max_samples, int)
            or not 1 <= max_samples <= 10**9  # a billion samples: weeks at the fastest period
        ):
            raise ValueError(
                f"max_samples must be a whole number from 1 to 10**9, got {max_samples!r}"
            )
        self.period_s = float(period_s)
        if isinstance(sources, (str, Source)):  # one source given alone: sources="torch"
            sources = [sources]
        if sources is not None and not isinstance(sources, Iterable):
            raise TypeError(
                f"sources must be names like ['torch', 'psutil'] or Source objects, got {sources!r}"
            )
        specs = tuple(_DEFAULT_SOURCES if sources is None else sources)
        if not specs:
            raise ValueError("give at least one source, e.g. LiveGauge(sources=['psutil'])")
        self.sources: list[Source] = [make_source(s) for s in specs]
        self._samples: deque[Sample] = deque(maxlen=max_samples)
        self._rows: dict[tuple[str, str], _Row] = {}
        self._lock = threading.RLock()  # guards samples, rows and the thread handle
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._schedule: _Schedule | None = None
        self._t0 = 0.0
        self._elapsed_s = 0.0
        self._last_redraw = -math.inf
        self.error: str = ""  # the last error raised inside the thread, as text
        self._build_widget()
        _LIVE.add(self)

    # ------------------------------------------------------------------ widgets

    def _build_widget(self) -> None:
        # One HTML widget for the whole gauge: one message per redraw, whatever the row count.
        self._state = "not started: call .start()"
        self._html = w.HTML(value=self._render(), layout=w.Layout(width="100%"))

    @property
    def widget(self) -> Any:
        """The ipywidgets HTML widget (display the gauge itself: its text form is stable)."""
        return self._html

    def _render(self) -> str:
        names = ", ".join(s.name for s in self.sources)
        parts = [
            '<div class="tu-gauge" style="font-size:13px;line-height:1.5">',
            '<div class="tu-gauge-header"><b>LiveGauge</b> · '
            f"every {self.period_s * 1000:.0f} ms · {html.escape(names)} · "
            f'<span class="tu-gauge-state">{html.escape(self._state)}</span></div>',
        ]
        if self.error:
            parts.append(
                '<div class="tu-gauge-error" style="color:#b00">'
                f"gauge error: {html.escape(self.error)}</div>"
            )
        for row in self._rows.values():
            parts.append(
                '<div class="tu-gauge-row" style="display:flex;align-items:center;gap:10px;'
                'margin:2px 0">'
                '<div style="flex:0 0 14em;font-weight:bold;overflow:hidden;'
                f'text-overflow:ellipsis;white-space:nowrap">{html.escape(row.label)}</div>'
                f'<div style="flex:0 0 35%">{row.bar}</div>'
                f'<div style="flex:1 1 auto">{row.text}</div></div>'
            )
        parts.append("</div>")
        return "".join(parts)

    def _new_row(self, source: str, label: str) -> _Row:
        row = _Row(source, label, bar=_bar_html(0, 0, 0), text=_row_text(None, 0, ""))
        self._rows[(source, label)] = row
        return row

    def _redraw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_redraw < _REDRAW_MIN_S:
            return
        self._last_redraw = now
        for row in list(self._rows.values()):
            r = row.last
            if row.error or r is None or r.used_bytes is None:
                row.bar = _bar_html(0, 0, 0, muted=True)
            else:
                scale = _bar_scale(row, r)
                row.bar = _bar_html(
                    r.used_bytes / scale, (r.reserved_bytes or 0) / scale, row.peak_bytes / scale
                )
            row.text = _row_text(r, row.peak_bytes, row.error, row.absent)
        if self.running:
            self._state = f"running {now - self._t0:.0f} s"
        else:
            self._state = f"stopped after {self._elapsed_s:.1f} s, {len(self._samples)} samples"
        value = self._render()
        if self._html.value != value:  # each change is one message to the front end
            self._html.value = value

    # ------------------------------------------------------------------ sampling

    def _tick(self) -> None:
        """Read every source once, record the samples, redraw if due. Runs in the thread."""
        t = time.monotonic() - self._t0
        # Read without the lock: a source that hangs must not block stop() or samples.
        results: list[tuple[Source, list[Reading] | None, str]] = []
        for src in self.sources:
            if not src.available:
                results.append((src, None, src.reason))
                continue
            try:
                results.append((src, _checked(src.read()), ""))
            except SourceError as exc:
                results.append((src, None, str(exc)))
            except Exception as exc:  # a source bug must not stop the other rows
                results.append((src, None, f"{type(exc).__name__}: {exc}"))
        with self._lock:
            for src, readings, error in results:
                if readings is None:
                    self._mark_failed(src.name, error, t, record=src.available)
                    absent = not src.available and getattr(src, "absent", False)
                    for (name, _), row in self._rows.items():
                        if name == src.name:
                            row.absent = absent
                    continue
                for r in readings:
                    row = self._rows.get((src.name, r.label)) or self._new_row(src.name, r.label)
                    row.last, row.error, row.absent = r, "", False
                    row.peak_bytes = max(row.peak_bytes, r.used_bytes or 0, r.peak_bytes or 0)
                    self._samples.append(
                        Sample(
                            t,
                            src.name,
                            r.label,
                            r.used_bytes,
                            r.reserved_bytes,
                            r.total_bytes,
                            r.peak_bytes,
                            r.utilization_pct,
                        )
                    )
            self._redraw()

    def _mark_failed(self, source: str, reason: str, t: float, record: bool = True) -> None:
        rows = [row for (s, _), row in self._rows.items() if s == source]
        if not rows:
            rows = [self._new_row(source, source)]
        for row in rows:
            row.error = reason
            if record:
                self._samples.append(Sample(t, source, row.label, error=reason))

    def _fault(self, exc: BaseException, fatal: bool = False) -> None:
        """An unexpected error in the thread: keep it, show it in the widget, print nothing.

        ``fatal``: it ended the thread (the sources stay open until ``stop()``, which is called
        from the notebook's thread, as the torch source needs).
        """
        try:
            self.error = f"{type(exc).__name__}: {exc}"
            if fatal:
                self.error = f"the sampling thread stopped: {self.error}"
            self._state = "stopped by an error" if fatal else "running, with an error"
            self._html.value = self._render()
        except Exception:
            pass

    # ------------------------------------------------------------------ public API

    @property
    def running(self) -> bool:
        """True while the sampling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def missed_ticks(self) -> int:
        """Ticks skipped because a sample came a period or more late (a busy machine)."""
        return self._schedule.missed if self._schedule else 0

    def start(self) -> LiveGauge:
        """Start a new recording (clears samples and peaks) and the sampling thread.

        Opens the sources in the calling thread (the CPU tracker counts this thread's tensors),
        takes the first sample at once, then samples every ``period_s``. Calling it while
        running does nothing. Returns the gauge, so ``LiveGauge().start()`` displays it.
        """
        with self._lock:
            if self.running:
                return self
            running = sum(1 for g in list(_LIVE) if g is not self and g.running)
            if running >= MAX_RUNNING:
                raise RuntimeError(
                    f"{running} LiveGauges are running already (the most at once is "
                    f"{MAX_RUNNING}: each has a thread that reads every source); stop one with "
                    ".stop(), or show several sources in one gauge"
                )
            self._samples.clear()
            self.error = ""
            for row in self._rows.values():
                row.last, row.error, row.peak_bytes, row.scale = None, "", 0, 0
            # A gauge forgotten while running (reassigned, deleted) still closes its sources when
            # it is collected: the CPU tracker's dispatch mode must not stay on forever. (The
            # tracker comes off the notebook's thread even when this runs in the sampling one.)
            self._finalizer = weakref.finalize(self, _close_sources, tuple(self.sources))
            try:
                self._open_and_start()
            except BaseException:  # Ctrl-C (KeyboardInterrupt) while starting: nothing stays on
                self._stop.set()
                self._thread = None
                self._finalizer.detach()
                _close_sources(self.sources)
                raise
        return self

    def _open_and_start(self) -> None:
        for src in self.sources:
            try:
                src.open()
            except Exception as exc:  # open() should not raise; a custom source might
                src.available, src.reason = False, f"{type(exc).__name__}: {exc}"
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._schedule = _Schedule(self.period_s, self._t0)
        self._last_redraw = -math.inf
        try:
            self._tick()  # the first sample now, so the rows appear at once
        except Exception as exc:
            self._fault(exc)
        self._thread = threading.Thread(
            target=_run,
            args=(weakref.ref(self), self._stop, self._schedule),
            name="LiveGauge",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> LiveGauge:
        """Stop sampling: joins the thread, closes the sources, draws the final numbers."""
        thread = self._thread
        if thread is None:
            return self
        self._stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout=max(_JOIN_TIMEOUT_S, 10 * self.period_s))
        with self._lock:
            self._thread = None
            self._elapsed_s = time.monotonic() - self._t0
            self._finalizer.detach()
            _close_sources(self.sources)
            if thread.is_alive():  # a source hung in read(): say so instead of hiding it
                self.error = "the sampling thread did not stop within its timeout (a source hung)"
            try:
                self._redraw(force=True)
            except Exception as exc:  # stop() always stops; what went wrong is shown
                self._fault(exc)
        return self

    def __enter__(self) -> LiveGauge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def samples(self) -> list[Sample]:
        """Every recorded sample, oldest first (a copy; safe to read while running)."""
        with self._lock:
            return list(self._samples)

    @property
    def peaks(self) -> dict[str, int]:
        """Highest bytes seen per row label (the allocator's exact peak where it has one)."""
        with self._lock:
            return {row.label: row.peak_bytes for row in self._rows.values() if row.peak_bytes}

    def plot(self, labels: Sequence[str] | None = None, ax: Any = None) -> Any:
        """Draw the recorded timeline, scaled to what changed: each row's used bytes *above its
        first sample*, from just before the first change to the end, each row's peak marked.

        ``labels``: the rows to draw; by default every row but psutil's ``system`` (the whole
        machine, whose other processes would set the scale). Rows with an exact allocator peak
        also get a dashed line at that peak: where it sits above the sampled curve, the poller
        missed a spike. Returns the matplotlib Axes; end the notebook line with ``;``.
        """
        # Deferred: pyplot takes a moment to import and picks a backend; only plots need it.
        import matplotlib.pyplot as plt

        samples = self.samples
        if not any(s.used_bytes is not None for s in samples):
            raise RuntimeError(
                "nothing recorded yet: start() the gauge, run your code, stop() it, then plot()"
            )
        by_label: dict[str, list[Sample]] = {}
        for s in samples:
            wanted = s.label != "system" if labels is None else s.label in labels
            if s.used_bytes is not None and wanted:
                by_label.setdefault(s.label, []).append(s)
        if not by_label:
            recorded = sorted({s.label for s in samples})
            raise ValueError(f"no samples for {list(labels or [])}; recorded rows: {recorded}")
        base = {label: ss[0].used_bytes or 0 for label, ss in by_label.items()}
        window = _changed_window(by_label, base, self.period_s)
        top = max(
            max((s.used_bytes or 0) - base[label], (s.peak_bytes or 0) - base[label], 1)
            for label, ss in by_label.items()
            for s in ss
        )
        unit_name, unit = next(
            ((n, 2.0**p) for n, p in (("GiB", 30), ("MiB", 20), ("KiB", 10)) if top >= 2.0**p),
            ("B", 1.0),
        )
        own_figure = ax is None
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 3.5))
        bottom = 0.0
        for label, ss in by_label.items():
            t = [s.t_s for s in ss]
            y = [((s.used_bytes or 0) - base[label]) / unit for s in ss]
            bottom = min(bottom, *y)
            (line,) = ax.plot(t, y, label=label, lw=1.4)
            k = max(range(len(y)), key=y.__getitem__)
            ax.plot([t[k]], [y[k]], marker="v", color=line.get_color(), ms=8)
            right = t[k] > window[0] + 0.6 * (window[1] - window[0])  # keep the label inside
            ax.annotate(
                f"sampled peak +{format_bytes(ss[k].used_bytes - base[label])}",
                (t[k], y[k]),
                textcoords="offset points",
                xytext=(-6 if right else 6, 6),
                ha="right" if right else "left",
                fontsize=8,
                color=line.get_color(),
            )
            exact = max((s.peak_bytes or 0) for s in ss)
            if exact:
                ax.axhline(
                    (exact - base[label]) / unit,
                    color=line.get_color(),
                    ls="--",
                    lw=1,
                    label=f"{label}: allocator peak +{format_bytes(exact - base[label])}",
                )
        ax.set_xlabel("time since the gauge started (s)")
        ax.set_ylabel(f"memory above the first sample ({unit_name})")
        ax.set_title(f"LiveGauge timeline, one sample every {self.period_s * 1000:.0f} ms")
        ax.set_xlim(*window)
        ax.set_ylim(min(bottom * 1.15, 0.0), 1.15 * top / unit)  # room for the peak labels
        ax.legend(fontsize=8, loc="best")
        if own_figure:
            ax.figure.tight_layout()
        return ax

    # ------------------------------------------------------------------ display

    def __repr__(self) -> str:
        # Constant on purpose: strict nbval compares this text, and the live state is in the
        # widget. A sentence, not an object's repr: a saved notebook shows it until the cell runs.
        names = ", ".join(s.name for s in self.sources)
        return (
            f"Live memory gauge ({names}, sampled every {self.period_s * 1000:.0f} ms): run the "
            "cell to see its bars"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(self._html._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = repr(self)
        return bundle


# Every gauge ever made, weakly: stopped when the interpreter (the kernel) exits.
_LIVE: weakref.WeakSet[LiveGauge] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for gauge in list(_LIVE):
        try:
            gauge.stop()
        except Exception:
            pass
