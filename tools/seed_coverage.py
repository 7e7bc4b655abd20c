"""Where the course answers each claim of the source guide, and what proves it (derived).

    python tools/seed_coverage.py           # print the page
    python tools/seed_coverage.py --write   # rewrite docs/seed-coverage.md
    python tools/seed_coverage.py --check   # exit 1 if the doc is stale or a row's evidence is
                                            # gone or proves nothing

The audit (``../shared/research/seed-audit.md`` in the project's shared folder) checked the 33
claims of "PyTorch 101: Memory Management and Using Multiple GPUs" against PyTorch 2.13. Each row
below names its evidence: a notebook (by its number) or a test file, and a regular expression. The
first cell of the evidence's kind (code or markdown) whose source matches is the evidence cell;
the line on which the match ends is the evidence line. A cell tagged ``seed-N`` in its metadata is
row N's evidence cell in that notebook, whatever the pattern says; the pattern then picks the line
if it matches there, and otherwise every check of the cell counts.

Nobody writes a row's status: this tool derives it from the evidence itself, so the page cannot
claim more than runs.

- **run here**: the evidence line is a check (an ``assert``, a ``raise AssertionError``, a checker
  call ending in ``.assert_passed()``) or an expected error that strict nbval compares (a cell
  tagged ``raises-exception``, or the ``except`` handler that prints a caught error in a cell whose
  output nbval compares), and no guard that is false on a CPU stands above it. The committed CPU
  output must show that the cell ran: an execution count, and no error unless one is expected.
- **runs on a GPU only**: the evidence line is a check under a guard that is false on a CPU
  (``if caps.cuda:``, ``if devices.has_gpu(2):``, the ``else`` of ``if devs.stand_ins:``, a test's
  ``skipif(torch.cuda.device_count() < 2)``). What it needs (1 GPU, 2 GPUs) is read from the guard.
  On a CPU the cell only explains: its committed output must hold the text the guard's CPU branch
  prints (or, where that branch only displays an object, some output), which also shows that the
  CPU run took the branch the tool thinks it did.
- **cited**: prose (a markdown cell) that names its source with a link, and nothing that runs it.
  Prose without a link is "said": it places the claim in a section and proves nothing.

A row with several pieces of evidence is "runs on a GPU only" if any piece is (the whole claim
needs that run), else "run here" if any piece runs here, else "cited". ``--check`` (run by
``tests/test_seed_coverage.py``) fails when a pattern matches nothing, when an evidence line is not
a check, when a guard above it is one ``GUARDS`` does not know, when a cell's committed output
contradicts its status, or when the page differs from what this tool writes.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
DOC = ROOT / "docs" / "seed-coverage.md"

RUN, GPU, CITED = "run here", "runs on a GPU only", "cited"
# What a piece of evidence can be besides those three; each is a problem when a row relies on it.
SAID, NOT_CHECKED, UNDECIDED, MISSING = "said", "not checked", "undecided", "missing"


@dataclass(frozen=True)
class Evidence:
    source: str  # a notebook's number ("01") or a test file ("tests/test_x.py")
    pattern: str  # a regular expression; the line its match ends on is the evidence line
    kind: str = "code"  # code | markdown (a notebook's cell type)


def code(source: str, pattern: str) -> Evidence:
    return Evidence(source, pattern, "code")


def prose(source: str, pattern: str) -> Evidence:
    return Evidence(source, pattern, "markdown")


@dataclass(frozen=True)
class Row:
    n: int
    claim: str  # the guide's claim, in a few words (never its sentences)
    verdict: str  # the audit's verdict
    evidence: tuple[Evidence, ...]
    how: str  # what the evidence shows
    on_gpu: str = ""  # for a row that runs on a GPU only: what that run would show


ROWS: tuple[Row, ...] = (
    Row(1, "code blocks as printed", "wrong",
        (code("01", r"except SyntaxError"),),
        "compiles the guide's line with its curly quotes; the SyntaxError it prints is compared"),
    Row(2, "CUDA and cuDNN pick the device", "misleading",
        (code("01", r"assert run_on\.type == caps\.device\.type"),),
        "the code picks the device with torch.accelerator, as capabilities() does"),
    Row(3, "to() takes a device; move new tensors by hand", "incomplete",
        (code("01", r"assert x\.to\(x\.device, copy=True\)"),
         code("02", r"assert inside\.device\.type == other\.type")),
        "Tensor.to with a device, a dtype and copy=; 02 creates tensors on the device"),
    Row(4, "the is_available() / to(device) recipe", "correct",
        (code("01", r"assert x\.to\(x\.device\) is x"),),
        "to() returns a new tensor, or self when nothing changes; x stays where it was"),
    Row(5, "a.to(0)", "correct, with a caveat",
        (code("01", r"assert int_index_worked =="),),
        "an int is an index on the current accelerator; without one, the error"),
    Row(6, "cuda() defaults to GPU 0", "misleading",
        (code("02", r"assert torch\.zeros\(1\)\.cuda\(\)\.device == torch\.device\(\"cuda:1\"\)"),),
        "on fewer than two GPUs the cell says it did not check this",
        "under torch.cuda.device(1), .cuda() with no argument lands on cuda:1, not GPU 0"),
    Row(7, "Module.to needs no assignment", "correct for Modules only",
        (code("01", r"assert model\.to\(torch\.float64\) is model"),
         code("01", r"assert held is not model\.weight")),
        "Module.to works in place; an optimizer built before a move holds stale tensors"),
    Row(8, "torch.get_device() tells the GPU", "misleading",
        (code("02", r"assert t_cpu\.get_device\(\) == -1"),),
        "Tensor.get_device() is -1 on the CPU; .device tells every device apart"),
    Row(9, "torch.tensor(a.shape) after get_device", "wrong",
        (code("02", r"b = torch\.tensor\(a\.shape\)"),
         code("02", r"assert fixed\.dtype == torch\.int64 and fixed\.device == t1\.device")),
        "the guide's line raises AttributeError; the cell before it builds and checks the fix"),
    Row(10, "set_device makes a GPU the default", "outdated",
        (code("02", r"assert following\.device\.type == other\.type"),),
        "with torch.device(...) and set_default_device, run on meta and the CPU"),
    Row(11, "mixing devices raises", "correct, with exceptions",
        (code("01", r"on_cpu \+ elsewhere"), code("01", r"assert not one_dim_ok")),
        "the cross-device error, and the 0-dim CPU tensor and copy_ that are allowed"),
    Row(12, "new_* came with PyTorch 1.0", "wrong",
        (prose("02", r"0\.4\.0 migration"),),
        "PyTorch's 0.4.0 migration guide (April 2018) introduces tensor.new_*; a date cannot run"),
    Row(13, "new_* and *_like", "misleading",
        (code("02", r"assert t\.device == src\.device and t\.dtype"),
         code("02", r"assert ones\.new_ones\(\(3, 4\)\)\.device == ones\.device")),
        "every new_* and *_like keeps dtype and device; the guide's randn lands on the CPU"),
    Row(14, "DataParallel(gpu_ids=...)", "wrong",
        (code("07", r"gpu_ids"),), "the TypeError it raises; the notebook goes on with device_ids"),
    Row(15, "DataParallel as the multi-GPU way", "outdated",
        (code("07", r"assert not old, "),),
        "no deprecation warning when built and run, asserted; the docstring's advice quoted"),
    Row(16, "loss.mean().backward() with DataParallel", "incomplete",
        (prose("07", r"loss inside `forward`"),
         Evidence("tests/test_data_parallel_gpus.py", r"assert per_device\.shape == \(2,\)")),
        "the advice: the loss inside forward, one per GPU, then their mean",
        "DataParallel gathers one loss per GPU (shape (2,)), and their mean is the batch's loss"),
    Row(17, "model and data start on GPU 0", "half wrong",
        (code("07", r"assert \"parameters and buffers on device cuda:0\" in str\(err\)"),),
        "on a CPU, DataParallel only calls the module (asserted); the 2-GPU branch is the proof",
        "a CPU input is taken, and a module on cuda:1 is refused: only the module must start on "
        "device_ids[0]"),
    Row(18, "the main GPU works harder", "correct",
        (code("07", r"assert \(\(got - want\)"),
         code("07", r"assert gap_ddp < tol_ddp")),
        "DDP runs one loss per process on 2 CPU ranks, equal to one process",
        "DataParallel's outputs, gathered on cuda:0, equal one device's; GPU 0's extra memory "
        "is not measured by any cell"),
    Row(19, "model parallelism is slower", "misleading",
        (code("08", r"assert run\[\"max_grad_diff\"\] < run\[\"grad_tol\"\]"),
         code("08", r"assert gpipe_order ==")),
        "pipelined micro-batches (torch.distributed.pipelining) run on 2 CPU ranks: gradients "
        "equal one process's, GPipe's order checked; the idle time is drawn by a simulator"),
    Row(20, "the model_parallel class", "wrong",
        (code("08", r"class GuideModelParallel"),),
        "the guide's forward without self raises TypeError; the fixed model follows"),
    Row(21, "gradients flow back across GPUs", "correct",
        (code("08", r"assert type\(h_copied\.grad_fn\)\.__name__ == \"ToCopyBackward0\""),
         code("08", r"assert gap_split < tol_split")),
        "a dtype copy records ToCopyBackward0 and passes the gradient back, on a CPU",
        "the split model's gradients equal one device's, and the cross-device copy is "
        "ToCopyBackward0"),
    Row(22, "GPUtil is faster than nvidia-smi", "wrong",
        (code("00", r"assert starts\[0\] == 3"), code("00", r"assert by_hand == \[0, exact, 0\]")),
        "GPUtil starts one nvidia-smi per call (a stand-in nvidia-smi); a peak counter catches "
        "a spike that polling misses"),
    Row(23, "del out, loss; i survives the loop", "correct",
        (code("04", r"assert dropped\.delta_bytes == -kept\.delta_bytes"),
         code("04", r"assert loop\.delta_bytes == 1024 \* 4")),
        "the graph's saved tensors freed only when every reference is gone; the loop's name lives"),
    Row(24, "total_loss += loss builds a graph", "correct",
        (code("04", r"assert growth\[\"\.item\(\)\"\] == 0"),),
        "five steps summed as tensors hold five graphs; .item() and .detach() hold nothing"),
    Row(25, "empty_cache() fixes an OOM", "wrong",
        (code("00", r"allocator_vs_nvml[\s\S]*?assert run\.returncode == 0"),),
        "on a CPU, empty_cache's docstring is quoted and a published CUDA-context figure shown",
        "after del, allocated falls back while reserved stays until empty_cache(); a live "
        "tensor survives empty_cache() (scripts/allocator_vs_nvml.py)"),
    Row(26, "the GPUtil + empty_cache demo", "misleading",
        (code("00", r"allocator_vs_nvml[\s\S]*?assert run\.returncode == 0"),),
        "on a CPU, a recorded run if there is one, else a published CUDA-context figure",
        "allocated, reserved and NVML's used after allocate, del and empty_cache(), side by side"),
    Row(27, "torch.no_grad() for inference", "correct idea, broken snippet",
        (code("04", r"assert peaks\[\"no_grad\"\] < peaks\[\"enable_grad\"\] / 2"),
         code("04", r"assert abs\(zeros\[\"train\"\]")),
        "no_grad and inference_mode keep no graph, measured; neither switches dropout off"),
    Row(28, "cudnn.benchmark = True; enabled = True", "incomplete",
        (code("05", r"assert cudnn\.enabled and not cudnn\.benchmark"),
         code("05", r"assert med\[\"varying, benchmark=True\"\]")),
        "the defaults (enabled, benchmark off, not deterministic), asserted on a CPU",
        "benchmark=True pays a search for each new shape and is no slower for one fixed shape"),
    Row(29, "RTX and Volta can train in fp16", "incomplete",
        (code("05", r"assert ratio < 1"),),
        "on a CPU, published Tensor Core speedups (with their source), and 'not checked here'",
        "autocast beats fp32 where the GPU has the hardware the dtype needs (fp16 from a T4, "
        "bf16 from an A100)"),
    Row(30, "mixed precision halves memory", "misleading",
        (code("05", r"assert ledger\[name, ac\] == formula"),),
        "saved bytes measured against a formula: activations shrink, parameters and state do not"),
    Row(31, "model.half() is mixed precision", "wrong",
        (code("05", r"assert torch\.isinf\(values\.half\(\)\[0\]\)"),
         code("05", r"assert torch\.isinf\(half_var\)\.all\(\)")),
        "pure fp16 overflows (70000 -> inf, BatchNorm's running variance) where autocast does not"),
    Row(32, "keep BatchNorm in fp32 with .float()", "outdated",
        (code("05", r"assert amp_var\.dtype == torch\.float32"),),
        "under autocast BatchNorm's statistics stay fp32 with no .float(), checked"),
    Row(33, "NVIDIA Apex for mixed precision", "outdated",
        (code("05", r"assert deprecations, "),),
        "torch.cuda.amp's FutureWarning, asserted; torch.amp instead"),
)  # fmt: skip


# The guards the notebooks and tests use, as ``ast.unparse`` writes them: (regular expression,
# GPUs). A positive count: the atom is false on a CPU and true from that many GPUs on. A negative
# count: true on a CPU, false from that many GPUs on (CPU stand-ins, no accelerator, a skip). Zero:
# true on every machine the course is tested on. A condition made of other atoms is undecided, so
# a check under it makes --check fail until a line here says what it means.
GUARDS: tuple[tuple[str, int], ...] = (
    (r"caps\.cuda|caps\.tf32|torch\.cuda\.is_available\(\)|caps\.expects_speedup\(.*\)", 1),
    (r"(?:device|other|where)\.type == 'cuda'", 1),
    (r"caps\.multi_gpu", 2),
    (r"devices\.has_gpu\((\d+)\)", 0),  # the count is the argument
    (r"torch\.cuda\.device_count\(\) >= (\d+)", 0),  # the count is the bound
    (r"torch\.cuda\.device_count\(\) < (\d+)", 0),  # a skip: true on a CPU (negated below)
    (r"devs\.stand_ins", -2),  # demo_devices(2) falls back to CPU stand-ins below 2 GPUs
    (r"accelerator is None|device\.type == 'cpu'", -1),
    (r"cudnn_results is None", -1),  # notebook 05: only the cuDNN timing (a GPU) sets it
    (r"os\.name == 'posix'", 0),  # the course's CPU machines are Linux
)


@dataclass(frozen=True)
class _Cond:
    cpu: bool | None  # the condition's value on a CPU; None: undecided
    true_needs: int | None  # GPUs needed to make it true (0: as on a CPU); None: undecided
    false_needs: int | None  # GPUs needed to make it false


_UNDECIDED = _Cond(None, None, None)


def _atom(text: str) -> _Cond:
    for pattern, gpus in GUARDS:
        m = re.fullmatch(pattern, text)
        if m is None:
            continue
        if m.groups():
            n = int(m.group(1))
            return _Cond(True, 0, n) if "<" in text else _Cond(False, n, 0)
        if gpus > 0:
            return _Cond(False, gpus, 0)
        if gpus < 0:
            return _Cond(True, 0, -gpus)
        return _Cond(True, 0, None)  # never false where the course is tested
    return _UNDECIDED


def _most(values: list[int | None]) -> int | None:
    return None if None in values else max(values)


def _least(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _cond(node: ast.expr) -> _Cond:
    """What a guard is on a CPU, and how many GPUs make it true or false."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        c = _cond(node.operand)
        return _Cond(None if c.cpu is None else not c.cpu, c.false_needs, c.true_needs)
    if isinstance(node, ast.BoolOp):
        parts = [_cond(v) for v in node.values]
        values = [p.cpu for p in parts]
        trues, falses = [p.true_needs for p in parts], [p.false_needs for p in parts]
        if isinstance(node.op, ast.And):
            cpu = False if False in values else (None if None in values else True)
            if cpu is False:  # false on a CPU whatever the rest: at least the known GPUs
                known = [t for t in trues if t is not None]
                return _Cond(False, max(known) if known else None, _least(falses))
            return _Cond(cpu, _most(trues), _least(falses))
        cpu = True if True in values else (None if None in values else False)
        return _Cond(cpu, _least(trues), _most(falses))
    return _atom(ast.unparse(node))


