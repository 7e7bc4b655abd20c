"""GPU benchmarks of the course, in one command: a JSON of figures and a markdown summary.

    python benchmarks/gpu_bench.py --out DIR            # DIR/gpu-bench.json and DIR/gpu-bench.md
    python benchmarks/gpu_bench.py --only amp_speed     # one benchmark (names: --list)

It runs on whatever device is here. On a CPU the parts that need CUDA say "skipped: needs
CUDA" (with the reason ``devices.require_gpu`` gives) and the others run at small sizes, so
the logic is exercised before a GPU ever runs it; no CPU figure is presented as a GPU one.

Each benchmark is isolated: one that raises is recorded as an error and the others still run.
Each result is stored under its key in ``tutorial_utils.recorded.KEYS`` (the notebooks show
them with ``recorded.show(key)``), as a table (``columns`` / ``rows``), a ``text`` (the OOM
message, verbatim) and ``figures`` (the numbers the goals are checked on). The goals of issue
10 are checked at the end and reported as met, or missed by how much.

Timing: CUDA events around back-to-back calls, after warm-up, median of several samples
(``tutorial_utils.timing.time_it``). Memory: the CUDA caching allocator's counters
(``tutorial_utils.memory.measure`` on CUDA and on the CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from tutorial_utils import devices, memory, models, monitor, timing
from tutorial_utils.units import format_bytes

__all__ = ["BENCHMARKS", "GOALS", "Result", "check_goals", "markdown", "run"]

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import monitor_cost  # noqa: E402  (the source-cost and spike helpers live there)

MiB, GiB = 2**20, 2**30


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    """One benchmark's outcome, in the ``recorded`` schema (plus ``figures`` for the goals)."""

    key: str
    title: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    text: str = ""
    note: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    skipped: str = ""  # why it did not run here
    error: str = ""  # what went wrong, one line (the traceback goes to the log)
    seconds: float = 0.0

    def as_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in ("", [], {}) or k == "key"}


@dataclass
class Context:
    device: torch.device
    caps: devices.Capabilities
    deadline: float  # time.monotonic() by which every benchmark must be done

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    @property
    def repeat(self) -> int:
        """Samples per timing: 7 on a GPU; 3 on a CPU, where nothing is claimed."""
        return 7 if self.cuda else 3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def _needs_cuda(ctx: Context, what: str) -> str:
    """'' when CUDA is here, else the skip reason (``devices.require_gpu``'s sentence)."""
    if ctx.cuda:
        return ""
    try:
        devices.require_gpu(why=what)
    except devices.DeviceUnavailableError as exc:
        return f"skipped: needs CUDA. {exc}"
    return "skipped: needs CUDA (this run was asked to use the CPU)"


def _gib_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GiB


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


@contextlib.contextmanager
def _matmul_precision(value: str) -> Iterator[None]:
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def _free_cuda() -> None:
    """Give the GPU memory of the last benchmark back (a full gc pass costs seconds: CUDA only)."""
    import gc

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- 01: H2D copies


def bench_h2d(ctx: Context) -> Result:
    r = Result("h2d_bandwidth", "Host-to-device copies, pageable vs pinned (CUDA events)")
    if skip := _needs_cuda(ctx, "the host-to-device copy benchmark"):
        r.skipped = skip
        return r
    sizes = [1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB]
    dst = torch.empty(sizes[-1], dtype=torch.uint8, device=ctx.device)
    measured = {}
    for size in sizes:
        pageable = torch.ones(size, dtype=torch.uint8)  # written: every page is real
        pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(1)
        target = dst[:size]
        repeat = 10 if size < GiB else 5
        t_pageable = timing.time_it(
            lambda t=target, s=pageable: t.copy_(s), device=ctx.device, repeat=repeat
        )
        t_pinned = timing.time_it(
            lambda t=target, s=pinned: t.copy_(s, non_blocking=True),
            device=ctx.device,
            repeat=repeat,
        )
        measured[size] = (_gib_s(size, t_pageable.median), _gib_s(size, t_pinned.median))
        del pageable, pinned
    large = measured[sizes[-1]][1]
    for size in sizes:
        pageable, pinned = measured[size]
        r.rows.append(
            [format_bytes(size), f"{pageable:.1f}", f"{pinned:.1f}", f"{pinned / large:.0%}"]
        )
    r.columns = ["size", "pageable GiB/s", "pinned GiB/s", "pinned, share of a 1 GiB pinned copy"]
    r.figures = {
        "pinned_1GiB_gib_s": large,
        "pageable_1GiB_gib_s": measured[sizes[-1]][0],
        # the goal: pinned copies of 16 MiB and more reach 80% of a large pinned copy
        "pinned_share_of_large_min_16MiB": min(measured[s][1] for s in sizes[1:]) / large,
    }
    r.note = (
        "Median of 5-10 samples after warm-up. A pageable copy is staged through a pinned "
        "buffer by the driver; a pinned one is a direct DMA."
    )
    return r


