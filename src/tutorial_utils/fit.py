"""Will it fit? The training memory of one GPU for a decoder preset, exact and by formula.

One job: for a ``decoder.PRESETS`` shape, a batch, a sequence length, a precision recipe, an
optimizer, activation checkpointing and ZeRO sharding, say how many bytes each category takes
on one GPU, the formula's total beside the exact one, and on which GPUs it fits.

How the exact numbers are made (no weights are ever allocated):

- **Model states** from the model built on ``meta``: the exact element count and tensor count,
  times the bytes of the recipe (``formulas.BYTES_PER_PARAMETER``) and the optimizer's state
  (``formulas.OPTIMIZER_STATE_BYTES``). On a GPU Adam's ``step`` counters stay on the CPU.
- **Activations** from fake tensors (``FakeTensorMode``, the same books as ``memory.estimate``):
  ONE block runs forward and backward at the real batch and sequence length, under the
  recipe's autocast and checkpointing; its held bytes are multiplied by the number of layers
  (every block is the same code on the same shapes, so the product is exact for the blocks).
  The embedding, final norm, output head and loss run once, the same way, with the logits
  upcast to fp32 for the cross-entropy as training code usually does (``logits.float()``).
  A whole 8B model on fake tensors would take tens of seconds; one block takes a fraction.
- **Transient**: the largest backward overshoot of either part (gradient buffers of the block
  being differentiated, the recomputed forward under checkpointing, the logits' gradient).
- **Sharding** over ``n_gpus`` divides the exact numbers as each ZeRO stage says: ZeRO-1 the
  optimizer state and fp32 master weights, ZeRO-2 also the gradients, ZeRO-3 / FSDP also the
  weights, plus one block's weights and gradients gathered in full while it runs. Activations
  are not sharded (each GPU runs its own micro-batch). ``shard_model_states`` is that division;
  ``tests/test_sharding_scripts.py`` checks it against what each of 2 ranks holds in notebook
  08's ``zero_stages.py``, and names the two places where PyTorch's implementations part from
  the even split: ``ZeroRedundancyOptimizer`` (ZeRO-1) gives each rank whole parameters, so its
  state is uneven; FSDP2 without resharding (ZeRO-2-like) keeps each rank's shard of the
  weights beside the full copy it gathered for the step. Adam's 0-d ``step`` counters (4 bytes
  per tensor) are on every rank, not sharded.

The total is the sum of the categories: an upper bound of the real peak, since a step's
gradients appear as its activations are freed (the sum is what the Playbook's widget shows
too). Autocast fp16 is simulated with bf16 (the same bytes); CPU autocast and CUDA autocast cast
the same matmuls, but their lists of other operators differ slightly. The allocator's cache
and fragmentation (often 5-10 % on a GPU) and the CUDA context (about 0.3-1 GiB) are not in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from . import formulas
from .decoder import PRESETS, Block, Decoder, DecoderConfig
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
OPTIMIZERS = ("sgd", "sgd-momentum", "adamw")
CHECKPOINTING = ("none", "selective", "full")
SHARDING = ("none", "zero1", "zero2", "zero3")

GB, GiB = 10**9, 2**30
#: Nominal memory of each GPU (the makers' figures; what a process can use is a little less).
GPUS: dict[str, int] = {
    "T4 (15 GiB)": 15 * GiB,
    "A100 40GB": 40 * GB,
    "A100 80GB": 80 * GB,
    "H100 80GB": 80 * GB,
    "H200 141GB": 141 * GB,
}

CATEGORIES = (
    "weights",
    "gradients",
    "master weights",
    "optimizer state",
    "activations",
    "transient",
)


@dataclass(frozen=True)
class FitReport:
    """One GPU's training memory for one choice of every knob, in bytes by category."""

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
    formula_total: int
    seconds: float = field(default=0.0, compare=False)  # how long this answer took

    @property
    def total(self) -> int:
        return sum(self.categories.values())

    @property
    def fits_on(self) -> tuple[str, ...]:
        return tuple(name for name, capacity in GPUS.items() if self.total <= capacity)

    @property
    def verdict(self) -> str:
        fits = self.fits_on
        if not fits:
            return f"fits on none of {', '.join(GPUS)}: shard it, checkpoint, or shrink the batch"
        missing = [name for name in GPUS if name not in fits]
        tail = f"; not on {', '.join(missing)}" if missing else ""
        return f"fits on {', '.join(fits)}{tail}"

    @property
    def knobs(self) -> str:
        shard = "no sharding" if self.sharding == "none" else f"{self.sharding} over {self.n_gpus}"
        return (
            f"{self.preset} ({self.n_parameters / 1e9:.2f} B params), batch {self.batch} x "
            f"{self.seq} tokens, {self.precision}, {self.optimizer}, checkpointing "
            f"{self.checkpointing}, {shard}"
        )

    def __repr__(self) -> str:
        lines = [f"FitReport({self.knobs})"]
        for name in CATEGORIES:
            lines.append(f"  {name:<16}{format_bytes(self.categories[name]):>12}")
        lines.append(f"  {'total (exact)':<16}{format_bytes(self.total):>12}")
        lines.append(f"  {'total (formula)':<16}{format_bytes(self.formula_total):>12}")
        lines.append(f"  {self.verdict}")
        return "\n".join(lines)

    def plot(self, ax=None):
        """One stacked bar of the categories, with a line at each GPU's capacity.

        The axis ends a little past the bigger bar or at the first GPU that holds it, so a
        small model's bar is not a sliver beside a 141 GB line; GPUs of the same capacity share
        one line.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(8, 2.8))
        left = 0.0
        for name in CATEGORIES:
            gib = self.categories[name] / GiB
            if gib > 0:
                ax.barh(0, gib, left=left, label=name)
                left += gib
        ax.barh(1, self.formula_total / GiB, color="0.6", label="formula total")
        biggest = max(self.total, self.formula_total) / GiB
        lines: dict[float, list[str]] = {}
        for name, capacity in GPUS.items():
            lines.setdefault(capacity / GiB, []).append(name)
        holding = [c for c in lines if c >= biggest]
        xmax = max(1.15 * biggest, 1.08 * min(holding)) if holding else 1.15 * biggest
        shown = [c for c in sorted(lines) if c <= xmax]
        for i, capacity in enumerate(shown):
            ax.axvline(capacity, color="k", ls=(0, (2, 2)), lw=0.8)
            label = " / ".join(lines[capacity])
            ax.text(capacity, 1.45 - 0.18 * (i % 2), label, fontsize=7, ha="center")
        ax.set_xlim(0, xmax)
        ax.set_yticks([0, 1], ["exact", "formula"])
        ax.set_ylim(-0.5, 1.7)
        ax.set_xlabel("GiB on one GPU")
        ax.set_title(self.verdict, fontsize=9)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
        ax.figure.tight_layout()
        return ax


def _check(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, not {value!r}")


@functools.cache
def _counts(cfg: DecoderConfig) -> tuple[int, int, int, int]:
    """(parameters, parameter tensors, one block's parameters, its tensors), built on meta."""
    with torch.device("meta"):
        model = Decoder(cfg, n_layers=1)
        block = model.blocks[0]
        block_n = sum(p.numel() for p in block.parameters())
        block_t = len(list(block.parameters()))
    n = sum(p.numel() for p in model.parameters()) + (cfg.n_layers - 1) * block_n
    t = len(list(model.parameters())) + (cfg.n_layers - 1) * block_t
    return n, t, block_n, block_t


def _selective_policy():
    """Save what matrix multiplies make; recompute the rest (norms, activations, adds)."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten.bmm.default}
    save |= {aten._scaled_dot_product_flash_attention_for_cpu.default}

    def policy(ctx, op, *args, **kwargs):
        if op in save:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _run(module: nn.Module, x: torch.Tensor, checkpointing: str) -> torch.Tensor:
    if checkpointing == "none":
        return module(x)
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    if checkpointing == "full":
        return checkpoint(module, x, use_reentrant=False)
    policy = _selective_policy()
    return checkpoint(
        module,
        x,
        use_reentrant=False,
        context_fn=functools.partial(create_selective_checkpoint_contexts, policy),
    )


def _fake_pass(build, make_input, loss, precision: str, checkpointing: str) -> tuple[int, int]:
    """(bytes held at the end of forward, largest overshoot in backward) on fake tensors.

    The overshoot is backward's peak above what forward held, less the parameters' gradients
    (their own category), so at most what it says: gradient buffers and recomputation.
    """
    from .anatomy import _booking_fake_mode_class, _fake_model, _FakeAccountant

    acc = _FakeAccountant(torch.device("cpu"))
    with torch.device("meta"):
        module = build()
    if precision == "bf16-master":
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
            with autocast:
                y = _run(module, x, checkpointing)  # kept: the next block's input, or the logits
                out = loss(y)
            held = acc.current - before - out.untyped_storage().nbytes()  # (not the scalar)
            window = acc.open_window()
            out.backward()
            # The parameters' gradients are a category of their own: not counted again here.
            grads = sum(p.grad.untyped_storage().nbytes() for p in module.parameters())
            overshoot = acc.window_peak(window) - held - grads
            acc.close_window(window)
            del y
    return held, max(overshoot, 0)


@functools.lru_cache(maxsize=256)
def _activations(
    cfg: DecoderConfig, batch: int, seq: int, precision: str, checkpointing: str
) -> tuple[int, int, int, int]:
    """(one block held, its backward overshoot, head+loss held, its overshoot), exact."""
    stream = torch.bfloat16 if precision == "bf16-master" else torch.float32

    def block_input():
        return torch.empty(batch, seq, cfg.d_model, dtype=stream, requires_grad=True)

    block = _fake_pass(lambda: Block(cfg), block_input, lambda y: y.sum(), precision, checkpointing)

    def tokens():
        return torch.zeros(batch, seq, dtype=torch.long)

    targets = torch.zeros(batch * seq, dtype=torch.long)  # (real, tiny: the loss's labels)

    head = _fake_pass(
        lambda: Decoder(cfg, n_layers=0), tokens, _cross_entropy(targets), precision, "none"
    )
    return (*block, *head)


def _cross_entropy(targets: torch.Tensor):
    """The loss of the step: logits upcast to fp32 (``logits.float()``), as training code does."""

    def loss(logits):
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.to(logits.device))

    return loss


def _formula_total(
    cfg: DecoderConfig,
    n: int,
    batch: int,
    seq: int,
    precision: str,
    optimizer: str,
    checkpointing: str,
    sharding: str,
    n_gpus: int,
) -> int:
    """The same total by formula alone: bytes per parameter, the block formula, 4*s*b*v, and
    under autocast 2 bytes per parameter for the cached bf16 weight copies. No transient."""
    states = formulas.model_state_bytes(n, precision, "adam" if optimizer == "adamw" else optimizer)
    weights, grads, master, state = (
        states.weights,
        states.gradients,
        states.master,
        states.optimizer_state,
    )
    if sharding in ("zero1", "zero2", "zero3"):
        master, state = master / n_gpus, state / n_gpus
    if sharding in ("zero2", "zero3"):
        grads = grads / n_gpus
    if sharding == "zero3":
        weights = weights / n_gpus
    e = 4 if precision == "fp32" else 2
    plain = dataclasses.replace(cfg, attention="sdpa")
    try:
        layer = formulas.block_activation_bytes(plain, batch, seq, e)
    except ValueError:
        layer = 0
    if checkpointing == "full":
        acts = cfg.n_layers * batch * seq * cfg.d_model * e + layer
    elif checkpointing == "selective":  # Korthikanti's selective recomputation: keep 34 sbh
        acts = cfg.n_layers * 34 * seq * batch * cfg.d_model * e // 2
    else:
        acts = cfg.n_layers * layer
    logits = (e + 4) * seq * batch * cfg.vocab  # the logits, and their fp32 upcast for the loss
    # autocast caches a bf16 copy of every weight a matmul uses, held until backward ends
    copies = 2 * n if precision.startswith("autocast") else 0
    return int(weights + grads + master + state + acts + logits + copies)


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


def will_it_fit(
    preset: str | DecoderConfig = "llama-1b",
    batch: int = 1,
    seq: int = 2048,
    precision: str = "autocast-bf16",
    optimizer: str = "adamw",
    checkpointing: str = "none",
    sharding: str = "none",
    n_gpus: int = 1,
) -> FitReport:
    """One GPU's training memory by category (see the module's docstring for how).

    ``preset``: a name of ``decoder.PRESETS`` or a ``DecoderConfig`` of your own.
    """
    start = time.perf_counter()
    if isinstance(preset, DecoderConfig):
        cfg, label = preset, "custom decoder"
    else:
        _check("preset", preset, PRESETS)
        cfg, label = PRESETS[preset], preset
    _check("precision", precision, PRECISIONS)
    _check("optimizer", optimizer, OPTIMIZERS)
    _check("checkpointing", checkpointing, CHECKPOINTING)
    _check("sharding", sharding, SHARDING)
    for name, value in (("batch", batch), ("seq", seq), ("n_gpus", n_gpus)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    if cfg.max_positions and seq > cfg.max_positions:
        raise ValueError(
            f"{label} has {cfg.max_positions} learned positions; choose seq <= {cfg.max_positions}"
        )
    if sharding == "none" and n_gpus != 1:
        raise ValueError("n_gpus > 1 needs a sharding stage (zero1, zero2 or zero3)")
    n, _tensors, block_n, _ = _counts(cfg)
    per = formulas.BYTES_PER_PARAMETER[precision]
    weights, grads, master = (per["weights"] * n, per["gradients"] * n, per["master"] * n)
    state = formulas.OPTIMIZER_STATE_BYTES["adam" if optimizer == "adamw" else optimizer] * n
    sharded = shard_model_states(
        {
            "weights": weights,
            "gradients": grads,
            "master weights": master,
            "optimizer state": state,
        },
        sharding,
        n_gpus,
    )
    weights, grads = sharded["weights"], sharded["gradients"]
    master, state = sharded["master weights"], sharded["optimizer state"]
    gathered = 0
    if sharding == "zero3":
        gathered = (per["weights"] + per["gradients"]) * block_n  # one block unsharded
    block_held, block_over, head_held, head_over = _activations(
        cfg, batch, seq, precision, checkpointing
    )
    categories = {
        "weights": weights,
        "gradients": grads,
        "master weights": master,
        "optimizer state": state,
        "activations": cfg.n_layers * block_held + head_held,
        "transient": max(block_over, head_over) + gathered,
    }
    formula = _formula_total(
        cfg, n, batch, seq, precision, optimizer, checkpointing, sharding, n_gpus
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
        formula,
        seconds=time.perf_counter() - start,
    )


def text_form(**knobs) -> str:
    """The calculator for a terminal or CI: ``python -m tutorial_utils.fit llama-8b ...``."""
    return repr(will_it_fit(**knobs))


def main(argv: list[str] | None = None) -> int:
    """``python -m tutorial_utils.fit PRESET [--batch ...]``: the text form, or one sentence
    saying what is wrong with the arguments (exit status 2)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils.fit", description="Will it fit? One GPU's training memory."
    )
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--precision", choices=PRECISIONS, default="autocast-bf16")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    parser.add_argument("--checkpointing", choices=CHECKPOINTING, default="none")
    parser.add_argument("--sharding", choices=SHARDING, default="none")
    parser.add_argument("--n-gpus", type=int, default=1)
    a = parser.parse_args(argv)
    knobs = {k: getattr(a, k) for k in ("preset", "batch", "seq", "precision", "optimizer")}
    knobs |= {"checkpointing": a.checkpointing, "sharding": a.sharding, "n_gpus": a.n_gpus}
    try:
        print(text_form(**knobs))
    except ValueError as exc:
        print(f"fit: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