def _then(need: int | None, extra: int | None) -> int | None:
    return None if need is None or extra is None else max(need, extra)


CHECK, ERROR, PLAIN = "check", "error", "plain"


def _role(stmt: ast.stmt) -> str:
    """A check raises when the claim is false: assert, raise AssertionError, .assert_passed()."""
    if isinstance(stmt, ast.Assert):
        return CHECK
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return CHECK if isinstance(exc, ast.Name) and exc.id == "AssertionError" else PLAIN
    if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)):
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "assert_passed"
            ):
                return CHECK
    return PLAIN


# A line's (GPUs it needs to run, role, what the guard's CPU branch prints where it is skipped).
Line = tuple[int | None, str, tuple[str, ...]]


def _announced(stmts: list[ast.stmt]) -> tuple[str, ...]:
    """The literal text a branch prints (print's strings and f-strings' fixed parts)."""
    said = []
    for node in (n for stmt in stmts for n in ast.walk(stmt)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "print"
        ):
            for arg in node.args:
                for part in arg.values if isinstance(arg, ast.JoinedStr) else [arg]:
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        said += [part.value.strip()] if len(part.value.strip()) >= 6 else []
    return tuple(said)


def _mark(stmts: list[ast.stmt], need: int | None, lines: dict[int, Line], said=()) -> None:
    """Each line's need, role and skip text; an inner statement overrides its parent."""
    for stmt in stmts:
        for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1):
            lines[line] = (need, _role(stmt), said)
        if isinstance(stmt, ast.If):
            c = _cond(stmt.test)
            body_said = _announced(stmt.orelse) if c.cpu is False else said
            else_said = _announced(stmt.body) if c.cpu is True else said
            body_need = need if c.cpu is True else _then(need, c.true_needs)
            else_need = need if c.cpu is False else _then(need, c.false_needs)
            _mark(stmt.body, body_need, lines, body_said)
            _mark(stmt.orelse, else_need, lines, else_said)
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            _mark(stmt.body, need, lines, said)
            _mark(getattr(stmt, "orelse", []), need, lines, said)
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            _mark(stmt.body, need, lines, said)
            for handler in stmt.handlers:
                first = handler.body[0].lineno if handler.body else handler.lineno + 1
                for line in range(handler.lineno, first):
                    lines[line] = (need, ERROR, said)  # the header: reached only when it raised
                _mark(handler.body, need, lines, said)
            _mark(stmt.orelse, need, lines, said)
            _mark(stmt.finalbody, need, lines, said)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Match)):
            for child in ast.iter_child_nodes(stmt):  # runs when called: undecided
                if isinstance(child, ast.stmt):
                    _mark([child], None, lines)
            for case in getattr(stmt, "cases", []):
                _mark(case.body, None, lines)


