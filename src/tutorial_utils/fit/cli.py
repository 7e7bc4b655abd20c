"""``python -m tutorial_utils fit MODEL [options]``: will it fit, and what to change if not.

One job: the calculator's command line. Its parser and every check of the arguments run
before ``peak`` and ``advice`` are imported, and those import torch only for a question with
no activation formula (``activation_formulas`` says which), so ``--help``, a mistyped
argument and the common questions answer without it (torch takes seconds to import).

    python -m tutorial_utils fit llama-3-8b --precision bf16 --optimizer adam \\
        --seq 4096 --batch 4 --gpu 80GB
"""

from __future__ import annotations

import argparse
import sys

from . import cards, inputs, presets

__all__ = ["main", "parser"]


class _Refused(Exception):
    """An argument the parser refused: printed as one sentence, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _Refused(message)


def _reader(read):
    """An argparse ``type`` that turns ``inputs``' one-sentence errors into argparse's."""

    def convert(text):
        try:
            return read(text)
        except (TypeError, ValueError) as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = read.__name__
    return convert


def _count(what: str, largest: int):
    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{what} must be a whole number such as 4, not {text!r}") from None
        return inputs.positive_int(what, value, largest)

    read.__name__ = what
    return _reader(read)


def parser() -> argparse.ArgumentParser:
    """The command line's parser (every option has a line in ``--help``)."""
    p = _Parser(
        prog="python -m tutorial_utils fit",
        description=(
            "Will it fit? One GPU's memory at the peak of a training step in eager mode "
            "(activations exact: by a formula checked against fake tensors, or on fake tensors; "
            "nothing is allocated), the headroom kept, and "
            "the smallest changes that make it fit, each with its cost."
        ),
        epilog=f"GPUs in the table: {', '.join(cards.CARDS)}. The answer is for eager mode.",
    )
    models = ", ".join(presets.PRESETS)
    p.add_argument(
        "model",
        nargs="?",
        type=_reader(presets.model),
        help=f"the model, as people name it: {models}; also meta-llama/Llama-3.1-8B and the "
        "like (or give --config)",
    )
    p.add_argument(
        "--config",
        type=_reader(presets.from_config_json),
        metavar="PATH",
        help="a Hugging Face config.json (Llama, Mistral, Qwen2, Gemma, GPT-2 families) "
        "instead of a model name",
    )
    p.add_argument(
        "--dims",
        type=_reader(_dims),
        metavar="K=V,...",
        help="explicit dimensions instead: vocab, d_model, n_layers, n_heads, n_kv_heads, d_ff, "
        "tied (e.g. vocab=32000,d_model=4096,n_layers=32,n_heads=32,d_ff=11008); a Llama-style "
        "block unless norm=layer,mlp=gelu",
    )
    p.add_argument(
        "--batch",
        type=_count("batch", 2**31),
        default=1,
        help="sequences per GPU per step (default 1)",
    )
    p.add_argument(
        "--seq",
        type=_count("seq", 2**31),
        default=None,
        help="tokens per sequence (default 2048, or GPT-2's 1024 positions)",
    )
    p.add_argument(
        "--precision",
        type=_reader(inputs.recipe),
        default="autocast-bf16",
        help="bf16 / fp16 (autocast over fp32 weights, as Hugging Face's bf16=True), mixed "
        "(bf16 weights + fp32 master), bf16-master-fp32-grads (DeepSpeed's), pure-bf16, fp32 "
        "(default bf16)",
    )
    p.add_argument(
        "--optimizer",
        type=_reader(inputs.optimizer),
        default="adamw",
        help="adam / adamw (two fp32 moments per parameter), adamw8bit, paged-adamw8bit, "
        "paged-adamw (bitsandbytes), sgd-momentum, sgd (default adamw)",
    )
    p.add_argument(
        "--optimizer-impl",
        type=_reader(inputs.optimizer_impl),
        default="foreach",
        help="how torch.optim steps: foreach (torch's default on CUDA), fused, forloop "
        "(default foreach)",
    )
    p.add_argument(
        "--optimizer-in-backward",
        action="store_true",
        help="step each parameter as its gradient is made, then free it (notebook 03, section 7)",
    )
    p.add_argument(
        "--grad-accumulation",
        type=_count("--grad-accumulation", 2**20),
        default=1,
        metavar="K",
        help="micro-batches per optimizer step (the gradients are held through the later "
        "forwards) (default 1)",
    )
    p.add_argument(
        "--lora",
        type=_count("--lora", 2**16),
        default=0,
        metavar="RANK",
        help="train LoRA adapters of this rank, the base frozen (default: full training)",
    )
    p.add_argument(
        "--lora-targets",
        type=_reader(inputs.lora_targets),
        default="attention",
        help="which linears LoRA adapts: qv (q and v: PEFT's and litgpt's default), attention "
        "(q, k, v, output) or all (with the MLP) (default attention)",
    )
    p.add_argument(
        "--qlora",
        action="store_true",
        help="with --lora: the frozen base in NF4 (4-bit), as QLoRA",
    )
    p.add_argument(
        "--qlora-library",
        choices=("torchao", "bitsandbytes"),
        default=None,
        help="with --qlora: whose NF4 holds the base: torchao's (torchtune's QLoRA recipes) or "
        "bitsandbytes' (litgpt's --quantize bnb.nf4, Hugging Face's BitsAndBytesConfig) "
        "(default torchao)",
    )
    p.add_argument(
        "--no-double-quant",
        dest="nf4_double_quant",
        action="store_false",
        help="with --qlora-library bitsandbytes: NF4 without double quantization, so each "
        "block of 64 weights keeps an fp32 scale (litgpt's --quantize bnb.nf4; its bnb.nf4-dq "
        "and torchao's NF4 quantize the scales too)",
    )
    p.add_argument(
        "--lora-dropout",
        type=_reader(_probability),
        default=None,
        metavar="P",
        help="with --lora: dropout on the adapters' input, whose mask is saved for backward "
        "(torchtune's and litgpt's LoRA recipes use 0.05) (default 0)",
    )
    p.add_argument(
        "--ce-chunks",
        type=_count("--ce-chunks", 2**12),
        default=1,
        metavar="N",
        help="cross-entropy in N chunks, each upcast to fp32 on its own (torchtune's "
        "CEWithChunkedOutputLoss uses 8) (default 1)",
    )
    p.add_argument(
        "--logits-kept",
        action="store_true",
        help="the training loop keeps the last micro-batch's logits, and so its graph, until "
        "the next forward returns (litgpt's finetune scripts: logits = model(...) stays bound)",
    )
    p.add_argument(
        "--activation-offload",
        action="store_true",
        help="saved activations to pinned CPU memory (torchtune's activation offloading)",
    )
    p.add_argument(
        "--cpu-offload",
        action="store_true",
        help="with zero3/fsdp: the sharded parameters, gradients and optimizer state on the CPU",
    )
    p.add_argument(
        "--checkpointing",
        type=_reader(inputs.checkpointing),
        default="none",
        help="activation checkpointing: none, full, every-matmul, or selective "
        "(torchtitan's: every second matmul) (default none)",
    )
    p.add_argument(
        "--sharding",
        type=_reader(inputs.sharding),
        default="none",
        help="none (or ddp: each GPU holds everything), zero1, zero2, zero3 (or fsdp), fsdp1 "
        "(FULL_SHARD), fsdp1-grad-op (SHARD_GRAD_OP), fsdp2 (fully_shard) (default none)",
    )
    p.add_argument(
        "--gpus",
        "--n-gpus",
        dest="gpus",
        type=_count("--gpus", 2**20),
        default=1,
        help="how many GPUs train together (default 1)",
    )
    for name, what in (
        ("--tp", "tensor-parallel degree, with sequence parallelism"),
        ("--pp", "pipeline stages (1F1B)"),
        ("--cp", "context-parallel degree (the sequence split)"),
    ):
        p.add_argument(name, type=_count(name, 2**12), default=1, help=f"{what} (default 1)")
    p.add_argument(
        "--pp-microbatches",
        type=_count("--pp-microbatches", 2**16),
        default=None,
        metavar="M",
        help="with --pp: micro-batches per step in the 1F1B schedule (default: as many as stages)",
    )
    p.add_argument(
        "--no-reshard-after-forward",
        dest="reshard_after_forward",
        action="store_false",
        help="FSDP2: keep each block's gathered weights from forward to backward",
    )
    p.add_argument(
        "--reduce-dtype",
        choices=("param", "fp32"),
        default="param",
        help="FSDP2's MixedPrecisionPolicy reduce_dtype: the parameters' dtype, or fp32 "
        "(torchtitan's) (default param)",
    )
    p.add_argument(
        "--block",
        type=_reader(inputs.block),
        default="course",
        help="whose transformer block the activations are of: course (what torchtune's and "
        "torchtitan's blocks save) or litgpt (litgpt 8641822's, which saves more) "
        "(default course)",
    )
    p.add_argument(
        "--gradient-sync",
        choices=("every", "last"),
        default="every",
        help="with --grad-accumulation over FSDP1: reduce every micro-batch's gradients, or "
        "the last one's only, no_sync() around the others (Lightning's no_backward_sync) "
        "(default every)",
    )
    card = p.add_mutually_exclusive_group()
    card.add_argument(
        "--gpu",
        type=_reader(cards.gpu),
        metavar="NAME",
        help="the GPU: a name from the table below (RTX 4090, A100-40GB, H100...) or its "
        "memory (24GB, 80GiB)",
    )
    card.add_argument(
        "--gpu-memory",
        type=_reader(cards.gpu_memory),
        dest="gpu",
        metavar="SIZE",
        help="the GPU's memory, like 24GB (10^9 bytes) or 80GiB (2^30 bytes)",
    )
    p.add_argument(
        "--no-headroom",
        action="store_true",
        help="compare the tensors' peak alone, without the CUDA context and the allocator's "
        "reserve",
    )
    return p


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise ValueError(f"--lora-dropout must be a probability from 0 to below 1, not {text!r}")
    return value