# --------------------------------------------------------------------------- 06: matmul peak


def _tflops(m: int, k: int, n: int, seconds: float) -> float:
    return 2 * m * k * n / seconds / 1e12


def bench_matmul(ctx: Context) -> Result:
    r = Result("matmul_peak", "Matrix products as a share of the measured bf16 peak")
    dev = ctx.device
    if ctx.cuda:
        squares = [4096, 8192, 16384]
        width, hidden, batch = ctx.caps.speed_shape
    else:  # small: exercises the code, claims nothing
        squares = [256, 512]
        width, hidden, batch = 256, 512, 128
    gen = torch.Generator(device=dev).manual_seed(0)

    def time_product(m, k, n, dtype, precision="highest"):
        a = torch.randn(m, k, device=dev, dtype=dtype, generator=gen)
        b = torch.randn(k, n, device=dev, dtype=dtype, generator=gen)
        with _matmul_precision(precision):
            t = timing.time_it(lambda: a @ b, device=dev, warmup=3, repeat=7, min_time=0.02)
        return _tflops(m, k, n, t.median)

    rows = []
    bf16 = {}
    for s in squares:
        bf16[s] = time_product(s, s, s, torch.bfloat16)
        rows.append((f"bf16 {s}x{s} @ {s}x{s}", bf16[s]))
    peak = max(bf16.values())
    large = squares[1]
    course = [
        (f"bf16 06's first layer {batch}x{width} @ {width}x{hidden}", (batch, width, hidden)),
        (f"bf16 06's middle layer {batch}x{hidden} @ {hidden}x{hidden}", (batch, hidden, hidden)),
    ]
    for name, (m, k, n) in course:
        rows.append((name, time_product(m, k, n, torch.bfloat16)))
    fp32 = time_product(large, large, large, torch.float32, "highest")
    tf32 = time_product(large, large, large, torch.float32, "high")
    rows.append((f"fp32 {large}^3 (matmul precision 'highest')", fp32))
    rows.append((f"fp32 {large}^3 as TF32 (matmul precision 'high')", tf32))
    r.columns = ["product", "TFLOP/s", "share of the bf16 peak"]
    r.rows = [[name, f"{v:.1f}", f"{v / peak:.0%}"] for name, v in rows]
    r.figures = {
        "bf16_peak_tflops": peak,
        "bf16_large_share_of_peak": bf16[large] / peak,
        "fp32_tflops": fp32,
        "tf32_tflops": tf32,
        "tf32_vs_fp32": tf32 / fp32,
    }
    r.note = (
        f"Measured peak: the best bf16 square product of {', '.join(map(str, squares))} "
        "(random normal inputs, 7 samples after 3 warm-ups, median)."
    )
    if not ctx.cuda:
        r.note += " CPU: small sizes, to exercise the code; no peak is claimed."
    return r


# --------------------------------------------------------------------------- the transformer demo


def _transformer_config(ctx: Context) -> dict:
    """The course's TinyTransformer (06's model class) at a size that keeps the device busy."""
    if ctx.cuda:
        return dict(vocab=1000, d_model=1024, n_heads=16, n_layers=4, batch=32, seq=512)
    return dict(vocab=1000, d_model=64, n_heads=4, n_layers=2, batch=8, seq=32)


