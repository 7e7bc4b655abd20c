"""Old import path of the calculator's input readers: now ``fit.inputs``, ``fit.presets``,
``fit.cards`` and ``fit.headroom`` (re-exported here; no torch)."""

from __future__ import annotations

from .fit.cards import GB, GPUS, GiB, Gpu, gpu, gpu_memory, parse_size
from .fit.headroom import HEADROOM, HeadroomTerm
from .fit.inputs import (
    CHECKPOINTING,
    OPTIMIZERS,
    RECIPES,
    SHARDING,
    checkpointing,
    optimizer,
    positive_int,
    recipe,
    sharding,
)
from .fit.presets import MODELS, model

#: The presets with learned position embeddings, and how many.
LEARNED_POSITIONS = {"gpt2-124m": 1024, "gpt2-1.5b": 1024}

__all__ = [
    "CHECKPOINTING",
    "GB",
    "GPUS",
    "HEADROOM",
    "LEARNED_POSITIONS",
    "MODELS",
    "OPTIMIZERS",
    "RECIPES",
    "SHARDING",
    "GiB",
    "Gpu",
    "HeadroomTerm",
    "checkpointing",
    "gpu",
    "gpu_memory",
    "model",
    "optimizer",
    "parse_size",
    "positive_int",
    "recipe",
    "sharding",
]
