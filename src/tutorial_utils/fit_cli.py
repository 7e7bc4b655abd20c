"""``python -m tutorial_utils fit MODEL [options]``: will it fit, and what to change if not.

One job: the calculator's command line. Its parser and every check of the arguments run
before torch is imported, so ``--help`` and a mistyped argument answer at once (torch takes
seconds to import); ``fit`` and ``fit_advice`` are imported only to answer.

    python -m tutorial_utils fit llama-3-8b --precision bf16 --optimizer adam \\
        --seq 4096 --batch 4 --gpu 80GB
"""

from __future__ import annotations

import argparse
import sys

from . import fit_inputs

__all__ = ["main", "parser"]


class _Refused(Exception):
    """An argument the parser refused: printed as one sentence, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _Refused(message)


def _reader(read):
    """An argparse ``type`` that turns ``fit_inputs``' one-sentence errors into argparse's."""

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
        return fit_inputs.positive_int(what, value, largest)

    read.__name__ = what
    return _reader(read)


def parser() -> argparse.ArgumentParser:
    """The command line's parser (every option has a line in ``--help``)."""
    p = _Parser(
        prog="python -m tutorial_utils fit",
        description=(
            "Will it fit? One GPU's memory at the peak of a training step (exact, on fake "
            "tensors: nothing is allocated), the headroom kept, and the smallest changes that "
            "make it fit."
        ),
        epilog=f"GPUs in the table: {', '.join(fit_inputs.GPUS)}.",
    )
    models = ", ".join(f"{k} ({v[0]})" for k, v in fit_inputs.MODELS.items())
    p.add_argument(
        "model",
        type=_reader(fit_inputs.model),
        help=f"the model, as people name it: {models}; also meta-llama/Llama-3.1-8B and the like",
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
        type=_reader(fit_inputs.recipe),
        default="autocast-bf16",
        help="bf16 / fp16 (autocast over fp32 weights, as Hugging Face's bf16=True), mixed "
        "(bf16 weights + fp32 master), bf16-master-fp32-grads (DeepSpeed's), pure-bf16, fp32 "
        "(default bf16)",
    )
    p.add_argument(
        "--optimizer",
        type=_reader(fit_inputs.optimizer),
        default="adamw",
        help="adam / adamw (two fp32 moments per parameter), sgd-momentum, sgd (default adamw)",
    )
    p.add_argument(
        "--checkpointing",
        type=_reader(fit_inputs.checkpointing),
        default="none",
        help="activation checkpointing: none, full, every-matmul, or selective "
        "(torchtitan's: every second matmul) (default none)",
    )
    p.add_argument(
        "--sharding",
        type=_reader(fit_inputs.sharding),
        default="none",
        help="none (or ddp: each GPU holds everything), zero1, zero2, zero3 (or fsdp) "
        "(default none)",
    )
    p.add_argument(
        "--gpus",
        "--n-gpus",
        dest="gpus",
        type=_count("--gpus", 2**20),
        default=1,
        help="how many GPUs train together (default 1)",
    )
    card = p.add_mutually_exclusive_group()
    card.add_argument(
        "--gpu",
        type=_reader(fit_inputs.gpu),
        metavar="NAME",
        help="the GPU: a name from the table below (RTX 4090, A100-40GB, H100...) or its "
        "memory (24GB, 80GiB)",
    )
    card.add_argument(
        "--gpu-memory",
        type=_reader(fit_inputs.gpu_memory),
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


def _arguments(argv: list[str]) -> argparse.Namespace:
    args = parser().parse_args(argv)
    positions = fit_inputs.LEARNED_POSITIONS.get(args.model)
    if args.seq is None:
        args.seq = min(2048, positions or 2048)
    if positions and args.seq > positions:
        raise _Refused(
            f"{args.model} has {positions} learned positions; give --seq {positions} or less"
        )
    if args.sharding != "none" and args.gpus == 1:
        raise _Refused(
            f"{args.sharding} shards over several GPUs and does nothing on one: "
            "give --gpus 2 or more, or --sharding none"
        )
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
    from . import fit, fit_advice  # torch: only now

    try:
        report = fit.will_it_fit(
            args.model,
            batch=args.batch,
            seq=args.seq,
            precision=args.precision,
            optimizer=args.optimizer,
            checkpointing=args.checkpointing,
            sharding=args.sharding,
            n_gpus=args.gpus,
            gpu=args.gpu,
            headroom=not args.no_headroom,
        )
    except (TypeError, ValueError) as err:
        print(f"fit: {err}", file=sys.stderr)
        return 2
    print(f"Read as: {report.preset}, {fit_inputs.RECIPES[report.precision]}, {report.optimizer}.")
    print(report)
    if report.headroom:
        for term in fit_inputs.HEADROOM:
            print(f"  ({term.name}: {term.source})")
    if report.fits is False:
        print("What would make it fit:")
        print(fit_advice.advise(report))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
