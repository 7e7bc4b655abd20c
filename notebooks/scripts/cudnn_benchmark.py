"""Notebook 05's cuDNN measurement: a convolution with ``cudnn.benchmark`` off and on, for one
fixed input shape and for a shape that changes every call. Needs a CUDA GPU with cuDNN; without
one it raises one sentence. ``python scripts/cudnn_benchmark.py`` prints the medians."""

from __future__ import annotations

import dataclasses
import sys

import torch
from torch import nn

from tutorial_utils import timing


def benchmark_modes(rounds: int = 5) -> dict[str, timing.Timing]:
    """Median time per convolution, keyed "fixed|varying, benchmark=False|True".

    The four are interleaved: each of ``rounds`` rounds times all of them, so a busy moment of
    the GPU hits them alike. The fixed shape is warmed up first in both modes (with benchmark
    on, its one search is paid there); every varying call has a shape cuDNN has not seen, so
    benchmark mode searches on each. Restores the default (benchmark off) afterwards.
    """
    if not (torch.cuda.is_available() and torch.backends.cudnn.is_available()):
        raise RuntimeError(
            "this measurement needs a CUDA GPU with cuDNN: run notebook 05 on a GPU runtime"
        )
    conv = nn.Conv2d(64, 64, 3, padding=1).to("cuda")
    fixed = torch.randn(32, 64, 56, 56, device="cuda")
    sizes = iter(range(40, 4000))  # a new spatial size for every call

    def varying():
        s = next(sizes)
        return conv(torch.randn(8, 64, s % 60 + 20, s % 53 + 20, device="cuda"))

    runs: dict[str, list[timing.Timing]] = {}
    try:
        for flag in (False, True):  # warm-up of the fixed shape in both modes
            torch.backends.cudnn.benchmark = flag
            timing.time_it(lambda: conv(fixed), device="cuda", warmup=3, repeat=1)
        for _ in range(rounds):
            for flag in (False, True):
                torch.backends.cudnn.benchmark = flag
                for kind, fn, calls in (
                    ("fixed", lambda: conv(fixed), 10),
                    ("varying", varying, 1),
                ):
                    t = timing.time_it(fn, device="cuda", warmup=0, number=calls, repeat=4)
                    runs.setdefault(f"{kind}, benchmark={flag}", []).append(t)
    finally:
        torch.backends.cudnn.benchmark = False
    return {
        name: dataclasses.replace(ts[0], samples=tuple(s for t in ts for s in t.samples))
        for name, ts in runs.items()
    }


def main() -> int:
    try:
        results = benchmark_modes()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    for name, t in results.items():
        print(f"{name:28} median {timing.format_seconds(t.median)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
