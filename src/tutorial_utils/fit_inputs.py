"""What people type into the "will it fit" calculator, read in one place, without torch.

One job: turn the names a person uses (``Llama-3.1-8B``, ``meta-llama/Llama-3.1-8B``, ``gpt2``,
``bf16``, ``adam``, ``RTX 4090``, ``24GB``) into the calculator's own keys, or say in one
sentence what to type instead. The command line's ``--help`` and its argument errors come from
here, before torch is imported (seconds), so this module imports nothing heavy.

The GPU table gives each card's memory as its maker's spec sheet states it ("24 GB"), read as
10**9 bytes. The cards' memory chips are sized in GiB, so the card reports a little more than
that (an "80 GB" A100 reports 80 GiB): reading the spec as GB errs on the side of "does not fit".

The headroom is what a training process needs beside its tensors, as named terms with sources:

- **CUDA context**: 0.47 GiB, what the CUDA context and PyTorch's kernels took on an A100 80GB
  with PyTorch 2.1.1 and lazy module loading (0.92 GiB with ``CUDA_MODULE_LOADING=EAGER``),
  stas00/ml-engineering (``published.json``, key ``cuda_context``). It is outside PyTorch's
  allocator: ``torch.cuda.memory_reserved()`` does not count it, ``nvidia-smi`` does.
- **allocator reserve**: 5 % of the tensors' peak, kept for what the caching allocator reserves
  beyond what is allocated (rounding and fragmentation). This fraction is an assumption, not a
  published figure: the reserve depends on the order of allocations (Edward Yang, "When does
  fragmentation occur in the CUDA caching allocator?", PyTorch dev-log, 2026-06-01). Measure
  yours: ``torch.cuda.max_memory_reserved()`` against ``torch.cuda.max_memory_allocated()``.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from .units import refuse_bits

__all__ = [
    "CHECKPOINTING",
    "GPUS",
    "HEADROOM",
    "LEARNED_POSITIONS",
    "MODELS",
    "OPTIMIZERS",
    "RECIPES",
    "SHARDING",
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

GB, GiB = 10**9, 2**30

#: The course's decoder presets (``decoder.PRESETS``) and the names people give them.
MODELS: dict[str, tuple[str, ...]] = {
    "gpt2-124m": ("gpt2", "gpt-2", "gpt2-small", "openai-community/gpt2"),
    "gpt2-1.5b": ("gpt2-xl", "gpt-2-xl", "openai-community/gpt2-xl"),
    "llama-1b": ("llama-3.2-1b", "llama3.2-1b", "meta-llama/llama-3.2-1b"),
    "llama-8b": (
        "llama-3-8b",
        "llama3-8b",
        "llama-3.1-8b",
        "llama3.1-8b",
        "meta-llama/llama-3.1-8b",
        "meta-llama/meta-llama-3-8b",
        "meta-llama/meta-llama-3.1-8b",
    ),
    "llama-70b": (
        "llama-3-70b",
        "llama3-70b",
        "llama-3.1-70b",
        "llama3.1-70b",
        "meta-llama/llama-3.1-70b",
        "meta-llama/meta-llama-3-70b",
        "meta-llama/meta-llama-3.1-70b",
    ),
}

#: The presets with learned position embeddings, and how many (``decoder.PRESETS`` agrees: a
#: test checks), so the command line refuses a longer sequence before torch is imported.
LEARNED_POSITIONS = {"gpt2-124m": 1024, "gpt2-1.5b": 1024}

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

OPTIMIZERS = ("sgd", "sgd-momentum", "adamw")
_OPTIMIZER_ALIASES = {"adam": "adamw", "momentum": "sgd-momentum"}

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

SHARDING = ("none", "zero1", "zero2", "zero3")
_SHARDING_ALIASES = {
    "ddp": "none",
    "fsdp": "zero3",
    "full-shard": "zero3",
    "shard-grad-op": "zero2",
    "zero-1": "zero1",
    "zero-2": "zero2",
    "zero-3": "zero3",
}


@dataclass(frozen=True)
class Gpu:
    """A card and its memory in bytes (``name`` is what was asked for when it is a size)."""

    name: str
    memory_bytes: int

    def __str__(self) -> str:
        if self.name.endswith(" GPU"):
            return self.name
        return f"{self.name} ({self.memory_bytes / GB:g} GB)"


#: Each card's memory from its maker's spec sheet, in GB (10**9 bytes).
GPUS: dict[str, int] = {
    "T4": 16,
    "V100-16GB": 16,
    "V100-32GB": 32,
    "RTX 3090": 24,
    "RTX 4090": 24,
    "A10G": 24,
    "L4": 24,
    "RTX A6000": 48,
    "L40S": 48,
    "A100-40GB": 40,
    "A100-80GB": 80,
    "H100": 80,
    "H200": 141,
}
_GPU_ALIASES = {
    "a100": "A100-80GB",
    "a100-40": "A100-40GB",
    "a100-80": "A100-80GB",
    "h100-80gb": "H100",
    "h200-141gb": "H200",
    "3090": "RTX 3090",
    "4090": "RTX 4090",
    "a6000": "RTX A6000",
    "v100": "V100-32GB",
}


@dataclass(frozen=True)
class HeadroomTerm:
    """Memory a training process needs beside its tensors: a fixed size or a fraction of them."""

    name: str
    fixed_bytes: int
    fraction: float
    source: str

    def bytes_for(self, tensors_bytes: int) -> int:
        return self.fixed_bytes + int(self.fraction * tensors_bytes)


HEADROOM = (
    HeadroomTerm(
        "CUDA context",
        int(0.47 * GiB),
        0.0,
        "ml-engineering: 0.47 GiB on an A100 80GB, PyTorch 2.1.1, lazy module loading",
    ),
    HeadroomTerm(
        "allocator reserve",
        0,
        0.05,
        "an assumed 5 % of the tensors' peak for the caching allocator's rounding and "
        "fragmentation; measure max_memory_reserved() against max_memory_allocated()",
    ),
)


def _key(text: str) -> str:
    """'Llama 3.1 8B' and 'llama_3.1-8b' alike: lower case, spaces and underscores as '-'."""
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def _pick(what: str, value, names, aliases: dict[str, str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be text such as {next(iter(names))!r}, not {value!r}")
    by_key = {_key(n): n for n in names} | {_key(a): n for a, n in aliases.items()}
    found = by_key.get(_key(value))
    if found is None:
        raise ValueError(f"{what} {value!r} is unknown: choose one of {', '.join(names)}")
    return found


def model(name: str) -> str:
    """The preset for a model name: ``model('meta-llama/Llama-3.1-8B') == 'llama-8b'``."""
    aliases = {alias: preset for preset, names in MODELS.items() for alias in names}
    return _pick("model", name, tuple(MODELS), aliases)


def recipe(name: str) -> str:
    """``recipe('mixed') == 'bf16-master'``, ``recipe('bf16') == 'autocast-bf16'`` (Hugging Face's
    ``--bf16``); pure bf16 (8 B/param with AdamW) is ``'pure-bf16'``."""
    return _pick("precision", name, tuple(RECIPES), _RECIPE_ALIASES)


def optimizer(name: str) -> str:
    """``optimizer('adam') == 'adamw'`` (the same state: two fp32 moments per parameter)."""
    return _pick("optimizer", name, OPTIMIZERS, _OPTIMIZER_ALIASES)


def checkpointing(name: str) -> str:
    """``checkpointing('selective') == 'every-second-matmul'`` (torchtitan's default policy)."""
    return _pick("checkpointing", name, tuple(CHECKPOINTING), _CHECKPOINTING_ALIASES)


def sharding(name: str) -> str:
    """``sharding('fsdp') == 'zero3'``; ``'ddp'`` is no sharding (every GPU holds it all)."""
    return _pick("sharding", name, SHARDING, _SHARDING_ALIASES)


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgtp]i?b?|b)?\s*$", re.I)
_FACTORS = {"": GB, "b": 1}
for _i, _p in enumerate("kmgtp", start=1):
    _FACTORS |= {f"{_p}": 10 ** (3 * _i), f"{_p}b": 10 ** (3 * _i), f"{_p}ib": 2 ** (10 * _i)}


