"""Notebook 00 on a GPU: allocated, reserved and the driver's "used", step by step.

With a 1 MiB tensor kept alive throughout, allocates 256 MiB on cuda:0, frees it, empties the
cache, and reads PyTorch's allocated and reserved bytes and NVML's "used" (what nvidia-smi
shows) after each step; checks what each one does. Exits 1 with one line when there is no
GPU (the notebook runs it only on one).

    python scripts/allocator_vs_nvml.py
"""

from __future__ import annotations

import sys

import torch

from tutorial_utils import nvml
from tutorial_utils.units import format_bytes

MiB = 2**20


def readings() -> tuple[int, int, int | None]:
    """(allocated, reserved, NVML used) of cuda:0; used is None without NVML."""
    status = nvml.probe()
    used = next((d.used_bytes for d in status.devices if d.cuda_index == 0), None)
    return torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0), used


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU: this script shows PyTorch's counters on cuda:0", file=sys.stderr)
        return 1
    kept = torch.ones(MiB, dtype=torch.uint8, device="cuda:0")  # alive throughout
    steps = {"before": readings()}
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda:0")
    steps["after allocating 256 MiB"] = readings()
    del x
    steps["after del"] = readings()
    torch.cuda.empty_cache()
    steps["after empty_cache()"] = readings()
    print(f"{'':26} {'allocated':>12} {'reserved':>12} {'NVML used':>12}")
    for name, (a, r, u) in steps.items():
        print(f"{name:26} {format_bytes(a):>12} {format_bytes(r):>12} {format_bytes(u):>12}")
    (a0, _, _), (a1, r1, u1), (a2, r2, _), (a3, r3, _) = steps.values()
    assert a1 - a0 == 256 * MiB, "allocated grows by exactly the tensor's bytes"
    assert a2 == a0, "del gives the bytes back to the allocator..."
    assert r2 == r1, "...but the allocator keeps them reserved"
    assert r3 <= r2 - 256 * MiB, "empty_cache() returns the unused cached block to the driver"
    assert a3 == a0 and int(kept.sum()) == MiB, "empty_cache() frees no live tensor"
    assert u1 is None or u1 >= r1, "the device's used memory includes every reserved byte"
    print("Checked: allocated, reserved and NVML's used behave as section 3's table says.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