def _python(text: str) -> str:
    """A cell's source with IPython's magics and shell lines blanked, line numbers kept."""
    keep = []
    for line in text.splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        keep.append(indent + "pass" if stripped.startswith(("%", "!")) else line)
    return "\n".join(keep)


def _lines(text: str) -> dict[int, Line] | None:
    try:
        tree = ast.parse(_python(text))
    except SyntaxError:
        return None
    lines: dict[int, Line] = {}
    _mark(tree.body, 0, lines)
    return lines


def _skip_needs(func: ast.FunctionDef, module: ast.Module) -> int | None:
    """GPUs a test needs, from its ``pytest.mark.skipif`` decorators (by name or inline)."""
    named = {
        t.id: s.value
        for s in module.body
        if isinstance(s, ast.Assign)
        for t in s.targets
        if isinstance(t, ast.Name)
    }
    need: int | None = 0
    for deco in func.decorator_list:
        deco = named.get(deco.id, deco) if isinstance(deco, ast.Name) else deco
        if isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("mark.skipif"):
            need = _then(need, _cond(deco.args[0]).false_needs)  # runs where the skip is false
    return need


@dataclass(frozen=True)
class Proof:
    evidence: Evidence
    status: str  # RUN | GPU | CITED, or SAID | NOT_CHECKED | UNDECIDED | MISSING
    gpus: int = 0  # for GPU: how many the guard asks for
    where: str = ""  # "`01_moving_tensors.ipynb` 4. Device-agnostic code (c14)"
    why: str = ""  # for a problem: what is wrong


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _line_of(text: str, m: re.Match) -> int:
    return text.count("\n", 0, max(m.start(), m.end() - 1)) + 1


