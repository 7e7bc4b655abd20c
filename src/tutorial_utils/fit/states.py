"""The model states: weights, gradients, master weights and optimizer state, whole.

One job: the bytes of each category for the whole model (no sharding: ``profiles`` divides
them), for a precision recipe, an optimizer, and LoRA or QLoRA when only adapters train.

- Full training: ``formulas.model_state_bytes`` (bytes per parameter of the recipe, the
  optimizer's fp32 moments; Adam's ``step`` counters stay on the CPU on a GPU).
- 8-bit AdamW (bitsandbytes ``AdamW8bit``, ``PagedAdamW8bit``; ``Optimizer2State.init_state``
  in ``bitsandbytes/optim/optimizer.py``, read at 0.41.1 = 18e827d6 and 0.50.1 = 37d2a938):
  each moment one byte per element and one fp32 absmax per block of ``ADAMW8BIT_BLOCK``
  elements (block-wise quantization), for each tensor of ``MIN_8BIT_SIZE`` elements or more;
  smaller tensors keep fp32 moments. One signed and one unsigned quantization map (256 fp32
  each, ``fill_qmap`` at construction, moved once per device and shared by every tensor) make
  ``QMAPS`` bytes per optimizer. ``paged-adamw8bit`` allocates a moment of ``PAGED_MIN``
  elements or more in CUDA unified memory (``get_state_buffer``: ``F.get_paged``, outside
  PyTorch's caching allocator, paged to the CPU by the driver under pressure); its absmax,
  the maps and the smaller tensors' moments stay in PyTorch's allocator and count. Sharded,
  the profiles divide these bytes by the ranks (each rank's optimizer sees its shards: the
  thresholds and the last block's rounding then move by under a block per tensor).
  ``paged-adamw`` (32-bit ``PagedAdamW``) keeps two fp32 moments per element whatever the
  weights' dtype, paged by the same rule, and no maps. ``tests/test_fit_8bit.py`` holds this
  to the byte against a replay of the library's allocations and, where bitsandbytes is
  installed, against the library itself.
- LoRA (``lora_rank``): the base is frozen (its weights only, in the recipe's weight dtype, or
  NF4 under QLoRA) and the adapters train: A (r x in) and B (out x r) per adapted linear.
  NF4 (torchao's ``NF4Tensor``, as torchtune's QLoRA): 4 bits per weight, one int8 scale per
  block of 64 and one fp32 factor per 256 such scales: 0.5 + 1/64 + 1/4096 bytes per weight,
  for the blocks' linear weights; the embedding, norms and head stay in the recipe's dtype.
  ``bnb-nf4`` (bitsandbytes' ``Linear4bit`` with double quantization, as litgpt's
  ``--quantize bnb.nf4-dq``): the same bytes (a uint8 absmax per 64, an fp32 one per 256 of
  those), and Lightning's ``BitsandbytesPrecision`` replaces every ``nn.Linear``, so an untied
  head is NF4 too. Without double quantization (``Lora.double_quant=False``, litgpt's
  ``--quantize bnb.nf4``: Lightning's ``_NF4Linear`` passes ``compress_statistics=False``)
  ``quantize_4bit`` keeps each block's absmax as it made it, one fp32 per 64 weights
  (bitsandbytes 0.41.0 and 0.42.0, ``functional.py``): 0.5 + 4/64 bytes per weight.
- Loading a QLoRA base (``nf4_load_bytes``): the checkpoint's bf16 weights are quantized on the
  GPU one linear at a time, so beside the whole model's states there is, for the largest linear,
  its bf16 copy (2 B/weight), its old NF4 storage until the new one replaces it, and the
  quantizer's scratch (``nf4_quantize_bytes``). torchtune's ``load_state_dict`` copies into an
  ``NF4Tensor`` with ``to_nf4(bf16.to(device))`` (``_register_nf4_dispatch_ops``), and
  Lightning's ``_Linear4bit._quantize_weight`` with ``w.to("cuda", torch.half)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import formulas
from ..decoder_config import DecoderConfig
from .shapes import counts, lora_counts

__all__ = [
    "ADAMW8BIT_BLOCK",
    "MIN_8BIT_SIZE",
    "NF4_CHUNK",
    "PAGED_MIN",
    "QMAPS",
    "STATES",
    "Lora",
    "States",
    "bnb_adamw_bytes",
    "model_states",
    "nf4_bytes",
    "nf4_load_bytes",
    "nf4_quantize_bytes",
]

STATES = ("weights", "gradients", "master weights", "optimizer state")


@dataclass(frozen=True)
class Lora:
    """LoRA's knobs: the rank, which linears (``inputs.LORA_TARGETS``) and the frozen base's
    storage: ``"bf16"`` (the recipe's weight dtype) or ``"nf4"`` (QLoRA)."""

    rank: int
    targets: str = "attention"
    base: str = "bf16"  # or "nf4" (torchao, torchtune's QLoRA) or "bnb-nf4" (bitsandbytes)
    dropout: float = 0.0  # on the adapters' input (torchtune's and litgpt's default: 0.05)
    nf4_chunk: int = 2**20  # weights torchao quantizes at a time (``NF4_CHUNK``); 0: all
    double_quant: bool = True  # bitsandbytes' compress_statistics (torchao's NF4: always)


@dataclass(frozen=True)
class States:
    """The whole model's states by category, and the trainable tensors' element counts (what
    the optimizer steps and ``temporaries`` sizes)."""

    bytes: dict[str, int]
    trainable: tuple[int, ...]
    n_trainable: int
    unified: int = 0  # a paged optimizer's state in CUDA unified memory, outside ``bytes``


def nf4_bytes(n: int, double_quant: bool = True) -> int:
    """Bytes of ``n`` weights stored as NF4: 4 bits each, and per block of 64 an int8 scale
    with an fp32 factor per 256 scales (double quantization), or else an fp32 absmax."""
    blocks = math.ceil(n / 64)
    if not double_quant:
        return math.ceil(n / 2) + 4 * blocks
    return math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / 256)


