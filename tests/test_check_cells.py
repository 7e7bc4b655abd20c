"""Check cells that can fail, and skips that say so (issue 20).

Two guards, both reading the committed notebooks (no kernel, no torch work to speak of):

1. **No silent skip.** In the notebooks listed in ``GUARDED``, an ``if`` whose condition asks
   about the hardware (``caps.cuda``, ``devices.has_gpu(2)``, stand-ins, ``meta``...) and whose
   body asserts something must end in an ``else``, and every branch of it that asserts nothing
   must print (or display) what it skipped. A check that runs only on a GPU then says so on a
   CPU, instead of passing in silence.
2. **Mutations.** For check cells that used to pass whatever happened, ``MUTATIONS`` runs the
   committed cell in a namespace where the claim is false (the thing it checks was broken:
   a doctor that misreads the build, a child that never got its environment variable, a
   scheduler that no longer pipelines its backward pass, a no-op ``channels_last``, an autocast
   that changes nothing...) and expects an ``AssertionError``. The cell is found by a line of its
   source, so it may move.

Run against the notebooks before issue 20 (``git show fd67aea:notebooks/...``), the rule flags
01's ``if caps.cuda:`` cells without an ``else``, 02's meta skips and 08's stand-in skip, and
every mutation below passes through the old cells without an assert firing.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from tutorial_utils import devices

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
GUARDED = ("00", "01", "02", "03", "04", "05", "06", "07", "08")
HARDWARE = re.compile(
    r"caps\.|devices\.|stand_ins|meta|cuda|gpu|cudnn|mps|accelerator|tf32", re.IGNORECASE
)


def _notebook(prefix: str) -> Path:
    (path,) = NOTEBOOKS.glob(f"{prefix}_*.ipynb")
    return path


def _code_cells(prefix: str) -> list[str]:
    cells = json.loads(_notebook(prefix).read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _python(source: str) -> str:
    """A cell's source with IPython's magics and shell escapes turned into ``pass``."""
    lines = source.splitlines()
    return "\n".join(
        line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip()[:1] in ("%", "!") else line
        for line in lines
    )


def _has(node: ast.AST, kind: type) -> bool:
    return any(isinstance(n, kind) for n in ast.walk(node))


def _reports(body: list[ast.stmt]) -> bool:
    """Does this branch print or display something?"""
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in ("print", "display", "show"):
                return True
    return False


def _branches(node: ast.If) -> tuple[list[list[ast.stmt]], bool]:
    """The bodies of an if / elif / else chain, and whether it ends in an else."""
    bodies = [node.body]
    while len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
        node = node.orelse[0]
        bodies.append(node.body)
    if node.orelse:
        return [*bodies, node.orelse], True
    return bodies, False


def silent_skips(source: str) -> list[str]:
    """Hardware-guarded asserts in ``source`` that can be skipped without a word."""
    problems = []
    tree = ast.parse(_python(source))
    elifs = {
        id(n.orelse[0]) for n in ast.walk(tree) if isinstance(n, ast.If) and len(n.orelse) == 1
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or id(node) in elifs:
            continue
        bodies, has_else = _branches(node)
        tests = ast.unparse(node.test)
        if not HARDWARE.search(tests) or not any(
            _has(ast.Module(b, []), ast.Assert) for b in bodies
        ):
            continue
        quiet = [b for b in bodies if not _has(ast.Module(b, []), ast.Assert) and not _reports(b)]
        if not has_else or quiet:
            problems.append(f"line {node.lineno}: `if {tests}:` skips its checks without a word")
    return problems


@pytest.mark.parametrize("prefix", GUARDED)
def test_no_check_is_skipped_in_silence(prefix):
    found = [
        f"{_notebook(prefix).name}, cell starting {src.splitlines()[0][:50]!r}: {problem}"
        for src in _code_cells(prefix)
        for problem in silent_skips(src)
    ]
    assert not found, "add an else that prints what was skipped and why:\n" + "\n".join(found)


def test_the_rule_flags_a_silent_skip():
    old_01_c54 = 'if caps.cuda:\n    assert both_ms < 0.8 * total, "overlap"\n    print("ok")\n'
    assert silent_skips(old_01_c54)
    said = old_01_c54 + 'else:\n    print("Skipped: no GPU, so no second stream")\n'
    assert not silent_skips(said)
    quiet_elif = (
        'if caps.cuda:\n    assert x\nelif devices.has_gpu(1):\n    pass\nelse:\n    print("no")\n'
    )
    assert silent_skips(quiet_elif)


# ----------------------------------------------------------------------------- mutations
def _cell(prefix: str, markers: tuple[str, ...]) -> str:
    """The one code cell of notebook ``prefix`` that contains one of ``markers`` (a line of the
    check as it is now, and as it was before issue 20, so the same case runs on both)."""
    found = [src for src in _code_cells(prefix) if any(m in src for m in markers)]
    if len(found) != 1:  # not an AssertionError: that would pass for the mutation's own
        raise LookupError(f"{len(found)} cells of notebook {prefix} contain one of {markers}")
    return _python(found[0])


def _run(prefix: str, markers: tuple[str, ...], namespace: dict) -> None:
    namespace.setdefault("display", lambda *a, **k: None)
    namespace.setdefault("torch", torch)
    exec(compile(_cell(prefix, markers), f"<notebook {prefix}>", "exec"), namespace)


def _doctor_misreads_the_build():
    from tutorial_utils.doctor import Check, DoctorReport

    wrong = "found no usable GPU" if torch.version.cuda is None else "this torch build has no CUDA"
    return {"report": DoctorReport([Check("GPUs", "missing", wrong)]), "devices": devices}


def _new_zeros_ignores_the_device(monkeypatch):
    real = torch.Tensor.new_zeros
    on_cpu = lambda self, *a, **k: real(torch.zeros((), dtype=self.dtype), *a, **k)  # noqa: E731
    monkeypatch.setattr(torch.Tensor, "new_zeros", on_cpu)
    return {"other": torch.device("meta")}


def _buffers_ignore_persistent(monkeypatch):
    real = torch.nn.Module.register_buffer
    monkeypatch.setattr(
        torch.nn.Module,
        "register_buffer",
        lambda self, name, tensor, persistent=True: real(self, name, tensor, persistent=True),
    )
    return {"nn": torch.nn, "other": torch.device("meta")}


def _launch_built_a_wrong_command():
    wrong = ["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "scripts/ddp_train.py"]
    return {
        "ddp": types.SimpleNamespace(command=wrong),
        "port": 12345,
        "sys": sys,
        "torchrun_command": lambda *a, **k: wrong,  # what the old cell compared with
    }


def _serial_backward_scheduler():
    """A GPipe scheduler whose backward passes never overlap: each waits for the previous one
    on every stage. Its idle fraction still falls with m, and is still 0.5 for m = 1."""

    def gpipe_schedule(fwd, bwd, m):
        p, free, done, events = len(fwd), [0.0] * len(fwd), {}, []
        for i in range(m):
            for s in range(p):
                start = max(free[s], done.get(("F", s - 1, i), 0.0))
                free[s] = done[("F", s, i)] = start + fwd[s]
                events.append((s, "F", i, start, free[s]))
        clock = max(free)
        for i in range(m):
            for s in reversed(range(p)):
                start, clock = clock, clock + bwd[s]
                events.append((s, "B", i, start, clock))
        return events

    def idle_fraction(events, stage):
        span = max(e[4] for e in events) - min(e[3] for e in events)
        return 1 - sum(e[4] - e[3] for e in events if e[0] == stage) / span

    ms = [1, 2, 4, 8, 16]
    scheduled = {m: gpipe_schedule([1.0, 1.0], [2.0, 2.0], m) for m in ms}
    sched = {m: sum(idle_fraction(ev, s) for s in range(2)) / 2 for m, ev in scheduled.items()}
    return {
        "gpipe_schedule": gpipe_schedule,
        "idle_fraction": idle_fraction,
        "bubble": lambda p, m: (p - 1) / (m + p - 1),
        "ms": ms,
        "sched_bubble": sched,
    }


def _channels_last_is_a_no_op():
    same = types.SimpleNamespace(parameters=100, activations=200, peak=300)
    half = types.SimpleNamespace(parameters=100, activations=150, peak=250)
    step_memory = {
        "fp32": same,
        "TF32 (matmul 'high')": same,
        "bf16 autocast": half,
        "fp16 autocast": half,
        "ConvNet fp32": same,
        "ConvNet channels_last": same,
    }
    from tutorial_utils import models

    return {
        "step_memory": step_memory,
        "models": models,
        "device": torch.device("cpu"),
        "cl": torch.contiguous_format,  # the layout change did nothing
        "caps": _cpu(),
    }


def _autocast_changes_nothing():
    return {"rel": lambda a: 0.0, "ytf": None, "ybf": None, "caps": _cpu(), "published": None}


def _deterministic_mode_does_nothing():
    return {"put_error": None, "fresh": torch.zeros(4), "caps": _cpu()}


def _pinning_per_batch_pays():
    t = [types.SimpleNamespace(median=m) for m in (10.0, 2.0, 3.0, 1.0)]
    return {
        "caps": devices.Capabilities.machine("a100"),
        "pin_ways": types.SimpleNamespace(timings=t),
    }


def _cpu():
    return devices.Capabilities.machine("cpu")


def _gpu_demos(**results):
    """Notebook 01's GPU cells call scripts/transfer_gpu.py; here it returns ``results``."""
    demos = types.SimpleNamespace(**{name: (lambda v=v: v) for name, v in results.items()})
    return {
        "caps": devices.Capabilities.machine("a100"),
        "transfer_gpu": demos,
        "listing": types.SimpleNamespace(show=lambda *a, **k: None),
        "timing": types.SimpleNamespace(format_seconds=str),
    }


