"""How exact are tutorial_utils.memory's numbers, and what do they cost?

For each demo model, batch size and optimizer this script compares three figures of one
training step's peak tensor memory on the CPU:

- ``profiler``: PyTorch's own profiler (``profile_memory=True``): every allocation and free the
  CPU allocator reports, summed in time order, plus the bytes that existed before the step
  (parameters, buffers, inputs). Independent of our code.
- ``breakdown``: ``memory.breakdown`` (a real step, booked by our dispatch-level accountant).
- ``estimate``: ``memory.estimate`` (the same step on fake tensors, nothing allocated).

Targets: breakdown within 1% of the profiler (it reads the same allocator events), estimate
within 3% of breakdown or flagged (``unseen_scratch`` names the operators whose scratch fake
tensors cannot see). It also times the first ``measure()`` of a fresh process (with 0 and 200k
tensors alive), the overhead per operator of a running ``Tracker``, ``measure()`` around a
training step (overhead ratio) and ``estimate()`` of a 7B transformer.

    python benchmarks/memory_accuracy.py           # the quick sweep (about a minute)
    python benchmarks/memory_accuracy.py --full    # every model x batch 1..64 x 4 optimizers
    python benchmarks/memory_accuracy.py --wide --skip-timings   # 22 families x 2 batches x
                                                   # fp32/bf16 autocast x SGD/AdamW
    python benchmarks/memory_accuracy.py --timings-only   # the costs alone (about 2 minutes)
    python benchmarks/memory_accuracy.py --bf16 --skip-timings   # bf16 weights and autocast;
    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/memory_accuracy.py --bf16 --skip-timings
                                                   # the same without native bf16 (see below)

The "truth" step is the loop people write: ``out = model(x); loss = loss_fn(out);
loss.backward(); opt.step()``, with ``out`` alive until the step ends (what ``breakdown`` and
``estimate`` model by default).

bf16 on the CPU takes one of two paths. A CPU with native bf16 (AVX512-BF16, AMX) runs bf16
matrix products in oneDNN, which allocates scratch inside the operator: breakdown (the
allocator) sees it, the estimate flags it (``unseen_scratch``). Without native bf16 they run in
PyTorch's own kernels, and the estimate is exact. ``ONEDNN_MAX_CPU_ISA=AVX2`` (read once, when
oneDNN starts) gives the second path on a CPU of the first kind. What it cannot emulate: a CPU
without native bf16 cannot be made to take the first path; ATen's own vectorized kernels
(elementwise ops, reductions, casts) still use the CPU's full instruction set (their choice is
``ATEN_CPU_CAPABILITY``, not this variable); PyTorch still decides some paths from the CPU's
own features (cpuinfo), not from oneDNN's cap: an LSTM under bf16 autocast still goes to oneDNN, which under
AVX2 cannot build it ("could not create a primitive descriptor for the LSTM forward propagation
primitive"), so those rows fail under the variable where a real AVX2 CPU would run them; and
oneDNN's convolutions and fp32 products drop to AVX2 kernels, whose scratch can differ from a
real AVX2 machine's where the choice depends on more than the instruction set (cache sizes,
core count).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

from tutorial_utils import memory, models

OPTIMIZERS = {
    "none": None,
    "SGD": torch.optim.SGD,
    "Adam": torch.optim.Adam,
    "AdamW": torch.optim.AdamW,
}


def _sum(out: torch.Tensor) -> torch.Tensor:
    return out.sum()


def _float_sum(out: torch.Tensor) -> torch.Tensor:  # a loss that saves nothing of the output
    return out.float().sum()


# name -> (model factory, batch factory(batch size)[, loss function of the output])
MODELS = {
    "MLP": (lambda: models.MLP(d_in=512, d_hidden=1024), lambda b: models.mlp_batch(b, d_in=512)),
    "ConvNet(BN)": (models.ConvNet, lambda b: models.image_batch(b, size=16)),
    "LSTM": (models.LSTMClassifier, lambda b: models.token_batch(b, seq=16)),
    "TinyTransformer": (models.TinyTransformer, lambda b: models.token_batch(b, seq=16)),
    "EmbeddingBag": (
        models.EmbeddingBagClassifier,
        lambda b: models.token_batch(b, seq=16, vocab=50_000),
    ),
    "TiedLM": (models.TiedLM, lambda b: models.token_batch(b, seq=16, vocab=2000)),
    # issue 25 §7: a big output that nothing saves for backward (the loss reads a float copy):
    # only a step that keeps out = model(x) alive, as a training loop does, sees its peak
    "TiedLM(out.float().sum())": (
        lambda: models.TiedLM(vocab=5000, d_model=128, mixer="transformer"),
        lambda b: models.token_batch(b, seq=64, vocab=5000),
        _float_sum,
    ),
}
# The example of facts.md, for the overhead on a step that takes tens of milliseconds.
FACTS_MLP = (
    lambda: models.MLP(d_in=1024, d_hidden=4096, d_out=1024),
    lambda b: models.mlp_batch(b, d_in=1024),
)


def _step(model: nn.Module, x: torch.Tensor, opt, loss_fn=_sum) -> None:
    """One step as a training loop writes it: ``out`` stays alive through backward and step."""
    out = model(x)
    loss = loss_fn(out)
    loss.backward()
    if opt is not None:
        opt.step()
    del out, loss


@contextlib.contextmanager
def _quiet_fd(fd: int):
    """Silence a file descriptor (C++ code writes past Python's sys.stdout / sys.stderr)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def profiler_peak(model: nn.Module, x: torch.Tensor, optimizer=None, loss_fn=_sum) -> int:
    """Peak bytes of one step from the profiler's allocation events (plus what existed before)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    before = set()
    existing = 0
    for t in [*model.parameters(), *model.buffers(), x]:
        s = t.untyped_storage()
        if s._cdata not in before:
            before.add(s._cdata)
            existing += s.nbytes()
    opt = optimizer(model.parameters()) if optimizer is not None else None
    with _quiet_fd(1), _quiet_fd(2):  # the profiler's C++ side prints start/stop lines
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _step(model, x, opt, loss_fn)
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
            events.append((node.start_time_ns, node.typed[1].alloc_size))
    running = peak = 0
    for _, nbytes in sorted(events):
        running += nbytes
        peak = max(peak, running)
    return existing + peak


@dataclass
class Row:
    model: str
    batch: int
    optimizer: str
    profiler: int
    breakdown: int
    estimate: int
    autocast: bool = False
    unseen: tuple[str, ...] = ()  # operators the estimate flags as having scratch it cannot see
    precision: str = "fp32"  # "fp32", "bf16 autocast" or "bf16" (bf16 weights and inputs)

    @property
    def est_err(self) -> float:
        return (self.estimate - self.breakdown) / self.breakdown

    @property
    def bd_err(self) -> float:
        return (self.breakdown - self.profiler) / self.profiler

    @property
    def ok(self) -> bool:
        """Breakdown within 1% of the allocator, estimate within 3% of it or flagged."""
        return abs(self.bd_err) <= 0.01 and (abs(self.est_err) <= 0.03 or bool(self.unseen))


PRECISIONS = ("fp32", "bf16 autocast", "bf16")


def compare(
    name: str, batch: int, opt_name: str, autocast: bool = False, precision: str | None = None
) -> Row:
    """The three figures for one case. ``precision``: "fp32", "bf16 autocast" (CPU autocast)
    or "bf16" (the model's floating-point weights and float inputs cast to bf16)."""
    make_model, make_batch, *rest = WIDE_MODELS[name]
    loss_fn = rest[0] if rest else _sum
    optimizer = OPTIMIZERS[opt_name]
    precision = precision or ("bf16 autocast" if autocast else "fp32")

    def amp():  # a fresh autocast region for each figure: its cast cache lives as long as it
        if precision == "bf16 autocast":
            return torch.autocast("cpu", torch.bfloat16)
        return contextlib.nullcontext()

    def model():
        m = make_model()
        return m.to(torch.bfloat16) if precision == "bf16" else m

    def batch_of(b):
        x = make_batch(b)
        return x.to(torch.bfloat16) if precision == "bf16" and x.is_floating_point() else x

    with amp():
        torch.manual_seed(0)
        prof = profiler_peak(model(), batch_of(batch), optimizer, loss_fn)
    with amp():
        torch.manual_seed(0)
        real = memory.breakdown(model(), batch_of(batch), optimizer=optimizer, loss_fn=loss_fn)
    with amp():
        est = memory.estimate(
            model, batch_of(batch), optimizer=optimizer, device="cpu", loss_fn=loss_fn
        )
    return Row(
        name,
        batch,
        opt_name,
        prof,
        real.peak,
        est.peak,
        precision == "bf16 autocast",
        est.unseen_scratch,
        precision,
    )


def cpu_bf16_path() -> str:
    """One line: which path this CPU's bf16 matrix products take (what the bf16 rows depend on)."""
    from tutorial_utils import anatomy

    native = torch.bfloat16 in anatomy.onednn_matmul_dtypes()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "(not set)")
    return (
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, ONEDNN_MAX_CPU_ISA={isa}: "
        + (
            "bf16 matmuls run in oneDNN on native bf16 units (scratch the estimate flags)"
            if native
            else "bf16 matmuls run in PyTorch's own kernels (no native bf16 path)"
        )
    )


def per_op_overhead(n: int = 20_000, repeats: int = 5) -> tuple[float, float]:
    """Seconds per small operator (``x + 1`` on 16x16), bare and with a CPU ``Tracker`` running."""
    x = torch.randn(16, 16)

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            x + 1
        return (time.perf_counter() - t0) / n

    bare = statistics.median(run() for _ in range(repeats))
    tracker = memory.Tracker("cpu").start()
    try:
        tracked = statistics.median(run() for _ in range(repeats))
    finally:
        tracker.stop()
    return bare, tracked


# One fresh interpreter per run: the first measure() of a session starts the accountant, which
# books every tensor that already exists (one pass over the garbage collector's objects).
_FIRST_MEASURE = """
import sys, time
import torch
from tutorial_utils import memory
keep = [torch.ones(1) for _ in range(int(sys.argv[1]))]
x = torch.ones(10)
t0 = time.perf_counter()
with memory.measure("cpu"):
    y = torch.ones(1000)
print(time.perf_counter() - t0)
"""


def first_measure(live_tensors: int = 0, runs: int = 5) -> list[float]:
    """Seconds of the first ``measure()`` in a fresh Python process, with ``live_tensors``
    one-element tensors alive before it (one process per run, sorted)."""
    import subprocess

    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_MEASURE, str(live_tensors)],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        times.append(float(out.stdout.split()[-1]))
    return sorted(times)


