"""Training memory by formula: parameter counts, bytes per parameter, activations per layer.

One job: the closed forms a learner writes on paper before measuring, each derived for the
course's own models and checked against a measurement in the "predict, measure, reconcile"
notebook (and in ``tests/test_formulas.py``). Nothing here runs a model.

- ``tiny_transformer_parameters`` / ``decoder_parameters``: exact counts from the shape.
- ``playbook_parameters``: the Ultra-Scale Playbook's N = h*v + L*(12h^2 + 13h) + 2h.
- ``BYTES_PER_PARAMETER`` and ``model_state_bytes``: weights, gradients, master weights and
  optimizer state per precision recipe and optimizer.
- ``attention_saved_bytes``: what attention saves for backward, fused (SDPA's flash kernels,
  as practitioners run it: no s x s matrix) or explicit (the softmax written out, as
  Korthikanti et al. (2022) counted it: ``5*a*s^2*b`` in 16-bit with dropout).
- ``korthikanti_bytes``: Korthikanti et al.'s per-layer ``s*b*h*(34 + 5*a*s/h)``, with the
  attention term either way (fused by default).
- ``block_activation_bytes``: what one decoder block saves for backward, the course block's
  version of Korthikanti et al. (2022)'s count.
- ``zero_rank_bytes``: what one rank keeps and moves under DDP and each ZeRO stage (notebook
  09 measures it to the byte; notebook 10's decision table reads it).
- ``pipeline_in_flight``: the micro-batches whose activations a pipeline stage holds at its peak
  under GPipe or 1F1B (notebook 08 measures it; notebook 10 reads it).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from .decoder_config import DecoderConfig

__all__ = [
    "BYTES_PER_PARAMETER",
    "OPTIMIZER_STATE_BYTES",
    "PRECISIONS",
    "STATE_ELEMENT_BYTES",
    "ATTENTION_KINDS",
    "PIPELINE_SCHEDULES",
    "ZERO_SETUPS",
    "ModelStates",
    "attention_saved_bytes",
    "block_activation_bytes",
    "decoder_parameters",
    "korthikanti_bytes",
    "model_state_bytes",
    "pipeline_in_flight",
    "playbook_parameters",
    "tiny_transformer_parameters",
    "zero_rank_bytes",
]


def _count(name: str, value, smallest: int = 0) -> int:
    """``value`` as a whole number >= ``smallest``, or one sentence saying what to pass."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number such as 8, not {value!r}")
    if value < smallest:
        raise ValueError(f"{name} must be a whole number >= {smallest}, not {value}")
    return int(value)


def tiny_transformer_parameters(vocab: int, d_model: int, n_layers: int, n_classes: int) -> int:
    """``models.TinyTransformer``: embedding, L encoder layers (ffn 4h), a classification head.

    Per layer: in_proj 3h^2 + 3h, out_proj h^2 + h, linear1 4h^2 + 4h, linear2 4h^2 + h and two
    LayerNorms 2h each: 12h^2 + 13h, the Playbook's per-layer term exactly.
    """
    for name, value in (("vocab", vocab), ("n_layers", n_layers), ("n_classes", n_classes)):
        _count(name, value, 1)  # as models.TinyTransformer refuses 0
    h = _count("d_model", d_model, 1)
    return vocab * h + n_layers * (12 * h * h + 13 * h) + h * n_classes + n_classes


def playbook_parameters(d_model: int, vocab: int, n_layers: int) -> int:
    """The Playbook's GPT-style count: tied embedding, L layers, a final LayerNorm (2h).

    ``n_layers=0`` is the embedding and the final norm alone (as ``decoder.DecoderConfig``)."""
    _count("vocab", vocab, 1)
    _count("n_layers", n_layers)
    h = _count("d_model", d_model, 1)
    return h * vocab + n_layers * (12 * h * h + 13 * h) + 2 * h


def _norm_weights(cfg: DecoderConfig) -> int:
    return 2 * cfg.d_model if cfg.norm == "layer" else cfg.d_model


