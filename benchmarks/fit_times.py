"""The calculator's speed: ``--help``, typical calls, the advice search, medians of 5.

    python benchmarks/fit_times.py            # 5 runs of each (about a minute on 2 cores)
    python benchmarks/fit_times.py --runs 9
    python benchmarks/fit_times.py --coverage  # the questions with no formula, by what they ask

Issue 39's targets, on a quiet 2-core machine: ``--help`` under 0.5 s, a typical call at most
1 s of CPU, the advice search at most 3 s. Each figure is CPU seconds (what the machine's load
does not inflate) beside wall seconds, with the load average printed first; nothing here fails
(no test asserts a time; ``tests/test_fit_cli.py`` checks what makes a call quick: no torch).

- fresh Python: ``python -m tutorial_utils fit ARGS`` as a person types it, the child's CPU
  seconds from ``resource.RUSAGE_CHILDREN``, and whether it imported torch (the activations
  come from ``fit.activation_formulas``; a case with no formula, such as cross-entropy in
  pieces of unequal length, runs the fake-tensor pass and imports torch: the last row shows
  that cost);
- the advice: issue 39's example (``llama-3.2-1b``, batch 8 x 4096, RTX 4090), which does not
  fit, so the answer includes the search, in a fresh Python and in a warm one from an empty
  cache;
- typical call, warm: ``will_it_fit`` on a shape not asked before, in a Python that has
  answered once (what the widget asks).
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import statistics
import subprocess
import sys
import time

PYTHON = sys.executable
#: Run the CLI as ``-m`` does, then say on stderr's last line whether torch was imported.
_CHILD = (
    "import sys\nfrom tutorial_utils.__main__ import main\n"
    "try:\n    code = main(['fit', *sys.argv[1:]])\nexcept SystemExit as e:\n    code = e.code\n"
    "print('torch' in sys.modules, file=sys.stderr)\nsys.exit(code)"
)


def child(*args: str) -> tuple[float, float, bool]:
    """(CPU, wall, imported torch) of a fresh ``python -m tutorial_utils fit ...``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([PYTHON, "-c", _CHILD, *args], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"fit {' '.join(args)} exited with {done.returncode}: {done.stderr}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, wall, done.stderr.splitlines()[-1] == "True"


def in_process(call) -> tuple[float, float, bool]:
    cpu, start = time.process_time(), time.perf_counter()
    call()
    return time.process_time() - cpu, time.perf_counter() - start, "torch" in sys.modules


ADVICE = ("llama-3.2-1b", "--batch", "8", "--seq", "4096", "--gpu", "RTX 4090")
WIDGET = ("llama-3.1-8b", "--precision", "mixed", "--checkpointing", "selective")
WIDGET += ("--sharding", "zero3", "--gpus", "8", "--gpu", "H100")
FRESH = {
    "--help": ("--help",),
    "llama-3.1-8b --gpu H100 (README)": ("llama-3.1-8b", "--gpu", "H100"),
    "mistral-7b": ("mistral-7b",),
    "llama-3.1-8b --lora 16": ("llama-3.1-8b", "--lora", "16"),
    "llama-3.1-70b --tp 8 --gpus 64": ("llama-3.1-70b", "--tp", "8", "--gpus", "64"),
    "advice: llama-3.2-1b b8 x 4096, RTX 4090": ADVICE,
    "widget's default: mixed, selective, zero3 x 8": WIDGET,
    "llama-3.1-8b --lora 16 --qlora": ("llama-3.1-8b", "--lora", "16", "--qlora"),
    "gpt2 --ce-chunks 8": ("gpt2", "--ce-chunks", "8"),
    "llama-3.2-1b --precision fp32": ("llama-3.2-1b", "--precision", "fp32"),
    "no formula: gpt2 --seq 1020 --ce-chunks 8": ("gpt2", "--seq", "1020", "--ce-chunks", "8"),
}


def coverage() -> tuple[int, int, dict[str, int]]:
    """(questions, of which with no formula, those by what they ask): every preset and the four
    ``--dims`` blocks (norm x MLP, tied and untied), every precision, checkpointing, no LoRA or
    each target set over a bf16 or NF4 base (``--qlora``), cross-entropy whole or in 8 pieces,
    at the CLI's default batch and sequence; what the CLI and the widget can ask that changes the
    activations (torch-free: ``activation_formulas.by_formula``)."""
    import dataclasses

    from tutorial_utils.fit import activation_formulas as af
    from tutorial_utils.fit import inputs, presets, shapes
    from tutorial_utils.fit.states import Lora

    configs = [shapes.config(name)[1] for name in presets.PRESETS]
    llama = shapes.config("llama-8b")[1]
    for norm, mlp, tied in itertools.product(("rms", "layer"), ("swiglu", "gelu"), (True, False)):
        fields = dict(norm=norm, mlp=mlp, bias=norm == "layer", tied=tied, max_positions=0)
        configs.append(dataclasses.replace(llama, **fields))
    loras = [None, *(Lora(16, t, b) for t in inputs.LORA_TARGETS for b in ("bf16", "nf4"))]
    asked = missing = 0
    by: dict[str, int] = {}
    for cfg, recipe, ckpt, lora, chunks in itertools.product(
        configs, inputs.RECIPES, inputs.CHECKPOINTING, loras, (1, 8)
    ):
        seq = min(2048, cfg.max_positions or 2048)
        asked += 1
        if af.by_formula(cfg, 1, seq, recipe, ckpt, lora, chunks) is None:
            missing += 1
            what = [f"{cfg.norm}-{cfg.mlp}" + ("" if cfg.tied else " untied"), recipe, ckpt]
            what += [af.lora_word(lora)] + (["ce-chunks 8"] if chunks > 1 else [])
            key = ", ".join(w for w in what if w != "none")
            by[key] = by.get(key, 0) + 1
    return asked, missing, by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="only count the questions with no formula (they import torch), and list them",
    )
    args = parser.parse_args()
    asked, missing, by = coverage()
    print(f"{missing} of {asked} questions the CLI and the widget can ask have no formula")
    if args.coverage:
        for what, n in sorted(by.items(), key=lambda item: -item[1]):
            print(f"{n:6d}  {what}")
        return
    runs = args.runs
    rows = {f"fit {what} (fresh)": [child(*a) for _ in range(runs)] for what, a in FRESH.items()}

    from tutorial_utils import fit

    fit.will_it_fit("gpt2", seq=64)  # one answer first: the typical call is not the first

    def empty_caches():
        fit.activation_formulas.activations.cache_clear()
        fit.activations.activations.cache_clear()

    def typical(i: int):
        empty_caches()
        return fit.will_it_fit("llama-3.1-8b", batch=1 + i, seq=4096, gpu="H100")

    def advice():
        empty_caches()
        return fit.advise(fit.will_it_fit("llama-3.2-1b", batch=8, seq=4096, gpu="RTX 4090"))

    rows["typical call, a new shape (warm)"] = [
        in_process(lambda i=i: typical(i)) for i in range(runs)
    ]
    rows["advice, empty cache (warm)"] = [in_process(advice) for _ in range(runs)]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, {runs} runs each")
    print(f"{'what':<58}{'CPU s':>8}{'wall s':>8}  torch")
    for what, times in rows.items():
        cpu = statistics.median(t[0] for t in times)
        wall = statistics.median(t[1] for t in times)
        torch = "yes" if any(t[2] for t in times) else "no"
        print(f"{what:<58}{cpu:>8.2f}{wall:>8.2f}  {torch}")
    print("(medians; CPU s is user + system time of the child, or of this process when warm)")


if __name__ == "__main__":
    main()
