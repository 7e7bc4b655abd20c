"""The GPU-only allocator demos of notebook 04: each runs PyTorch's own calls and returns what
it measured; the notebook shows each function it runs (``listing.show``) before it runs it, then
prints what it returned and checks it (``growing_batch`` is left to the learner to run).

They need the CUDA caching allocator; without CUDA each raises a one-sentence RuntimeError (the
notebook calls them only when a GPU is there, and says on a CPU what it skipped).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["growing_batch", "oom_under_fraction", "snapshot_live_blocks"]

MiB = 2**20


def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs the CUDA caching allocator, and this machine has no CUDA GPU: "
            "run it on one (notebook 00 says how to get one on Colab)"
        )


def oom_under_fraction(step: Callable[[], object], limit: int, device) -> tuple[str, int]:
    """``step()`` capped at ``limit`` bytes: its OOM message ("" if it fitted), the OOMs counted."""
    _need_cuda("oom_under_fraction")
    total = torch.cuda.mem_get_info(device)[1]  # the total the fraction is taken of
    ooms_before = torch.cuda.memory_stats(device)["num_ooms"]
    torch.cuda.empty_cache()  # cached blocks count against the cap
    torch.cuda.set_per_process_memory_fraction(limit / total, device)  # what memory.budget does
    message = ""
    try:
        step()
    except torch.OutOfMemoryError as oom:
        message = str(oom)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    return message, torch.cuda.memory_stats(device)["num_ooms"] - ooms_before


def snapshot_live_blocks(work: Callable[[], object], path: str | os.PathLike) -> list[dict]:
    """Snapshot while ``work()``'s result is alive: live blocks, largest first, with frames."""
    _need_cuda("snapshot_live_blocks")
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    try:
        result = work()  # kept alive until the snapshot is written
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)  # stop recording
    del result
    with open(path, "rb") as f:
        segments = pickle.load(f)["segments"]
    live = [b for seg in segments for b in seg["blocks"] if b["state"] == "active_allocated"]
    return sorted(live, key=lambda block: block["size"], reverse=True)


# PYTORCH_ALLOC_CONF from 2.11; on 2.9.x CUDA ignores it for expandable_segments (alloc_conf.py)
_VERSION = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
ALLOC_CONF = "PYTORCH_ALLOC_CONF" if _VERSION >= (2, 11) else "PYTORCH_CUDA_ALLOC_CONF"


def growing_batch(setting: str | None, timeout_s: float = 300) -> dict:
    """Run ``growing_batch.py`` (a batch that grows by one every step) in a fresh Python with
    the allocator setting ``setting`` (None: the default); its peak reserved and allocated
    bytes."""
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    if setting:
        env[ALLOC_CONF] = setting
    script = Path(__file__).with_name("growing_batch.py")
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if out.returncode != 0:  # say why in one line, not with a traceback from the child
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the child Python failed with {setting or 'the default'}: {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])