_DIM_NAMES = {"vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "d_head", "tied"}
_DIM_WORDS = {"norm": ("rms", "layer"), "mlp": ("swiglu", "gelu")}


def _dims(text: str) -> tuple[str, dict]:
    """``vocab=32000,d_model=4096,...`` as a decoder's fields (a Llama-style block by default)."""
    fields: dict = {"norm": "rms", "mlp": "swiglu", "bias": False, "tied": False}
    fields["max_positions"] = 0
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip().replace("-", "_")
        if name in _DIM_WORDS:
            if value not in _DIM_WORDS[name]:
                raise ValueError(f"--dims {name} must be one of {', '.join(_DIM_WORDS[name])}")
            fields[name] = value
            continue
        if name not in _DIM_NAMES:
            raise ValueError(
                f"--dims has no {name!r}: give {', '.join(sorted(_DIM_NAMES | set(_DIM_WORDS)))}"
            )
        if name == "tied":
            fields[name] = value.lower() in ("1", "true", "yes")
            continue
        try:
            fields[name] = inputs.positive_int(name, int(value), 2**24)
        except ValueError:
            raise ValueError(
                f"--dims {name} must be a whole number such as 4096, not {value!r}"
            ) from None
    missing = {"vocab", "d_model", "n_layers", "n_heads"} - set(fields)
    if missing:
        raise ValueError(f"--dims needs {', '.join(sorted(missing))} too")
    if fields["norm"] == "layer":
        fields |= {"bias": True, "max_positions": fields.get("max_positions") or 0}
    return "custom dimensions", fields


_LORA_BASE = {"torchao": "nf4", "bitsandbytes": "bnb-nf4"}  # will_it_fit's lora_base


def _arguments(argv: list[str]) -> argparse.Namespace:
    args = parser().parse_args(argv)
    given = [x for x in (args.model, args.config, args.dims) if x is not None]
    if len(given) != 1:
        raise _Refused("give one model: a name (like llama-3.1-8b), --config PATH or --dims")
    if args.model is not None:
        positions = presets.learned_positions(args.model)
        args.label, args.shape = args.model, args.model
    else:
        args.label, args.shape = args.config or args.dims
        positions = args.shape.get("max_positions", 0)
    if args.seq is None:
        args.seq = min(2048, positions or 2048)
    if positions and args.seq > positions:
        raise _Refused(
            f"{args.label} has {positions} learned positions; give --seq {positions} or less"
        )
    if args.sharding != "none" and args.gpus == 1:
        raise _Refused(
            f"{args.sharding} shards over several GPUs and does nothing on one: "
            "give --gpus 2 or more, or --sharding none"
        )
    if args.qlora and not args.lora:
        raise _Refused("--qlora quantizes LoRA's frozen base: give --lora RANK too")
    if args.lora_dropout is not None and not args.lora:
        raise _Refused("--lora-dropout is on LoRA's adapters: give --lora RANK too")
    if args.qlora_library is not None and not args.qlora:
        raise _Refused("--qlora-library says whose NF4 holds the base: give --qlora too")
    if not args.nf4_double_quant and args.qlora_library != "bitsandbytes":
        raise _Refused(
            "--no-double-quant is bitsandbytes' NF4 without double quantization (torchao's "
            "always has it): give --lora RANK --qlora --qlora-library bitsandbytes too"
        )
    if args.logits_kept and args.tp * args.pp * args.cp > 1:
        raise _Refused(
            "--logits-kept is modelled for one GPU, DDP and FSDP: leave out --tp, --pp and --cp"
        )
    if args.pp_microbatches is not None and args.pp == 1:
        raise _Refused("--pp-microbatches feeds a pipeline: give --pp 2 or more too")
    return args


def main(argv: list[str] | None = None) -> int:
    """Answer on stdout (exit 0 if it fits or no GPU was given, 1 if it does not fit), or one
    sentence on stderr saying what is wrong with the arguments (exit 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _arguments(argv)
    except _Refused as err:
        print(f"fit: {err}", file=sys.stderr)
        return 2
    from .advice import advise  # torch only where no formula is written
    from .headroom import headroom_for
    from .peak import will_it_fit

    try:
        report = will_it_fit(
            args.shape,
            batch=args.batch,
            seq=args.seq,
            precision=args.precision,
            optimizer=args.optimizer,
            checkpointing=args.checkpointing,
            sharding=args.sharding,
            n_gpus=args.gpus,
            gpu=args.gpu,
            headroom=not args.no_headroom,
            optimizer_impl=args.optimizer_impl,
            optimizer_in_backward=args.optimizer_in_backward,
            grad_accumulation=args.grad_accumulation,
            lora_rank=args.lora,
            lora_targets=args.lora_targets,
            lora_base=_LORA_BASE[args.qlora_library or "torchao"] if args.qlora else "bf16",
            lora_dropout=args.lora_dropout or 0.0,
            nf4_double_quant=args.nf4_double_quant,
            logits_kept=args.logits_kept,
            pp_microbatches=args.pp_microbatches or 0,
            ce_chunks=args.ce_chunks,
            activation_offload=args.activation_offload,
            cpu_offload=args.cpu_offload,
            tp=args.tp,
            pp=args.pp,
            cp=args.cp,
            reshard_after_forward=args.reshard_after_forward,
            reduce_dtype=args.reduce_dtype,
            gradient_sync=args.gradient_sync,
            block=args.block,
        )
    except (TypeError, ValueError) as err:
        print(f"fit: {err}", file=sys.stderr)
        return 2
    name = report.preset if args.model is not None else args.label
    print(f"Read as: {name}, {inputs.RECIPES[report.precision]}, {report.optimizer}.")
    print(report)
    if report.headroom:
        for term in headroom_for(report.sharding, report.n_gpus):
            print(f"  ({term.name}: {term.source})")
            if term.band is not None:
                low, high = (f * report.peak_bytes for f in term.band)
                print(
                    f"  (published pairs put the {term.name} at {low / 2**30:.1f}-"
                    f"{high / 2**30:.1f} GiB for this peak)"
                )
    low, high = report.compile_band
    print(
        f"  ({report.notes[0]}; published compile/Float8 runs: {low / 2**30:.1f}-"
        f"{high / 2**30:.1f} GiB for this total)"
    )
    for note in report.notes[1:]:
        print(f"  ({note})")
    if report.gpu is not None and report.gpu.source:
        print(f"  (GPU memory: {report.gpu.source})")
    if report.fits is False:
        print("What would make it fit:")
        print(advise(report))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