#: torchao's ``to_nf4`` finds each weight's nearest NF4 code 2**20 weights at a time since
#: pytorch/ao#196 ("Perform quantization in Chunks", 2024-05-01, in torchao 0.2: "a huge memory
#: spike when attempting to NF4'afy the very large tensors"); torchao 0.1 did a whole tensor.
NF4_CHUNK = 2**20


def nf4_quantize_bytes(n: int, chunk: int = NF4_CHUNK) -> int:
    """Scratch torchao's ``to_nf4`` holds at its peak while it quantizes ``n`` bf16 weights.

    ``convert_to_norm_float_weight`` keeps the scaled weights (2 B each) while
    ``quantize_tensor_nearest`` compares each weight with the 16 codes: ``value - nf4`` is a
    (weights, 16) bf16 tensor (32 B a weight) and its ``.abs()`` another, both alive at once;
    chunked (``chunk`` > 0), on ``chunk`` weights at a time, into a uint8 index per weight
    allocated first (1 B). (pytorch/ao#315, 2024-06-04, measured 68.1 B a weight with torchao
    0.1, whose ``to_nf4`` first casts to bf16 (2 B), quantizing the 4096 x 128256 head of Llama
    3 8B: 2.10 GB before, 37.87 GB at the peak; ``tests/test_fit_qlora.py`` holds this to it.)
    """
    if chunk <= 0 or chunk >= n:
        return 2 * n + 64 * n
    return 2 * n + n + 64 * chunk


