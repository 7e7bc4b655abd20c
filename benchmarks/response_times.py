"""The seconds the unit tests used to assert, measured here instead: medians over several runs.

    python benchmarks/response_times.py              # 5 runs of each (about 2 minutes on 2 cores)
    python benchmarks/response_times.py --runs 9
    python benchmarks/response_times.py --only cli   # cli, count, fit, timers, gauge or hung

Issue 37: no test asserts a wall-clock time (on a loaded 2-core machine a calculator update a
test held to 2.0 s took 8.4 s). Each test now checks what the code does that makes it quick;
this script prints how quick it is on this machine, with the bound the test once asserted
beside it for reference (a bound, not a verdict: nothing here fails).

- cli: ``python -m tutorial_utils fit --help`` and an argument error, each in a fresh Python,
  beside a bare ``python -c pass`` and ``import torch`` (``tests/test_fit_cli.py`` checks that
  neither imports torch);
- count: the first ``memory.measure`` in a fresh Python that has imported torch
  (``tests/test_memory.py`` checks that it does not import ``torch._dynamo``);
- fit: ``will_it_fit("gpt2", batch=100_000)`` from an empty cache (``tests/test_fit.py``
  checks it runs one block and the head on fake tensors);
- timers: ``timing.time_it`` and ``torch.utils.benchmark`` on a real 10 ms sleep
  (``tests/test_timing.py`` checks both on a fake clock);
- gauge: a ``LiveGauge`` at 50 ms for 1 s: samples taken and ticks missed
  (``tests/test_gauges.py`` checks the loop on a fake clock);
- hung: how long NVML's init, a doctor check and ``LiveGauge.stop()`` take to give up on a
  call that never answers (the tests check that they gave up while the call still hung).

The calculator's own: ``benchmarks/calculator_updates.py``. Say where and when you measured:
the figures depend on the machine and on whatever else runs on it (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable

PYTHON = sys.executable


def child_seconds(code: str) -> float:
    """Wall seconds of a fresh ``python -c code``, from the parent's side."""
    start = time.perf_counter()
    subprocess.run([PYTHON, "-c", code], check=True, capture_output=True, timeout=600)
    return time.perf_counter() - start


def fit_cli(*args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [PYTHON, "-m", "tutorial_utils", "fit", *args], capture_output=True, timeout=600
    )
    if done.returncode not in (0, 2):
        raise RuntimeError(f"fit {' '.join(args)} exited with {done.returncode}")
    return time.perf_counter() - start


