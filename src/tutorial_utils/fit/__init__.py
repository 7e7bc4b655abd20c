"""Will it fit? One GPU's memory at the peak of a training step, and what to change if not.

A file per job, read from the bottom up (each imports only those above it in this list):

- ``inputs``: the names people type for the knobs (``bf16``, ``adam``, ``selective``), no torch
- ``presets``: models by name (with each shape's config.json source) or by config.json, no torch
- ``cards``: GPU cards as programs see them, and sizes (``24GB``), no torch
- ``reserve_pairs``: published peak reserved / allocated pairs, each with its profile, and the
  rules that count them
- ``headroom``: the CUDA context and the allocator's reserve (one per profile), with sources
- ``shapes``: the model's ``DecoderConfig`` and its parameter counts (by formula, no torch)
- ``states``: weights, gradients, master weights, optimizer state (8-bit, LoRA, QLoRA)
- ``activations``: one block and the head on fake tensors (checkpointing, LoRA, chunked loss)
- ``litgpt_block``: litgpt 8641822's block re-created, the one ``block="litgpt"`` runs
- ``activation_formulas``: the same figures by formula, no torch (``activation_terms``, which
  ``tools/fit_activation_terms.py`` writes); the fake-tensor pass where no formula is written
- ``temporaries``: what the optimizer step allocates (foreach, fused, for-loop)
- ``kept_graph``: what a loop that keeps its logits carries into the next forward (litgpt's;
  bitsandbytes' ``MatMul4Bit`` keeps its input on the graph)
- ``profiles``: one GPU's share: DDP, ZeRO-1/2/3, FSDP1, FSDP2, and TP/PP/CP degrees
- ``report``: ``FitReport``, the answer: categories, verdict, bar
- ``peak``: ``will_it_fit``: the moments of a step and the peak
- ``advice``: the smallest changes that make it fit, each with its cost
- ``cli``: ``python -m tutorial_utils fit``; ``widget``: ``Calculator()``
- ``scope``: ``scope.table()``, the table of what it models and what it does not (notebook 03)

``from tutorial_utils import fit; fit.will_it_fit("llama-3.1-8b", gpu="H100")``. The names
below load on first use, so ``fit.inputs`` (and ``--help``) never import torch, and a
question with a formula for its activations answers without it.
"""

from __future__ import annotations

import importlib

__all__ = [
    "CATEGORIES",
    "CHECKPOINTING",
    "GPUS",
    "OPTIMIZERS",
    "OPTIMIZER_IMPLS",
    "PRECISIONS",
    "SHARDED_BY_STAGE",
    "SHARDING",
    "FitReport",
    "advise",
    "shard_model_states",
    "text_form",
    "will_it_fit",
]

#: public name -> the module of this package that defines it
_WHERE = {
    "CATEGORIES": "report",
    "FitReport": "report",
    "will_it_fit": "peak",
    "ABSURD_BYTES": "peak",
    "SHARDED_BY_STAGE": "profiles",
    "shard_model_states": "profiles",
    "GPUS": "cards",
    "GB": "cards",
    "GiB": "cards",
    "Gpu": "cards",
    "HEADROOM": "headroom",
    "STATES": "states",
    "OPTIMIZERS": "inputs",
    "OPTIMIZER_IMPLS": "inputs",
    "SHARDING": "inputs",
    "advise": "advice",
}


_MODULES = (
    "inputs",
    "presets",
    "cards",
    "reserve_pairs",
    "headroom",
    "shapes",
    "states",
    "activations",
    "litgpt_block",
    "activation_formulas",
    "temporaries",
    "kept_graph",
    "profiles",
    "report",
    "peak",
    "advice",
    "cli",
    "widget",
    "scope",
)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    if name == "PRECISIONS":
        return tuple(importlib.import_module(".inputs", __name__).RECIPES)
    if name == "CHECKPOINTING":
        return tuple(importlib.import_module(".inputs", __name__).CHECKPOINTING)
    if name == "text_form":
        return _text_form
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _text_form(**knobs) -> str:
    """The calculator for a terminal or CI: ``python -m tutorial_utils fit llama-3-8b ...``."""
    return repr(__getattr__("will_it_fit")(**knobs))