def nf4_load_bytes(cfg: DecoderConfig, lora: Lora) -> int:
    """What loading a QLoRA base adds to the model's states, at the largest linear (see the
    module's docstring): its bf16 (bitsandbytes: fp16) copy, its old NF4 storage and, under
    torchao, the quantizer's scratch; bitsandbytes quantizes in one CUDA kernel, no scratch."""
    h, q, kv = cfg.d_model, cfg.q_dim, cfg.kv_heads * cfg.head_dim
    if lora.base == "bnb-nf4":  # litgpt fuses q, k and v into one linear; its head is NF4 too
        linears = [h * (q + 2 * kv), h * cfg.ff] + ([] if cfg.tied else [h * cfg.vocab])
    else:  # torchtune's q, k and v projections are three linears
        linears = [h * q, h * kv, h * cfg.ff]
    n = max(linears)
    scratch = nf4_quantize_bytes(n, lora.nf4_chunk) if lora.base == "nf4" else 0
    return 2 * n + nf4_bytes(n, lora.double_quant) + scratch


#: bitsandbytes quantizes each 8-bit moment in blocks of this many elements, one fp32 absmax
#: each: 256 since 0.44.0 (aa57bd89, bitsandbytes#1365, 2024-09-20: "Change 8bit optimizer
#: blocksize 2048->256"); 2048 in 0.41.1 (litgpt's pin) to 0.43.3. torchtune asks for
#: ``bitsandbytes>=0.43.0`` (pyproject.toml at 1814feb), so either.
ADAMW8BIT_BLOCK = 256
#: Tensors under this many elements keep fp32 moments (``min_8bit_size``'s default).
MIN_8BIT_SIZE = 4096
#: A paged optimizer's moment goes to unified memory from this many elements (``1e5``).
PAGED_MIN = 100_000
#: The two quantization maps, 256 fp32 each, one pair per optimizer and device.
QMAPS = 2 * 256 * 4


def bnb_adamw_bytes(
    numels, bits: int = 8, paged: bool = False, block: int = ADAMW8BIT_BLOCK
) -> tuple[int, int]:
    """Bytes of bitsandbytes' AdamW state (``bits`` 8 or 32) for tensors of ``numels``
    elements: (in PyTorch's allocator, in CUDA unified memory), as the module's docstring
    reads the source."""
    allocator = unified = 0
    for n in numels:
        if bits == 32 or n < MIN_8BIT_SIZE:
            moments, absmax = 2 * 4 * n, 0  # two fp32 moments
        else:
            moments, absmax = 2 * n, 2 * 4 * math.ceil(n / block)
        if paged and n >= PAGED_MIN:
            unified += moments
        else:
            allocator += moments
        allocator += absmax
    if bits == 8 and any(n >= MIN_8BIT_SIZE for n in numels):
        allocator += QMAPS
    return allocator, unified


def model_states(
    cfg: DecoderConfig, precision: str, optimizer: str, lora: Lora | None = None
) -> States:
    """The whole model's states (see the module's docstring)."""
    c = counts(cfg)
    per = formulas.BYTES_PER_PARAMETER[precision]
    if lora is None:
        trainable = tuple(c.tensors())
        frozen_bytes = 0
    else:
        n_lora, one_block = lora_counts(cfg, lora.rank, lora.targets)
        trainable = one_block * cfg.n_layers
        if lora.base in ("nf4", "bnb-nf4"):  # the linears quantized, the rest as the recipe
            linear = sum(n for n in c.block_tensors if n > cfg.d_model) * cfg.n_layers
            if lora.base == "bnb-nf4" and not cfg.tied:
                linear += cfg.vocab * cfg.d_model  # the head
            frozen_bytes = nf4_bytes(linear, lora.double_quant)
            frozen_bytes += per["weights"] * (c.total - linear)
        else:
            frozen_bytes = per["weights"] * c.total
    n = sum(trainable)
    bnb = optimizer in ("adamw8bit", "paged-adamw8bit", "paged-adamw")
    s = formulas.model_state_bytes(n, precision, "adamw" if bnb else optimizer)
    state, unified = s.optimizer_state, 0
    if bnb:
        bits = 32 if optimizer == "paged-adamw" else 8
        state, unified = bnb_adamw_bytes(trainable, bits, paged=optimizer.startswith("paged"))
    whole = {
        "weights": s.weights + frozen_bytes,
        "gradients": s.gradients,
        "master weights": s.master,
        "optimizer state": state,
    }
    return States(whole, trainable, n, unified)
