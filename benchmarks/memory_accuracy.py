"""How exact are tutorial_utils.memory's numbers, and what do they cost?

For each demo model, batch size and optimizer this script compares three figures of one
training step's peak tensor memory on the CPU:

- ``profiler``: PyTorch's own profiler (``profile_memory=True``): every allocation and free the
  CPU allocator reports, summed in time order, plus the bytes that existed before the step
  (parameters, buffers, inputs). Independent of our code.
- ``breakdown``: ``memory.breakdown`` (a real step, booked by our dispatch-level accountant).
- ``estimate``: ``memory.estimate`` (the same step on fake tensors, nothing allocated).

Targets: estimate within 3% of breakdown, breakdown within 1% of the profiler. It also times
``measure()`` around a training step (overhead ratio) and ``estimate()`` of a 7B transformer.

    python benchmarks/memory_accuracy.py           # the quick sweep (about a minute)
    python benchmarks/memory_accuracy.py --full    # every model x batch 1..64 x 4 optimizers
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

# name -> (model factory, batch factory(batch size))
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
}
# The example of facts.md, for the overhead on a step that takes tens of milliseconds.
FACTS_MLP = (
    lambda: models.MLP(d_in=1024, d_hidden=4096, d_out=1024),
    lambda b: models.mlp_batch(b, d_in=1024),
)


def _step(model: nn.Module, x: torch.Tensor, opt) -> None:
    loss = model(x).sum()
    loss.backward()
    if opt is not None:
        opt.step()


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


def profiler_peak(model: nn.Module, x: torch.Tensor, optimizer=None) -> int:
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
            _step(model, x, opt)
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

    @property
    def est_err(self) -> float:
        return (self.estimate - self.breakdown) / self.breakdown

    @property
    def bd_err(self) -> float:
        return (self.breakdown - self.profiler) / self.profiler

    @property
    def ok(self) -> bool:
        return abs(self.est_err) <= 0.03 and abs(self.bd_err) <= 0.01


def compare(name: str, batch: int, opt_name: str) -> Row:
    make_model, make_batch = MODELS[name]
    optimizer = OPTIMIZERS[opt_name]
    prof = profiler_peak(make_model(), make_batch(batch), optimizer)
    real = memory.breakdown(make_model(), make_batch(batch), optimizer=optimizer).peak
    est = memory.estimate(make_model, make_batch(batch), optimizer=optimizer, device="cpu").peak
    return Row(name, batch, opt_name, prof, real, est)


def overhead_ratio(
    name: str, batch: int, repeats: int = 7, tracking: bool = False
) -> tuple[float, float, float]:
    """Median time of a training step inside ``measure()`` over the bare step's.

    ``tracking=False``: each ``measure()`` block starts the CPU accountant, which first books
    every tensor Python can reach (a scan of the garbage collector's objects). ``True``: a
    ``Tracker`` is already running (as when the live gauge is on), so only the per-operator
    bookkeeping is left.
    """
    make_model, make_batch = MODELS[name] if name in MODELS else FACTS_MLP
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
    parser.add_argument("--skip-7b", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # steadier timings on a shared machine

    if args.batches:
        batches = args.batches
    else:
        batches = [1, 8, 32, 64] if args.full else [1, 64]
    plan = [
        (name, b, opt)
        for name in MODELS
        for b in batches
        for opt in (OPTIMIZERS if args.full else (["none", "AdamW"] if b == 1 else ["SGD", "Adam"]))
    ]
    print(
        f"{'model':<16}{'batch':>6} {'optim':<6}{'profiler':>14}{'breakdown':>14}{'estimate':>14}"
        f"{'bd vs prof':>11}{'est vs bd':>10}"
    )
    rows = []
    for name, b, opt in plan:
        row = compare(name, b, opt)
        rows.append(row)
        flag = "" if row.ok else "  <-- off target"
        print(
            f"{name:<16}{b:>6} {opt:<6}{row.profiler / 2**20:>10.3f} MiB{row.breakdown / 2**20:>10.3f} MiB"
            f"{row.estimate / 2**20:>10.3f} MiB{row.bd_err:>+10.2%}{row.est_err:>+10.2%}{flag}",
            flush=True,
        )
    ok = sum(r.ok for r in rows)
    print(
        f"\n{ok} of {len(rows)} cases within both targets "
        f"(worst breakdown vs profiler {max(abs(r.bd_err) for r in rows):.2%}, "
        f"worst estimate vs breakdown {max(abs(r.est_err) for r in rows):.2%})"
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

    if not args.skip_7b:
        seconds, result = time_7b()
        print(
            f"\nestimate() of a 7B decoder (AdamW, batch 1 x 512 tokens): {seconds:.2f} s; "
            f"{result.parameters / 2**30:.2f} GiB parameters, peak {result.peak / 2**30:.2f} GiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
