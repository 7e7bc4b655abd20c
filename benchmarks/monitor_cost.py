"""What do the live-gauge sources and the gauge itself cost on this machine?

1. Cost per sample of each source in ``tutorial_utils.monitor`` (NVML, torch, GPUtil, psutil):
   median and mean over many reads. A source that cannot run here says why; no figure is
   invented for it. GPUtil additionally runs against a stub ``nvidia-smi`` (a shell script that
   prints one line): that isolates the process start GPUtil pays on every call; a real
   ``nvidia-smi`` adds its own query time on top (published: 7-20 ms).
2. The whole gauge's CPU overhead at 10 Hz, as % of one core: process CPU time (user + system,
   every thread) over a window with the gauge running minus the same window without it, while
   the main thread sleeps. ``--kernel`` measures it inside a real Jupyter kernel, where every
   widget update is also sent as a message.
3. What the CPU torch source costs the code being watched: with no GPU it keeps
   ``tutorial_utils.memory``'s accountant on, which books every torch operator.
4. ``--spikes``: short allocation spikes (about 20 ms each) and the share of them each poller
   shows, against the allocator's exact peak (``memory.measure`` around every spike). On a GPU:
   spikes of several GiB, GPUtil at its natural rate (back to back), NVML at 100 ms, the gauge
   at its default 200 ms. On a CPU: spikes of 64 MiB (written, so RSS sees them), psutil RSS
   at 100 ms and the gauge at 200 ms.

    python benchmarks/monitor_cost.py                 # about 30 s
    python benchmarks/monitor_cost.py --kernel        # overhead inside a Jupyter kernel too
    python benchmarks/monitor_cost.py --seconds 20    # longer overhead windows
    python benchmarks/monitor_cost.py --spikes        # the spike-catching table (about 30 s)

Figures depend on the machine and on whatever else runs on it: say where and when you
measured them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time

import psutil
import torch

from tutorial_utils import devices, monitor
from tutorial_utils.gauges import LiveGauge


def time_reads(source: monitor.Source, n: int) -> tuple[float, float] | str:
    """(median, mean) seconds per read, or the reason the source cannot read."""
    source.open()
    try:
        if not source.available:
            return f"unavailable: {source.reason}"
        for _ in range(min(5, n)):  # warm-up
            source.read()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            source.read()
            times.append(time.perf_counter() - t)
        return statistics.median(times), statistics.fmean(times)
    except monitor.SourceError as exc:
        return f"read failed: {exc}"
    finally:
        source.close()


def gputil_with_stub(n: int) -> tuple[float, float] | str:
    """GPUtil reading a stub nvidia-smi: the per-call process start, without a driver's
    query time."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "nvidia-smi")
        with open(exe, "w") as f:
            f.write(
                "#!/bin/sh\necho '0, GPU-stub, 0, 81920, 1024, 80896, 0.0, stub, 0, "
                "Disabled, Disabled, 30'\n"
            )
        os.chmod(exe, 0o755)
        old = os.environ["PATH"]
        os.environ["PATH"] = f"{tmp}{os.pathsep}{old}"
        try:
            return time_reads(monitor.GPUtilSource(), n)
        finally:
            os.environ["PATH"] = old


def fmt(result: tuple[float, float] | str) -> str:
    if isinstance(result, str):
        return result
    median, mean = result
    return f"{median * 1e6:9.1f} us median, {mean * 1e6:9.1f} us mean"


def cpu_seconds() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def overhead_pct(seconds: float, period_s: float = 0.1, sources=None) -> dict:
    """% of one core the gauge adds while the main thread sleeps (the kernel between cells)."""
    c0, w0 = cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    idle = (cpu_seconds() - c0) / (time.monotonic() - w0)
    gauge = LiveGauge(sources=sources, period_s=period_s)
    gauge.start()
    try:
        time.sleep(1.0)  # past the start-up (opening sources, the first sample)
        c0, w0 = cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        busy = (cpu_seconds() - c0) / (time.monotonic() - w0)
    finally:
        gauge.stop()
    rows = sorted({s.label for s in gauge.samples})
    return {
        "idle_pct": 100 * idle,
        "gauge_pct": 100 * busy,
        "overhead_pct": 100 * (busy - idle),
        "samples": len(gauge.samples),
        "missed": gauge.missed_ticks,
        "rows": rows,
    }


