"""The moments of a training step and its peak: will it fit?

One job: for a model's shape, a batch, a sequence length and the knobs (precision, optimizer
and its implementation, checkpointing, a profile over some GPUs, LoRA, ...), the bytes one GPU
holds at each moment of the step, and the largest of them, the peak, with the headroom a real
process needs beside its tensors, against a card. The terms come from the modules below it:
states (model states), profiles (one GPU's share), activations (activation_formulas: by
formula, or on fake tensors where none is written),
temporaries (the optimizer step) and headroom.

**Peak, not sum.** The step's peak is the largest of four moments:

- the end of the forward pass: every block's activations and the loss's;
- the start of backward: those, the head's gradient buffers and its weight gradients;
- the end of backward: every weight gradient, the first block's activations and its buffers;
- the optimizer step: every gradient, and the step's temporaries (temporaries).

A loop that keeps its logits (``logits_kept``, litgpt's) keeps the micro-batch's graph until the
next forward returns, and what that graph still holds (``kept_graph``): the previous
micro-batch's at the end of forward, this one's at the end of backward and at the step.

FSDP2 adds a fifth, the middle of backward (a later block's, with the block before it
prefetched and the last block's reduce-scatter input kept), and counts at each moment what its
code keeps then (profiles: the root gathered from forward on, no gradient before backward).

Activations are freed as gradients appear, so the two never peak together; measured peaks
(torchtitan's) show the same. With gradient accumulation the gradients of the earlier
micro-batches are held through the later forwards; with the optimizer step in backward
(notebook 03, section 7) each gradient is freed as soon as its parameter steps. FSDP1
accumulating under ``no_sync()`` (``gradient_sync="last"``) holds every unit's gradient
unsharded instead, through the later forwards and the syncing backward (profiles).

The answer is for **eager mode**: torch.compile and Float8 change what is saved, and published
runs with them land in a band below it (report.COMPILE_BAND), shown, not modelled.
"""

from __future__ import annotations

import dataclasses
import math
import time

from .. import formulas
from ..decoder_config import DecoderConfig
from ..units import format_bytes
from . import cards, inputs
from .activation_formulas import activations, check_block, same_module
from .headroom import headroom_for
from .kept_graph import kept_graph_bytes
from .profiles import Mesh, spread, tp_block_held
from .report import FitReport
from .shapes import config, counts
from .states import NF4_CHUNK, Lora, model_states, nf4_load_bytes
from .temporaries import step_temporaries

__all__ = ["ABSURD_BYTES", "will_it_fit"]

#: A step asking for more than this on one GPU is beyond any GPU: refused in one sentence.
ABSURD_BYTES = 2**50  # 1 PiB


def _formula_total(
    cfg: DecoderConfig, n: int, batch: int, seq: int, precision: str, states: int, ckpt: str
) -> int | None:
    """The total by formula alone, as the Playbook's widget sums it: the model states, the
    block formula times the layers (or each block's input under full checkpointing), the
    logits (16-bit and their fp32 upcast) and under autocast 2 bytes per parameter for its
    cached 16-bit weight copies. None for the matmul policies (no closed form)."""
    if ckpt not in ("none", "full"):
        return None
    e = 4 if precision == "fp32" else 2  # the residual stream's element size
    plain = dataclasses.replace(cfg, attention="sdpa")
    layer = formulas.block_activation_bytes(plain, batch, seq, e)
    if ckpt == "full":
        acts = cfg.n_layers * batch * seq * cfg.d_model * e + layer
    else:
        acts = cfg.n_layers * layer
    logits = (e + 4) * seq * batch * cfg.vocab
    copies = 2 * n if precision.startswith("autocast") else 0
    return int(states + acts + logits + copies)