def _printed(cell: dict) -> str:
    out = []
    for o in cell.get("outputs", []):
        for value in [o.get("text", "")] + list(o.get("data", {}).values()):
            out.append("".join(value) if isinstance(value, list) else str(value))
    return "".join(out).strip()


def _code_proof(ev: Evidence, cell: dict, where: str, line: int | None) -> Proof:
    def unproven(why: str, status: str = NOT_CHECKED) -> Proof:
        return Proof(ev, status, where=where, why=why)

    lines = _lines(_source(cell))
    if lines is None:
        return unproven("its cell is not Python the tool can parse", UNDECIDED)
    tags = cell.get("metadata", {}).get("tags", [])
    expects_error = "raises-exception" in tags
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if line is None:  # a tagged cell the pattern does not match: every check of the cell counts
        needs = [need for need, role, _ in lines.values() if role == CHECK]
        needs += [0] if expects_error else []
        if not needs:
            return unproven("its tagged cell has no check")
        here = [n for n in needs if n is not None]
        need, role, said = (0 if 0 in here else min(here, default=None)), CHECK, ()
    else:
        need, role, said = lines.get(line, (0, PLAIN, ()))
        if expects_error:
            role = ERROR
        elif role == ERROR and "nbval-ignore-output" in tags:
            role = PLAIN  # nbval does not compare what the handler printed
    if role == PLAIN:
        return unproven(
            "its line is not a check (assert, raise AssertionError, .assert_passed(), "
            "or an expected error nbval compares)"
        )
    if need is None:
        return unproven("a condition above its line is not in GUARDS", UNDECIDED)
    if cell.get("execution_count") is None:
        return unproven("its cell was never run (no execution count in the committed notebook)")
    printed = _printed(cell)
    if need > 0:
        if role == ERROR:
            return unproven("an expected error under a GPU guard")
        if not printed:
            return unproven("guarded, yet its committed CPU output says nothing of what it skipped")
        if said and not any(text in printed for text in said):
            return unproven(
                f"its committed output lacks what the guard's CPU branch prints ({said[0]!r})"
            )
        return Proof(ev, GPU, need, where)
    if errors and not expects_error:
        return unproven("its committed output is an error")
    if expects_error and not errors:
        return unproven("tagged raises-exception, but its committed output has no error")
    return Proof(ev, RUN, 0, where)