def overhead_in_kernel(seconds: float) -> dict:
    """Run overhead_pct inside a Jupyter kernel (widget updates become real messages)."""
    import nbformat
    from nbclient import NotebookClient

    code = textwrap.dedent(
        f"""
        import sys, json
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from monitor_cost import overhead_pct
        print(json.dumps(overhead_pct({seconds!r})))
        """
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    NotebookClient(nb, timeout=int(4 * seconds + 120), kernel_name="python3").execute()
    out = nb.cells[0].outputs
    text = "".join(o.get("text", "") for o in out if o.get("output_type") == "stream")
    import json

    return json.loads(text.strip().splitlines()[-1])


def tracker_cost_per_op(n: int = 3000) -> tuple[float, float]:
    """Seconds per small torch op without and with the CPU accountant on (the torch source)."""
    from tutorial_utils import memory

    x = torch.ones(64)

    def loop() -> float:
        t = time.perf_counter()
        for _ in range(n):
            y = x * 2  # noqa: F841 - one op, one small allocation
        return (time.perf_counter() - t) / n

    loop()
    plain = min(loop() for _ in range(3))
    with memory.Tracker("cpu"):
        loop()
        tracked = min(loop() for _ in range(3))
    return plain, tracked


# --------------------------------------------------------------------------- spikes


class Poller:
    """Calls ``read()`` (-> bytes) every ``period_s`` (0: back to back) in a thread;
    keeps (t, bytes)."""

    def __init__(self, name: str, read, period_s: float) -> None:
        import threading

        self.name, self.read, self.period_s = name, read, period_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                self.samples.append((t, int(self.read())))
            except Exception:  # a failed read is a missed sample, not a crash
                pass
            if self.period_s:
                next_t += self.period_s
                self._stop.wait(max(0.0, next_t - time.monotonic()))

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def seen(
    samples: list[tuple[float, int]], start: float, end: float, size: int, slack_s: float
) -> bool:
    """Did any sample inside the spike show at least half of it above the last sample before it?"""
    before = [b for t, b in samples if t < start]
    if not before:
        return False
    base = before[-1]
    return any(b - base >= size // 2 for t, b in samples if start <= t <= end + slack_s)


def spike_experiment(
    n: int = 30, seed: int = 0, size: int | None = None, device: torch.device | None = None
) -> dict:
    """Allocate ``n`` short spikes and count the ones each watcher shows.

    Returns ``{"rows": [(watcher, samples, spikes shown), ...], "size": bytes, "n": n,
    "median_ms": allocation-to-free time, "held_ms": time held after the op returned}``; the
    first row is the allocator's exact peak (``memory.measure`` around every spike).
    """
    import random

    from tutorial_utils import memory

    rng = random.Random(seed)
    gpu = devices.has_gpu() if device is None else device.type == "cuda"
    device = device or (torch.device("cuda", 0) if gpu else torch.device("cpu"))
    if size is None:
        if gpu:
            free, _ = torch.cuda.mem_get_info(device)
            size = min(4 * 2**30, free // 4)
        else:
            size = 64 * 2**20
    pollers: list[Poller] = []
    nv = None
    if gpu:
        nv = monitor.NvmlSource()
        nv.open()
        if nv.available:
            label = next((r.label for r in nv.read() if r.label.startswith("NVML cuda:0 ")), None)
            pollers.append(
                Poller(
                    "NVML every 100 ms",
                    lambda: next(r.used_bytes for r in nv.read() if r.label == label),
                    0.1,
                )
            )
        gputil = monitor.GPUtilSource()
        gputil.open()
        if gputil.available:

            def gputil_used() -> int:
                rows = gputil.read()
                mine = [r for r in rows if r.label == "GPUtil cuda:0"] or rows
                return int(mine[0].used_bytes)

            pollers.append(Poller("GPUtil back to back", gputil_used, 0.0))
    else:
        proc = psutil.Process()
        pollers.append(Poller("psutil RSS every 100 ms", lambda: proc.memory_info().rss, 0.1))
    gauge = LiveGauge(sources=["torch"], period_s=0.2)
    spikes: list[tuple[float, float]] = []
    held_s: list[float] = []
    exact_caught = 0
    for p in pollers:
        p.__enter__()
    t_before = time.monotonic()
    gauge.start()
    t_after = time.monotonic()
    try:
        time.sleep(0.5)
        for _ in range(n):
            with memory.measure(device) as m:
                start = time.monotonic()
                x = torch.ones(size // 4, device=device)  # written: RSS and the driver see it
                if gpu:
                    torch.cuda.synchronize()
                held = time.monotonic()  # the tensor exists (and is booked) from here
                time.sleep(0.02)
                del x
                if gpu:
                    torch.cuda.synchronize()
                end = time.monotonic()
            spikes.append((start, end))
            held_s.append(end - held)
            exact_caught += m.peak_above_start_bytes >= size
            time.sleep(rng.uniform(0.15, 0.45))
    finally:
        gauge.stop()
        for p in pollers:
            p.__exit__()
        if nv is not None:
            nv.close()
    # The gauge counts its times from inside start(): place them between the two clock reads
    # (the error is at most start()'s duration, small next to the 150-450 ms between spikes).
    t0 = (t_before + t_after) / 2
    row = "cuda:0" if gpu else "cpu (exact)"
    gauge_samples = [
        (t0 + s.t_s, s.used_bytes)
        for s in gauge.samples
        if s.label == row and s.used_bytes is not None
    ]
    rows = [("allocator peak (memory.measure)", n, exact_caught)]
    for name, samples in [(f"LiveGauge every 200 ms ({row})", gauge_samples)] + [
        (p.name, p.samples) for p in pollers
    ]:
        rows.append((name, len(samples), sum(seen(samples, s, e, size, 0.0) for s, e in spikes)))
    return {
        "rows": rows,
        "size": size,
        "n": n,
        "device": str(device),
        "median_ms": 1000 * statistics.median(e - s for s, e in spikes),
        "held_ms": 1000 * statistics.median(held_s),
    }


def print_spikes(result: dict) -> None:
    n = result["n"]
    print(
        f"   {n} spikes of {result['size'] / 2**20:.0f} MiB on {result['device']}: "
        f"{result['median_ms']:.0f} ms each from allocation to free, {result['held_ms']:.0f} ms "
        "of it after the op returned (medians), 150-450 ms apart"
    )
    print(f"   {'watcher':34s} {'samples':>8s} {'spikes shown':>13s}")
    for name, samples, shown in result["rows"]:
        print(f"   {name:34s} {samples:>8d} {shown:>7d} / {n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=300, help="reads per source (GPUtil: a tenth)")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of each overhead window"
    )
    parser.add_argument(
        "--kernel", action="store_true", help="also measure the overhead inside a Jupyter kernel"
    )
    parser.add_argument(
        "--spikes", action="store_true", help="also run the spike-catching comparison"
    )
    args = parser.parse_args()

    gpu = devices.has_gpu()
    print(
        f"machine: {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, torch {torch.__version__}, GPU: "
        + ("yes" if gpu else f"none ({devices.cuda_unavailable_reason()})")
    )
    print(
        f"load average now: {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
        "(other work on the machine inflates every figure)"
    )
    print()
    print("1. cost per sample")
    for name in monitor.SOURCE_NAMES:
        n = max(10, args.reads // 10) if name == "gputil" else args.reads
        print(f"   {name:28s} {fmt(time_reads(monitor.make_source(name), n))}")
    print(f"   {'gputil + stub nvidia-smi':28s} {fmt(gputil_with_stub(max(10, args.reads // 10)))}")
    print()
    print(
        f"2. gauge CPU overhead at 10 Hz, default sources, {args.seconds:.0f} s windows "
        "(% of one core)"
    )
    r = overhead_pct(args.seconds)
    print(
        f"   in-process:  {r['overhead_pct']:.2f}%  (idle {r['idle_pct']:.2f}%, "
        f"with gauge {r['gauge_pct']:.2f}%; "
        f"{r['samples']} samples, {r['missed']} missed ticks, rows: {', '.join(r['rows'])})"
    )
    if args.kernel:
        k = overhead_in_kernel(args.seconds)
        print(
            f"   in a kernel: {k['overhead_pct']:.2f}%  (idle {k['idle_pct']:.2f}%, "
            f"with gauge {k['gauge_pct']:.2f}%; "
            f"{k['samples']} samples, {k['missed']} missed ticks)"
        )
    print()
    plain, tracked = tracker_cost_per_op()
    print("3. the CPU torch source keeps memory's accountant on while the gauge runs")
    print(
        f"   a small torch op: {plain * 1e6:.1f} us without, {tracked * 1e6:.1f} us with "
        f"(+{(tracked - plain) * 1e6:.1f} us per op)"
    )
    if args.spikes:
        print()
        print("4. short allocation spikes: how many does each poller show?")
        print_spikes(spike_experiment())
    if not gpu:
        print()
        print(
            "No GPU on this machine: NVML and GPUtil cannot read here, and the GPU version of the"
        )
        print(
            "spike table (GPUtil / NVML at 100 ms / the gauge vs the allocator's peak) needs one. "
            "No GPU figures here."
        )


if __name__ == "__main__":
    sys.exit(main())
