"""What PyTorch's CUDA memory calls do on a machine without CUDA.

The course relies on it: code that must run everywhere asks ``devices.capabilities()`` first,
because ``memory_stats()`` quietly returns an empty dict there and the others raise (which
error depends on the build). Notebook 04 showed this table until issue 20's editorial pass; the
claim is a fact the course stands on, not a lesson, so it is pinned here.
"""

from __future__ import annotations

import pytest
import torch

CALLS = {
    "dict(torch.cuda.memory_stats())": lambda: dict(torch.cuda.memory_stats()),
    "torch.cuda.memory_summary()": torch.cuda.memory_summary,
    "torch.cuda.mem_get_info()": torch.cuda.mem_get_info,
    "torch.cuda.set_per_process_memory_fraction(0.5)": (
        lambda: torch.cuda.set_per_process_memory_fraction(0.5)
    ),
    "torch.cuda.memory._record_memory_history()": torch.cuda.memory._record_memory_history,
}

CPU_ONLY_BUILD = {
    "dict(torch.cuda.memory_stats())": "returns {}",
    "torch.cuda.memory_summary()": "raises KeyError",  # it reads keys the empty dict lacks
    "torch.cuda.mem_get_info()": "raises AssertionError",  # "not compiled with CUDA"
    "torch.cuda.set_per_process_memory_fraction(0.5)": "raises AssertionError",
    "torch.cuda.memory._record_memory_history()": "raises AttributeError",
}
CUDA_BUILD_WITHOUT_DRIVER = {
    "dict(torch.cuda.memory_stats())": "returns {}",
    "torch.cuda.memory_summary()": "raises KeyError",
    "torch.cuda.mem_get_info()": "raises RuntimeError",  # "Found no NVIDIA driver"
    "torch.cuda.set_per_process_memory_fraction(0.5)": "raises RuntimeError",
    "torch.cuda.memory._record_memory_history()": "raises RuntimeError",
}


def what_happens(call) -> str:
    """Run one call and say what it did: returned a value, or raised which error."""
    try:
        return f"returns {call()!r}"
    except Exception as err:  # without CUDA several of these raise
        return f"raises {type(err).__name__}"


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="needs a machine without CUDA: on a GPU these calls change the allocator's settings",
)
@pytest.mark.skipif(torch.version.hip is not None, reason="a ROCm build: not pinned here")
def test_cuda_memory_calls_without_cuda_return_an_empty_dict_or_raise():
    outcomes = {name: what_happens(call) for name, call in CALLS.items()}
    expected = CPU_ONLY_BUILD if torch.version.cuda is None else CUDA_BUILD_WITHOUT_DRIVER
    assert outcomes == expected


def test_what_happens_names_the_error_or_the_value():
    assert what_happens(lambda: {}) == "returns {}"
    assert what_happens(lambda: {}["missing"]) == "raises KeyError"
