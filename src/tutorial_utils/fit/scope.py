"""What the calculator models and what it leaves out, as one table read from the package.

One job: notebook 03's calculator section shows ``table()``. Each row is built from the constant
or signature that decides it (``inputs``' choices, ``will_it_fit``'s keyword knobs, ``cards``'
sources, ``headroom``'s terms, ``report.COMPILE_BAND``), so the table changes when the calculator
does: the moments are asked of a toy decoder. ``tests/test_fit_scope.py`` holds the rest (the
knobs' words, the published misses) to the calculator and to ``tests/test_fit_published.py``.
"""

from __future__ import annotations

import html
import inspect
from dataclasses import dataclass

from ..decoder_config import DecoderConfig
from . import cards, inputs, presets, reserve_pairs
from .headroom import ASSUMED_RESERVE, CONTEXT, RESERVES
from .peak import will_it_fit
from .report import COMPILE_BAND

__all__ = ["KNOB_WORDS", "Scope", "moments", "table"]

#: What each keyword knob of ``will_it_fit`` is called in words (a new knob shows by its name).
KNOB_WORDS = {
    "optimizer_impl": "the step as foreach, fused or for-loop",
    "lora_rank": "LoRA",
    "lora_base": "QLoRA (an NF4 base)",
    "lora_dropout": "LoRA dropout",
    "nf4_chunk": "QLoRA's quantizing chunk",
    "nf4_double_quant": "NF4 with or without double quantization",
    "logits_kept": "a loop that keeps the last logits (and graph)",
    "ce_chunks": "chunked cross-entropy",
    "activation_offload": "activation offload",
    "cpu_offload": "CPU offload of the sharded states",
    "optimizer_in_backward": "the optimizer step in backward",
    "grad_accumulation": "gradient accumulation",
    "tp": "a TP degree (with SP)",
    "pp": "a PP degree (1F1B)",
    "cp": "a CP degree",
    "reshard_after_forward": "FSDP2's reshard_after_forward",
    "reduce_dtype": "FSDP2's reduce dtype",
    "gradient_sync": "FSDP1's no_sync on all but the last micro-batch",
    "block": "litgpt's block (8641822) or the course's (torchtune's and torchtitan's)",
}
#: Knobs that say how to ask, not what is modelled: not rows of the table.
_NOT_KNOBS = ("gpu", "headroom", "lora_targets", "pp_microbatches")


@dataclass(frozen=True)
class Scope:
    """Rows of (what, how), first what the calculator models, then what it does not."""

    modelled: tuple[tuple[str, str], ...]
    not_modelled: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        width = max(len(what) for what, _ in self.modelled + self.not_modelled) + 2
        lines = ["What the calculator models:"]
        lines += [f"  {what:<{width}}{how}" for what, how in self.modelled]
        lines.append("What it does not:")
        lines += [f"  {what:<{width}}{how}" for what, how in self.not_modelled]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = []
        for head, group in (("models", self.modelled), ("does not model", self.not_modelled)):
            rows.append(
                f"<tr><th colspan='2' style='text-align:left'>The calculator {head}</th></tr>"
            )
            rows += [
                f"<tr><td style='text-align:left'>{html.escape(what)}</td>"
                f"<td style='text-align:left'>{html.escape(how)}</td></tr>"
                for what, how in group
            ]
        return "<table>" + "".join(rows) + "</table>"


def _knobs() -> str:
    params = inspect.signature(will_it_fit).parameters.values()
    names = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in _NOT_KNOBS]
    return "; ".join(KNOB_WORDS.get(name, name) for name in names)


def moments() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The moments a report weighs, asked of a toy decoder: those of every step, and those only
    QLoRA adds (the moment its base is loaded, where the package models one)."""
    toy = DecoderConfig(vocab=64, d_model=32, n_layers=1, n_heads=4)
    every = tuple(will_it_fit(toy, batch=1, seq=8).peaks)
    qlora = will_it_fit(toy, batch=1, seq=8, precision="pure-bf16", lora_rank=2, lora_base="nf4")
    return every, tuple(m for m in qlora.peaks if m not in every)


def table() -> Scope:
    """The table, read from the package as it is now."""
    reported = [name for name, card in cards.CARDS.items() if card.reported_mib]
    sourced = {p: t for p, t in RESERVES.items() if t.band is not None}
    assumed = [reserve_pairs.PROFILES[p] for p, t in RESERVES.items() if t.band is None]
    low, high = COMPILE_BAND
    every, only_qlora = moments()
    qlora = f"; under QLoRA also {', '.join(only_qlora)}" if only_qlora else ""
    modelled = (
        ("the peak", f"the largest moment of the step: {', '.join(every)}{qlora}"),
        (
            "model states",
            f"{len(inputs.RECIPES)} precision recipes; {', '.join(inputs.OPTIMIZERS)}",
        ),
        (
            "activations",
            "per block and head, to the byte: formulas checked against one block on fake "
            "tensors, or that pass itself where no formula is written; checkpointing "
            f"{', '.join(inputs.CHECKPOINTING)}",
        ),
        ("profiles", f"{', '.join(inputs.SHARDING)} (none: one GPU, or DDP)"),
        ("knobs", _knobs()),
        ("models", f"{len(presets.PRESETS)} presets, or a Hugging Face config.json"),
        (
            "cards",
            f"{len(reported)} of {len(cards.CARDS)} at the total nvidia-smi reports "
            f"({', '.join(reported)}); the rest at their spec sheet, labelled",
        ),
        (CONTEXT.name, "a fixed term: its figure and source in notebook 00, section 3"),
        *(
            (f"allocator reserve, {reserve_pairs.PROFILES[p]}", t.source)
            for p, t in sourced.items()
        ),
    )
    not_modelled = (
        (
            "torch.compile, Float8",
            f"eager mode only: published compiled runs peaked at {low:.0%} to {high:.0%} of "
            "the same run in eager mode, shown as a band (FitReport.compile_band)",
        ),
        (
            "allocator reserve, other profiles",
            f"an ASSUMED {ASSUMED_RESERVE:.0%} of the tensors' peak under "
            f"{', '.join(assumed[:-1])} and {assumed[-1]}: "
            "no published pair of max_memory_reserved and max_memory_allocated counts for "
            "them (fit.reserve_pairs); measure yours",
        ),
        (
            "some QLoRA and FSDP1 runs",
            "published peaks more than 10 % off the answer: QLoRA's above it; FSDP1's reserved "
            "peaks below it, where FSDP1's reserve (its pairs' median) is more than the run "
            "kept: tests/test_fit_published.py names the term each one lacks",
        ),
        (
            "paged AdamW (8-, 32-bit)",
            "the moments of tensors of 100,000 elements or more are CUDA unified memory, "
            "outside PyTorch's allocator: not in the peak (the note says how much)",
        ),
        ("other models", "encoder-decoders, mixtures of experts: not the decoder family"),
    )
    return Scope(modelled, not_modelled)
