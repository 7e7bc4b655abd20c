"""What people type into the calculator, read in one place, without torch.

One job: turn the names a person uses for the knobs (``bf16``, ``adam``, ``foreach``,
``selective``, ``fsdp2``) into the calculator's own keys, or say in one sentence what to type
instead, with "did you mean" for a near miss. Models are read in ``presets``, cards in
``cards``. The command line's ``--help`` and its argument errors come from these modules
before torch is imported (seconds), so nothing here imports anything heavy.
"""

from __future__ import annotations

import difflib
import numbers
import re

__all__ = [
    "CHECKPOINTING",
    "BLOCKS",
    "LORA_TARGETS",
    "OPTIMIZERS",
    "OPTIMIZER_IMPLS",
    "RECIPES",
    "SHARDING",
    "block",
    "checkpointing",
    "flag",
    "lora_targets",
    "optimizer",
    "optimizer_impl",
    "pick",
    "positive_int",
    "recipe",
    "sharding",
]

#: Precision recipes: how weights, gradients and optimizer state are stored (bytes per
#: parameter in ``formulas.BYTES_PER_PARAMETER``), each with what it is called.
RECIPES: dict[str, str] = {
    "fp32": "fp32 weights, gradients and optimizer state (16 B/param with AdamW)",
    "autocast-bf16": "fp32 states, bf16 autocast for the matmuls (16 B/param + bf16 copies)",
    "autocast-fp16": "fp32 states, fp16 autocast for the matmuls (16 B/param + fp16 copies)",
    "bf16-master": "bf16 weights and gradients, fp32 master weights and AdamW (16 B/param)",
    "bf16-master-fp32-grads": (
        "bf16 weights, fp32 gradient accumulation, fp32 master and AdamW (DeepSpeed's 18 B/param)"
    ),
    "pure-bf16": "weights, gradients and AdamW state all bf16 (8 B/param)",
}
#: "bf16" and "fp16" are read as mixed precision with autocast over fp32 weights, the way
#: Hugging Face's Trainer trains with ``bf16=True`` (Transformers docs, "Mixed precision
#: training": fp32 weights for the optimizer, the forward under autocast). "mixed" is the
#: bf16 weights + fp32 master recipe (Megatron, DeepSpeed, FSDP's MixedPrecisionPolicy).
#: The answer says how it read them.
_RECIPE_ALIASES = {
    "bf16": "autocast-bf16",
    "bfloat16": "autocast-bf16",
    "amp": "autocast-bf16",
    "autocast": "autocast-bf16",
    "fp16": "autocast-fp16",
    "float16": "autocast-fp16",
    "float32": "fp32",
    "mixed": "bf16-master",
    "bf16-mixed": "bf16-master",
    "deepspeed": "bf16-master-fp32-grads",
}

#: The optimizers, by the state they keep per trainable parameter: SGD none, SGD with momentum
#: one buffer, AdamW two moments; bitsandbytes' 8-bit AdamW keeps the two moments in one byte
#: each plus one fp32 scale per block of 256 (``bnb.optim.AdamW8bit``, block-wise
#: quantization, Dettmers et al. 2022); the paged variant keeps the moments of its large
#: tensors in CUDA unified memory, which the driver pages to the CPU when the GPU runs short
#: (``states.bnb_adamw_bytes``). ``paged-adamw`` is bitsandbytes' 32-bit ``PagedAdamW``: fp32
#: moments whatever the weights' dtype, paged the same way (litgpt's QLoRA, torchtune's
#: low-memory full fine-tune).
OPTIMIZERS = ("sgd", "sgd-momentum", "adamw", "adamw8bit", "paged-adamw8bit", "paged-adamw")
_OPTIMIZER_ALIASES = {
    "adam": "adamw",
    "momentum": "sgd-momentum",
    "adam8bit": "adamw8bit",
    "adamw-8bit": "adamw8bit",
    "bnb-adamw8bit": "adamw8bit",
    "pagedadamw8bit": "paged-adamw8bit",
    "paged-adamw-8bit": "paged-adamw8bit",
    "paged-adamw32bit": "paged-adamw",
    "bnb-paged-adamw": "paged-adamw",
}

#: How ``torch.optim`` runs the step (``foreach=``, ``fused=``). ``default`` is what torch
#: picks when neither is given: on CUDA, foreach (``torch/optim/optimizer.py``,
#: ``_default_to_fused_or_foreach``: fused only when asked, foreach when every parameter is on
#: a CUDA/XPU device), in torch 2.4 to 2.13.
OPTIMIZER_IMPLS = ("foreach", "fused", "forloop")
_IMPL_ALIASES = {"default": "foreach", "for-loop": "forloop", "single-tensor": "forloop"}

#: Activation checkpointing policies, named for what each keeps for backward.
CHECKPOINTING: dict[str, str] = {
    "none": "keep every activation",
    "full": "keep each block's input only; recompute the block in backward",
    "every-matmul": "keep every matmul's and attention's output; recompute the rest",
    "every-second-matmul": (
        "keep attention's output and every second matmul's (torchtitan's selective op policy)"
    ),
}
_CHECKPOINTING_ALIASES = {
    "no": "none",
    "off": "none",
    "selective": "every-second-matmul",
    "selective-op": "every-second-matmul",
    "torchtitan": "every-second-matmul",
}

