"""Will it fit? The training step's peak memory on one GPU for a decoder preset.

One job: for a ``decoder.PRESETS`` shape, a batch, a sequence length, a precision recipe, an
optimizer, activation checkpointing and ZeRO sharding over some GPUs, say how many bytes one GPU
holds at the step's peak, by category, with the headroom a real process needs beside its
tensors, and whether that fits a given GPU. ``fit_advice`` searches the knobs when it does not;
``fit_cli`` is the command line; ``fit_inputs`` reads the names people type.

How the numbers are made (nothing is allocated, at any size):

- **Model states** from the model built on ``meta``: the exact element count, times the bytes
  of the recipe (``formulas.BYTES_PER_PARAMETER``) and the optimizer's state. On a GPU Adam's
  ``step`` counters stay on the CPU. Gradients are freed between steps (``zero_grad()`` sets
  them to None by default), so the forward pass runs without them.
- **Activations** from fake tensors (``FakeTensorMode``, the same books as ``memory.estimate``):
  ONE block runs forward and backward at the real batch and sequence length, under the
  recipe's autocast and checkpointing, and what it holds is multiplied by the number of layers
  (every block is the same code on the same shapes). The embedding, final norm, output head and
  loss run once the same way, with the logits upcast to fp32 for the cross-entropy
  (``logits.float()``), as training code usually does. Inputs and labels are fake too.
- **Peak, not sum.** The step's peak is the largest of three moments: the end of the forward
  pass (every block's activations and the loss's), the start of backward (those, the head's
  gradient buffers and its weight gradients) and the end of backward (every weight gradient,
  the first block's activations and its gradient buffers). Activations are freed as gradients
  appear, so the two never peak together; measured peaks (torchtitan's, below) show the same.
- **Sharding** over ``n_gpus``: ZeRO-1 divides the optimizer state and the fp32 master weights,
  ZeRO-2 also the gradients, ZeRO-3 / FSDP also the weights (``shard_model_states``). ZeRO-3
  gathers one FSDP unit at a time, unsharded weights and their gradients: the wrapping assumed
  is torchtitan's (``fully_shard`` on each block, then on the root, which keeps the embedding,
  final norm and output head), so the largest unit is the root for Llama 8B (2 x 525 M
  parameters, untied) and a block for GPT-2. Without sharding, several GPUs are plain data
  parallelism (DDP): each holds everything, plus DDP's gradient buckets, which equal the
  gradients unless ``gradient_as_bucket_view=True`` (DDP's docstring).

What it leaves out, and says so: the optimizer step's temporaries (``foreach`` Adam), FSDP's
prefetch of the next unit, NCCL's own buffers, torch.compile and Float8 (measured peaks differ),
tensor, pipeline and context parallelism. The headroom terms (``fit_inputs.HEADROOM``) are
the CUDA context and the allocator's reserve, each with its source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from . import fit_inputs, formulas
from .decoder import PRESETS, Block, Decoder, DecoderConfig
from .fit_inputs import GB, HEADROOM, GiB, Gpu
from .units import format_bytes

__all__ = [
    "CHECKPOINTING",
    "GPUS",
    "OPTIMIZERS",
    "PRECISIONS",
    "SHARDED_BY_STAGE",
    "SHARDING",
    "FitReport",
    "shard_model_states",
    "text_form",
    "will_it_fit",
]

PRECISIONS = formulas.PRECISIONS
OPTIMIZERS = fit_inputs.OPTIMIZERS
CHECKPOINTING = tuple(fit_inputs.CHECKPOINTING)
SHARDING = fit_inputs.SHARDING
#: The cards the picture draws a line for, by name, in bytes (the makers' GB).
GPUS: dict[str, int] = {name: gb * GB for name, gb in fit_inputs.GPUS.items()}

STATES = ("weights", "gradients", "master weights", "optimizer state")
#: The categories of the bar, in order: model states, then what the step adds at its peak.
CATEGORIES = (*STATES, "DDP buckets", "gathered unit", "activations", "transient")

#: A step asking for more than this on one GPU is beyond any GPU: refused in one sentence.
ABSURD_BYTES = 2**50  # 1 PiB


@dataclass(frozen=True)
class FitReport:
    """One GPU's training memory at the step's peak, by category, for one choice of knobs.

    ``categories`` are the bytes held at the peak; ``peak_bytes`` their sum (PyTorch's
    ``max_memory_allocated``); ``headroom`` the named terms added on top (``{}`` with
    ``headroom=False``); ``total`` what the verdict compares with the GPU's memory.
    """

    preset: str
    batch: int
    seq: int
    precision: str
    optimizer: str
    checkpointing: str
    sharding: str
    n_gpus: int
    n_parameters: int
    categories: dict[str, int]
    model_states: dict[str, int]  # this GPU's share of the four states, gradients in full
    peaks: dict[str, int]  # the three moments' totals (before headroom)
    headroom: dict[str, int]
    gathered_unit: str
    formula_total: int | None
    gpu: Gpu | None = None
    seconds: float = field(default=0.0, compare=False)  # how long this answer took

    @property
    def peak_bytes(self) -> int:
        return sum(self.categories.values())

    @property
    def states_bytes(self) -> int:
        """What no batch or checkpointing change can shrink: the model states (this GPU's
        share, every gradient), DDP's buckets and ZeRO-3's gathered unit."""
        extra = self.categories["DDP buckets"] + self.categories["gathered unit"]
        return sum(self.model_states.values()) + extra

    @property
    def headroom_bytes(self) -> int:
        return sum(self.headroom.values())

    @property
    def total(self) -> int:
        return self.peak_bytes + self.headroom_bytes

    @property
    def peak_moment(self) -> str:
        return max(self.peaks, key=self.peaks.__getitem__)

    @property
    def fits(self) -> bool | None:
        return None if self.gpu is None else self.total <= self.gpu.memory_bytes

    @property
    def fits_on(self) -> tuple[str, ...]:
        return tuple(name for name, capacity in GPUS.items() if self.total <= capacity)

    @property
    def verdict(self) -> str:
        """One sentence: fits or not, the number it used and the headroom it kept."""
        kept = (
            f"peak {format_bytes(self.peak_bytes)} + headroom {format_bytes(self.headroom_bytes)}"
            if self.headroom
            else f"peak {format_bytes(self.peak_bytes)}, no headroom kept"
        )
        if self.gpu is None:
            cards = ", ".join(self.fits_on) or "none of the cards in the table"
            return f"needs {format_bytes(self.total)} per GPU ({kept}): fits on {cards}"
        word = "fits" if self.fits else "does not fit"
        where = "one" if self.n_gpus == 1 else f"each of {self.n_gpus} x"
        return (
            f"{word} on {where} {self.gpu}: needs {format_bytes(self.total)} per GPU ({kept}) "
            f"of {format_bytes(self.gpu.memory_bytes)}"
        )

    @property
    def knobs(self) -> str:
        if self.sharding != "none":
            where = f"{self.sharding} over {self.n_gpus} GPUs"
        else:
            where = "one GPU" if self.n_gpus == 1 else f"DDP over {self.n_gpus} GPUs"
        return (
            f"{self.preset} ({self.n_parameters / 1e9:.2f} B params), batch {self.batch} x "
            f"{self.seq} tokens, {self.precision}, {self.optimizer}, checkpointing "
            f"{self.checkpointing}, {where}"
        )

    def __repr__(self) -> str:
        lines = [f"FitReport({self.knobs})"]
        for name in CATEGORIES:
            if self.categories[name] or name in STATES:
                lines.append(f"  {name:<30}{format_bytes(self.categories[name]):>12}")
        at = f"peak, at the {self.peak_moment}"
        lines.append(f"  {at:<30}{format_bytes(self.peak_bytes):>12}")
        for name, nbytes in self.headroom.items():
            lines.append(f"  + {name:<28}{format_bytes(nbytes):>12}")
        lines.append(f"  {'total':<30}{format_bytes(self.total):>12}")
        if self.gathered_unit:
            lines.append(
                "  ZeRO-3 gathers one FSDP unit at a time (torchtitan's wrapping: each block, "
                f"then the root); the largest: {self.gathered_unit}"
            )
        formula = (
            format_bytes(self.formula_total)
            if self.formula_total is not None
            else f"no closed form for checkpointing {self.checkpointing}"
        )
        lines.append(f"  formula check (a sum, not a peak): {formula}")
        lines.append(f"  {self.verdict}")
        return "\n".join(lines)

    def plot(self, ax=None):
        """One stacked bar: the peak's categories, then each headroom term, and a line at the
        GPU's memory (or at each card of ``GPUS`` near the bar when no GPU was given)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(8, 2.8))
        left = 0.0
        parts = [(n, b) for n, b in self.categories.items()]
        parts += [(n, b) for n, b in self.headroom.items()]
        for name, nbytes in parts:
            gib = nbytes / GiB
            if gib > 0:
                hatch = "//" if name in self.headroom else None
                ax.barh(0, gib, left=left, label=name, hatch=hatch)
                left += gib
        biggest = self.total / GiB
        lines: dict[float, list[str]] = {}
        if self.gpu is not None:
            lines[self.gpu.memory_bytes / GiB] = [str(self.gpu)]
        else:
            for name, capacity in GPUS.items():
                lines.setdefault(capacity / GiB, []).append(name)
        holding = [c for c in lines if c >= biggest]
        xmax = max(1.15 * biggest, 1.08 * min(holding)) if holding else 1.15 * biggest
        shown = [c for c in sorted(lines) if c <= xmax]
        for i, capacity in enumerate(shown):
            ax.axvline(capacity, color="k", ls=(0, (2, 2)), lw=0.8)
            label = " / ".join(lines[capacity])
            ax.text(capacity, 0.55 + 0.15 * (i % 2), label, fontsize=7, ha="center")
        ax.set_xlim(0, xmax)
        ax.set_yticks([])
        ax.set_ylim(-0.5, 0.9)
        ax.set_xlabel("GiB on one GPU")
        word = {None: "needs", True: "fits:", False: "does not fit:"}[self.fits]
        ax.set_title(
            f"{self.preset}, batch {self.batch} x {self.seq}: {word} "
            f"{format_bytes(self.total)} per GPU",
            fontsize=9,
            wrap=True,
        )
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
        ax.figure.tight_layout()
        return ax