def will_it_fit(
    preset: str | dict | DecoderConfig = "llama-1b",
    batch: int = 1,
    seq: int = 2048,
    precision: str = "autocast-bf16",
    optimizer: str = "adamw",
    checkpointing: str = "none",
    sharding: str = "none",
    n_gpus: int = 1,
    *,
    gpu: str | int | cards.Gpu | None = None,
    headroom: bool = True,
    optimizer_impl: str = "foreach",
    lora_rank: int = 0,
    lora_targets: str = "attention",
    lora_base: str = "bf16",
    lora_dropout: float = 0.0,
    nf4_chunk: int = NF4_CHUNK,
    nf4_double_quant: bool = True,
    logits_kept: bool = False,
    ce_chunks: int = 1,
    activation_offload: bool = False,
    cpu_offload: bool = False,
    optimizer_in_backward: bool = False,
    grad_accumulation: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    pp_microbatches: int = 0,
    reshard_after_forward: bool = True,
    reduce_dtype: str = "param",
    gradient_sync: str = "every",
    block: str = "course",
) -> FitReport:
    """One GPU's training memory at the step's peak (see the module's docstring for how).

    ``preset``: a name people use (``"Llama-3.1-8B"``, ``"mistral-7b"``; ``presets.PRESETS``),
    the fields of a config.json (``presets.from_config_json``) or a ``DecoderConfig``.
    ``precision``, ``optimizer``, ``checkpointing`` and ``sharding`` take the names
    ``inputs`` reads (``"bf16"``, ``"adam"``, ``"selective"``, ``"fsdp2"``). ``gpu``: a card
    (``"RTX 4090"``) or a size (``"24GB"``) for the verdict. ``headroom=False`` leaves out the
    CUDA context and the allocator's reserve. The keyword knobs: ``optimizer_impl`` (foreach,
    torch's default on CUDA; fused; forloop), ``lora_rank`` (0: full training),
    ``lora_targets``, ``lora_base`` ("bf16"; "nf4": QLoRA with torchao, as torchtune;
    "bnb-nf4": with bitsandbytes, as litgpt), ``lora_dropout``, ``nf4_chunk`` (weights
    torchao quantizes at a time as the base loads; 0: a whole tensor, as torchao 0.1),
    ``nf4_double_quant`` (bitsandbytes' double quantization: off for litgpt's ``--quantize
    bnb.nf4``), ``logits_kept`` (the loop keeps the last micro-batch's logits, and so its
    graph, until the next forward returns: litgpt's), ``ce_chunks``, ``activation_offload``,
    ``cpu_offload`` (sharded states on the CPU: ZeRO-3/FSDP only), ``optimizer_in_backward``,
    ``grad_accumulation`` (micro-batches per step), ``tp``, ``pp``, ``cp``,
    ``pp_microbatches``, FSDP2's ``reshard_after_forward`` and ``reduce_dtype`` ("param" or
    "fp32"), and ``gradient_sync`` ("every" micro-batch, or "last": FSDP1's ``no_sync()``
    around the others, as Lightning's ``no_backward_sync``), and ``block``: whose block's
    activations ("course": the course's, which saves what torchtune's and torchtitan's do;
    "litgpt": litgpt 8641822's, ``fit.litgpt_block``).
    """
    start = time.perf_counter()
    label, cfg = config(preset)
    precision = inputs.recipe(precision)
    optimizer = inputs.optimizer(optimizer)
    optimizer_impl = inputs.optimizer_impl(optimizer_impl)
    checkpointing = inputs.checkpointing(checkpointing)
    sharding = inputs.sharding(sharding)
    batch = inputs.positive_int("batch", batch)
    seq = inputs.positive_int("seq", seq)
    n_gpus = inputs.positive_int("n_gpus", n_gpus, largest=2**20)
    tp, pp, cp = (inputs.positive_int(n, v, 2**12) for n, v in (("tp", tp), ("pp", pp), ("cp", cp)))
    ce_chunks = inputs.positive_int("ce_chunks", ce_chunks, 2**12)
    grad_accumulation = inputs.positive_int("grad_accumulation", grad_accumulation)
    block = inputs.block(block)
    check_block(cfg, block)
    inputs.flag("headroom", headroom)
    for name, value in (
        ("activation_offload", activation_offload),
        ("cpu_offload", cpu_offload),
        ("optimizer_in_backward", optimizer_in_backward),
        ("reshard_after_forward", reshard_after_forward),
        ("nf4_double_quant", nf4_double_quant),
        ("logits_kept", logits_kept),
    ):
        inputs.flag(name, value)
    if gradient_sync not in ("every", "last"):
        raise ValueError(f"gradient_sync must be 'every' or 'last', not {gradient_sync!r}")
    no_sync = gradient_sync == "last" and grad_accumulation > 1
    if no_sync and (sharding not in ("none", "fsdp1") or cpu_offload):
        raise ValueError(
            "gradient_sync='last' (no_sync on all but the last micro-batch) is modelled for "
            "DDP and FSDP1 FULL_SHARD without CPU offload: choose gradient_sync='every'"
        )
    if reduce_dtype not in ("param", "fp32"):
        raise ValueError(f"reduce_dtype must be 'param' or 'fp32', not {reduce_dtype!r}")
    if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 0:
        raise ValueError(f"lora_rank must be a whole number >= 0 (0: no LoRA), not {lora_rank!r}")
    if lora_base not in ("bf16", "nf4", "bnb-nf4"):
        raise ValueError(
            f"lora_base must be 'bf16', 'nf4' (QLoRA, torchao) or 'bnb-nf4' (QLoRA, "
            f"bitsandbytes), not {lora_base!r}"
        )
    if (
        not isinstance(lora_dropout, int | float)
        or isinstance(lora_dropout, bool)
        or not (0 <= lora_dropout < 1)
    ):
        raise ValueError(f"lora_dropout must be a probability in [0, 1), not {lora_dropout!r}")
    targets = inputs.lora_targets(lora_targets)
    if not (isinstance(nf4_chunk, int) and not isinstance(nf4_chunk, bool) and nf4_chunk == 0):
        nf4_chunk = inputs.positive_int("nf4_chunk (0: a whole tensor at once)", nf4_chunk)
    if not nf4_double_quant and not (lora_rank and lora_base == "bnb-nf4"):
        raise ValueError(
            "nf4_double_quant=False is bitsandbytes' NF4 without double quantization: it needs "
            "lora_rank > 0 and lora_base='bnb-nf4' (torchao's NF4 always has it)"
        )
    lora = (
        Lora(lora_rank, targets, lora_base, float(lora_dropout), nf4_chunk, nf4_double_quant)
        if lora_rank
        else None
    )
    card = gpu if isinstance(gpu, cards.Gpu) or gpu is None else cards.gpu(gpu)
    if cfg.max_positions and seq > cfg.max_positions:
        raise ValueError(
            f"{label} has {cfg.max_positions} learned positions; choose seq <= {cfg.max_positions}"
        )
    mesh = Mesh(tp, pp, cp, pp_microbatches)
    if n_gpus % (tp * pp * cp):
        raise ValueError(
            f"{n_gpus} GPUs do not split into tp {tp} x pp {pp} x cp {cp} = {tp * pp * cp}: "
            "give a number of GPUs that is a multiple of their product"
        )
    dp = mesh.dp(n_gpus)
    if sharding != "none" and dp * cp == 1:
        raise ValueError(
            f"{sharding} shards over several GPUs and does nothing on one: choose sharding "
            "'none', or 2 GPUs or more"
        )
    if cpu_offload and sharding not in ("zero3", "fsdp1", "fsdp1-grad-op", "fsdp2"):
        raise ValueError("cpu_offload keeps the sharded states on the CPU: choose zero3 or fsdp")
    if optimizer_in_backward and grad_accumulation > 1:
        raise ValueError(
            "the optimizer step in backward frees each gradient at once, so it cannot "
            "accumulate gradients: choose one of optimizer_in_backward and grad_accumulation"
        )
    if pp > 1 and pp > cfg.n_layers:
        raise ValueError(f"{label} has {cfg.n_layers} layers: choose pp <= {cfg.n_layers}")
    if seq % cp:
        raise ValueError(f"context parallelism splits the sequence: make seq a multiple of cp {cp}")
    if logits_kept and tp * pp * cp > 1:
        raise ValueError(
            "logits_kept is modelled for one GPU, DDP and FSDP: choose tp = pp = cp = 1"
        )
    local_seq = seq // cp
    c = counts(cfg)
    plain = dataclasses.replace(cfg, attention="sdpa")
    rough = cfg.n_layers * formulas.block_activation_bytes(plain, batch, local_seq, 2)
    rough += 6 * batch * local_seq * cfg.vocab
    if rough > ABSURD_BYTES:
        raise ValueError(
            f"batch {batch:,} x seq {seq:,} needs about {format_bytes(rough)} of activations "
            "on each GPU, more than any GPU has: choose a smaller batch or sequence"
        )
    whole = model_states(cfg, precision, optimizer, lora)
    per = formulas.BYTES_PER_PARAMETER[precision]
    share = spread(
        whole.bytes,
        c,
        per["weights"],
        per["weights"],
        sharding,
        n_gpus,
        mesh,
        reshard_after_forward=reshard_after_forward,
        reduce_fp32=reduce_dtype == "fp32",
        trainable_fraction=whole.n_trainable / c.total,
        no_sync=no_sync,
        frozen_root=lora is not None,  # the adapters are in the blocks
    )
    states = dict(share.states)
    ranks = (
        dp * cp if sharding in ("zero1", "zero2", "zero3", "fsdp1", "fsdp1-grad-op", "fsdp2") else 1
    )
    local = [max(1, math.ceil(n * share.fraction / ranks)) for n in whole.trainable]
    on_cpu = {}
    if cpu_offload:  # the shards live on the CPU; the optimizer steps there
        on_cpu = dict(states)
        states = dict.fromkeys(states, 0)
    block_pass, head = activations(
        cfg, batch, local_seq, same_module(precision), checkpointing, lora, ce_chunks, block
    )
    layers = math.ceil(cfg.n_layers / pp)
    in_flight = mesh.in_flight
    linear_bytes = 4 if precision == "fp32" else 2
    kept = checkpointing == "none"  # the Linears' gathered inputs saved, not recomputed
    block_held = tp_block_held(
        block_pass.held, batch, local_seq, cfg.d_model, linear_bytes, tp, kept
    )
    head_held = head.held // tp  # SP: the head's activations sharded
    if activation_offload:  # one block's on the GPU at a time; the rest in pinned CPU memory
        forward_acts = block_held + head_held
    else:
        forward_acts = in_flight * layers * block_held + head_held
    grads_share = states["gradients"]
    held_grads = grads_share if grad_accumulation > 1 else 0  # the earlier micro-batches'
    if share.unsharded_grads:  # FSDP1's no_sync: held unsharded until the syncing backward's end
        held_grads = share.unsharded_grads
    # At the start of backward the head's weight gradients exist in full (under ZeRO-3 they are
    # in the gathered unit). The head pass's include the embedding's, which a real step makes
    # last: counted early, a small overstatement.
    head_grads = 0 if share.gathered or cpu_offload else head.grads // tp
    state_bytes = formulas.STATE_ELEMENT_BYTES[precision]
    if optimizer_in_backward:  # each parameter steps as its gradient is made, then frees it
        largest = max(local)
        end_grads = per["gradients"] * largest
        temps = step_temporaries([largest], optimizer, optimizer_impl, state_bytes)
    else:
        end_grads = held_grads if share.unsharded_grads else grads_share
        temps = step_temporaries(local, optimizer, optimizer_impl, state_bytes)
    if cpu_offload:
        temps = 0
    kept_graph, kept_at_end = 0, 0  # the previous micro-batch's graph; this one's at the end
    if logits_kept:
        element = 4 if precision == "fp32" else 2
        ask = (cfg, batch, local_seq, lora, checkpointing, element)
        kept_graph = kept_graph_bytes(*ask)
        kept_at_end = kept_graph_bytes(*ask, blocks=cfg.n_layers - 1)
    moments = {
        # (activations, transient, weight gradients, step temporaries) at each moment
        "end of forward": (forward_acts + kept_graph, head.forward_over // tp, held_grads, 0),
        "start of backward": (
            forward_acts,
            head.backward_over // tp,
            held_grads or head_grads,
            0,
        ),
        "end of backward": (
            block_held + kept_at_end,
            block_pass.backward_over // tp,
            end_grads,
            temps if optimizer_in_backward else 0,
        ),
    }
    at_moment: dict[str, int] = {}
    if share.at is not None:  # FSDP2: what is gathered and in flight, moment by moment
        emb = cfg.vocab * cfg.d_model  # the root's gradients made before the blocks' (below)
        early = c.root - cfg.max_positions * cfg.d_model - (0 if cfg.tied else emb)
        no_shards = optimizer_in_backward or cpu_offload
        moments, at_moment = _fsdp2_moments(
            share, moments, forward_acts, block_held, block_pass, head,
            per["weights"] * early // tp, held_grads, no_shards, layers, kept_at_end,
        )  # fmt: skip
    if not optimizer_in_backward:
        moments["optimizer step"] = (kept_graph, 0, grads_share, temps)
    fixed = states["weights"] + states["master weights"] + states["optimizer state"]
    fixed += share.buckets
    computing = share.gathered + share.kept_gathered
    peaks = {
        name: fixed
        + sum(parts)
        + (at_moment.get(name, computing) if name != "optimizer step" else 0)
        for name, parts in moments.items()
    }
    loading = lora is not None and lora.base != "bf16" and not cpu_offload
    if loading:  # quantized on the GPU as it loads, before the optimizer has made its state
        moments["loading the base"] = (0, nf4_load_bytes(cfg, lora), 0, 0)  # (whole, no TP)
        peaks["loading the base"] = (
            fixed - states["optimizer state"] + moments["loading the base"][1]
        )
    at = max(peaks, key=peaks.__getitem__)
    acts, transient, grads_now, temps_now = moments[at]
    categories = {
        "weights": states["weights"],
        "gradients": grads_now,
        "master weights": states["master weights"],
        "optimizer state": states["optimizer state"] if at != "loading the base" else 0,
        "DDP buckets": share.buckets,
        "gathered unit": (
            at_moment.get(at, computing) if at not in ("optimizer step", "loading the base") else 0
        ),
        "activations": acts,
        "transient": transient,
        "step temporaries": temps_now,
    }
    peak = sum(categories.values())
    terms = headroom_for(sharding, n_gpus)  # the CUDA context and the profile's reserve
    kept = {t.name: t.bytes_for(peak) for t in terms} if headroom else {}
    formula = _formula_total(
        cfg,
        c.total,
        batch,
        seq,
        precision,
        sum(states.values()) + share.gathered + share.buckets,
        checkpointing,
    )
    extras = _extras(
        optimizer_impl=optimizer_impl,
        lora=lora,
        logits_kept=logits_kept,
        ce_chunks=ce_chunks,
        activation_offload=activation_offload,
        cpu_offload=cpu_offload,
        optimizer_in_backward=optimizer_in_backward,
        grad_accumulation=grad_accumulation,
        mesh=mesh,
        reshard_after_forward=reshard_after_forward,
        reduce_dtype=reduce_dtype,
        gradient_sync=gradient_sync,
        block=block,
    )
    unified = math.ceil(whole.unified * share.fraction / ranks)  # this GPU's paged state
    notes = _notes(optimizer, on_cpu, sharding, unified)
    return FitReport(
        label,
        batch,
        seq,
        precision,
        optimizer,
        checkpointing,
        sharding,
        n_gpus,
        c.total,
        categories,
        states,
        peaks,
        kept,
        share.unit,
        formula,
        card,
        seconds=time.perf_counter() - start,
        extras=extras,
        notes=notes,
        unit_bytes=computing,
        arguments=dict(
            preset=cfg if label == "custom decoder" else label,
            batch=batch,
            seq=seq,
            precision=precision,
            optimizer=optimizer,
            checkpointing=checkpointing,
            sharding=sharding,
            n_gpus=n_gpus,
            gpu=card,
            headroom=headroom,
            optimizer_impl=optimizer_impl,
            lora_rank=lora_rank,
            lora_targets=lora_targets,
            lora_base=lora_base,
            lora_dropout=lora_dropout,
            nf4_chunk=nf4_chunk,
            nf4_double_quant=nf4_double_quant,
            logits_kept=logits_kept,
            ce_chunks=ce_chunks,
            activation_offload=activation_offload,
            cpu_offload=cpu_offload,
            optimizer_in_backward=optimizer_in_backward,
            grad_accumulation=grad_accumulation,
            tp=tp,
            pp=pp,
            cp=cp,
            pp_microbatches=pp_microbatches,
            reshard_after_forward=reshard_after_forward,
            reduce_dtype=reduce_dtype,
            gradient_sync=gradient_sync,
            block=block,
        ),
    )


def _fsdp2_moments(
    share,
    moments,
    forward_acts,
    block_held,
    block,
    head,
    root_grads,
    held_grads,
    no_shards,
    layers,
    kept_at_end=0,
) -> tuple[dict, dict]:
    """FSDP2's moments (``profiles._fsdp2`` says what is gathered at each, and why): the end of
    forward as any profile's; the start of backward with only the root's gradients made before
    the blocks' (``root_grads``: the final norm's and the head's, a tied head's into the
    embedding's), which the root keeps unsharded to the end of backward; the middle, in the
    last block's backward or the one before it, whichever holds more (the last holds every
    block's activations, the one before the last's reduce-scatter input and gradient shard);
    the end, in the first block's. A block's unsharded gradients are there in its backward.
    ``no_shards``: the gradient shards are not on the device (stepped in backward and freed,
    or offloaded to the CPU). With the optimizer step in backward each shard steps in its
    unit's ``post_backward``, after the unit's unsharded gradients are freed: its temporaries
    (a shard's) come at none of these moments. ``kept_at_end``: what a loop that keeps its
    logits still holds of this micro-batch's graph at the end of backward (``kept_graph``).
    Returns the moments and the bytes gathered at each."""
    shards = dict.fromkeys(share.moment_shards, 0) if no_shards else share.moment_shards
    at = dict(share.at)

    def in_block(held_blocks, name):
        grads = (held_grads or share.block_shard * shards[name]) + root_grads + share.block_grads
        return (held_blocks * block_held, block.backward_over, grads, 0)

    out = dict(moments)
    out["start of backward"] = (forward_acts, head.backward_over, held_grads + root_grads, 0)
    middle, name = in_block(layers, "last block"), "last block"
    if layers > 2:
        before = in_block(layers - 1, "block before")
        if sum(before) + at["block before"] > sum(middle) + at["last block"]:
            middle, name = before, "block before"
    out["middle of backward"] = middle
    at["middle of backward"] = at[name]
    acts, *rest = in_block(1, "end of backward")
    out["end of backward"] = (acts + kept_at_end, *rest)  # ``logits_kept``: this graph's
    return out, at


def _extras(
    *,
    optimizer_impl,
    lora,
    logits_kept,
    ce_chunks,
    activation_offload,
    cpu_offload,
    optimizer_in_backward,
    grad_accumulation,
    mesh,
    reshard_after_forward,
    reduce_dtype,
    gradient_sync,
    block,
) -> tuple[str, ...]:
    """The knobs away from their defaults, in words (the default answer's text is unchanged)."""
    said = []
    if optimizer_impl != "foreach":
        said.append(f"{optimizer_impl} step")
    if lora is not None:
        base = {"nf4": "QLoRA (NF4 base)", "bnb-nf4": "QLoRA (bitsandbytes NF4 base)"}
        base = base.get(lora.base, "LoRA")
        said.append(f"{base} rank {lora.rank} on {lora.targets}")
        if lora.dropout:
            said.append(f"LoRA dropout {lora.dropout:g}")
        if not lora.double_quant:
            said.append("NF4 without double quantization")
    if logits_kept:
        said.append("the last micro-batch's logits (and graph) kept")
    if ce_chunks > 1:
        said.append(f"cross-entropy in {ce_chunks} chunks")
    if activation_offload:
        said.append("activations offloaded")
    if cpu_offload:
        said.append("states offloaded to the CPU")
    if optimizer_in_backward:
        said.append("optimizer step in backward")
    if grad_accumulation > 1:
        said.append(f"{grad_accumulation} micro-batches accumulated")
    for name in ("tp", "pp", "cp"):
        if getattr(mesh, name) > 1:
            said.append(f"{name.upper()} {getattr(mesh, name)}")
    if mesh.pp > 1 and mesh.microbatches:
        said.append(f"{mesh.microbatches} pipeline micro-batches")
    if not reshard_after_forward:
        said.append("reshard_after_forward=False")
    if reduce_dtype == "fp32":
        said.append("fp32 gradient reduction")
    if gradient_sync == "last":
        said.append("gradients synced on the last micro-batch only (no_sync)")
    if block == "litgpt":
        said.append("litgpt 8641822's block")
    return tuple(said)


def _notes(optimizer: str, on_cpu: dict, sharding: str, unified: int = 0) -> tuple[str, ...]:
    notes = ["eager mode: torch.compile and Float8 change what is saved (a band, not modelled)"]
    if optimizer in ("paged-adamw8bit", "paged-adamw"):
        eight = optimizer == "paged-adamw8bit"
        notes.append(
            f"paged {'8' if eight else '32'}-bit AdamW keeps {format_bytes(unified)} of its "
            "moments (those of tensors of 100,000 elements or more) in CUDA unified memory, "
            "outside PyTorch's allocator: not in this peak, and paged to the CPU when the GPU "
            f"runs short; {'their block scales and ' if eight else ''}the smaller tensors' "
            "moments are in it"
        )
    if on_cpu:
        notes.append(f"on the CPU (offloaded): {format_bytes(sum(on_cpu.values()))} of states")
    return tuple(notes)