def decoder_parameters(cfg: DecoderConfig) -> int:
    """``decoder.Decoder``'s exact parameter count from its config."""
    if not isinstance(cfg, DecoderConfig):
        raise TypeError(f"cfg must be a decoder.DecoderConfig, not {type(cfg).__name__}")
    h, f, kv = cfg.d_model, cfg.ff, cfg.kv_heads * cfg.head_dim
    bias, q = int(cfg.bias), cfg.q_dim  # q: d_model unless the config sets d_head (Gemma)
    qkv_bias = int(cfg.bias or cfg.qkv_bias)  # Qwen2: q, k and v only
    attention = h * (q + 2 * kv) + qkv_bias * (q + 2 * kv) + q * h + bias * h
    n_matrices = 3 if cfg.mlp == "swiglu" else 2
    mlp = n_matrices * h * f + bias * ((n_matrices - 1) * f + h)
    layer = attention + mlp + 2 * _norm_weights(cfg)
    embeddings = cfg.vocab * h + cfg.max_positions * h
    head = 0 if cfg.tied else cfg.vocab * h
    return embeddings + cfg.n_layers * layer + _norm_weights(cfg) + head


#: The recipes of the calculator and the notebook: how weights, gradients and optimizer state
#: are stored, in bytes per parameter (before the optimizer's own state).
PRECISIONS = (
    "fp32",
    "autocast-bf16",
    "autocast-fp16",
    "bf16-master",
    "bf16-master-fp32-grads",
    "pure-bf16",
)

#: bytes per parameter of weights, gradients and fp32 master weights for each recipe.
#: Autocast keeps everything fp32 and adds cached low-precision copies of the weights during
#: the step (2 bytes per weight that a matmul uses: in the activations, not here).
#: "bf16-master" (Megatron, FSDP's MixedPrecisionPolicy): bf16 weights and gradients, an fp32
#: master copy the optimizer updates; ``fp32_grads=True`` adds an fp32 gradient accumulation
#: buffer (20 B with Adam). "bf16-master-fp32-grads" is that recipe as DeepSpeed's ZeRO
#: estimators count it (``deepspeed/runtime/zero/stage_1_and_2.py``,
#: ``estimate_zero2_model_states_mem_needs``: 2 B of 16-bit weights, plus 18 = 2 B 16-bit
#: gradients + 4 B fp32 gradients + 4 B fp32 weights + 8 B Adam moments). "pure-bf16" is pure bf16:
#: weights, gradients and the optimizer's moments all bf16 (8 B/param with AdamW).
BYTES_PER_PARAMETER = {
    "fp32": {"weights": 4, "gradients": 4, "master": 0},
    "autocast-bf16": {"weights": 4, "gradients": 4, "master": 0},
    "autocast-fp16": {"weights": 4, "gradients": 4, "master": 0},
    "bf16-master": {"weights": 2, "gradients": 2, "master": 4},
    "bf16-master-fp32-grads": {"weights": 2, "gradients": 6, "master": 4},
    "pure-bf16": {"weights": 2, "gradients": 2, "master": 0},
}

#: Bytes of one element of the optimizer's state: fp32, except in the pure bf16 recipe.
STATE_ELEMENT_BYTES = {name: 2 if name == "pure-bf16" else 4 for name in BYTES_PER_PARAMETER}

#: fp32 optimizer state per parameter: momentum buffer (SGD with momentum), exp_avg and
#: exp_avg_sq (Adam, AdamW). Adam also keeps a ``step`` counter per parameter tensor: a 4-byte
#: fp32 scalar tensor on the CPU; on CUDA it stays on the CPU unless ``capturable`` or
#: ``fused`` is set, so it costs the GPU nothing.
OPTIMIZER_STATE_BYTES = {"sgd": 0, "sgd-momentum": 4, "adam": 8, "adamw": 8}


@dataclass(frozen=True)
class ModelStates:
    """Bytes of the model states (everything but activations) for ``n`` parameters."""

    weights: int
    gradients: int
    master: int
    optimizer_state: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.master + self.optimizer_state

    def per_parameter(self, n: int) -> float:
        """Bytes per parameter for ``n`` parameters (a whole number, 1 or more)."""
        return self.total / _count("n", n, 1)