def _test_proof(ev: Evidence, root: Path) -> Proof:
    path = root / ev.source
    if not path.is_file():
        return Proof(ev, MISSING, why=f"no file {ev.source}")
    text = path.read_text(encoding="utf-8")
    m = re.search(ev.pattern, text)
    if m is None:
        return Proof(ev, MISSING, why=f"nothing in {ev.source} matches {ev.pattern!r}")
    line = _line_of(text, m)
    module = ast.parse(text)
    for func in module.body:
        if isinstance(func, ast.FunctionDef) and func.lineno <= line <= (func.end_lineno or 0):
            where = f"`{ev.source}::{func.name}`"
            lines: dict[int, Line] = {}
            _mark(func.body, _skip_needs(func, module), lines)
            need, role, _ = lines.get(line, (0, PLAIN, ()))
            if role != CHECK:
                return Proof(ev, NOT_CHECKED, where=where, why="its line is not a check")
            if need is None:
                return Proof(ev, UNDECIDED, where=where, why="a skip or guard not in GUARDS")
            return Proof(ev, GPU if need else RUN, need, where)
    return Proof(ev, NOT_CHECKED, why=f"{ev.source}:{line} is not inside a test function")


def prove(ev: Evidence, row: Row, notebooks: Path = NOTEBOOKS, root: Path = ROOT) -> Proof:
    """What one piece of evidence proves, read from the notebook (or test) itself."""
    if ev.source.startswith("tests/"):
        return _test_proof(ev, root)
    paths = sorted(notebooks.glob(f"{ev.source}_*.ipynb"))
    if not paths:
        return Proof(ev, MISSING, why=f"no notebook {ev.source}_*.ipynb")
    pattern, section, found = re.compile(ev.pattern), "Intro", None
    for i, cell in enumerate(_cells(paths[0])):
        text = _source(cell)
        if cell.get("cell_type") == "markdown":
            for heading in text.splitlines():
                if heading.startswith("## "):
                    section = heading[3:].strip()
        if cell.get("cell_type") != ev.kind:
            continue
        tagged = f"seed-{row.n}" in cell.get("metadata", {}).get("tags", [])
        m = pattern.search(text)
        if tagged:  # the tag wins over the pattern; the pattern may still pick the line
            found = (i, cell, section, m)
            break
        if m is not None and found is None:
            found = (i, cell, section, m)
    if found is None:
        return Proof(
            ev,
            MISSING,
            why=f"no {ev.kind} cell of {paths[0].name} matches "
            f"{ev.pattern!r}: the claim's answer moved or was cut; point the row at it",
        )
    i, cell, section, m = found
    where = f"`{paths[0].name}` {section} (c{i})"
    if ev.kind == "markdown":
        linked = re.search(r"https?://", _source(cell))
        return Proof(
            ev,
            CITED if linked else SAID,
            where=where,
            why="" if linked else "prose without a linked source",
        )
    return _code_proof(ev, cell, where, None if m is None else _line_of(_source(cell), m))