def overhead_ratio(
    name: str, batch: int, repeats: int = 7, tracking: bool = False
) -> tuple[float, float, float]:
    """Median time of a training step inside ``measure()`` over the bare step's.

    ``tracking=False``: each ``measure()`` block starts the CPU accountant, which first books
    every tensor Python can reach (a scan of the garbage collector's objects). ``True``: a
    ``Tracker`` is already running (as when the live gauge is on), so only the per-operator
    bookkeeping is left.
    """
    make_model, make_batch, *_ = MODELS[name] if name in MODELS else FACTS_MLP
    model, x = make_model(), make_batch(batch)
    opt = torch.optim.Adam(model.parameters())

    def bare():
        _step(model, x, opt)
        opt.zero_grad(set_to_none=True)

    def measured():
        with memory.measure("cpu"):
            bare()

    bare(), measured()  # warm up: optimizer state, first-call costs
    plain, timed = [], []
    for _ in range(repeats):  # interleave, so load from other processes hits both alike
        t0 = time.perf_counter()
        bare()
        plain.append(time.perf_counter() - t0)
        tracker = memory.Tracker("cpu").start() if tracking else None  # not timed
        t0 = time.perf_counter()
        measured()
        timed.append(time.perf_counter() - t0)
        if tracker is not None:
            tracker.stop()
    a, b = statistics.median(plain), statistics.median(timed)
    return b / a, a, b


