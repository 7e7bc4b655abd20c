"""How long the "will it fit" calculator takes to answer a change, per preset: medians.

    python benchmarks/calculator_updates.py            # 5 runs of each (a few minutes on 2 cores)
    python benchmarks/calculator_updates.py --runs 9

Issue 21 asks for at most 2 s per change for presets up to 8B on a 2-core machine. For each
preset, three kinds of change, each timed by ``Calculator.updates`` (the whole redraw: the
answer, the advice when it does not fit, the summary, the bar rendered to a PNG):

- a new shape: the activations by formula (``fit.activation_formulas``; the widget's default,
  selective checkpointing, has one), or where none is written the block and the head on fake
  tensors; both caches are cleared before each run, so every run pays it;
- another new batch;
- a shape seen before, answered from the cache.

Then, on llama-8b (ZeRO-3 over 8 GPUs, the widget's profile), a change of each knob added for
litgpt's and Lightning's recipes, from that answer: first with both caches cleared (what a
learner's first turn of it costs; bitsandbytes' NF4 and LoRA dropout have no formula, so their
fake-tensor pass runs), then the same change again (answered from the cache).

Each is repeated ``--runs`` times and the median printed, with the minimum and maximum beside
it, then the machine's load average, since a busy machine is slower. The unit tests check what
keeps an update quick (one answer per change, fake passes only for a new shape, one block each:
``tests/test_calculator.py``), not these seconds (issue 37).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import matplotlib

matplotlib.use("Agg")

from tutorial_utils import fit  # noqa: E402
from tutorial_utils.calculator import Calculator  # noqa: E402
from tutorial_utils.decoder import PRESETS  # noqa: E402

BASE = dict(preset="llama-8b", seq=2048, batch=1, sharding="zero3", n_gpus=8)
#: The widget's controls added for litgpt's and Lightning's recipes, each as a change from BASE.
KNOB_CHANGES = {
    "block litgpt": dict(block="litgpt"),
    "logits_kept": dict(logits_kept=True),
    "QLoRA, bnb NF4": dict(lora_rank=8, lora_base="bnb-nf4"),
    "  no double quant": dict(lora_rank=8, lora_base="bnb-nf4", nf4_double_quant=False),
    "LoRA dropout 0.05": dict(lora_rank=8, lora_dropout=0.05),
    "paged-adamw": dict(optimizer="paged-adamw"),
    "fsdp1 no_sync": dict(sharding="fsdp1", grad_accumulation=4, gradient_sync="last"),
    "pp 4, 2 micro": dict(pp=4, pp_microbatches=2),
}


def clear_caches() -> None:
    fit.activations.activations.cache_clear()  # every run answers from scratch
    fit.activation_formulas.activations.cache_clear()


def summary(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):6.2f}s ({min(seconds):.2f}-{max(seconds):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each change (at least 5)")
    parser.add_argument(
        "--checkpointing",
        default="every-second-matmul",
        help="the widget's default, every-second-matmul (selective); each mode has a formula",
    )
    parser.add_argument("--presets", nargs="*", default=list(PRESETS), metavar="NAME")
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be 5 or more: a median of fewer says little on a busy machine")
    start = time.perf_counter()
    calc = Calculator(
        preset="gpt2-124m", seq=512, sharding="none", n_gpus=1, checkpointing=args.checkpointing
    )
    print(f"first Calculator(): {time.perf_counter() - start:.2f} s (imports, first fake run)")
    print(f"medians of {args.runs} runs (min-max), checkpointing {args.checkpointing}")
    print(f"{'preset':>10}  {'new shape':>19}  {'new batch':>19}  {'cached':>19}")
    for name in args.presets:
        seq = 1024 if name.startswith("gpt2") else 2048
        times: dict[str, list[float]] = {"new": [], "again": [], "cached": []}
        for _ in range(args.runs):
            clear_caches()
            calc.set(preset=name, seq=seq, batch=3, sharding="zero3", n_gpus=8)
            times["new"].append(calc.updates[-1])
            calc.set(batch=5)
            times["again"].append(calc.updates[-1])
            calc.set(batch=3)
            times["cached"].append(calc.updates[-1])
        print(f"{name:>10}  " + "  ".join(summary(times[k]) for k in ("new", "again", "cached")))
    print(f"\na knob turned on llama-8b, zero3 over 8 GPUs: medians of {args.runs} runs (min-max)")
    print(f"{'knob':>18}  {'caches cleared':>19}  {'cached':>19}")
    defaults = {name: calc.values()[name] for name in {k for c in KNOB_CHANGES.values() for k in c}}
    for name, change in KNOB_CHANGES.items():
        cold, warm = [], []
        for _ in range(args.runs):
            calc.set(**{**defaults, **BASE})
            clear_caches()
            calc.set(**change)
            cold.append(calc.updates[-1])
            calc.set(**defaults)
            calc.set(**change)
            warm.append(calc.updates[-1])
            assert calc.report is not None, f"{name}: {calc.error}"
        print(f"{name:>18}  {summary(cold)}  {summary(warm)}")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
