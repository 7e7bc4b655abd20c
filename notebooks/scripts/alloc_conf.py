"""Which environment variable this PyTorch reads for the allocator's settings (notebook 04 §4).

    python scripts/alloc_conf.py    # prints, as JSON, what this process's allocator read

PyTorch 2.9 renamed ``PYTORCH_CUDA_ALLOC_CONF`` to ``PYTORCH_ALLOC_CONF`` (the old name warns).
On 2.9.x the CUDA allocator ignores ``expandable_segments`` set through the new name
(pytorch/pytorch#183387, reported on 2.9.1+cu128); the reporter found 2.11.0 reads it. In
2.13's headers (``c10/core/AllocatorConfig.h``, ``c10/cuda/CUDAAllocatorConfig.h``) the
device-generic config reads ``PYTORCH_ALLOC_CONF`` first and the old name as a fallback, and CUDA
takes ``expandable_segments`` from it. The variable is read once, before the first CUDA
allocation: ``read_back`` starts a child Python with one name set and returns what it read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def read_here() -> dict:
    """This process's allocator settings: the string its config parsed (2.9 and later), and on
    CUDA, after one allocation, whether the caching allocator uses expandable segments."""
    parsed = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    out = {"torch": torch.__version__, "parsed": parsed() if parsed else None}
    out["expandable_segments"] = None  # no CUDA: no caching allocator to ask
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # the allocator reads its settings on first use
        settings = torch.cuda.memory._snapshot()["allocator_settings"]
        out["expandable_segments"] = settings["expandable_segments"]
    return out


def read_back(name: str, setting: str = "expandable_segments:True", timeout: float = 120) -> dict:
    """``read_here()`` in a child Python whose environment sets only ``name`` of the two, to
    ``setting`` (by default ``expandable_segments:True``)."""
    if name not in NAMES:
        raise ValueError(f"name must be one of {NAMES}, not {name!r}")
    env = {k: v for k, v in os.environ.items() if k not in NAMES} | {name: setting}
    done = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"the child with {name} set failed: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def expected_on_cuda(version: str) -> dict[str, bool | None]:
    """Whether ``expandable_segments:True`` set through each name takes effect on CUDA in
    PyTorch ``version``, from the sources above; None where none of them says."""
    major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    if (major, minor) < (2, 9):  # the course's earlier text; the new name did not exist yet
        return {"PYTORCH_ALLOC_CONF": None, "PYTORCH_CUDA_ALLOC_CONF": True}
    if (major, minor) < (2, 11):  # 2.9.1: #183387; 2.10: not reported either way
        new = False if (major, minor) == (2, 9) else None
        return {"PYTORCH_ALLOC_CONF": new, "PYTORCH_CUDA_ALLOC_CONF": True}
    return dict.fromkeys(NAMES, True)  # 2.11: the reporter; 2.13: its headers


if __name__ == "__main__":
    print(json.dumps(read_here()))