def model_state_bytes(
    n_parameters: int,
    precision: str = "fp32",
    optimizer: str = "adam",
    *,
    fp32_grads: bool = False,
    n_tensors: int = 0,
    step_counter_bytes: int = 0,
) -> ModelStates:
    """Weights, gradients, master weights and optimizer state for ``n_parameters``.

    ``fp32 + Adam`` is 4 + 4 + 8 = 16 bytes per parameter; ``bf16-master + Adam`` is
    2 + 2 + 4 + 8 = 16, or 20 with ``fp32_grads`` (an fp32 buffer the bf16 gradients are
    accumulated into, as the Ultra-Scale Playbook counts; ml-engineering's 18 keeps only the
    fp32 gradients: 2 + 4 + 4 + 8). Adam's step counters add
    ``step_counter_bytes`` per tensor (4 on the CPU, 0 on a GPU by default).
    """
    if precision not in BYTES_PER_PARAMETER:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(
            f"optimizer must be one of {tuple(OPTIMIZER_STATE_BYTES)}, not {optimizer!r}"
        )
    _count("n_parameters", n_parameters)
    _count("n_tensors", n_tensors)
    _count("step_counter_bytes", step_counter_bytes)
    if not isinstance(fp32_grads, bool):
        raise TypeError(f"fp32_grads must be True or False, not {fp32_grads!r}")
    per = BYTES_PER_PARAMETER[precision]
    extra = 4 if fp32_grads and precision == "bf16-master" else 0
    grads = per["gradients"] + extra
    moments = OPTIMIZER_STATE_BYTES[optimizer] // 4  # fp32 elements per parameter
    state = moments * STATE_ELEMENT_BYTES[precision] * n_parameters
    if optimizer in ("adam", "adamw"):
        state += step_counter_bytes * n_tensors
    return ModelStates(
        weights=per["weights"] * n_parameters,
        gradients=grads * n_parameters,
        master=per["master"] * n_parameters,
        optimizer_state=state,
    )


#: How attention is computed: "fused" (``F.scaled_dot_product_attention``'s flash or
#: memory-efficient kernels, which keep no s x s matrix) or "explicit" (``softmax(q k^T) v``
#: written out, which saves the s x s probabilities).
ATTENTION_KINDS = ("fused", "explicit")


def _layer_shape(seq, batch, d_model, n_heads) -> tuple[int, int, int, int]:
    """(s, b, h, a) as whole numbers >= 1, ``n_heads`` dividing ``d_model``, or one sentence."""
    s, b, h, a = (
        _count(name, value, 1)
        for name, value in (
            ("seq", seq),
            ("batch", batch),
            ("d_model", d_model),
            ("n_heads", n_heads),
        )
    )
    if h % a:
        raise ValueError(
            f"d_model ({h}) must be a multiple of n_heads ({a}): each head gets "
            "d_model / n_heads dimensions"
        )
    return s, b, h, a


def attention_saved_bytes(
    seq: int,
    batch: int,
    d_model: int,
    n_heads: int,
    element_bytes: int = 2,
    *,
    attention: str = "fused",
    dropout: bool = True,
) -> int:
    """Bytes attention saves for backward, from q, k, v to its output (which the output
    projection saves in either case, so it is counted here, once).

    - ``"fused"`` (``F.scaled_dot_product_attention``, as torchtitan and practitioners run it):
      q, k, v, the output (4h per token) and one fp32 log-sum-exp per head and token. With
      dropout the kernel keeps an RNG seed and offset, not a mask.
    - ``"explicit"`` (``softmax(q k^T / sqrt(d)) v``, Korthikanti et al. 2022): q, k, v, the
      output and the (s, s) probabilities of every head; with ``dropout`` also a 1-byte mask
      and the dropped-out probabilities. In 16-bit with dropout: ``8sbh + 5as^2b``.

    Checked to the byte against what autograd saves on a CPU in ``tests/test_formulas.py``
    (CPU SDPA is a flash kernel: ``ScaledDotProductFlashAttentionForCpuBackward0``).
    """
    s, b, h, a = _layer_shape(seq, batch, d_model, n_heads)
    if element_bytes not in (1, 2, 4, 8) or isinstance(element_bytes, bool):
        raise ValueError(
            f"element_bytes must be 1, 2, 4 or 8 (a dtype's size), not {element_bytes!r}"
        )
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, not {attention!r}")
    if not isinstance(dropout, bool):
        raise TypeError(f"dropout must be True or False, not {dropout!r}")
    qkvo = 4 * s * b * h * element_bytes
    if attention == "fused":
        return qkvo + 4 * a * s * b  # the log-sum-exp is fp32 whatever the inputs are
    per_score = element_bytes + (1 + element_bytes if dropout else 0)  # probabilities, mask, out
    return qkvo + per_score * a * s * s * b


