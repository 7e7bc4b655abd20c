"""How long the "will it fit" calculator takes to answer a change, per preset.

    python benchmarks/calculator_updates.py

Issue 21 asks for at most 2 s per change for presets up to 8B on a 2-core machine. For each
preset: a new shape (the block runs on fake tensors), another new batch, and a shape seen
before (from the cache), each timed by ``Calculator.updates``: the whole redraw (the answer,
the summary, the bar rendered to a PNG). Prints one row per preset and the machine's load
average, since a busy machine is slower.
"""

from __future__ import annotations

import os
import time

import matplotlib

matplotlib.use("Agg")

from tutorial_utils.calculator import Calculator  # noqa: E402
from tutorial_utils.decoder import PRESETS  # noqa: E402


def main() -> None:
    start = time.perf_counter()
    calc = Calculator(preset="gpt2-124m", seq=512, sharding="none", n_gpus=1)
    print(f"first Calculator(): {time.perf_counter() - start:.2f} s (imports, first fake run)")
    print(f"{'preset':>10}  {'new shape':>9}  {'new batch':>9}  {'cached':>6}")
    for name in PRESETS:
        seq = 1024 if name.startswith("gpt2") else 2048
        calc.set(preset=name, seq=seq, batch=3, sharding="zero3", n_gpus=8)
        new = calc.updates[-1]
        calc.set(batch=5)
        again = calc.updates[-1]
        calc.set(batch=3)
        cached = calc.updates[-1]
        print(f"{name:>10}  {new:8.2f}s  {again:8.2f}s  {cached:5.2f}s")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
