"""What PyTorch's memory calls do on a machine without a GPU: a fact notebook 00 relies on.

Notebook 00 proved this with a table of eight calls; the editorial pass of issue 20 (§5, "the
table of CPU failure modes") moved the table here and kept one call in the notebook
(``torch.cuda.memory_allocated()`` reads 0 whatever you allocate). If a torch release changes
an outcome, this fails and 00's section 3 prose ("the counters read 0, the others raise") gets
rewritten.
"""

from __future__ import annotations

import pytest
import torch

CALLS = {
    "torch.cuda.memory_allocated()": torch.cuda.memory_allocated,
    "torch.cuda.max_memory_allocated()": torch.cuda.max_memory_allocated,
    "torch.cuda.memory_reserved()": torch.cuda.memory_reserved,
    "len(torch.cuda.memory_stats())": lambda: len(torch.cuda.memory_stats()),
    "torch.cuda.reset_peak_memory_stats()": torch.cuda.reset_peak_memory_stats,
    "torch.cuda.mem_get_info()": torch.cuda.mem_get_info,
    "torch.accelerator.memory_allocated()": torch.accelerator.memory_allocated,
    "torch.accelerator.get_memory_info()": torch.accelerator.get_memory_info,
}
EXPECTED = {  # (on a CPU-only build, on a CUDA build without a driver: checked on 2.11, 2.15)
    "torch.cuda.memory_allocated()": ("returns 0", "returns 0"),  # 0, whatever you allocate
    "torch.cuda.max_memory_allocated()": ("returns 0", "returns 0"),
    "torch.cuda.memory_reserved()": ("returns 0", "returns 0"),
    "len(torch.cuda.memory_stats())": ("returns 0", "returns 0"),  # an empty dict
    "torch.cuda.reset_peak_memory_stats()": ("raises AttributeError", "raises RuntimeError"),
    "torch.cuda.mem_get_info()": ("raises AssertionError", "raises RuntimeError"),
    "torch.accelerator.memory_allocated()": ("raises RuntimeError", "returns 0"),
    "torch.accelerator.get_memory_info()": ("raises RuntimeError", "raises RuntimeError"),
}


def _what_happens(call) -> str:
    try:
        return f"returns {call()!r}"
    except Exception as err:
        return f"raises {type(err).__name__}"


def test_without_a_gpu_the_cuda_counters_read_zero_and_the_other_memory_calls_raise():
    cpu_only_build = torch.version.cuda is None and torch.version.hip is None
    no_driver = torch.version.cuda is not None and not torch.cuda.is_available()
    if not (cpu_only_build or no_driver) or torch.accelerator.is_available():
        pytest.skip("this build has an accelerator runtime: the calls answer for it")
    kept = torch.ones(1024, 1024)  # 4 MiB on the CPU: the counters do not see it
    outcomes = {name: _what_happens(call) for name, call in CALLS.items()}
    del kept
    column = 0 if cpu_only_build else 1
    assert outcomes == {name: pair[column] for name, pair in EXPECTED.items()}