def _copy_read_after_it_finished():
    return _gpu_demos(read_too_early=(1e6, 1e6), reuse_too_early=(1.0, 1.0))


def _streams_that_do_not_overlap():
    return _gpu_demos(overlap={"copy_ms": 10.0, "compute_ms": 10.0, "both_ms": 20.0})


def _a_naive_timer_that_waits():
    return _gpu_demos(naive_timer={"naive": 0.01, "synchronized": 0.01, "CUDA events": 0.01})


def _item_that_does_not_synchronize():
    return _gpu_demos(hidden_syncs={"g.sum().item()": False, "g.nonzero()": True, "g * 2": False})


def _cudnn_search_that_costs_nothing():
    med = {"fixed": 1.0, "varying": 1.0}
    results = {
        f"{kind}, benchmark={flag}": types.SimpleNamespace(median=med[kind])
        for kind in med
        for flag in (False, True)
    }
    return {"cudnn_results": results, "cudnn": torch.backends.cudnn}


#: case: (notebook, lines that find the check cell, the world in which its claim is false)
MUTATIONS = {
    "00 doctor names the wrong reason": (
        "00",
        ("caps.plan().items()",),
        _doctor_misreads_the_build,
    ),
    "01 pinning per batch is faster": ("01", ("pin_each = pin_ways",), _pinning_per_batch_pays),
    "01 a copy read too early is right": (
        "01",
        ("transfer_gpu.read_too_early()",),
        _copy_read_after_it_finished,
    ),
    "01 two streams do not overlap": (
        "01",
        ("transfer_gpu.overlap()",),
        _streams_that_do_not_overlap,
    ),
    "01 the naive timer waits": ("01", ("transfer_gpu.naive_timer()",), _a_naive_timer_that_waits),
    "01 item() does not synchronize": (
        "01",
        ("transfer_gpu.hidden_syncs()",),
        _item_that_does_not_synchronize,
    ),
    "05 cudnn.benchmark costs nothing": (
        "05",
        ("benchmark=True should pay a search",),
        _cudnn_search_that_costs_nothing,
    ),
    "02 new_zeros ignores the device": (
        "02",
        ("src.new_zeros(3, dtype=torch.int32)",),
        _new_zeros_ignores_the_device,
    ),
    "02 persistent=False is ignored": (
        "02",
        ("persistent=False buffers are not saved",),
        _buffers_ignore_persistent,
    ),
    "07 launch's command is wrong": ("07", ("without_logs = [",), _launch_built_a_wrong_command),
    "08 backward never pipelines": (
        "08",
        ("assert abs(sched_bubble[1]",),
        _serial_backward_scheduler,
    ),
    "05 channels_last does nothing": (
        "05",
        ("same bytes, other layout",),
        _channels_last_is_a_no_op,
    ),
    "05 bf16 autocast changes nothing": (
        "05",
        ("0 < gap_probe < tol_probe", 'get_float32_matmul_precision() == "highest"'),
        _autocast_changes_nothing,
    ),
    "05 deterministic mode does nothing": (
        "05",
        ("torch.isnan(fresh)", '"switched back off"'),
        _deterministic_mode_does_nothing,
    ),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_the_check_fails_when_its_claim_is_false(case, monkeypatch):
    prefix, markers, world = MUTATIONS[case]
    namespace = world(monkeypatch) if world.__code__.co_argcount else world()
    with pytest.raises(AssertionError):
        _run(prefix, markers, namespace)
