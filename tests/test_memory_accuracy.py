"""A small slice of benchmarks/memory_accuracy.py, so CI notices when the numbers drift.

Three figures of one training step's peak memory must agree: the PyTorch profiler's allocation
events (independent), ``memory.breakdown`` (real step) and ``memory.estimate`` (fake tensors).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tutorial_utils import memory


def _load_benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_accuracy.py"
    spec = importlib.util.spec_from_file_location("memory_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()


def test_breakdown_matches_the_profiler_on_the_facts_example():
    # facts.md: the profiler gave 160.09 MiB (with the parameters) for this step
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))

    x = torch.randn(256, 1024)
    profiled = bench.profiler_peak(make(), x, torch.optim.Adam)
    assert round((profiled - x.nbytes) / 2**20, 2) == 160.09
    measured = memory.breakdown(make(), x, optimizer=torch.optim.Adam).peak
    # Python numbers passed to ops become 8-byte tensors before dispatch: the profiler sees
    # a few of those at the peak, our accountant does not. Everything else matches to the byte.
    assert 0 <= profiled - measured <= 64


CASES = [
    ("MLP", 1, "AdamW"),
    ("MLP", 64, "SGD"),
    ("ConvNet(BN)", 1, "none"),  # PyTorch's own convolution: an im2col buffer inside the op
    ("ConvNet(BN)", 16, "Adam"),  # oneDNN convolution
    ("TinyTransformer", 8, "AdamW"),
    ("EmbeddingBag", 4, "Adam"),
    ("TiedLM", 8, "SGD"),  # an expanded gradient copied inside the matrix multiply
]


@pytest.mark.parametrize(("name", "batch", "opt"), CASES)
def test_three_figures_agree(name, batch, opt):
    row = bench.compare(name, batch, opt)
    assert abs(row.bd_err) <= 0.01, f"breakdown {row.breakdown} vs profiler {row.profiler}"
    assert abs(row.est_err) <= 0.03, f"estimate {row.estimate} vs breakdown {row.breakdown}"


@pytest.mark.xfail(
    strict=True,
    reason="oneDNN's LSTM keeps a workspace that its meta kernel reports as empty (estimate misses it) "
    "and scratch buffers that never leave the operator (breakdown misses them); see the module docstring",
)
def test_lstm_is_the_known_gap():
    row = bench.compare("LSTM", 8, "SGD")
    assert abs(row.bd_err) <= 0.01 and abs(row.est_err) <= 0.03
