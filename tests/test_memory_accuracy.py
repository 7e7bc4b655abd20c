"""A small slice of benchmarks/memory_accuracy.py, so CI notices when the numbers drift.

Three figures of one training step's peak memory must agree: the PyTorch profiler's allocation
events (independent), ``memory.breakdown`` (real step) and ``memory.estimate`` (fake tensors).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import load_file
from torch import nn

from tutorial_utils import anatomy, memory, models


def _load_benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_accuracy.py"
    return load_file(path)


bench = _load_benchmark()


@pytest.mark.heavy
def test_breakdown_matches_the_profiler_on_the_facts_example():
    # facts.md: the profiler gave 160.09 MiB (with the parameters) for this step
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))

    x = torch.randn(256, 1024)
    # facts.md's step freed the output before backward (loss = model(x).sum()); the benchmark's
    # loop keeps out = model(x) alive: 1 MiB of output and the 4-byte loss more
    profiled = bench.profiler_peak(make(), x, torch.optim.Adam)
    assert round((profiled - x.nbytes - 2**20 - 4) / 2**20, 2) == 160.09
    step = memory.breakdown(make(), x, optimizer=torch.optim.Adam)
    assert step.peak_source == "CPU allocator"
    # breakdown reads the same allocator events; the two runs differ only by the few
    # 8-byte tensors that Python numbers become inside operators (timing-dependent order)
    assert abs(profiled - step.peak) <= 64


CASES = [
    ("MLP", 1, "AdamW"),
    ("MLP", 64, "SGD"),
    ("ConvNet(BN)", 1, "none"),  # PyTorch's own convolution: an im2col buffer inside the op
    ("ConvNet(BN)", 16, "Adam"),  # oneDNN convolution
    ("TinyTransformer", 8, "AdamW"),
    ("EmbeddingBag", 4, "Adam"),
    ("TiedLM", 8, "SGD"),  # an expanded gradient copied inside the matrix multiply
    ("TiedLM(out.float().sum())", 8, "SGD"),  # issue 25 §7: the output lives through backward
]


@pytest.mark.parametrize("precision", ["bf16", "bf16 autocast"])
@pytest.mark.parametrize(("name", "batch"), [("MLP", 32), ("TiedLM(out.float().sum())", 4)])
def test_bf16_figures_agree_or_the_estimate_says_why_not(name, batch, precision):
    # On a CPU with native bf16 (and without ONEDNN_MAX_CPU_ISA=AVX2) oneDNN's bf16 matmul
    # scratch makes the estimate low, and it says so; elsewhere it is within 3%.
    row = bench.compare(name, batch, "SGD", precision=precision)
    assert abs(row.bd_err) <= 0.01, f"breakdown {row.breakdown} vs profiler {row.profiler}"
    if {"mm", "addmm"} & set(row.unseen):  # flagged only where this CPU takes that path
        assert torch.bfloat16 in anatomy.onednn_matmul_dtypes()
    if not row.unseen:
        assert abs(row.est_err) <= 0.03, f"estimate {row.estimate} vs breakdown {row.breakdown}"


@pytest.mark.parametrize(("name", "batch", "opt"), CASES)
def test_three_figures_agree(name, batch, opt):
    row = bench.compare(name, batch, opt)
    assert abs(row.bd_err) <= 0.01, f"breakdown {row.breakdown} vs profiler {row.profiler}"
    assert abs(row.est_err) <= 0.03, f"estimate {row.estimate} vs breakdown {row.breakdown}"


def test_lstm_breakdown_is_exact_and_its_estimate_says_it_is_low():
    # oneDNN's LSTM keeps a workspace its meta kernel reports as empty, and scratch that never
    # leaves the operator: the allocator sees both, fake tensors neither, and the estimate says so
    row = bench.compare("LSTM", 32, "SGD")
    assert abs(row.bd_err) <= 0.01, f"breakdown {row.breakdown} vs allocator {row.profiler}"
    assert row.est_err < -0.03, "the estimate is low here (if this fails, the gap closed)"
    assert {"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"} <= set(row.unseen)


class ConvEncoderDecoder(nn.Module):
    """Strided convolutions down, transposed convolutions up, GroupNorm: a small UNet-ish net."""

    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1), nn.GroupNorm(8, 32), nn.SiLU(),
            nn.Conv2d(32, 64, 3, 2, 1), nn.GroupNorm(8, 64), nn.SiLU(),
        )  # fmt: skip
        self.up = nn.Sequential(
            nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.GroupNorm(8, 32), nn.SiLU(),
            nn.ConvTranspose2d(32, 3, 4, 2, 1),
        )  # fmt: skip

    def forward(self, x):  # (B, 3, H, W) -> (B, 3, H, W)
        return self.up(self.down(x))


@pytest.mark.parametrize(
    ("make", "batch", "opt"),
    [
        (ConvEncoderDecoder, lambda: torch.randn(8, 3, 64, 64), torch.optim.AdamW),
        (  # the benchmark's TiedTransformerLM is smaller: this is the size the issue measured
            lambda: models.TiedLM(vocab=5000, d_model=128, mixer="transformer"),
            lambda: torch.randint(0, 5000, (8, 64)),
            torch.optim.SGD,
        ),
    ],
    ids=["conv-encoder-decoder", "tied-embedding-LM"],
)
def test_breakdown_peak_is_the_allocators_on_models_outside_the_benchmark(make, batch, opt):
    torch.manual_seed(0)
    x = batch()
    profiled = bench.profiler_peak(make(), x, opt)
    step = memory.breakdown(make(), x, optimizer=opt)  # plain sum of the output as the loss
    assert abs(step.peak - profiled) <= 0.03 * profiled, (step.peak, profiled)


def test_the_books_alone_miss_scratch_inside_operators():
    # why breakdown reads the allocator: the transposed convolutions' and GroupNorm's scratch
    # never leaves the operator, so a count of tensor storages comes out more than 10% low
    x = torch.randn(8, 3, 64, 64)
    step = memory.breakdown(ConvEncoderDecoder(), x, optimizer=torch.optim.AdamW)
    books = memory.estimate(ConvEncoderDecoder, x, optimizer=torch.optim.AdamW)
    assert books.peak < 0.9 * step.peak and books.unseen_scratch


def test_estimate_names_the_scratch_it_cannot_see():
    est = memory.estimate(ConvEncoderDecoder, (2, 3, 32, 32), optimizer=torch.optim.SGD)
    assert {"convolution", "native_group_norm_backward"} <= set(est.unseen_scratch)
    assert "real peak may be higher" in repr(est) and "convolution" in repr(est)
    real = memory.breakdown(ConvEncoderDecoder(), torch.randn(2, 3, 32, 32))
    assert real.peak > est.peak, "the flag is there because the estimate is low"


def test_estimate_of_a_plain_mlp_has_no_blind_spot():
    est = memory.estimate(bench.MODELS["MLP"][0], (8, 512), optimizer=torch.optim.AdamW)
    assert est.unseen_scratch == () and "may be higher" not in repr(est)


WIDE_NAMES = [n for n in bench.WIDE_MODELS if n not in bench.MODELS]


@pytest.mark.slow
@pytest.mark.parametrize("name", WIDE_NAMES)
def test_every_family_is_exact_or_flagged(name):
    # fp32, AdamW, batch 2 (the wide table in the benchmark adds bf16 autocast, SGD, batch 32)
    row = bench.compare(name, 2, "AdamW")
    assert abs(row.bd_err) <= 0.01, f"breakdown {row.breakdown} vs allocator {row.profiler}"
    assert abs(row.est_err) <= 0.03 or row.unseen, (
        f"estimate {row.estimate} vs {row.breakdown}, and no flag"
    )
