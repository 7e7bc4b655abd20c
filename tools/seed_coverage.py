"""Where the course answers each claim of the source guide, and proof that it still does.

    python tools/seed_coverage.py           # print the table
    python tools/seed_coverage.py --write   # rewrite docs/seed-coverage.md
    python tools/seed_coverage.py --check   # exit 1 if a row's evidence is gone or the doc is stale

The audit (``../shared/research/seed-audit.md`` in the project's shared folder) checked the 33
claims of "PyTorch 101: Memory Management and Using Multiple GPUs" against PyTorch 2.13. Each
row below names the notebook that answers it and a pattern that must match a cell of the kind
named (``code``: a cell that runs and checks it; ``markdown``: prose). The section is found from
the notebook itself, so renumbering a notebook cannot make the table lie: ``--check`` (run by
``tests/test_seed_coverage.py``) fails when a pattern no longer matches.

**fully**: a cell runs the claim and checks it on the device it runs on (on a CPU where a CPU
can show it), or, for what only a GPU shows, the cell checks what a CPU can (the docstring, the
API) and a published or recorded GPU figure is shown with its source. **partly**: the notebook
says it, but what proves it is a citation only; the note says what is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
DOC = ROOT / "docs" / "seed-coverage.md"


@dataclass(frozen=True)
class Row:
    n: int
    claim: str  # the guide's claim, in a few words (never its sentences)
    verdict: str  # the audit's verdict
    status: str  # fully | partly
    notebook: str  # prefix of the notebook's file name, e.g. "01"
    kind: str  # code | markdown
    evidence: str  # a regular expression that must match a cell of that kind
    how: str  # what the cell does
    missing: str = ""  # for partly: what is not proven, and why


ROWS: tuple[Row, ...] = (
    Row(1, "code blocks as printed", "wrong", "fully", "01", "code",
        r"typographic quotes", "compiles the guide's line with its curly quotes: SyntaxError"),
    Row(2, "CUDA and cuDNN pick the device", "misleading", "fully", "01", "code",
        r"current_accelerator\(check_available=True\)",
        "the code picks the device with torch.accelerator"),
    Row(3, "to() takes a device; move new tensors by hand", "incomplete", "fully", "01", "code",
        r"copy=True", "Tensor.to with a str, an int, a dtype, a tensor, copy=; 02 creates on "
        "the device"),
    Row(4, "the is_available() / to(device) recipe", "correct", "fully", "01", "code",
        r"is model|returns self|is x",
        "to() returns a new tensor, or self when nothing changes; asserted"),
    Row(5, "a.to(0)", "correct, with a caveat", "fully", "01", "code", r"\.to\(0\)",
        "an int is an index on the current accelerator; the CPU-only error is shown"),
    Row(6, "cuda() defaults to GPU 0", "misleading", "fully", "01", "code",
        r"torch\.cuda\.device\(1\)",
        "the current device: checked on 2 GPUs; on a CPU, the docstring quoted"),
    Row(7, "Module.to needs no assignment", "correct for Modules only", "fully", "01", "code",
        r"optimizer", "Module.to is in place; build the optimizer after it"),
    Row(8, "torch.get_device() tells the GPU", "misleading", "fully", "02", "code",
        r"get_device\(\)", "Tensor.get_device() is -1 on the CPU; prefer .device"),
    Row(9, "torch.tensor(a.shape) after get_device", "wrong", "fully", "02", "code",
        r"b = torch\.tensor\(a\.shape\)",
        "the guide's line raises AttributeError; exercise 1's checker takes the fix"),
    Row(10, "set_device makes a GPU the default", "outdated", "fully", "02", "code",
        r"set_default_device|with torch\.device\(",
        "torch.device as a context and set_default_device, run on meta and CPU"),
    Row(11, "mixing devices raises", "correct, with exceptions", "fully", "01", "code",
        r"0-dim|zero-dim|scalar", "the error, and the 0-dim CPU tensor that is allowed"),
    Row(12, "new_* came with PyTorch 1.0", "wrong", "fully", "02", "markdown",
        r"0\.4\.0 migration", "cited: PyTorch's 0.4.0 migration guide (2018-04-22) introduces "
        "tensor.new_*; a date cannot be run"),
    Row(13, "new_* and *_like", "misleading", "fully", "02", "code", r"new_full|zeros_like",
        "every new_* and *_like keeps dtype and device, asserted"),
    Row(14, "DataParallel(gpu_ids=...)", "wrong", "fully", "07", "code", r"gpu_ids",
        "the TypeError, then device_ids"),
    Row(15, "DataParallel as the multi-GPU way", "outdated", "fully", "07", "code",
        r"recommended to use",
        "the docstring's recommendation quoted; no deprecation warning when built, asserted"),
    Row(16, "loss.mean().backward() with DataParallel", "incomplete", "partly", "07", "markdown",
        r"inside .forward|loss inside", "the advice: the loss inside forward, one per GPU, mean",
        "the behaviour is a 2-GPU test (tests/test_data_parallel_gpus.py), never run yet"),
    Row(17, "model and data start on GPU 0", "half wrong", "partly", "07", "code",
        r"input_var can be on any device",
        "on 2 GPUs the cell asserts a CPU input taken and a module on cuda:1 refused",
        "a CPU has no DataParallel to split over; that branch has never run"),
    Row(18, "the main GPU works harder", "correct", "partly", "07", "code",
        r"output gathered on", "the gather to output_device (2 GPUs); DDP's one loss per process",
        "the first GPU's extra memory is measured only on 2 GPUs; no run recorded yet"),
    Row(19, "model parallelism is slower", "misleading", "fully", "08", "code",
        r"Schedule1F1B|ScheduleGPipe|pipelin",
        "a naive split and pipelined micro-batches, run on 2 CPU ranks"),
    Row(20, "the model_parallel class", "wrong", "fully", "08", "code", r"def forward\(self",
        "the missing self, fixed, on two devices"),
    Row(21, "gradients flow back across GPUs", "correct", "fully", "08", "code",
        r"ToCopyBackward0", "ToCopyBackward0 in the graph; gradients equal one device's"),
    Row(22, "GPUtil is faster than nvidia-smi", "wrong", "fully", "00", "code",
        r"max_memory_allocated|peak", "the allocator's peak, and what a poller misses"),
    Row(23, "del out, loss; i survives the loop", "correct", "fully", "04", "code",
        r"del out", "the graph's saved tensors freed only when every reference is gone"),
    Row(24, "total_loss += loss builds a graph", "correct", "fully", "04", "code",
        r"\.item\(\)|detach\(\)", "the graph grows; detach() on the device, .item() per log"),
    Row(25, "empty_cache() fixes an OOM", "wrong", "fully", "00", "code", r"empty_cache",
        "empty_cache frees no live tensor (checked on a GPU, its docstring quoted); "
        "expandable_segments in 04"),
    Row(26, "the GPUtil + empty_cache demo", "misleading", "fully", "00", "code",
        r"allocator_vs_nvml", "allocated, reserved and NVML's used after allocate, free and "
        "empty_cache (GPU); on a CPU the recorded run, or a published CUDA-context figure"),
    Row(27, "torch.no_grad() for inference", "correct idea, broken snippet", "fully", "04",
        "code", r"inference_mode", "inference_mode, and that neither calls eval()"),
    Row(28, "cudnn.benchmark = True; enabled = True", "incomplete", "fully", "05", "code",
        r"cudnn\.enabled", "the defaults, asserted; benchmark and determinism"),
    Row(29, "RTX and Volta can train in fp16", "incomplete", "fully", "05", "code",
        r"get_device_capability|is_bf16_supported",
        "the learner's own capability calls; Tensor Core speedups quoted with sources"),
    Row(30, "mixed precision halves memory", "misleading", "fully", "05", "code",
        r"saved_for_backward",
        "measured against a formula: activations shrink, parameters and state do not"),
    Row(31, "model.half() is mixed precision", "wrong", "fully", "05", "code", r"\.half\(\)",
        "pure fp16 against autocast + GradScaler"),
    Row(32, "keep BatchNorm in fp32 with .float()", "outdated", "fully", "05", "code",
        r"batch_norm|BatchNorm", "under autocast BatchNorm's buffers stay fp32, checked"),
    Row(33, "NVIDIA Apex for mixed precision", "outdated", "fully", "05", "code",
        r"FutureWarning", "torch.cuda.amp's FutureWarning; torch.amp instead"),
)  # fmt: skip


@dataclass(frozen=True)
class Found:
    row: Row
    notebook: str | None  # the file name
    section: str | None  # the heading of the first matching cell's section
    cell: int | None


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def locate(row: Row) -> Found:
    """The first cell of the row's kind in its notebook that matches its evidence."""
    paths = sorted(NOTEBOOKS.glob(f"{row.notebook}_*.ipynb"))
    if not paths:
        return Found(row, None, None, None)
    pattern = re.compile(row.evidence)
    section = "Intro"
    for i, cell in enumerate(_cells(paths[0])):
        text = _source(cell)
        if cell.get("cell_type") == "markdown":
            for line in text.splitlines():
                if line.startswith("## "):
                    section = line[3:].strip()
        if cell.get("cell_type") == row.kind and pattern.search(text):
            return Found(row, paths[0].name, section, i)
    return Found(row, paths[0].name, None, None)