def korthikanti_bytes(
    seq: int, batch: int, d_model: int, n_heads: int, *, attention: str = "fused"
) -> int:
    """Korthikanti et al. (2022), eq. 2: one GPT layer in 16-bit with 1-byte dropout masks.

    ``attention="explicit"`` is their count, ``s*b*h*34 + 5*a*s^2*b``: the softmax written out
    saves its (s, s) probabilities, their dropout mask and the dropped-out copy. The default,
    ``"fused"``, is the same layer as it runs today with ``scaled_dot_product_attention``: the
    ``5*a*s^2*b`` becomes a 4-byte log-sum-exp per head and token, ``s*b*h*34 + 4*a*s*b``.
    Both are ``26 sbh`` (norms, MLP, the QKV input, the output dropout mask) plus
    ``attention_saved_bytes``.

    ``n_heads`` must divide ``d_model`` (each head gets ``d_model / n_heads`` dimensions), as in
    ``decoder.DecoderConfig``; otherwise no such layer exists and the answer would be for nothing.
    """
    s, b, h, a = _layer_shape(seq, batch, d_model, n_heads)
    core = attention_saved_bytes(s, b, h, a, 2, attention=attention, dropout=True)
    return 26 * s * b * h + core


def block_activation_bytes(cfg: DecoderConfig, batch: int, seq: int, element_bytes: int = 4) -> int:
    """What one ``decoder.Block`` saves for backward, in bytes (fp32: ``element_bytes=4``).

    Derived from the tensors the block's operators save (the notebook lists them), per token:

    - each norm saves its input and its output (the next Linear's input); LayerNorm adds a
      mean and a 1/std per token, RMSNorm one 1/rms (fp32) and its normalised input: 2h+2
      or 3h+1;
    - attention saves the q/k/v projection (h + 2*kv per token); SDPA saves its output (h,
      which the output projection saves as a view) and a log-sum-exp per head (a, fp32);
      explicit attention saves the softmax (a*s per token), a proj input copy (h), the
      (s, s) causal mask (1 byte each, once);
    - the MLP saves its hidden activations: 2f (GELU: pre and post) or 4f (SwiGLU: gate, up,
      silu(gate), product).

    For GPT-2's shape in 16-bit this is s*b*h*32 + 2*a*s*b: Korthikanti's 34 without its two
    dropout masks, and SDPA's log-sum-exp where their s^2 terms were. The log-sum-exp and
    RMSNorm's 1/rms are fp32 whatever ``element_bytes`` says, and RMSNorm in bf16 saves its
    input and normalised input upcast to fp32.
    """
    if not isinstance(cfg, DecoderConfig):
        raise TypeError(f"cfg must be a decoder.DecoderConfig, not {type(cfg).__name__}")
    _count("batch", batch, 1)
    _count("seq", seq, 1)
    if element_bytes not in (1, 2, 4, 8) or isinstance(element_bytes, bool):
        raise ValueError(
            f"element_bytes must be 1, 2, 4 or 8 (a dtype's size), not {element_bytes!r}"
        )
    if cfg.attention == "explicit" and cfg.kv_heads != cfg.n_heads:
        raise ValueError(
            "the formula covers explicit attention with one key/value head per query head "
            "only; use attention='sdpa' for grouped-query attention"
        )
    h, f, a = cfg.d_model, cfg.ff, cfg.n_heads
    kv = cfg.kv_heads * cfg.head_dim
    tokens = batch * seq
    e = element_bytes
    if cfg.norm == "layer":
        norm = (2 * h + 2) * e
    else:
        norm = (h * (4 if e < 4 else e) * 2 + h * e) + 4  # input and x_hat upcast, output
    mlp = (4 if cfg.mlp == "swiglu" else 2) * f * e
    per_token = 2 * norm + (h + 2 * kv) * e + mlp
    if cfg.attention == "sdpa":
        per_token += h * e + a * 4
        return tokens * per_token
    per_token += h * e  # the output projection's input (a copy: matmul's output is transposed)
    return tokens * per_token + batch * a * seq * seq * e + seq * seq