def _transformer(cfg: dict, device: torch.device) -> nn.Module:
    return models.TinyTransformer(
        vocab=cfg["vocab"],
        d_model=cfg["d_model"],
        n_heads=cfg["n_heads"],
        n_layers=cfg["n_layers"],
        n_classes=5,
        seed=0,
    ).to(device)


def _transformer_batch(cfg: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = models.token_batch(cfg["batch"], cfg["seq"], vocab=cfg["vocab"], device=device)
    labels = torch.randint(0, 5, (cfg["batch"],), generator=models.seeded(2)).to(device)
    return tokens, labels


def _describe(cfg: dict) -> str:
    return (
        f"TinyTransformer d_model {cfg['d_model']}, {cfg['n_heads']} heads, {cfg['n_layers']} "
        f"layers, batch {cfg['batch']} x {cfg['seq']} tokens"
    )


def bench_amp(ctx: Context) -> Result:
    r = Result("amp_speed", "One training step of the transformer demo per precision")
    dev, cfg = ctx.device, _transformer_config(ctx)
    tokens, labels = _transformer_batch(cfg, dev)
    variants = [
        ("fp32 (matmul precision 'highest')", None, "highest"),
        ("TF32 (matmul precision 'high')", None, "high"),
        ("bf16 autocast", torch.bfloat16, "highest"),
        ("fp16 autocast + GradScaler", torch.float16, "highest"),
    ]
    measured = {}
    for name, dtype, precision in variants:
        _free_cuda()
        model = _transformer(cfg, dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        scaler = torch.amp.GradScaler(dev.type, enabled=dtype == torch.float16)

        def step(model=model, opt=opt, scaler=scaler, dtype=dtype):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(tokens), labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        with _matmul_precision(precision):
            step()  # Adam's state exists from here on
            with memory.measure(dev) as m:  # one step's peak, measured apart from the timing
                step()
            t = timing.time_it(step, device=dev, warmup=2, repeat=ctx.repeat, number=1)
        measured[name] = (t.median, m.peak_bytes)
        del model, opt, scaler
    base = measured[variants[0][0]][0]
    r.columns = ["variant", "ms per step", "speedup vs fp32", "peak memory"]
    r.rows = [
        [name, _ms(sec), f"{base / sec:.2f}x", format_bytes(peak)]
        for name, (sec, peak) in measured.items()
    ]
    r.figures = {
        "bf16_vs_fp32": base / measured["bf16 autocast"][0],
        "tf32_vs_fp32": base / measured["TF32 (matmul precision 'high')"][0],
        "fp16_vs_fp32": base / measured["fp16 autocast + GradScaler"][0],
    }
    clock = "CUDA events" if ctx.cuda else "wall clock"
    r.note = f"{_describe(cfg)}, AdamW; median of {ctx.repeat} steps after warm-up ({clock})."
    if not ctx.cuda:
        r.note += " CPU: a small model; no speed claim."
    return r


def _forward(model: nn.Module, tokens: torch.Tensor, checkpointed: bool) -> torch.Tensor:
    """TinyTransformer's forward, layer by layer, optionally checkpointing each layer."""
    from torch.utils.checkpoint import checkpoint

    h = model.embed(tokens)
    for layer in model.encoder.layers:
        h = checkpoint(layer, h, use_reentrant=False) if checkpointed else layer(h)
    return model.head(h.mean(dim=1))


def bench_checkpointing(ctx: Context) -> Result:
    r = Result("checkpointing", "Activation checkpointing: memory saved and time paid")
    dev, cfg = ctx.device, _transformer_config(ctx)
    tokens, labels = _transformer_batch(cfg, dev)
    amp = ctx.caps.amp_dtype if ctx.cuda else torch.float32
    model = _transformer(cfg, dev)
    with torch.no_grad():
        same = torch.allclose(_forward(model, tokens, False), model(tokens), atol=1e-5)
    if not same:
        raise AssertionError("the layer-by-layer forward differs from the model's own forward")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    measured = {}
    for checkpointed in (False, True):

        def step(checkpointed=checkpointed):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=amp, enabled=amp != torch.float32):
                loss = nn.functional.cross_entropy(_forward(model, tokens, checkpointed), labels)
            loss.backward()
            opt.step()

        step()
        opt.zero_grad(set_to_none=True)
        with memory.measure(dev) as m:  # what the forward pass keeps for backward
            with torch.autocast(dev.type, dtype=amp, enabled=amp != torch.float32):
                out = _forward(model, tokens, checkpointed)
        activations = m.delta_bytes
        with memory.measure(dev) as whole:
            out.float().sum().backward()
        del out
        t = timing.time_it(step, device=dev, warmup=2, repeat=ctx.repeat, number=1)
        measured[checkpointed] = (activations, whole.peak_bytes, t.median)
    (a0, p0, t0), (a1, p1, t1) = measured[False], measured[True]
    r.columns = ["forward", "activations kept", "peak during backward", "ms per step"]
    r.rows = [
        ["plain", format_bytes(a0), format_bytes(p0), _ms(t0)],
        ["checkpoint every layer", format_bytes(a1), format_bytes(p1), _ms(t1)],
    ]
    r.figures = {"activation_saving": a0 / max(a1, 1), "time_ratio": t1 / t0}
    r.note = (
        f"{_describe(cfg)}, AdamW, {str(amp).replace('torch.', '')}"
        f"{' autocast' if amp != torch.float32 else ''}; activations kept = memory allocated by "
        f"the forward pass and still held when it returns; time: median of {ctx.repeat} steps."
    )
    return r


def bench_inference(ctx: Context) -> Result:
    r = Result("inference_mode", "Forward passes: grad mode, no_grad, inference_mode")
    dev, cfg = ctx.device, _transformer_config(ctx)
    tokens, _ = _transformer_batch(cfg, dev)
    model = _transformer(cfg, dev).eval()
    modes = {
        "grad enabled": contextlib.nullcontext,
        "torch.no_grad()": torch.no_grad,
        "torch.inference_mode()": torch.inference_mode,
    }
    measured = {}
    for name, mode in modes.items():

        def forward(mode=mode):
            with mode():
                return model(tokens)

        forward()
        with memory.measure(dev) as m:
            out = forward()
        kept = m.delta_bytes
        del out
        t = timing.time_it(forward, device=dev, warmup=2, repeat=ctx.repeat + 2, min_time=0.01)
        measured[name] = (t.median, kept)
    base = measured["torch.no_grad()"][0]
    r.columns = ["mode", "ms per forward", "vs no_grad", "memory kept after the forward"]
    r.rows = [[n, _ms(s), f"{s / base:.2f}x", format_bytes(k)] for n, (s, k) in measured.items()]
    r.figures = {
        "inference_vs_no_grad_time": measured["torch.inference_mode()"][0] / base,
        "grad_kept_bytes": measured["grad enabled"][1],
        "no_grad_kept_bytes": measured["torch.no_grad()"][1],
    }
    r.note = f"{_describe(cfg)} in eval mode; median of {ctx.repeat + 2} samples."
    return r


# --------------------------------------------------------------------------- 06: cuDNN


def bench_cudnn(ctx: Context) -> Result:
    r = Result("cudnn_benchmark", "cudnn.benchmark on and off, fixed and varying input shapes")
    if skip := _needs_cuda(ctx, "the cuDNN benchmark"):
        r.skipped = skip
        return r
    dev = ctx.device
    cudnn = torch.backends.cudnn
    old = cudnn.benchmark
    conv = nn.Conv2d(64, 64, 3, padding=1).to(dev)
    fixed = torch.randn(32, 64, 56, 56, device=dev)
    counter = iter(range(10**6))  # every varying call gets a shape never seen before

    def varying():
        i = next(counter)
        h, w = 24 + i % 97, 24 + (i // 97) % 89
        return conv(torch.randn(8, 64, h, w, device=dev))

    measured = {}
    try:
        with torch.no_grad():
            for flag in (False, True):
                cudnn.benchmark = flag
                measured[("fixed", flag)] = timing.time_it(
                    lambda: conv(fixed), device=dev, warmup=3, repeat=10, min_time=0.005
                ).median
                measured[("varying", flag)] = timing.time_it(
                    varying, device=dev, warmup=0, repeat=20, number=1
                ).median
    finally:
        cudnn.benchmark = old
    r.columns = ["input shapes", "benchmark=False (ms)", "benchmark=True (ms)", "True vs False"]
    for shapes in ("fixed", "varying"):
        off, on = measured[(shapes, False)], measured[(shapes, True)]
        r.rows.append([shapes, _ms(off), _ms(on), f"{on / off:.2f}x"])
    r.figures = {
        "fixed_on_vs_off": measured[("fixed", True)] / measured[("fixed", False)],
        "varying_on_vs_off": measured[("varying", True)] / measured[("varying", False)],
    }
    r.note = (
        "Conv2d(64, 64, 3) forward. Fixed: a (32, 64, 56, 56) input, 10 samples after warm-up "
        "(the autotuning happens in the warm-up). Varying: a new spatial size at every call, "
        "so benchmark=True autotunes every time; median of 20 single calls."
    )
    return r


# ------------------------------------------------------------------ 00: the gauge's sources


def bench_source_cost(ctx: Context) -> Result:
    r = Result("source_cost", "The cost of one reading from each gauge source")
    r.columns = ["source", "median per read", "mean per read"]
    for name in monitor.SOURCE_NAMES:
        n = 20 if name == "gputil" else 300
        got = monitor_cost.time_reads(monitor.make_source(name), n)
        if isinstance(got, str):
            r.rows.append([name, got, ""])
        else:
            median, mean = got
            r.rows.append([name, f"{median * 1e6:.1f} us", f"{mean * 1e6:.1f} us"])
            r.figures[f"{name}_median_us"] = median * 1e6
    r.note = "Reads back to back after 5 warm-up reads (GPUtil: 20 reads, each one nvidia-smi)."
    return r


def bench_spikes(ctx: Context) -> Result:
    r = Result("spike_test", "A 20 ms memory spike: who sees it?")
    if skip := _needs_cuda(ctx, "the spike test"):
        r.skipped = skip
        return r
    n = 20
    size = ctx.caps.demo_tensor_bytes
    spike = monitor_cost.spike_experiment(n=n, size=size, device=ctx.device)
    r.columns = ["watcher", "samples", "spikes shown"]
    r.rows = [[name, samples, f"{shown} / {n}"] for name, samples, shown in spike["rows"]]
    r.figures = {f"shown_{i}": shown / n for i, (_, _, shown) in enumerate(spike["rows"])}
    r.note = (
        f"{n} spikes of {format_bytes(size)} on {ctx.device}, each held about 20 ms "
        f"({spike['median_ms']:.0f} ms from allocation to free, median), 150-450 ms apart. "
        "The allocator's peak counter sees every spike; a poller sees one only if it samples "
        "inside it."
    )
    return r


# ------------------------------------------------------------------ 00 and 05: the allocator


def _nvml_used(source: monitor.Source) -> int | None:
    if not source.available:
        return None
    for reading in source.read():
        if reading.label.startswith("NVML cuda:0 "):
            return reading.used_bytes
    return None


def bench_allocator_vs_nvml(ctx: Context) -> Result:
    r = Result("allocator_vs_nvml", "Allocated, reserved and the driver's 'used', step by step")
    if skip := _needs_cuda(ctx, "the allocator-vs-NVML table"):
        r.skipped = skip
        return r
    dev = ctx.device
    size = ctx.caps.demo_tensor_bytes
    nvml_source = monitor.NvmlSource()
    nvml_source.open()
    try:

        def row(stage):
            torch.cuda.synchronize(dev)
            free, total = torch.cuda.mem_get_info(dev)
            used = _nvml_used(nvml_source)
            return [
                stage,
                format_bytes(torch.cuda.memory_allocated(dev)),
                format_bytes(torch.cuda.memory_reserved(dev)),
                format_bytes(total - free),
                format_bytes(used)
                if used is not None
                else f"n/a ({nvml_source.reason or 'no NVML row matched cuda:0'})",
            ]

        _free_cuda()
        rows = [row("start (CUDA context up, no tensors of this test)")]
        x = torch.empty(size, dtype=torch.uint8, device=dev)
        rows.append(row(f"after x = torch.empty({format_bytes(size)})"))
        small = torch.empty(1000, device=dev)  # 4000 bytes: a 512-byte-rounded block
        rows.append(row("after a 4000-byte tensor (a 2 MiB segment is reserved)"))
        del x
        rows.append(row("after del x (the block stays cached)"))
        torch.cuda.empty_cache()
        rows.append(row("after torch.cuda.empty_cache()"))
        del small
    finally:
        nvml_source.close()
    r.columns = ["stage", "allocated", "reserved", "mem_get_info used", "NVML used"]
    r.rows = rows
    r.note = (
        "'used' (mem_get_info, NVML, nvidia-smi) counts every process on the GPU and the CUDA "
        "context, so it exceeds what PyTorch reserves; allocated <= reserved always."
    )
    return r


def bench_empty_cache(ctx: Context) -> Result:
    r = Result("empty_cache", "Reserved memory before and after torch.cuda.empty_cache()")
    if skip := _needs_cuda(ctx, "the empty_cache table"):
        r.skipped = skip
        return r
    dev = ctx.device
    _free_cuda()
    size = 256 * MiB

    def row(stage):
        return [
            stage,
            format_bytes(torch.cuda.memory_allocated(dev)),
            format_bytes(torch.cuda.memory_reserved(dev)),
        ]

    rows = [row("start")]
    x = torch.ones(size // 4, device=dev)
    rows.append(row("with a 256 MiB tensor"))
    del x
    after_del = torch.cuda.memory_reserved(dev)
    rows.append(row("after del"))
    torch.cuda.empty_cache()
    after_empty = torch.cuda.memory_reserved(dev)
    rows.append(row("after empty_cache()"))
    r.columns, r.rows = ["stage", "allocated", "reserved"], rows
    r.figures = {"returned_bytes": after_del - after_empty}
    r.note = "del frees the tensor into PyTorch's cache; only empty_cache() returns it to CUDA."
    return r


# --------------------------------------------------------------------------- 05: subprocesses

_OOM_SCRIPT = textwrap.dedent(
    """
    import json, torch
    dev = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(0).total_memory
    budget = 2 * 2**30
    torch.cuda.set_per_process_memory_fraction(budget / total, 0)
    keep = torch.empty(512 * 2**20, dtype=torch.uint8, device=dev)
    try:
        big = torch.empty(3 * 2**30, dtype=torch.uint8, device=dev)
        print(json.dumps({"error": "no OOM: 3 GiB fitted a 2 GiB budget"}))
    except torch.OutOfMemoryError as exc:
        print(json.dumps({"text": str(exc), "budget": budget, "total": total}))
    """
)

_FRAGMENT_SCRIPT = textwrap.dedent(
    """
    import json, torch
    dev = torch.device("cuda", 0)
    MiB = 2**20
    keep = []
    for i in range(1, 41):
        grow = torch.empty(i * 8 * MiB, dtype=torch.uint8, device=dev)  # a bit bigger each time
        keep.append(torch.empty(3 * MiB, dtype=torch.uint8, device=dev))  # pins its neighbour
        del grow
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats(dev)
    segments = torch.cuda.memory_snapshot()
    print(json.dumps({
        "allocated": torch.cuda.memory_allocated(dev),
        "reserved": torch.cuda.memory_reserved(dev),
        "peak_reserved": torch.cuda.max_memory_reserved(dev),
        "segments": len(segments),
        "cuda_mallocs": stats.get("segment.all.allocated", 0),
    }))
    """
)


def _run_script(script: str, env_extra: dict[str, str], timeout: float) -> subprocess.Popen[str]:
    env = dict(os.environ)
    for key in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env.pop(key, None)
    env.update(env_extra)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _collect(proc: subprocess.Popen[str], timeout: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (err or out).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1])


def bench_subprocesses(ctx: Context) -> list[Result]:
    """The OOM message and the two expandable-segments runs: three processes at once."""
    oom = Result("oom_message", "A real CUDA out-of-memory message, verbatim")
    frag = Result(
        "expandable_segments", "Reserved minus allocated, with and without expandable segments"
    )
    if skip := _needs_cuda(ctx, "the out-of-memory and expandable-segments runs"):
        oom.skipped = frag.skipped = skip
        return [oom, frag]
    timeout = max(20.0, min(90.0, ctx.left()))
    expandable = {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",  # the name before torch 2.9
    }
    procs = {
        "oom": _run_script(_OOM_SCRIPT, {}, timeout),
        "default": _run_script(_FRAGMENT_SCRIPT, {}, timeout),
        "expandable_segments:True": _run_script(_FRAGMENT_SCRIPT, expandable, timeout),
    }
    got = {name: _collect(proc, timeout) for name, proc in procs.items()}
    if "text" in got["oom"]:
        oom.text = got["oom"]["text"]
        oom.note = (
            f"torch.cuda.set_per_process_memory_fraction set a {format_bytes(got['oom']['budget'])}"
            f" budget on a {format_bytes(got['oom']['total'])} GPU; 512 MiB were held; "
            "torch.empty(3 GiB) raised torch.OutOfMemoryError with this message."
        )
    else:
        oom.error = got["oom"].get("error", "no message")
    frag.columns = [
        "allocator setting",
        "allocated",
        "reserved",
        "reserved - allocated",
        "peak reserved",
        "segments",
    ]
    for name in ("default", "expandable_segments:True"):
        g = got[name]
        if "error" in g:
            frag.rows.append([name, g["error"], "", "", "", ""])
            continue
        frag.rows.append(
            [
                name,
                format_bytes(g["allocated"]),
                format_bytes(g["reserved"]),
                format_bytes(g["reserved"] - g["allocated"]),
                format_bytes(g["peak_reserved"]),
                g["segments"],
            ]
        )
        frag.figures[f"{name}_unused_reserved_bytes"] = g["reserved"] - g["allocated"]
    if all("error" in got[n] for n in ("default", "expandable_segments:True")):
        frag.error = got["default"]["error"]
    frag.note = (
        "Each run in its own process: 40 times, allocate a tensor 8 MiB bigger than the last, "
        "allocate 3 MiB that stays, free the big one. PYTORCH_ALLOC_CONF (and, for torch "
        "before 2.9, PYTORCH_CUDA_ALLOC_CONF) set to expandable_segments:True in the second."
    )
    return [oom, frag]


# --------------------------------------------------------------------------- running and goals

BENCHMARKS: dict[str, Callable[[Context], Result | list[Result]]] = {
    "allocator_vs_nvml": bench_allocator_vs_nvml,
    "empty_cache": bench_empty_cache,
    "h2d_bandwidth": bench_h2d,
    "matmul_peak": bench_matmul,
    "amp_speed": bench_amp,
    "checkpointing": bench_checkpointing,
    "inference_mode": bench_inference,
    "cudnn_benchmark": bench_cudnn,
    "source_cost": bench_source_cost,
    "spike_test": bench_spikes,
    "subprocesses": bench_subprocesses,  # oom_message and expandable_segments
}

# issue 10, part 3: (benchmark key, figure, at least / at most, goal, what it means)
GOALS = [
    ("amp_speed", "bf16_vs_fp32", ">=", 2.5, "bf16 autocast step vs fp32 without TF32"),
    ("matmul_peak", "bf16_large_share_of_peak", ">=", 0.70, "bf16 8192^3 product, share of peak"),
    (
        "h2d_bandwidth",
        "pinned_share_of_large_min_16MiB",
        ">=",
        0.80,
        "pinned copies (16 MiB and up), share of a 1 GiB pinned copy",
    ),
    ("checkpointing", "activation_saving", ">=", 4.0, "activation memory saved by checkpointing"),
    ("checkpointing", "time_ratio", "<=", 1.4, "step time with checkpointing vs without"),
]


def check_goals(results: dict[str, dict], cuda: bool) -> list[dict]:
    """Each goal: met, missed (by how much), or not checked (and why)."""
    out = []
    for key, figure, op, goal, what in GOALS:
        entry = {"goal": f"{what} {op} {goal:g}", "key": key, "figure": figure}
        value = results.get(key, {}).get("figures", {}).get(figure)
        if not cuda:
            entry.update(status="not checked", why="needs CUDA (these goals are for an H200)")
        elif value is None:
            why = results.get(key, {}).get("error") or results.get(key, {}).get("skipped")
            entry.update(status="not checked", why=why or "no figure was measured")
        else:
            met = value >= goal if op == ">=" else value <= goal
            entry.update(status="met" if met else "missed", value=round(value, 4))
            if not met:
                entry["by"] = f"{abs(value - goal) / goal:.0%} {'short' if op == '>=' else 'over'}"
        out.append(entry)
    return out


def run(only: list[str] | None = None, budget_s: float = 150.0, prefer=None) -> dict:
    """Run the benchmarks (all, or ``only``) and return the results as one dict."""
    caps = devices.capabilities(prefer)
    ctx = Context(caps.device, caps, time.monotonic() + budget_s)
    names = list(BENCHMARKS) if not only else only
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}: see --list")
    results: dict[str, dict] = {}
    log: list[str] = []
    for name in names:
        if ctx.left() <= 0:
            results[name] = Result(name, skipped="skipped: the time budget ran out").as_json()
            continue
        t0 = time.monotonic()
        try:
            got = BENCHMARKS[name](ctx)
            outs = got if isinstance(got, list) else [got]
        except Exception as exc:  # one failure must not hide the other figures
            log.append(f"--- {name}\n{traceback.format_exc()}")
            outs = [Result(name, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")]
        finally:
            _free_cuda()
        for out in outs:
            out.seconds = round(time.monotonic() - t0, 2)
            results[out.key] = out.as_json()
    return {
        "device": str(caps),
        "cuda": caps.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "results": results,
        "goals": check_goals(results, caps.cuda),
        "log": "\n".join(log),
    }


def markdown(report: dict) -> str:
    """The results as markdown: one section per benchmark, then the goals."""
    lines = [f"# Benchmarks on {report['device']} (torch {report['torch']})", ""]
    for key, res in report["results"].items():
        lines.append(f"## {key}: {res.get('title', '')}".rstrip(": "))
        if res.get("skipped"):
            lines.append(res["skipped"])
        if res.get("error"):
            lines.append(f"**failed**: {res['error']}")
        if res.get("columns"):
            lines.append("| " + " | ".join(map(str, res["columns"])) + " |")
            lines.append("|" + " --- |" * len(res["columns"]))
            for row in res.get("rows", []):
                lines.append("| " + " | ".join(map(str, row)) + " |")
        if res.get("text"):
            lines += ["```", res["text"], "```"]
        if res.get("note"):
            lines.append(res["note"])
        lines.append("")
    lines += ["## Goals (issue 10)", "", "| goal | status | value |", "| --- | --- | --- |"]
    for g in report["goals"]:
        status = g["status"] + (f" by {g['by']}" if g.get("by") else "")
        detail = g.get("value", g.get("why", ""))
        lines.append(f"| {g['goal']} | {status} | {detail} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for gpu-bench.json and gpu-bench.md")
    parser.add_argument("--only", action="append", help="run only this benchmark (repeatable)")
    parser.add_argument("--budget-s", type=float, default=150.0, help="time for all of them")
    parser.add_argument("--device", default=None, help="'cpu' to run the CPU parts only")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    if not args.budget_s > 0:
        parser.error(f"--budget-s must be a positive number of seconds, not {args.budget_s}")
    report = run(args.only, args.budget_s, args.device)
    text = markdown(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-bench.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / "gpu-bench.md").write_text(text)
    print(text)
    if report["log"]:
        print(report["log"], file=sys.stderr)
    failed = [k for k, r in report["results"].items() if r.get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