def problems() -> list[str]:
    out = []
    for row in ROWS:
        found = locate(row)
        if found.notebook is None:
            out.append(f"row {row.n}: no notebook {row.notebook}_*.ipynb")
        elif found.cell is None:
            out.append(
                f"row {row.n}: no {row.kind} cell of {found.notebook} matches {row.evidence!r}: "
                "the claim's answer moved or was cut; point the row at where it is now"
            )
    if [r.n for r in ROWS] != list(range(1, 34)):
        out.append("ROWS must list the audit's rows 1-33 in order")
    return out


def render() -> str:
    fully = sum(r.status == "fully" for r in ROWS)
    lines = [
        "# The source guide's claims, and where the course answers each",
        "",
        "Written by `python tools/seed_coverage.py --write`; do not edit by hand.",
        "`tests/test_seed_coverage.py` fails when a row's evidence is no longer in its notebook.",
        "",
        f"{fully} of {len(ROWS)} rows fully, {len(ROWS) - fully} partly. **fully**: a cell runs "
        "the claim and checks it (on a CPU where a CPU can show it; for what only a GPU shows, "
        "the cell checks what a CPU can, and a published or recorded GPU figure stands beside "
        "it). **partly**: said, but proven by a citation only.",
        "",
        "| # | the guide | audit | course | notebook, section (cell) | how |",
        "| ---: | --- | --- | --- | --- | --- |",
    ]
    for row in ROWS:
        f = locate(row)
        where = f"`{f.notebook}` {f.section} (c{f.cell})" if f.cell is not None else "MISSING"
        how = row.how + (f". Missing: {row.missing}" if row.missing else "")
        lines.append(f"| {row.n} | {row.claim} | {row.verdict} | {row.status} | {where} | {how} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true")
    group.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    text = render()
    if args.write:
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC.relative_to(ROOT)}")
    elif args.check:
        if not DOC.is_file() or DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC.relative_to(ROOT)} is stale: python tools/seed_coverage.py --write")
            return 1
    else:
        print(text)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