def parse_size(text) -> int:
    """``parse_size('24GB') == 24 * 10**9``, ``parse_size('80GiB') == 80 * 2**30``; a bare
    number is GB, as people say "a 24 GB card"."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise TypeError(f"a memory size must be text such as '24GB' or '80GiB', not {text!r}")
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"cannot read {text!r} as a memory size: write it like '24GB' or '80GiB'")
    refuse_bits(text, match.group(1), match.group(2) or "")  # '24Gb' is gigabits
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if unit.endswith("i"):
        unit += "b"
    size = number * _FACTORS[unit]
    if not math.isfinite(size) or size < 2**20 or size > 2**50:
        raise ValueError(
            f"{text!r} is not a GPU's memory: give a size between 1 MiB and 1 PiB, like '24GB'"
        )
    return int(size)


def gpu(text) -> Gpu:
    """A card from ``GPUS`` by name (``'RTX 4090'``, ``'a100-40gb'``) or a size (``'24GB'``)."""
    if isinstance(text, str):
        by_key = {_key(n): n for n in GPUS} | {_key(a): n for a, n in _GPU_ALIASES.items()}
        name = by_key.get(_key(text)) or by_key.get(_key(text).removeprefix("nvidia-"))
        if name:
            return Gpu(name, GPUS[name] * GB)
        if not _SIZE.match(text):
            raise ValueError(
                f"GPU {text!r} is unknown: give its memory instead (like '24GB'), or one of "
                f"{', '.join(GPUS)}"
            )
    return gpu_memory(text)


def gpu_memory(text) -> Gpu:
    """A GPU known by its memory only: ``gpu_memory('80GiB')``."""
    return Gpu(f"{str(text).strip()} GPU", parse_size(text))


def positive_int(what: str, value, largest: int = 2**31) -> int:
    """``value`` as a whole number from 1 to ``largest``, or one sentence saying what to give."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be a whole number such as 4, not {value!r}")
    if not 1 <= value <= largest:
        raise ValueError(f"{what} must be a whole number from 1 to {largest:,}, not {value:,}")
    return int(value)