class Llama7B(nn.Module):
    """A 7B-parameter decoder (LLaMA-2-7B sizes: 32 layers, d=4096, ffn 11008, vocab 32000)."""

    def __init__(
        self, d: int = 4096, layers: int = 32, ffn: int = 11008, vocab: int = 32000, heads: int = 32
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_Block(d, ffn, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):  # (B, T) -> (B, T, vocab)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class _Block(nn.Module):
    def __init__(self, d: int, ffn: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x):  # (B, T, d)
        B, T, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, d // self.heads).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # (B, nh, T, hs)
        x = x + self.proj(att.transpose(1, 2).reshape(B, T, d))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


# -----------------------------------------------------------------------------
# More families, built here (a CPU torchvision matching torch 2.13 is not installable without
# a multi-GB CUDA build on this machine): each small enough for a CPU step in well under a second.


def _seq(layers):
    return lambda: nn.Sequential(*layers())


class _Residual(nn.Module):
    """A ResNet basic block: conv-BN-ReLU-conv-BN plus the input."""

    def __init__(self, c: int = 32):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
        )  # fmt: skip

    def forward(self, x):  # (B, 3, H, W) -> (B, c, H, W)
        h = self.stem(x)
        return torch.relu(h + self.body(h))


class _UNetish(nn.Module):
    """Strided convolutions down, transposed convolutions up, GroupNorm, one skip connection."""

    def __init__(self):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.GroupNorm(4, 16), nn.SiLU())
        self.down2 = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1), nn.GroupNorm(8, 32), nn.SiLU())
        self.up2 = nn.Sequential(
            nn.ConvTranspose2d(32, 16, 4, 2, 1), nn.GroupNorm(4, 16), nn.SiLU()
        )
        self.up1 = nn.ConvTranspose2d(32, 3, 4, 2, 1)

    def forward(self, x):  # (B, 3, H, W) -> (B, 3, H, W)
        d1 = self.down1(x)
        return self.up1(torch.cat([self.up2(self.down2(d1)), d1], dim=1))