@dataclass(frozen=True)
class Verdict:
    row: Row
    proofs: tuple[Proof, ...]
    status: str  # RUN | GPU | CITED, or NOT_CHECKED when nothing proves the row
    gpus: int  # for GPU: the most any piece asks for


def derive(row: Row, notebooks: Path = NOTEBOOKS, root: Path = ROOT) -> Verdict:
    """The row's status, derived from its evidence: the weakest proof that runs decides."""
    proofs = tuple(prove(ev, row, notebooks, root) for ev in row.evidence)
    statuses = [p.status for p in proofs]
    if GPU in statuses:
        return Verdict(row, proofs, GPU, max(p.gpus for p in proofs))
    for status in (RUN, CITED):
        if status in statuses:
            return Verdict(row, proofs, status, 0)
    return Verdict(row, proofs, NOT_CHECKED, 0)


def problems(
    rows: tuple[Row, ...] | None = None, notebooks: Path = NOTEBOOKS, root: Path = ROOT
) -> list[str]:
    """Every row whose evidence is gone, proves nothing, or disagrees with its on_gpu note."""
    rows = ROWS if rows is None else rows
    out = []
    for row in rows:
        verdict = derive(row, notebooks, root)
        for p in verdict.proofs:
            if p.status in (MISSING, NOT_CHECKED, UNDECIDED):
                at = f" ({p.where})" if p.where else ""
                out.append(f"row {row.n}: {p.evidence.pattern!r}{at}: {p.why}")
        if verdict.status == NOT_CHECKED:
            out.append(f"row {row.n}: nothing runs it here or on a GPU, and no prose cites it")
        if (verdict.status == GPU) != bool(row.on_gpu):
            out.append(
                f"row {row.n} is {verdict.status!r}: on_gpu must say what a GPU run shows "
                "exactly when the row runs on a GPU only"
            )
    if rows is ROWS and [r.n for r in ROWS] != list(range(1, 34)):
        out.append("ROWS must list the audit's rows 1-33 in order")
    return out


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("s" if n > 1 else "")


