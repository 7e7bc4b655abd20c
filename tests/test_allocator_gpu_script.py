"""notebooks/scripts/allocator_gpu.py, notebook 04's GPU-only demos: on a machine without CUDA
each says so in one sentence instead of failing deep inside PyTorch (on a GPU, strict nbval of
notebook 04 runs them and checks what they return)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import load_file

SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")


def _module():
    return load_file(SCRIPTS / "allocator_gpu.py")


@no_cuda
@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.oom_under_fraction(lambda: None, 2**20, "cuda"),
        lambda m: m.empty_cache_steps("cuda"),
        lambda m: m.snapshot_live_blocks(lambda: None, "unused.pickle"),
    ],
    ids=["oom_under_fraction", "empty_cache_steps", "snapshot_live_blocks"],
)
def test_each_demo_says_it_needs_a_gpu(call):
    with pytest.raises(RuntimeError, match="needs the CUDA caching allocator"):
        call(_module())


@no_cuda
@pytest.mark.slow
def test_growing_batch_reports_a_failed_child_in_one_line():
    with pytest.raises(RuntimeError, match=r"the child Python failed .*needs a CUDA GPU"):
        _module().growing_batch(None, timeout_s=120)