def first_count() -> float:
    """Seconds of the first ``memory.measure`` block, printed by a fresh Python."""
    code = (
        "import time, torch\n"
        "from tutorial_utils import memory\n"
        "t = time.perf_counter()\n"
        "with memory.measure('cpu'):\n"
        "    x = torch.zeros(1024)\n"
        "print(time.perf_counter() - t)\n"
    )
    out = subprocess.run([PYTHON, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def huge_batch() -> float:
    from tutorial_utils import fit

    fit.activations.activations.cache_clear()
    start = time.perf_counter()
    fit.will_it_fit("gpt2", batch=100_000, seq=1024, precision="bf16-master")
    return time.perf_counter() - start


def ours_on_a_sleep() -> float:
    from tutorial_utils.timing import time_it

    return time_it(lambda: time.sleep(0.01), device="cpu", warmup=1, repeat=5, number=1).median


def torch_on_a_sleep() -> float:
    from torch.utils import benchmark

    return benchmark.Timer(stmt="sleep(0.01)", globals={"sleep": time.sleep}).timeit(5).median


def gauge_samples() -> tuple[int, int, float]:
    """(ticks, missed ticks, seconds) of a psutil gauge at 50 ms over about 1 s (a tick reads
    every row of the source at one time: process and system memory)."""
    from tutorial_utils.gauges import LiveGauge

    gauge = LiveGauge(sources=["psutil"], period_s=0.05)
    start = time.monotonic()
    with gauge:
        time.sleep(1.0)
    ticks = len({s.t_s for s in gauge.samples})
    return ticks, gauge.missed_ticks, time.monotonic() - start


def nvml_gives_up() -> float:
    """Seconds until ``nvml.init(timeout_s=0.15)`` gives up on a driver that never answers."""
    from tutorial_utils import nvml

    release = threading.Event()

    class NVMLError(Exception):
        pass

    wedged = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: release.wait(30),
        nvmlShutdown=lambda: None,
    )
    saved = nvml.pynvml, nvml._initialized
    nvml.pynvml, nvml._initialized = wedged, 0
    start = time.perf_counter()
    try:
        nvml.init(timeout_s=0.15)
    except nvml.NvmlError:
        pass
    seconds = time.perf_counter() - start
    release.set()
    for t in [t for t in threading.enumerate() if t.name.startswith("nvml ")]:
        t.join(timeout=10)
    nvml.pynvml, nvml._initialized = saved
    return seconds


def doctor_gives_up() -> float:
    """Seconds until a doctor check that never returns becomes a row (it gives up at 0.2 s)."""
    from tutorial_utils import doctor

    release = threading.Event()
    start = time.perf_counter()
    doctor._in_background(lambda: release.wait(30), "GPUtil", 0.2)()
    seconds = time.perf_counter() - start
    release.set()
    return seconds


def gauge_stop_gives_up() -> float:
    """Seconds ``LiveGauge.stop()`` takes when a source's read never returns."""
    from tutorial_utils import gauges
    from tutorial_utils.monitor import Reading, Source

    release, hanging = threading.Event(), threading.Event()

    class Hangs(Source):
        name = "hangs"

        def read(self):
            if threading.current_thread().name == "LiveGauge":  # not start()'s first read
                hanging.set()
                release.wait(30)
            return [Reading("dev", used_bytes=1)]

    gauge = gauges.LiveGauge(sources=[Hangs()], period_s=0.02).start()
    hanging.wait(10)
    start = time.perf_counter()
    gauge.stop()
    seconds = time.perf_counter() - start
    release.set()
    return seconds


def row(name: str, seconds: list[float], was: str) -> None:
    med = statistics.median(seconds)
    print(f"{name:<44} {med:8.3f} s  ({min(seconds):.3f}-{max(seconds):.3f})   {was}")


def repeat(runs: int, measure: Callable[[], float]) -> list[float]:
    return [measure() for _ in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each (at least 5)")
    groups = ("cli", "count", "fit", "timers", "gauge", "hung")
    parser.add_argument("--only", choices=groups, action="append", help="one group (repeatable)")
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be 5 or more: a median of fewer says little on a busy machine")
    chosen = set(args.only or groups)
    n = args.runs
    print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"medians of {n} runs (min-max); on the right, what a test once asserted\n")
    if "cli" in chosen:
        row("python -c pass (a fresh interpreter)", repeat(n, lambda: child_seconds("pass")), "")
        row("python -c 'import torch'", repeat(n, lambda: child_seconds("import torch")), "")
        row("fit --help", repeat(n, lambda: fit_cli("--help")), "was < 0.5 s (inside the child)")
        row(
            "fit llama-9b (an argument error)",
            repeat(n, lambda: fit_cli("llama-9b")),
            "was < 2.0 s",
        )
    if "count" in chosen:
        row("first memory.measure in a fresh Python", repeat(n, first_count), "was < 2.0 s")
    if "fit" in chosen:
        row("will_it_fit(gpt2, batch=100_000), no cache", repeat(n, huge_batch), "was < 20 s")
    if "timers" in chosen:
        ours, theirs = repeat(n, ours_on_a_sleep), repeat(n, torch_on_a_sleep)
        row("time_it on a 10 ms sleep (median of 5)", ours, "was 0.01-0.05 s")
        row("torch.utils.benchmark on it (median of 5)", theirs, "was 0.01-0.05 s")
        ratio = max(statistics.median(ours), statistics.median(theirs)) / min(
            statistics.median(ours), statistics.median(theirs)
        )
        print(f"{'  the two medians apart':<44} {ratio:8.3f} x                        was < 1.5x")
    if "gauge" in chosen:
        runs = [gauge_samples() for _ in range(n)]
        rates = [ticks / seconds for ticks, _, seconds in runs]
        missed = [m for _, m, _ in runs]
        print(
            f"{'LiveGauge at 50 ms: ticks per second':<44} {statistics.median(rates):8.1f}"
            f"    ({min(rates):.1f}-{max(rates):.1f}; 20 is every one; missed: median "
            f"{statistics.median(missed):.0f})   was 10-20 (+2)"
        )
    if "hung" in chosen:
        from tutorial_utils import gauges

        row("nvml.init(timeout_s=0.15), a wedged driver", repeat(n, nvml_gives_up), "was < 0.55 s")
        row("a doctor check that never returns (0.2 s)", repeat(n, doctor_gives_up), "was < 5 s")
        row(
            f"LiveGauge.stop(), a hung source ({gauges._JOIN_TIMEOUT_S:g} s wait)",
            repeat(n, gauge_stop_gives_up),
            "was < 2 s (with the wait at 0.3 s)",
        )
    print(f"\nload average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