def render(rows: tuple[Row, ...] | None = None, notebooks: Path = NOTEBOOKS) -> str:
    verdicts = [derive(row, notebooks) for row in (ROWS if rows is None else rows)]
    count = {s: sum(v.status == s for v in verdicts) for s in (RUN, GPU, CITED)}
    by_gpus = sorted({v.gpus for v in verdicts if v.status == GPU})
    split = ", ".join(
        f"{sum(v.status == GPU and v.gpus == n for v in verdicts)} need {_gpus(n)}" for n in by_gpus
    )
    lines = [
        "# The source guide's claims, and where the course answers each",
        "",
        "Written by `python tools/seed_coverage.py --write`; do not edit by hand.",
        "`tests/test_seed_coverage.py` fails when this page is stale, or when a row's evidence is",
        "gone from its notebook or no longer proves what its status says.",
        "",
        f"Of {len(verdicts)} rows: **{count[RUN]} run here**, **{count[GPU]} run on a GPU only**"
        + (f" ({split})" if split else "")
        + f", **{count[CITED]} cited**.",
        "",
        "**The status is derived, not declared.** Each row points at its evidence (a notebook",
        "and a pattern, or a test); the tool reads that cell and decides.",
        "**run here**: the line is a check (`assert`, a checker's `.assert_passed()`, or an",
        "expected error that strict nbval compares) that no GPU guard stands above, and the",
        "committed CPU output shows the cell ran.",
        "**runs on a GPU only**: the check sits under a guard that is false on a CPU (`if",
        "caps.cuda:`, `if devices.has_gpu(2):`, a test's `skipif(torch.cuda.device_count() < 2)`);",
        "the GPUs it needs are read from that guard, and on a CPU the cell only says what it",
        "skipped. **cited**: prose with a linked source, and no cell that runs the claim",
        "(**said**: prose without a source, listed for where the course says it; proves nothing).",
        "A row with a GPU-only piece is GPU-only: the claim is proven only when that piece runs.",
        "",
        "| # | the guide | audit | status | evidence: notebook, section (cell) | what it shows "
        "| what a GPU run shows |",
        "| ---: | --- | --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        status = f"{v.status} ({_gpus(v.gpus)})" if v.status == GPU else v.status
        pieces = []  # one entry per cell: two checks in one cell are listed once
        for p in v.proofs:
            piece = f"{p.where or p.evidence.source}: {p.status}"
            piece += f" ({_gpus(p.gpus)})" if p.status == GPU else ""
            if piece not in pieces:
                pieces.append(piece)
        where = "; ".join(pieces)
        row = v.row
        lines.append(
            f"| {row.n} | {row.claim} | {row.verdict} | {status} | {where} | {row.how} "
            f"| {row.on_gpu or '-'} |"
        )
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