def _check(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, not {value!r}")


@functools.cache
def _counts(cfg: DecoderConfig) -> tuple[int, int]:
    """(parameters, one block's parameters), from a one-block model built on meta."""
    with torch.device("meta"):
        model = Decoder(cfg, n_layers=1)
        block_n = sum(p.numel() for p in model.blocks[0].parameters())
    n = sum(p.numel() for p in model.parameters()) + (cfg.n_layers - 1) * block_n
    return n, block_n


def _matmul_policy(every: int):
    """Save attention's output and every ``every``-th matmul's; recompute the rest.

    ``every=1`` keeps every matmul (norms, activation functions and adds are recomputed).
    ``every=2`` is torchtitan's selective op policy (``torchtitan/distributed/
    activation_checkpoint.py``, ``_get_custom_policy``: "Save all compute/comm ops, except
    every second mm/linear"), its count restarting in each block. torchtitan counts ``aten.mm``
    (its Llama has no biases); this counts ``addmm`` too, so a GPT-2 block is treated the same.
    The course's block computes q, k and v in one matmul where torchtitan's has three, so here
    the saved matmuls are qkv, the MLP's gate and its down projection (torchtitan's: q, v, w1,
    w2): 1024 more values per token for Llama 8B, under 4 % of the block.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    matmuls = {aten.mm.default, aten.addmm.default, aten.bmm.default}
    attention = {
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
    }
    count = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs):
        if op in attention:
            return CheckpointPolicy.MUST_SAVE
        if op in matmuls:
            mode = "recompute" if ctx.is_recompute else "forward"
            count[mode] += 1
            if (count[mode] - 1) % every == 0:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _run(module: nn.Module, x: torch.Tensor, checkpointing: str) -> torch.Tensor:
    if checkpointing == "none":
        return module(x)
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    if checkpointing == "full":
        return checkpoint(module, x, use_reentrant=False)
    every = 1 if checkpointing == "every-matmul" else 2

    def contexts():  # a fresh policy (and count) for each call, as torchtitan makes one
        return create_selective_checkpoint_contexts(_matmul_policy(every))

    return checkpoint(module, x, use_reentrant=False, context_fn=contexts)


#: The recipes whose module itself is bf16 (its activations are bf16 too).
_BF16_MODULE = ("bf16-master", "bf16-master-fp32-grads", "pure-bf16")


@dataclass(frozen=True)
class Pass:
    """One part's forward and backward on fake tensors, in bytes above what it started with.

    ``held``: kept at the end of forward (saved tensors and the output); ``forward_over``: the
    forward's peak above ``held``; ``backward_over``: backward's peak above ``held``, less the
    weight gradients (``grads``, a category of their own).
    """

    held: int
    forward_over: int
    backward_over: int
    grads: int


def _fake_pass(build, make_input, loss, precision: str, checkpointing: str) -> Pass:
    """Run ``loss(build()(make_input()))`` forward and backward on fake tensors and book it."""
    from .anatomy import _booking_fake_mode_class, _fake_model, _FakeAccountant

    acc = _FakeAccountant(torch.device("cpu"))
    with torch.device("meta"):
        module = build()
    if precision in _BF16_MODULE:
        module = module.to(torch.bfloat16)
    low = torch.bfloat16  # fp16 has the same sizes; CPU autocast takes bf16
    autocast = (
        torch.autocast("cpu", dtype=low)
        if precision.startswith("autocast")
        else contextlib.nullcontext()
    )
    with _booking_fake_mode_class()(acc):
        module = _fake_model(module, torch.device("cpu"), in_place=True)
        x = make_input()
        acc.book([*module.parameters(), x])
        with acc:
            before = acc.current
            forward = acc.open_window()
            with autocast:
                y = _run(module, x, checkpointing)  # kept: the next block's input, or the logits
                out = loss(y)
            held = acc.current - before - out.untyped_storage().nbytes()  # (not the scalar)
            forward_over = acc.window_peak(forward) - before - held
            acc.close_window(forward)
            window = acc.open_window()
            out.backward()
            grads = sum(p.grad.untyped_storage().nbytes() for p in module.parameters())
            backward_over = acc.window_peak(window) - before - held - grads
            acc.close_window(window)
            del y
    return Pass(held, max(forward_over, 0), max(backward_over, 0), grads)


def _stream_dtype(precision: str) -> torch.dtype:
    return (
        torch.float32
        if precision in ("fp32",) or precision.startswith("autocast")
        else (torch.bfloat16)
    )


@functools.lru_cache(maxsize=256)
def _activations(
    cfg: DecoderConfig, batch: int, seq: int, precision: str, checkpointing: str
) -> tuple[Pass, Pass]:
    """(one block, the embedding + head + loss), exact on fake tensors."""
    stream = _stream_dtype(precision)

    def block_input():
        return torch.empty(batch, seq, cfg.d_model, dtype=stream, requires_grad=True)

    block = _fake_pass(lambda: Block(cfg), block_input, lambda y: y.sum(), precision, checkpointing)

    def tokens():
        return torch.zeros(batch, seq, dtype=torch.long)

    head = _fake_pass(lambda: Decoder(cfg, n_layers=0), tokens, _cross_entropy, precision, "none")
    return block, head


def _cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The step's loss: logits upcast to fp32 (``logits.float()``) as training code does; the
    labels are made where the logits are (fake, under the fake mode: nothing allocated)."""
    flat = logits.flatten(0, 1)
    targets = torch.zeros(flat.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(flat.float(), targets)


def _formula_total(
    cfg: DecoderConfig, n: int, batch: int, seq: int, precision: str, states: int, ckpt: str
) -> int | None:
    """The total by formula alone, as the Playbook's widget sums it: the model states, the
    block formula times the layers (or each block's input under full checkpointing), the
    logits (16-bit and their fp32 upcast) and under autocast 2 bytes per parameter for its
    cached 16-bit weight copies. None for the matmul policies (no closed form)."""
    if ckpt not in ("none", "full"):
        return None
    e = (
        4
        if _stream_dtype(precision) == torch.float32 and not precision.startswith("autocast")
        else 2
    )
    plain = dataclasses.replace(cfg, attention="sdpa")
    layer = formulas.block_activation_bytes(plain, batch, seq, e)
    if ckpt == "full":
        acts = cfg.n_layers * batch * seq * cfg.d_model * e + layer
    else:
        acts = cfg.n_layers * layer
    logits = (e + 4) * seq * batch * cfg.vocab
    copies = 2 * n if precision.startswith("autocast") else 0
    return int(states + acts + logits + copies)


#: What each ZeRO stage divides by the number of GPUs (Rajbhandari et al., 2020).
SHARDED_BY_STAGE: dict[str, tuple[str, ...]] = {
    "none": (),
    "zero1": ("master weights", "optimizer state"),
    "zero2": ("master weights", "optimizer state", "gradients"),
    "zero3": ("master weights", "optimizer state", "gradients", "weights"),
}


def shard_model_states(states: dict[str, int], sharding: str, n_gpus: int) -> dict[str, int]:
    """One GPU's share of the model states: the categories ``sharding`` divides, over ``n_gpus``.

    ``states`` holds the unsharded bytes by category (``weights``, ``gradients``, ``master
    weights``, ``optimizer state``); the others pass through whole.

    >>> shard_model_states({"weights": 8, "gradients": 8, "optimizer state": 16}, "zero2", 2)
    {'weights': 8, 'gradients': 4, 'optimizer state': 8}
    """
    _check("sharding", sharding, SHARDING)
    if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
        raise ValueError(f"n_gpus must be a whole number >= 1, not {n_gpus!r}")
    divided = SHARDED_BY_STAGE[sharding]
    return {k: v // n_gpus if k in divided else v for k, v in states.items()}


def model_states(cfg: DecoderConfig, precision: str, optimizer: str, sharding: str, n_gpus: int):
    """This GPU's model states by category (bytes) and ZeRO-3's largest unit (bytes, name)."""
    n, block_n = _counts(cfg)
    per = formulas.BYTES_PER_PARAMETER[precision]
    states = formulas.model_state_bytes(n, precision, optimizer)
    whole = {
        "weights": states.weights,
        "gradients": states.gradients,
        "master weights": states.master,
        "optimizer state": states.optimizer_state,
    }
    shared = shard_model_states(whole, sharding, n_gpus)
    if sharding != "zero3":
        return shared, 0, ""
    root_n = n - cfg.n_layers * block_n  # embedding, positions, final norm, untied head
    unit_n, name = max(
        (root_n, "the root (embedding, final norm, output head)"), (block_n, "one block")
    )
    unit = 2 * per["weights"] * unit_n  # its weights gathered, and their gradients unsharded
    return shared, unit, f"{name}, {unit_n / 1e6:,.0f} M parameters"


def will_it_fit(
    preset: str | DecoderConfig = "llama-1b",
    batch: int = 1,
    seq: int = 2048,
    precision: str = "autocast-bf16",
    optimizer: str = "adamw",
    checkpointing: str = "none",
    sharding: str = "none",
    n_gpus: int = 1,
    *,
    gpu: str | int | Gpu | None = None,
    headroom: bool = True,
) -> FitReport:
    """One GPU's training memory at the step's peak (see the module's docstring for how).

    ``preset``: a name people use (``"Llama-3.1-8B"``, ``"gpt2"``; ``fit_inputs.MODELS``) or a
    ``DecoderConfig`` of your own. ``precision``, ``optimizer``, ``checkpointing`` and
    ``sharding`` take the names ``fit_inputs`` reads (``"bf16"``, ``"adam"``, ``"selective"``,
    ``"fsdp"``). ``gpu``: a card (``"RTX 4090"``) or a size (``"24GB"``) for the verdict.
    ``headroom=False`` leaves out the CUDA context and the allocator's reserve.
    """
    start = time.perf_counter()
    if isinstance(preset, DecoderConfig):
        cfg, label = preset, "custom decoder"
    else:
        label = fit_inputs.model(preset)
        cfg = PRESETS[label]
    precision = fit_inputs.recipe(precision)
    optimizer = fit_inputs.optimizer(optimizer)
    checkpointing = fit_inputs.checkpointing(checkpointing)
    sharding = fit_inputs.sharding(sharding)
    batch = fit_inputs.positive_int("batch", batch)
    seq = fit_inputs.positive_int("seq", seq)
    n_gpus = fit_inputs.positive_int("n_gpus", n_gpus, largest=2**20)
    if not isinstance(headroom, bool):
        raise TypeError(f"headroom must be True or False, not {headroom!r}")
    card = gpu if isinstance(gpu, Gpu) or gpu is None else fit_inputs.gpu(gpu)
    if cfg.max_positions and seq > cfg.max_positions:
        raise ValueError(
            f"{label} has {cfg.max_positions} learned positions; choose seq <= {cfg.max_positions}"
        )
    if sharding != "none" and n_gpus == 1:
        raise ValueError(
            f"{sharding} shards over several GPUs and does nothing on one: choose sharding "
            "'none', or 2 GPUs or more"
        )
    n, _ = _counts(cfg)
    plain = dataclasses.replace(cfg, attention="sdpa")
    rough = cfg.n_layers * formulas.block_activation_bytes(plain, batch, seq, 2)
    rough += 6 * batch * seq * cfg.vocab
    if rough > ABSURD_BYTES:
        raise ValueError(
            f"batch {batch:,} x seq {seq:,} needs about {format_bytes(rough)} of activations "
            "on each GPU, more than any GPU has: choose a smaller batch or sequence"
        )
    states, unit, unit_name = model_states(cfg, precision, optimizer, sharding, n_gpus)
    ddp = states["gradients"] if sharding == "none" and n_gpus > 1 else 0
    # bf16 modules hold the same activations whatever the optimizer's copies: one cache entry
    same = "bf16-master" if precision in _BF16_MODULE else precision
    block, head = _activations(cfg, batch, seq, same, checkpointing)
    L = cfg.n_layers
    forward_acts = L * block.held + head.held
    grads_share = states["gradients"]
    # At the start of backward the head's weight gradients exist in full (under ZeRO-3 they are
    # in the gathered unit). The head pass's include the embedding's, which a real step makes
    # last: counted early, a small overstatement.
    head_grads = 0 if sharding == "zero3" else head.grads
    moments = {
        # (activations, transient, weight gradients) at each moment
        "end of forward": (forward_acts, head.forward_over, 0),
        "start of backward": (forward_acts, head.backward_over, head_grads),
        "end of backward": (block.held, block.backward_over, grads_share),
    }
    fixed = states["weights"] + states["master weights"] + states["optimizer state"] + unit + ddp
    peaks = {name: fixed + sum(parts) for name, parts in moments.items()}
    at = max(peaks, key=peaks.__getitem__)
    acts, transient, grads_now = moments[at]
    categories = {
        "weights": states["weights"],
        "gradients": grads_now,
        "master weights": states["master weights"],
        "optimizer state": states["optimizer state"],
        "DDP buckets": ddp,
        "gathered unit": unit,
        "activations": acts,
        "transient": transient,
    }
    peak = sum(categories.values())
    kept = {t.name: t.bytes_for(peak) for t in HEADROOM} if headroom else {}
    formula = _formula_total(
        cfg, n, batch, seq, precision, sum(states.values()) + unit + ddp, checkpointing
    )
    return FitReport(
        label,
        batch,
        seq,
        precision,
        optimizer,
        checkpointing,
        sharding,
        n_gpus,
        n,
        categories,
        states,
        peaks,
        kept,
        unit_name,
        formula,
        card,
        seconds=time.perf_counter() - start,
    )


def text_form(**knobs) -> str:
    """The calculator for a terminal or CI: ``python -m tutorial_utils fit llama-3-8b ...``."""
    return repr(will_it_fit(**knobs))