class _Recurrent(nn.Module):
    """Embedding, a recurrent layer (nn.GRU or nn.RNN), a classifier on the last step."""

    def __init__(self, kind, vocab: int = 1000, d: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.rnn = kind(d, d, batch_first=True)
        self.head = nn.Linear(d, 10)

    def forward(self, tokens):  # (B, T) -> (B, 10)
        return self.head(self.rnn(self.embed(tokens))[0][:, -1])


class _Decoder(nn.Module):
    """nn.TransformerDecoderLayer over an embedded target, attending to an encoded memory."""

    def __init__(self, vocab: int = 1000, d: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layer = nn.TransformerDecoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.memory = nn.Parameter(torch.randn(16, d) * 0.02)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):  # (B, T) -> (B, T, vocab)
        x = self.embed(tokens)
        mem = self.memory.expand(x.shape[0], -1, -1)
        return self.head(self.layer(x, mem, tgt_is_causal=False))


class _SelfAttention(nn.Module):
    """nn.MultiheadAttention on its own, with a residual and a LayerNorm."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):  # (B, T, d) -> (B, T, d)
        return self.norm(x + self.attn(x, x, x, need_weights=False)[0])


def _mini_llama():
    return nn.Sequential(_Block(64, 172, 4), _Block(64, 172, 4))


def _images(size: int, channels: int = 3):
    return lambda b: torch.randn(b, channels, size, size, generator=models.seeded(1))


def _vectors(d: int):
    return lambda b: torch.randn(b, d, generator=models.seeded(1))


def _sequences(t: int, d: int, layout: str = "btd"):
    shape = (lambda b: (b, t, d)) if layout == "btd" else (lambda b: (b, d, t))
    return lambda b: torch.randn(*shape(b), generator=models.seeded(1))


def _tokens(seq: int = 16, vocab: int = 1000):
    return lambda b: models.token_batch(b, seq=seq, vocab=vocab)


WIDE_MODELS = {
    **MODELS,
    "ResNet block": (_Residual, _images(16)),
    "UNet-ish": (_UNetish, _images(32)),
    "GRU": (lambda: _Recurrent(nn.GRU), _tokens()),
    "RNN(tanh)": (lambda: _Recurrent(nn.RNN), _tokens()),
    "TransformerDecoder": (_Decoder, _tokens()),
    "SelfAttention": (_SelfAttention, _sequences(16, 64)),
    "TiedTransformerLM": (lambda: models.TiedLM(mixer="transformer"), _tokens(vocab=2000)),
    "MiniLlama(RMSNorm)": (_mini_llama, _sequences(16, 64)),
    "LayerNorm MLP": (
        _seq(lambda: [nn.Linear(256, 512), nn.LayerNorm(512), nn.GELU(), nn.Linear(512, 10)]),
        _vectors(256),
    ),
    "BatchNorm MLP": (
        _seq(lambda: [nn.Linear(256, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 10)]),
        _vectors(256),
    ),
    "GroupNorm CNN": (
        _seq(
            lambda: [
                nn.Conv2d(3, 32, 3, padding=1),
                nn.GroupNorm(8, 32),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(32, 10),
            ]
        ),
        _images(16),
    ),  # fmt: skip
    "InstanceNorm+MaxPool CNN": (
        _seq(
            lambda: [
                nn.Conv2d(3, 16, 3, padding=1),
                nn.InstanceNorm2d(16, affine=True),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(16 * 8 * 8, 10),
            ]
        ),
        _images(16),
    ),  # fmt: skip
    "Depthwise-separable CNN": (
        _seq(
            lambda: [
                nn.Conv2d(3, 32, 3, padding=1),
                nn.Conv2d(32, 32, 3, padding=1, groups=32),
                nn.Conv2d(32, 64, 1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(64, 10),
            ]
        ),
        _images(16),
    ),  # fmt: skip
    "Conv1d": (
        _seq(
            lambda: [
                nn.Conv1d(32, 64, 5, padding=2),
                nn.ReLU(),
                nn.Conv1d(64, 64, 5, padding=2),
                nn.AdaptiveMaxPool1d(1),
                nn.Flatten(),
                nn.Linear(64, 10),
            ]
        ),
        _sequences(64, 32, layout="bdt"),
    ),  # fmt: skip
    "Conv3d": (
        _seq(
            lambda: [
                nn.Conv3d(2, 8, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool3d(1),
                nn.Flatten(),
                nn.Linear(8, 10),
            ]
        ),
        lambda b: torch.randn(b, 2, 8, 8, 8, generator=models.seeded(1)),
    ),  # fmt: skip
    "Autoencoder(Dropout)": (
        _seq(lambda: [nn.Linear(256, 64), nn.Tanh(), nn.Dropout(0.1), nn.Linear(64, 256)]),
        _vectors(256),
    ),
}


def time_7b(batch: int = 1, seq: int = 512) -> tuple[float, memory.MemoryBreakdown]:
    t0 = time.perf_counter()
    result = memory.estimate(
        Llama7B, memory.spec((batch, seq), torch.long), optimizer=torch.optim.AdamW, device="cpu"
    )
    return time.perf_counter() - t0, result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--full", action="store_true", help="every model x batch 1, 8, 32, 64 x 4 optimizers"
    )
    parser.add_argument(
        "--batches", type=int, nargs="*", help="batch sizes (overrides the default)"
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help="every family (22 models) x batch 2, 32 x fp32 / bf16 autocast x SGD, AdamW",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="the quick models in bf16 weights and in bf16 autocast (run it with and without "
        "ONEDNN_MAX_CPU_ISA=AVX2 on a CPU with native bf16)",
    )
    parser.add_argument("--skip-7b", action="store_true")
    parser.add_argument("--skip-timings", action="store_true")
    parser.add_argument(
        "--timings-only", action="store_true", help="skip the accuracy table, only time"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # steadier timings on a shared machine
    if args.timings_only:
        return timings(args.skip_7b)

    if args.batches:
        batches = args.batches
    else:
        batches = [1, 8, 32, 64] if args.full else [1, 64]
    if args.wide:
        plan = [
            (name, b, opt, precision)
            for name in WIDE_MODELS
            for b in (args.batches or [2, 32])
            for precision in ("fp32", "bf16 autocast")
            for opt in ("SGD", "AdamW")
        ]
    elif args.bf16:
        plan = [
            (name, b, opt, precision)
            for name in MODELS
            for b in (args.batches or [2, 32])
            for precision in ("bf16", "bf16 autocast")
            for opt in ("SGD", "AdamW")
        ]
    else:
        plan = [
            (name, b, opt, "fp32")
            for name in MODELS
            for b in batches
            for opt in (
                OPTIMIZERS if args.full else (["none", "AdamW"] if b == 1 else ["SGD", "Adam"])
            )
        ]
    print(cpu_bf16_path())
    print(
        f"{'model':<27}{'batch':>6} {'precision':<14}{'optim':<6}{'truth':>14}{'breakdown':>14}"
        f"{'estimate':>14}{'bd err':>9}{'est err':>9}  flagged by estimate"
    )
    rows = []
    for name, b, opt, precision in plan:
        try:
            row = compare(name, b, opt, precision=precision)
        except Exception as exc:  # a case that cannot run is a line in the table, not a crash
            print(f"{name:<27}{b:>6} {precision:<14}{opt:<6}  failed: {exc}")
            continue
        rows.append(row)
        flag = "" if row.ok else "  <-- off target"
        print(
            f"{name:<27}{b:>6} {precision:<14}{opt:<6}"
            f"{row.profiler / 2**20:>10.3f} MiB{row.breakdown / 2**20:>10.3f} MiB"
            f"{row.estimate / 2**20:>10.3f} MiB{row.bd_err:>+9.2%}{row.est_err:>+9.2%}"
            f"  {', '.join(row.unseen) or '-'}{flag}",
            flush=True,
        )
    ok = sum(r.ok for r in rows)
    silent = [r for r in rows if abs(r.est_err) > 0.03 and not r.unseen]
    print(
        f"\n{ok} of {len(rows)} cases on target (breakdown within 1% of the allocator, estimate "
        f"within 3% or flagged); worst breakdown error {max(abs(r.bd_err) for r in rows):.2%}, "
        f"worst estimate error {max(abs(r.est_err) for r in rows):.2%}, "
        f"{len(silent)} estimates off by more than 3% without a flag"
    )
    if args.skip_timings:
        return 0
    return timings(args.skip_7b)


def timings(skip_7b: bool = False) -> int:
    for live in (0, 200_000):
        runs = first_measure(live)
        print(
            f"\nfirst measure() in a fresh process, {live:,} tensors alive before it: median "
            f"{statistics.median(runs) * 1e3:.1f} ms (5 processes: "
            + ", ".join(f"{t * 1e3:.1f}" for t in runs)
            + " ms)"
        )
    bare, tracked = per_op_overhead()
    print(
        f"\nper-operator overhead of a running Tracker (x + 1 on 16x16, median of 5 x 20k): "
        f"{bare * 1e6:.2f} us bare, {tracked * 1e6:.2f} us tracked, "
        f"+{(tracked - bare) * 1e6:.2f} us per operator"
    )
    print("\nmeasure() overhead on one Adam training step (median of 7, interleaved):")
    for tracking in (False, True):
        print(
            "  with a Tracker already running (bookkeeping only):"
            if tracking
            else "  measure() on its own (includes booking the tensors that already exist):"
        )
        for name, b in [
            ("MLP", 64),
            ("ConvNet(BN)", 32),
            ("TinyTransformer", 32),
            ("TiedLM", 32),
            ("facts MLP", 256),
        ]:
            ratio, bare, timed = overhead_ratio(name, b, tracking=tracking)
            print(
                f"    {name:<16} batch {b:>3}: {bare * 1e3:7.2f} ms bare, {timed * 1e3:7.2f} ms measured, "
                f"ratio {ratio:.2f}x"
            )

    if not skip_7b:
        seconds, result = time_7b()  # the first in this process also imports torch._dynamo
        runs = sorted(time_7b()[0] for _ in range(5))
        per_param = (result.parameters + result.gradients + result.optimizer_state) / (
            result.parameters / 4
        )
        print(
            f"\nestimate() of a 7B decoder (AdamW, batch 1 x 512 tokens): first in the process "
            f"{seconds:.2f} s, then median {statistics.median(runs):.2f} s (5 runs: "
            + ", ".join(f"{t:.2f}" for t in runs)
            + f" s); {result.parameters / 2**30:.2f} GiB parameters, peak "
            f"{result.peak / 2**30:.2f} GiB, {per_param:.2f} bytes per parameter (Adam: 16)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
