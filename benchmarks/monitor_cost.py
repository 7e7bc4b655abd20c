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

    python benchmarks/monitor_cost.py                 # about 30 s
    python benchmarks/monitor_cost.py --kernel        # overhead inside a Jupyter kernel too
    python benchmarks/monitor_cost.py --seconds 20    # longer overhead windows

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
    """GPUtil reading a stub nvidia-smi: the per-call process start, without a driver's query time."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "nvidia-smi")
        with open(exe, "w") as f:
            f.write("#!/bin/sh\necho '0, GPU-stub, 0, 81920, 1024, 80896, 0.0, stub, 0, Disabled, Disabled, 30'\n")
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
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=300, help="reads per source (GPUtil: a tenth)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each overhead window")
    parser.add_argument("--kernel", action="store_true", help="also measure the overhead inside a Jupyter kernel")
    args = parser.parse_args()

    gpu = devices.has_gpu()
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"torch {torch.__version__}, GPU: {'yes' if gpu else 'none (' + str(devices.cuda_unavailable_reason()) + ')'}")
    print(f"load average now: {', '.join(f'{x:.2f}' for x in os.getloadavg())} (other work on the machine inflates every figure)")
    print()
    print("1. cost per sample")
    for name in monitor.SOURCE_NAMES:
        n = max(10, args.reads // 10) if name == "gputil" else args.reads
        print(f"   {name:28s} {fmt(time_reads(monitor.make_source(name), n))}")
    print(f"   {'gputil + stub nvidia-smi':28s} {fmt(gputil_with_stub(max(10, args.reads // 10)))}")
    print()
    print(f"2. gauge CPU overhead at 10 Hz, default sources, {args.seconds:.0f} s windows (% of one core)")
    r = overhead_pct(args.seconds)
    print(f"   in-process:  {r['overhead_pct']:.2f}%  (idle {r['idle_pct']:.2f}%, with gauge {r['gauge_pct']:.2f}%; "
          f"{r['samples']} samples, {r['missed']} missed ticks, rows: {', '.join(r['rows'])})")
    if args.kernel:
        k = overhead_in_kernel(args.seconds)
        print(f"   in a kernel: {k['overhead_pct']:.2f}%  (idle {k['idle_pct']:.2f}%, with gauge {k['gauge_pct']:.2f}%; "
              f"{k['samples']} samples, {k['missed']} missed ticks)")
    print()
    plain, tracked = tracker_cost_per_op()
    print("3. the CPU torch source keeps memory's accountant on while the gauge runs")
    print(f"   a small torch op: {plain * 1e6:.1f} us without, {tracked * 1e6:.1f} us with "
          f"(+{(tracked - plain) * 1e6:.1f} us per op)")
    if not gpu:
        print()
        print("No GPU on this machine: NVML and GPUtil cannot read, and the spike-catching comparison")
        print("(GPUtil / NVML at 100 ms / the gauge against the allocator's exact peak) needs one. No GPU figures here.")


if __name__ == "__main__":
    sys.exit(main())