#: Notebook 09's data-parallel setups, fp32 parameters and Adam; "ZeRO-3 bf16" computes in bf16
#: (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``).
ZERO_SETUPS = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-3 bf16")


def zero_rank_bytes(
    setup: str, psi: int, n: int, *, tensors: int = 0, owned: tuple[int, int] | None = None
) -> dict[str, int]:
    """What one of ``n`` ranks keeps and moves under ``setup``, for ``psi`` fp32 parameters in
    ``tensors`` tensors trained with Adam. Notebook 09 sections 1 and 2 measure every value.

    - ``params``, ``grads``, ``state``: bytes kept between steps. DDP and ZeRO-1 keep 4Ψ of
      parameters and of gradients, ZeRO-2 and ZeRO-3 a shard, 4Ψ/N (as FSDP2 does it). Adam keeps
      8 bytes per element the rank steps and a 4-byte ``step`` per tensor: every tensor's (a
      shard of each) from ZeRO-2 on, and under ZeRO-1 only the ``owned`` (elements, tensors).
      ``ZeroRedundancyOptimizer`` gives each rank whole tensors, so its split is uneven: pass
      what the rank owns; the default is the Playbook's even split, ``(psi // n, tensors // n)``.
    - ``gathered``: parameter bytes held whole from forward to backward: ZeRO-2's 4Ψ
      (``reshard_after_forward=False``); ZeRO-3 gathers one layer at a time and frees it.
    - ``moved``: the bytes of one step's collectives, an all-reduce weighed 2 (a reduce-scatter
      and an all-gather): DDP 2 x 4Ψ; ZeRO-1 3 x 4Ψ (PyTorch's sits on DDP's all-reduce, then
      each owner broadcasts its parameters); ZeRO-2 2 x 4Ψ (reduce-scatter the gradients, gather
      the parameters once); ZeRO-3 3 x 4Ψ (gather in forward and again in backward); ZeRO-3 bf16
      (2 + 2 + 4)Ψ (bf16 all-gathers, an fp32 reduce-scatter).
    """
    if setup not in ZERO_SETUPS:
        raise ValueError(f"setup must be one of {ZERO_SETUPS}, not {setup!r}")
    psi, n, tensors = _count("psi", psi, 1), _count("n", n, 1), _count("tensors", tensors)
    if owned is None:
        owned = (psi // n, tensors // n)
    mine, my_tensors = (_count(f"owned[{i}]", v) for i, v in enumerate(owned))
    whole = 4 * psi
    if setup in ("DDP", "ZeRO-1"):
        kept = {"params": whole, "grads": whole}
        stepped = (psi, tensors) if setup == "DDP" else (mine, my_tensors)
    else:
        kept = {"params": whole // n, "grads": whole // n}
        stepped = (psi // n, tensors)
    moved = {"DDP": 2, "ZeRO-1": 3, "ZeRO-2": 2, "ZeRO-3": 3, "ZeRO-3 bf16": 2}[setup] * whole
    return {
        **kept,
        "state": 8 * stepped[0] + 4 * stepped[1],
        "gathered": whole if setup == "ZeRO-2" else 0,
        "moved": moved,
    }


#: The schedules ``pipeline_in_flight`` knows: ``ScheduleGPipe`` and ``Schedule1F1B``.
PIPELINE_SCHEDULES = ("GPipe", "1F1B")


def pipeline_in_flight(schedule: str, m: int, p: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` of ``p`` holds at its peak, of ``m``.

    GPipe runs every forward before any backward: all ``m``. 1F1B (PipeDream-Flush) runs
    ``p - stage`` warm-up forwards, then alternates one forward and one backward: at most
    ``p - stage``. Notebook 08 section 4 measures both on 2 stages with a saved-tensor hook.
    """
    if schedule not in PIPELINE_SCHEDULES:
        raise ValueError(f"schedule must be one of {PIPELINE_SCHEDULES}, not {schedule!r}")
    m, p, stage = _count("m", m, 1), _count("p", p, 1), _count("stage", stage)
    if stage >= p:
        raise ValueError(f"stage must be 0 to p - 1 = {p - 1}, not {stage}")
    return m if schedule == "GPipe" else min(m, p - stage)