#: How the model states are spread over the data-parallel GPUs (``profiles`` says what each
#: keeps). ``zero3`` is also what ``fsdp`` has always meant here (per-unit gathering).
SHARDING = ("none", "zero1", "zero2", "zero3", "fsdp1", "fsdp1-grad-op", "fsdp2")
_SHARDING_ALIASES = {
    "ddp": "none",
    "fsdp": "zero3",
    "full-shard": "fsdp1",
    "fsdp1-full-shard": "fsdp1",
    "shard-grad-op": "fsdp1-grad-op",
    "fsdp1-shard-grad-op": "fsdp1-grad-op",
    "fully-shard": "fsdp2",
    "zero-1": "zero1",
    "zero-2": "zero2",
    "zero-3": "zero3",
}

#: Whose block the activations are of: the course's (``decoder.Block``: what torchtune's and
#: torchtitan's blocks save) or litgpt 8641822's (``fit.litgpt_block``: it saves more).
BLOCKS = ("course", "litgpt")
_BLOCK_ALIASES = {"torchtune": "course", "torchtitan": "course", "lit-gpt": "litgpt"}

#: Which linear layers LoRA adapts: q and v (Hugging Face PEFT's and litgpt's default for
#: Llama, torchtune's ``lora_attn_modules=['q_proj', 'v_proj']``), the four attention
#: projections (q, k, v, output), or those and the MLP (``apply_lora_to_mlp``).
LORA_TARGETS = ("qv", "attention", "all")
_LORA_ALIASES = {
    "q-v": "qv",
    "attn": "attention",
    "qkvo": "attention",
    "all-linear": "all",
    "mlp": "all",
}


def key(text: str) -> str:
    """'Llama 3.1 8B' and 'llama_3.1-8b' alike: lower case, spaces and underscores as '-'."""
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def pick(what: str, value, names, aliases: dict[str, str]) -> str:
    """``value`` read as one of ``names`` (or an alias), or one sentence naming the choices and
    the nearest one ("did you mean")."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be text such as {next(iter(names))!r}, not {value!r}")
    by_key = {key(n): n for n in names} | {key(a): n for a, n in aliases.items()}
    found = by_key.get(key(value))
    if found is None:
        near = difflib.get_close_matches(key(value), list(by_key), n=1, cutoff=0.6)
        hint = f"did you mean {by_key[near[0]]!r}? " if near else ""
        shown = ", ".join(names) if len(names) <= 12 else f"{', '.join(list(names)[:12])}, ..."
        raise ValueError(f"{what} {value!r} is unknown: {hint}choose one of {shown}")
    return found


def recipe(name: str) -> str:
    """``recipe('mixed') == 'bf16-master'``, ``recipe('bf16') == 'autocast-bf16'`` (Hugging Face's
    ``--bf16``); pure bf16 (8 B/param with AdamW) is ``'pure-bf16'``."""
    return pick("precision", name, tuple(RECIPES), _RECIPE_ALIASES)


def optimizer(name: str) -> str:
    """``optimizer('adam') == 'adamw'`` (the same state: two fp32 moments per parameter)."""
    return pick("optimizer", name, OPTIMIZERS, _OPTIMIZER_ALIASES)


def optimizer_impl(name: str) -> str:
    """``optimizer_impl('default') == 'foreach'`` (what torch picks on CUDA)."""
    return pick("optimizer implementation", name, OPTIMIZER_IMPLS, _IMPL_ALIASES)


def checkpointing(name: str) -> str:
    """``checkpointing('selective') == 'every-second-matmul'`` (torchtitan's default policy)."""
    return pick("checkpointing", name, tuple(CHECKPOINTING), _CHECKPOINTING_ALIASES)


def sharding(name: str) -> str:
    """``sharding('fsdp') == 'zero3'``; ``'ddp'`` is no sharding (every GPU holds it all)."""
    return pick("sharding", name, SHARDING, _SHARDING_ALIASES)


def block(name: str) -> str:
    """``block('lit-gpt') == 'litgpt'``: whose block the activations are of (``BLOCKS``)."""
    return pick("block", name, BLOCKS, _BLOCK_ALIASES)


def lora_targets(name: str) -> str:
    """``lora_targets('all-linear') == 'all'``."""
    return pick("LoRA targets", name, LORA_TARGETS, _LORA_ALIASES)


def positive_int(what: str, value, largest: int = 2**31) -> int:
    """``value`` as a whole number from 1 to ``largest``, or one sentence saying what to give."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be a whole number such as 4, not {value!r}")
    if not 1 <= value <= largest:
        raise ValueError(f"{what} must be a whole number from 1 to {largest:,}, not {value:,}")
    return int(value)


def flag(what: str, value) -> bool:
    """``value`` as a switch: True or False only (1, "yes" or None are refused in one sentence)."""
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, not {value!r}")
    return value
