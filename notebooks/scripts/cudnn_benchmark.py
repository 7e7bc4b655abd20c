"""Notebook 05's cuDNN measurement: a convolution with ``cudnn.benchmark`` off and on, for one
fixed input shape and for a shape that changes every call. Needs a CUDA GPU with cuDNN; without
one it raises one sentence. ``python scripts/cudnn_benchmark.py`` prints the medians."""

from __future__ import annotations

import sys

import torch
from torch import nn

from tutorial_utils import timing


def benchmark_modes() -> dict[str, timing.Timing]:
    """Median time per convolution, keyed "fixed|varying, benchmark=False|True"; restores the
    default (benchmark off) afterwards."""
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

    results = {}
    try:
        for flag in (False, True):
            torch.backends.cudnn.benchmark = flag
            results[f"fixed, benchmark={flag}"] = timing.time_it(
                lambda: conv(fixed), device="cuda", repeat=10
            )
            results[f"varying, benchmark={flag}"] = timing.time_it(
                varying, device="cuda", warmup=0, number=1, repeat=20
            )
    finally:
        torch.backends.cudnn.benchmark = False
    return results


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
