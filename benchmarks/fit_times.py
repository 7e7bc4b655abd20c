"""The calculator's speed: ``--help``, a typical call and the advice search, medians of 5.

    python benchmarks/fit_times.py            # 5 runs of each (about a minute on 2 cores)
    python benchmarks/fit_times.py --runs 9

Issue 39's targets, on a quiet 2-core machine: ``--help`` under 0.5 s, a typical call at most
1 s of CPU, the advice search at most 3 s. Each figure is CPU seconds (what the machine's load
does not inflate) beside wall seconds; nothing here fails (no test asserts a time).

- ``--help``: ``python -m tutorial_utils fit --help`` in a fresh Python (no torch: the tests
  check that), the child's CPU seconds from ``resource.RUSAGE_CHILDREN``;
- first call: ``python -m tutorial_utils fit llama-3.1-8b --gpu H100`` in a fresh Python:
  importing torch, the first fake-tensor pass, the answer;
- typical call: ``will_it_fit`` on a shape not asked before (``fit.activations`` cleared) in a
  Python that has answered once: the question a widget or a second call asks;
- advice: ``advise`` for issue 39's example (``llama-3.2-1b``, batch 8 x 4096, RTX 4090),
  every knob it tries from an empty cache.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

PYTHON = sys.executable


def child(*args: str) -> tuple[float, float]:
    """(CPU, wall) seconds of a fresh ``python -m tutorial_utils fit ...``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([PYTHON, "-m", "tutorial_utils", "fit", *args], capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"fit {' '.join(args)} exited with {done.returncode}: {done.stderr}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, wall


def in_process(call) -> tuple[float, float]:
    cpu, start = time.process_time(), time.perf_counter()
    call()
    return time.process_time() - cpu, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    from tutorial_utils import fit

    fit.will_it_fit("gpt2", seq=64)  # one answer first: the typical call is not the first

    def typical(i: int):
        fit.activations.activations.cache_clear()
        return fit.will_it_fit("llama-3.1-8b", batch=1 + i, seq=4096, gpu="H100")

    def advice():
        fit.activations.activations.cache_clear()
        return fit.advise(fit.will_it_fit("llama-3.2-1b", batch=8, seq=4096, gpu="RTX 4090"))

    rows = {
        "--help (fresh Python)": [child("--help") for _ in range(runs)],
        "first call, llama-3.1-8b --gpu H100 (fresh Python)": [
            child("llama-3.1-8b", "--gpu", "H100") for _ in range(runs)
        ],
        "typical call, a new shape (warm Python)": [
            in_process(lambda i=i: typical(i)) for i in range(runs)
        ],
        "advice, llama-3.2-1b b8 x 4096 on an RTX 4090": [in_process(advice) for _ in range(runs)],
    }
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, {runs} runs each")
    print(f"{'what':<52}{'CPU s (median)':>16}{'wall s (median)':>17}")
    for what, times in rows.items():
        cpu = statistics.median(t[0] for t in times)
        wall = statistics.median(t[1] for t in times)
        print(f"{what:<52}{cpu:>16.2f}{wall:>17.2f}")


if __name__ == "__main__":
    main()
