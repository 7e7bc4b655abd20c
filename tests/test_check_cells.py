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
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import load_file

from tutorial_utils import devices, formulas

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


# ------------------------------------------------------------------- asserts on text alone
#: where an assert reads text, not behaviour: a docstring, a function's source or signature
TEXT = re.compile(r"__doc__|getsource|inspect\.signature")
#: issue 38 §3: every notebook it named
TEXT_CHECKED = ("00", "01", "02", "03", "04", "05", "07", "11")


def text_asserts(source: str) -> list[str]:
    """Asserts in ``source`` that read only text (a docstring, a function's source or
    signature, or names assigned from one): they pass whatever the code they quote does."""
    tree = ast.parse(_python(source))
    texts = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and TEXT.search(ast.unparse(node.value))
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
            if TEXT.search(ast.unparse(node.test)) or (names and names <= texts):
                found.append(f"line {node.lineno}: assert {ast.unparse(node.test)[:70]}")
    return found


@pytest.mark.parametrize("prefix", TEXT_CHECKED)
def test_no_check_reads_only_text(prefix):
    found = [
        f"{_notebook(prefix).name}, cell starting {src.splitlines()[0][:50]!r}: {problem}"
        for src in _code_cells(prefix)
        for problem in text_asserts(src)
    ]
    assert not found, "check what the text claims, or print it as a quote:\n" + "\n".join(found)


def test_the_rule_flags_an_assert_on_a_docstring():
    old_00_c16 = (
        'empty_cache_doc = " ".join(torch.cuda.empty_cache.__doc__.split())\n'
        'assert "Release all unoccupied cached memory" in empty_cache_doc, "the quote"\n'
    )
    old_05_c15 = (
        "assert amp_choice(**facts) == (caps.amp_dtype, caps.grad_scaler)\n"
        "assert inspect.signature(torch.cuda.is_bf16_supported).parameters['x'].default\n"
    )
    assert len(text_asserts(old_00_c16)) == 1 and len(text_asserts(old_05_c15)) == 1
    quoted = 'doc = " ".join(torch.cuda.set_device.__doc__.split())\nprint(doc)\n'
    assert not text_asserts(quoted + "assert torch.zeros(1).device.type == 'cpu'\n")


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


def _told_by_static(rank: int) -> dict:
    """What torch 2.13's static rendezvous on 127.0.0.1:41234 tells rank ``rank`` (measured)."""
    return {
        **{"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"},
        **{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41234", "TORCHELASTIC_RUN_ID": "none"},
    }


def _told_by_standalone(rank: int) -> dict:
    """What ``torchrun --standalone`` (c10d) told rank ``rank`` (measured): another store's port,
    the host's name, a fresh run id."""
    run_id = "9b67c89f-93f8-4332-af90-3c542b882b2d"
    return {
        **_told_by_static(rank),
        **{"MASTER_ADDR": "localhost", "MASTER_PORT": "38859", "TORCHELASTIC_RUN_ID": run_id},
    }


def _launch_of_07(told=_told_by_static, command=None):
    """07's first launch: the command launch ran, and what each rank read from its environment
    (``told(rank)``) and reported."""
    from tutorial_utils.distributed import torchrun_command

    args = ["--epochs", "3"]
    cmd = command or torchrun_command("scripts/ddp_train.py", 2, args, 41234, "/tmp/x/logs")
    reports = {rank: {"torchrun_env": told(rank)} for rank in (0, 1)}
    ddp = types.SimpleNamespace(command=cmd, command_line=" ".join(cmd), reports=reports)
    return {"launch": lambda *a, **k: ddp, "sys": sys}


def _launch_built_a_wrong_command():
    wrong = ["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "scripts/ddp_train.py"]
    return {**_launch_of_07(command=wrong), "torchrun_command": lambda *a, **k: wrong}


def _torchrun_ran_standalone():
    """The command says static on 127.0.0.1:41234; the ranks were told what c10d tells them."""
    return _launch_of_07(told=_told_by_standalone)


def _a_rank_told_another_world():
    return _launch_of_07(told=lambda rank: {**_told_by_static(rank), "WORLD_SIZE": "1"})


COMMAND_07 = ("without_logs = [", "get_args_parser().parse_args(ddp.command")


def test_notebook_07s_command_check_passes_what_torchrun_tells_the_ranks():
    _run("07", COMMAND_07, _launch_of_07())


def _replicas_were_detached():
    """DataParallel's stand-in replicas made with ``.detach()``: no gradient reaches the model."""
    from torch.nn import functional as F

    from tutorial_utils.models import MLP, mlp_batch

    model = MLP(d_in=16, d_hidden=32, d_out=4, seed=0)
    x = mlp_batch(batch=8, d_in=16, seed=1)
    return {
        "MLP": MLP,
        "F": F,
        "devs": devices.demo_devices(2),
        "model": model,
        "x": x,
        "y": torch.randn(8, 4, generator=torch.Generator().manual_seed(2)),
        "out": model(x),
    }


def _data_parallel(warns=False, forward=None):
    """07's DataParallel cell on a CPU, with the real ``nn.DataParallel`` or, where a mutation
    asks, one that warns of a deprecation when built (``warns``) or whose forward without CUDA
    does something other than call the module (``forward``)."""
    import warnings

    class DataParallel(torch.nn.DataParallel):
        __doc__ = torch.nn.DataParallel.__doc__

        def __init__(self, *args, **kwargs):
            if warns:
                warnings.warn("DataParallel is deprecated: use DDP", FutureWarning, stacklevel=2)
            super().__init__(*args, **kwargs)

        def forward(self, *inputs, **kwargs):
            if forward is not None:
                return forward(self, *inputs)
            return super().forward(*inputs, **kwargs)

    world = _replicas_were_detached()
    world.update(
        devices=types.SimpleNamespace(has_gpu=lambda n=1: False),  # the CPU branch checks
        nn=types.SimpleNamespace(DataParallel=DataParallel),
        single=world["MLP"](d_in=16, d_hidden=32, d_out=4, seed=0),
        tol_dp=1e-5,
    )
    return world


def _data_parallel_that_warns():
    return _data_parallel(warns=True)


def _data_parallel_that_splits_without_cuda():
    """Without CUDA it runs the module on the first half of the batch only (one "device")."""
    return _data_parallel(forward=lambda self, x: self.module(x[: len(x) // 2]))


DATA_PARALLEL_07 = ("none a deprecation",)


def _buffers_seen(at_init: dict, argument: str = "forward_sync_buffers"):
    """07 section 4's buffer reports from both ranks: rank r's data shifted by r, the sync's
    running means as DDP broadcasts them, and rank 1's ``at_init`` as given (rank 0's is 0.0
    whatever the switch). SyncBatchNorm refused the CPU and the sum by hand matched."""
    sbn = {
        "how": "all_reduce by hand, since SyncBatchNorm refuses CPU input",
        "refusal": "SyncBatchNorm expected input tensor to be on GPU or XPU",
        "tol": 4e-6,
        "sync_vs_full": {"running_mean": 0.0, "running_var": 1e-7, "output": 2e-7},
        "local_vs_full": {"running_mean": 1.11, "output": 1.0},
    }

    def buffers(rank: int) -> dict:
        own = [float(rank)] * 4
        return {
            "argument": argument,
            "True": {"after_first": own, "after_second": [0.0] * 4},
            "False": {"after_first": own, "after_second": own},
            "at_init": dict.fromkeys(at_init, 0.0) if rank == 0 else at_init,
        }

    reports = {r: {"buffers": buffers(r), "sync_batchnorm": sbn} for r in (0, 1)}
    return {"seen": types.SimpleNamespace(reports=reports)}


BUFFERS_07 = ("rank 1's running mean once DDP is built",)
AT_INIT_213 = {"forward_sync_buffers=False": 0.0, "broadcast_buffers=False": 1.0}  # measured


def _step_time(bucket_bytes: list[int]):
    """07 section 5's report: a DDP step of 4,198,400 parameters whose hook counted
    ``bucket_bytes`` (and as many buckets); the times as measured on a shared CPU."""
    report = {
        "world": 2,
        "params": 4198400,
        "rows_per_rank": 64,
        "message_bytes": 32 * 2**20,
        "allreduce_s": 0.05,
        "sync": 0.07,
        "no_sync": 0.02,
        "buckets": len(bucket_bytes),
        "bucket_bytes": bucket_bytes,
    }
    return {
        "seen": types.SimpleNamespace(reports={0: {"step_time": report}}),  # section 4's launch
        "devices": types.SimpleNamespace(has_gpu=lambda n=1: False),
        "os": os,
    }


STEP_BYTES_07 = ("one step all-reduced",)
PSI_07 = 4198400


@pytest.mark.parametrize(
    "markers, world",
    [
        (DATA_PARALLEL_07, _data_parallel),
        (BUFFERS_07, lambda: _buffers_seen(AT_INIT_213)),
        (BUFFERS_07, lambda: _buffers_seen({"broadcast_buffers=False": 1.0}, "broadcast_buffers")),
        (STEP_BYTES_07, lambda: _step_time([4 * PSI_07])),
    ],
    ids=["DataParallel", "buffers, torch 2.13", "buffers, torch before 2.13", "bucket bytes"],
)
def test_notebook_07s_checks_pass_where_their_claims_hold(markers, world):
    """The controls of the 07 mutations below: the same cells, in worlds where the claims hold."""
    _run("07", markers, world())


def _pipeline_activations(gpipe_held: int, f1b_held: tuple[int, int]):
    """Notebook 08's two stages after GPipe and 1F1B with m = 8, holding ``gpipe_held`` and
    ``f1b_held`` micro-batches' activations at their peaks; orders and gradients right. The cell
    compares them with ``pipeline_in_flight``, the formula notebook 10 reads."""
    m, one = 8, 327_680
    gpipe_order = [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)]
    right = {"max_grad_diff": 0.0, "grad_tol": 1e-3, "left_bytes": 0}
    reports = {
        rank: {
            "m": m,
            "compare": {
                "one_microbatch_bytes": one,
                "GPipe": {**right, "order": gpipe_order, "peak_bytes": gpipe_held * one},
                "1F1B": {**right, "order": [], "peak_bytes": f1b_held[rank] * one},
            },
        }
        for rank in range(2)
    }
    pipe = types.SimpleNamespace(reports=reports)
    return {"pipe": pipe, "pipeline_in_flight": formulas.pipeline_in_flight}


def test_notebook_08s_activation_check_passes_the_right_counts():
    _run("08", ("GPipe holds m micro-batches per stage",), _pipeline_activations(8, (2, 1)))


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


def _probe_world() -> dict:
    """What 05's check cell reads before what each speed row ran: a small MLP to probe, the
    ConvNet for the layout, on the CPU."""
    from tutorial_utils import models, published

    return {
        "speed_model": lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()),
        "mlp_batch": torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),
        **{"dev": "cpu", "caps": _cpu(), "published": published, "models": models},
        **{"device": torch.device("cpu"), "cl": torch.channels_last},
    }


def _autocast_changes_nothing(monkeypatch):
    """torch.autocast turned into a no-op: the bf16 probe equals fp32's, to the bit."""
    import contextlib

    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    return _probe_world()


def _deterministic_mode_does_nothing(monkeypatch):
    """torch.use_deterministic_algorithms turned into a no-op: put_ runs, nothing raises."""
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda *a, **k: None)
    return {"caps": _cpu()}


def _picked_fp16_without_a_scaler():
    """capabilities() picks fp16 and no GradScaler: the tiny gradient underflows."""
    layer = torch.nn.Linear(16, 1)
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
    reference = torch.autograd.grad(layer(x).mean() * 1e-6, layer.weight)[0]
    picked = types.SimpleNamespace(cuda=False, amp_dtype=torch.float16, grad_scaler=False)
    sys.path.insert(0, str(NOTEBOOKS / "scripts"))
    import common

    return {
        "devices": types.SimpleNamespace(capabilities=lambda: picked),
        "amp_choice": lambda **facts: (torch.float16, False),
        "facts": {},
        **{"layer": layer, "x": x, "reference": reference, "dev": "cpu"},
        **{k: getattr(common, k) for k in ("relative_gap", "sum_bound", "BF16_ROUNDING", "within")},
    }


def _native_bf16_on_a_t4(monkeypatch, mutate=True):
    """A T4 (capability 7.5) where PyTorch says no native bf16, and a capabilities() that
    claims it anyway (``mutate``): 05 c15's GPU branch must catch the disagreement."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d=0: types.SimpleNamespace(major=7, minor=5)
    )
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda d: True)  # emulated
    dtype = torch.bfloat16 if mutate else torch.float16
    caps = types.SimpleNamespace(
        cuda=True,
        name="Tesla T4",
        compute_capability=(7, 5),
        native_bf16=mutate,
        amp_dtype=dtype,
        grad_scaler=not mutate,
    )
    world = _picked_fp16_without_a_scaler()
    world["devices"] = types.SimpleNamespace(capabilities=lambda: caps)
    world["amp_choice"] = lambda **facts: (caps.amp_dtype, caps.grad_scaler)
    return world


def _allocator_ignoring_the_new_name(monkeypatch, mutate=True, cuda=False):
    """04 §4's read-back where this torch ignores ``PYTORCH_ALLOC_CONF`` (as CUDA does for
    ``expandable_segments`` on 2.9.x): the children report what they took, the table says
    2.13 reads both names, so the cell must fail (``mutate``) or pass (both taken)."""
    real = load_file(NOTEBOOKS / "scripts" / "alloc_conf.py")

    def read_back(name, setting="expandable_segments:True"):
        took = not (mutate and name == "PYTORCH_ALLOC_CONF")
        return {
            "torch": torch.__version__,
            "parsed": setting if took else "",
            "expandable_segments": took if cuda else None,
        }

    module = types.SimpleNamespace(
        NAMES=real.NAMES, read_back=read_back, expected_on_cuda=real.expected_on_cuda
    )
    return {"alloc_conf": module, "caps": types.SimpleNamespace(cuda=cuda)}


def _cuda_allocator_ignoring_the_new_name(monkeypatch, mutate=True):
    return _allocator_ignoring_the_new_name(monkeypatch, mutate, cuda=True)


def _autocast_that_does_nothing(monkeypatch):
    """torch.autocast turned into a no-op: the autocast rows are fp32's, not the formula's."""
    import contextlib

    from tutorial_utils import models
    from tutorial_utils.units import format_bytes

    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    return {
        "nn": torch.nn,
        "models": models,
        "format_bytes": format_bytes,
        "amp_checks": _script("amp_checks"),
        **{"device": torch.device("cpu"), "dev": "cpu", "amp_dtype": torch.bfloat16},
    }


def _script(name: str):
    """A module of notebooks/scripts/, imported as the notebooks import it."""
    sys.path.insert(0, str(NOTEBOOKS / "scripts"))
    return importlib.import_module(name)


def _speed_rows_that_all_run_fp32():
    """Every row of the speed table runs the same fp32 step: the check of what each ran fails."""
    model = torch.nn.Linear(4, 4)

    def step():
        model(torch.ones(2, 4))

    step.model = model
    names = ("fp32", "TF32 (matmul 'high')", "bf16 autocast", "fp16 autocast", "ConvNet fp32")
    from tutorial_utils import recorded

    return {
        **_probe_world(),  # the layout and the probe, which pass, come first in the cell
        "variants": dict.fromkeys((*names, "ConvNet channels_last"), step),
        "nn": torch.nn,
        "amp_checks": _script("amp_checks"),
        "recorded": recorded,
        "rows": {},
    }


def _pinning_per_batch_pays():
    t = [types.SimpleNamespace(median=m) for m in (10.0, 2.0, 3.0, 1.0)]
    ways = types.SimpleNamespace(timings=t)
    return {
        "caps": devices.Capabilities.machine("a100"),
        "pin_ways": ways,
        "transfer_gpu": types.SimpleNamespace(pin_ways=lambda n_bytes: ways),  # 01 runs it now
    }


def _pinned_copies_no_faster(monkeypatch=None, mutate=True):
    """01's pinning cell on a GPU where pinning per batch gains nothing (as it should) and, with
    ``mutate``, a copy from the pinned buffer takes as long as a pageable one."""
    world = _pinning_per_batch_pays()
    medians = (10.0, 11.0, 12.0, 10.0 if mutate else 5.0)  # pageable, pin each, refill, pinned
    world["pin_ways"].timings = [types.SimpleNamespace(median=m) for m in medians]
    return world


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
    """05's cuDNN cell on an A100 whose benchmark mode times a new shape no slower."""
    from tutorial_utils import timing

    med = {"fixed": 1.0, "varying": 1.0}
    results = {
        f"{kind}, benchmark={flag}": types.SimpleNamespace(median=med[kind])
        for kind in med
        for flag in (False, True)
    }
    return {
        "caps": devices.Capabilities.machine("a100"),
        "cudnn_benchmark": types.SimpleNamespace(benchmark_modes=lambda: results),
        "timing": timing,
    }


def _gputil_without_nvidia_smi(monkeypatch):
    """GPUtil as the guide imagines it: it reads the GPU without starting nvidia-smi."""
    import GPUtil

    gpu = types.SimpleNamespace(name="read directly", memoryUsed=1234.0)
    monkeypatch.setattr(GPUtil, "getGPUs", lambda: [gpu])
    start_here = load_file(NOTEBOOKS / "scripts" / "start_here.py")  # the stand-in nvidia-smi
    return {"os": __import__("os"), "start_here": start_here}


def _cuda_counters_that_see_cpu_tensors(monkeypatch, mutate=True):
    """00's CPU block on a machine with CUDA (its counters answer, as on a GPU): with
    ``mutate``, the peak counter also counts the block's 8 MiB of CPU tensors."""
    from tutorial_utils import memory
    from tutorial_utils.units import format_bytes

    for name in ("reset_peak_memory_stats", "mem_get_info", "memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: 0)
    peak = 8 * 2**20 if mutate else 0
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: peak)
    caps = devices.Capabilities.machine("a100")
    return {"memory": memory, "format_bytes": format_bytes, "MiB": 2**20, "caps": caps}


def _cuda_that_answers_without_cuda(monkeypatch):
    """A CPU machine where torch.cuda's counters answer instead of raising."""
    world = _cuda_counters_that_see_cpu_tensors(monkeypatch, mutate=False)
    return {**world, "caps": _cpu()}


def _a_peak_counter_that_missed_the_spike():
    spike = types.SimpleNamespace(peak_bytes=0, start_bytes=0)
    return {"spike": spike, "seen": 0, "ticks": [0, 0, 0], "MiB": 2**20, "recorded": _NOTHING}


_NOTHING = types.SimpleNamespace(show=lambda *a, **k: None)  # recorded.show: no GPU run here
SPIKE_CELL = ("torch_source = gauge.sources[0]",)  # 00's gauge cell, which takes the ticks


def _spike_ticks(monkeypatch, mutate=True):
    """00's spike cell run for real, the gauge's torch source read by hand (the gauge itself a
    stand-in that only opens and closes that source, and no sleeping). With ``mutate``, the
    source reads the running peak instead of what is alive: a poller that never misses."""
    import time

    from tutorial_utils import gauges, memory, monitor

    class OneSource:  # LiveGauge's shape, as the cell uses it
        def __init__(self, period_s):
            self.sources, self.samples = [monitor.TorchSource()], []

        def __enter__(self):
            self.sources[0].open()
            return self

        def __exit__(self, *exc):
            self.sources[0].close()

    if mutate:
        real = monitor.TorchSource.read

        def read_the_peak(self):
            return [dataclasses.replace(r, used_bytes=r.peak_bytes) for r in real(self)]

        monkeypatch.setattr(monitor.TorchSource, "read", read_the_peak)
    monkeypatch.setattr(gauges, "LiveGauge", OneSource)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    namespace = {"devices": devices, "memory": memory, "MiB": 2**20, "recorded": _NOTHING}
    _run("00", SPIKE_CELL, namespace)
    return namespace


class _OnceTimer:
    """``benchmark.Timer`` that runs its statement once and reports 1 ms: 01's timing loop
    without the timing (its checks are on what the statements did, not on their times)."""

    def __init__(self, stmt, globals):
        self.stmt, self.globals = stmt, globals

    def timeit(self, number):
        exec(self.stmt, dict(self.globals))
        return types.SimpleNamespace(median=1e-3)


def _moving(monkeypatch, to=None, copy_=None):
    """01's move cell, with ``Tensor.to`` / ``Tensor.copy_`` replaced where given."""
    import statistics

    if to is not None:
        monkeypatch.setattr(torch.Tensor, "to", to)
    if copy_ is not None:
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    benchmark = types.SimpleNamespace(Timer=_OnceTimer)
    return {"run_on": torch.device("cpu"), "benchmark": benchmark, "statistics": statistics}


def _a_move_that_copies_nothing(monkeypatch):
    """``.to(copy=True)`` and ``copy_`` that hand back their tensor without moving a byte."""
    return _moving(monkeypatch, to=lambda self, *a, **k: self, copy_=lambda self, *a, **k: self)


def _a_no_op_that_copies(monkeypatch):
    """``x.to(x.device)``, with nothing to do, copies anyway."""
    real = torch.Tensor.to
    return _moving(monkeypatch, to=lambda self, *a, **k: real(self, *a, **{**k, "copy": True}))


def _a_copy_into_dst_that_writes_nothing(monkeypatch):
    return _moving(monkeypatch, copy_=lambda self, *a, **k: self)


def _the_playbook_counting_positions(monkeypatch, mutate=True):
    """03's count of GPT-2 against the Playbook; with ``mutate``, a Playbook formula that
    counts the position table too (1024 x 768). Only GPT-2 is built (on meta)."""
    from tutorial_utils import decoder, formulas
    from tutorial_utils.decoder import Decoder

    monkeypatch.setattr(decoder, "PRESETS", {"gpt2-124m": decoder.PRESETS["gpt2-124m"]})
    if mutate:
        real = formulas.playbook_parameters
        monkeypatch.setattr(
            formulas, "playbook_parameters", lambda h, v, n: real(h, v, n) + 1024 * h
        )
    return {"Decoder": Decoder, "formulas": formulas}


def _a_decoder_that_keeps_its_position_table(monkeypatch):
    """``Decoder(gpt2, max_positions=0)`` built with the table anyway: the count the Playbook's
    is held to is no longer GPT-2 without it (the old check, formula minus formula, passed)."""
    from tutorial_utils.decoder import Decoder

    world = _the_playbook_counting_positions(monkeypatch, mutate=False)
    return {**world, "Decoder": lambda cfg, **fields: Decoder(cfg)}


def _an_adamw_that_keeps_one_moment(monkeypatch):
    """PyTorch's AdamW keeping one buffer per parameter (SGD's momentum), the calculator
    unchanged: only a real step sees it (the old check, 16 x n, passed)."""
    world = _a_calculator_without_adams_second_moment(monkeypatch, mutate=False)
    monkeypatch.setattr(torch.optim, "AdamW", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    return world


def _a_calculator_without_adams_second_moment(monkeypatch, mutate=True):
    """03's calculator check; with ``mutate``, the calculator books AdamW's state as one
    moment (4 bytes per parameter) instead of two."""
    from tutorial_utils import fit, formulas, memory
    from tutorial_utils.decoder import Decoder, DecoderConfig

    if mutate:
        monkeypatch.setitem(formulas.OPTIMIZER_STATE_BYTES, "adamw", 4)
    return {"fit": fit, "memory": memory, "Decoder": Decoder, "DecoderConfig": DecoderConfig}


def _dropout(monkeypatch, forward=None):
    """04's evaluation cell on its own model and batch; ``forward`` replaces nn.Dropout's."""
    from torch.nn import functional as F

    from tutorial_utils import memory, models
    from tutorial_utils.units import format_bytes

    class Dropout(torch.nn.Dropout):
        def forward(self, x):
            return forward(self, x) if forward else F.dropout(x, self.p, self.training)

    fix_model, xb = (
        models.MLP(d_in=128, d_hidden=256, d_out=10, depth=8),
        models.mlp_batch(2048, 128),
    )
    return {  # the cell first sums five losses (needs the step's activations), then no_grad
        "nn": types.SimpleNamespace(Dropout=Dropout),
        **{"fix_model": fix_model, "xb": xb, "fix_step": memory.breakdown(fix_model, xb)},
        **{"memory": memory, "format_bytes": format_bytes, "device": torch.device("cpu")},
    }


def _dropout_at_a_third(monkeypatch):
    """A dropout that says p = 0.5 and zeroes 35 %: the old bound (> 0.3) let it through."""
    from torch.nn import functional as F

    return _dropout(monkeypatch, lambda self, x: F.dropout(x, 0.35, self.training))


def _dropout_that_ignores_eval(monkeypatch):
    from torch.nn import functional as F

    return _dropout(monkeypatch, lambda self, x: F.dropout(x, self.p, True))


def _capstone_state(monkeypatch, optimizer=None, budget=None):
    """11's model and budget; ``optimizer`` replaces torch.optim.Adam, ``budget`` BUDGET."""
    from tutorial_utils import memory
    from tutorial_utils.units import format_bytes

    ranks, grader = _script("capstone_ranks"), _script("capstone_grader")
    if optimizer is not None:
        monkeypatch.setattr(torch.optim, "Adam", optimizer)
    names = ("BLOCKS", "GLOBAL_BATCH", "WIDTH", "build_model")
    return {
        **{name: getattr(ranks, name) for name in names},
        "PSI": grader.PSI,
        "BUDGET": grader.BUDGET if budget is None else budget,
        **{"memory": memory, "format_bytes": format_bytes},
    }


def _adam_with_one_moment(monkeypatch):
    """An optimizer that keeps one buffer per parameter (SGD's momentum): 12 PSI in all."""
    return _capstone_state(monkeypatch, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))


def _a_budget_one_replica_fits(monkeypatch):
    return _capstone_state(monkeypatch, budget=64 * 2**20)


def _notebook_03_block() -> dict:
    """Notebook 03's section 3 cell run for real: its block, ``saved_storages``, ``weight_keys``."""
    from tutorial_utils import devices, formulas, memory, models
    from tutorial_utils.decoder import Decoder, DecoderConfig
    from tutorial_utils.units import format_bytes

    namespace = {
        "torch": torch,
        "memory": memory,
        "models": models,
        "formulas": formulas,
        "Decoder": Decoder,
        "DecoderConfig": DecoderConfig,
        "format_bytes": format_bytes,
        "caps": devices.capabilities(),
    }
    _run("03", ("def saved_storages(",), namespace)
    return namespace


def _fused_step_with_hooks(monkeypatch=None):
    """03 section 7's world (its measurement and check are one cell); with ``monkeypatch``, the
    hooks are never registered."""
    namespace = _notebook_03_block()
    if monkeypatch is not None:
        monkeypatch.setattr(torch.Tensor, "register_post_accumulate_grad_hook", lambda *a: None)
    return namespace


def _offloading(monkeypatch=None):
    """03 section 8's world; with ``monkeypatch``, the offloader's index holds each storage alive
    (a plain dict instead of a WeakKeyDictionary: the bug that frees nothing)."""
    import weakref

    namespace = _notebook_03_block()
    if monkeypatch is not None:
        monkeypatch.setattr(weakref, "WeakKeyDictionary", dict)
    return namespace  # the offloader, its measurement and its check are one cell


def _tp_activations(monkeypatch=None, fused_keeps_scores=False, mutate=True):
    """Notebook 10 section 2's activations (its cell computes the formulas, then checks them), as
    its tensor_parallel.py run on 2 gloo ranks measured them (bytes per rank; ``saved_fused``
    with scaled_dot_product_attention). With
    ``fused_keeps_scores``, an SDPA that saves the (s, s) matrix as the explicit softmax does;
    with ``monkeypatch``, section 4's ``Cluster.activations`` counts every attention as explicit.
    """
    comm = {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
    saved = {"single": (657_408, 528_384), "TP": (395_264, 330_752), "TP+SP": (361_472, 296_960)}
    rep = {"S": 64, "B": 2, "H": 64, "heads": 4}
    for name, (explicit, fused) in saved.items():
        rep[name] = {"saved": explicit, "saved_fused": explicit if fused_keeps_scores else fused}
    rep["TP+SP"]["forward_comm"] = comm
    wp = _script("which_parallelism")
    if monkeypatch is not None and mutate:
        real = wp.Cluster.activations
        explicit = lambda self, b, t=1, attention="fused": real(self, b, t, "explicit")  # noqa: E731
        monkeypatch.setattr(wp.Cluster, "activations", explicit)
    namespace = {"tp": types.SimpleNamespace(reports={0: rep, 1: rep}), "t": 2, "wp": wp}
    namespace["single"] = rep["single"]
    return namespace


TP_ACTIVATIONS = ("this_block = wp.Cluster(",)


def test_notebook_10s_activation_check_passes_what_the_ranks_measured(monkeypatch):
    _run("10", TP_ACTIVATIONS, _tp_activations(monkeypatch, mutate=False))


def _cluster_of_10(monkeypatch, mutate=True):
    """Notebook 10 section 4's cluster cell, given the reports its runs gave (recorded in
    tests/data/notebook_10_reports.json). With ``mutate``, a fit whose 2-D mesh sends the whole
    batch's activations over tp, as TP alone does, though each tp group sees only its dp share
    (the old check, the 2-D traffic against TP's over dp, was the fit's arithmetic twice)."""
    wp = _script("which_parallelism")
    recorded = json.loads((Path(__file__).parent / "data" / "notebook_10_reports.json").read_text())
    reports = {k: {int(r): rep for r, rep in recorded[k].items()} for k in ("tp", "mesh2d")}
    if mutate:
        real = wp.Cluster.fit

        def fit(self, *runs):
            real(self, *runs)
            *rest, tp_bytes = self.parts["2-D"]
            self.parts["2-D"] = (*rest, tp_bytes * self.dp2)
            return self

        monkeypatch.setattr(wp.Cluster, "fit", fit)
    runs = {k: types.SimpleNamespace(reports=reports[k]) for k in ("tp", "mesh2d")}
    return {"wp": wp, "m2": reports["mesh2d"][0], **runs}  # the cell builds and fits the cluster


CLUSTER_CHECK = ("closed_parts = {",)


def _recompute_that_stops_early(monkeypatch, mutate=True):
    """03 section 4's checkpointing cell; with ``mutate``, ``set_checkpoint_early_stop(False)``
    does nothing, so each checkpointed block stops recomputing once backward has what it needs
    (torch's default): full checkpointing then adds less than one forward's FLOPs."""
    import contextlib

    from torch.utils import checkpoint

    if mutate:
        monkeypatch.setattr(
            checkpoint, "set_checkpoint_early_stop", lambda on: contextlib.nullcontext()
        )
    return _notebook_03_block()


CHECKPOINT_CHECK = ("full: one more forward in a step of three",)


FUSED_CHECK = ("assert drop == grads_bytes - one_layer - saved",)
OFFLOAD_CHECK = ("assert offload.moved == back == predicted",)


REAL_WORLDS = {"_fused_step_with_hooks": FUSED_CHECK, "_offloading": OFFLOAD_CHECK}


@pytest.mark.heavy
@pytest.mark.parametrize("world", sorted(REAL_WORLDS))
def test_03_checks_pass_in_the_real_world(world, in_child):
    """The control for the two 03 mutations below: unmutated, the same cells pass."""
    assert in_child[("real", world)] == 0


#: Worlds whose cells leave tensors alive after their names are gone (03 section 7's hooks keep
#: its model alive from C++; 05's ledger under a patched autocast): run in a child process, or
#: every later test in this process counts their bytes (the capstone's budgets are absolute, as
#: a GPU's are).
LEAKY = frozenset({"_fused_step_with_hooks", "_autocast_that_does_nothing"})

#: The child's code: each case in a process forked from it, a fresh copy of a process that has
#: imported torch, this file and torch._dynamo once (the first optimizer a process builds
#: imports torch._dynamo, 2 s of CPU), so no case sees what another left. Exit status per case:
#: 0 if the check passed, 3 if it raised AssertionError, 1 (with a traceback) if anything else.
_CHILD = """
import json, os, sys, traceback
sys.path.insert(0, sys.argv[1])
import pytest, test_check_cells as t
import torch._dynamo
statuses = {}
for key, (prefix, markers, world, mutated) in json.loads(sys.argv[2]).items():
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            with pytest.MonkeyPatch.context() as mp:
                world = getattr(t, world)
                ns = world(mp) if mutated and world.__code__.co_argcount else world()
                try:
                    t._run(prefix, tuple(markers), ns)
                except AssertionError:
                    status = 3
        except BaseException:
            print(f"{key}:", file=sys.stderr)
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    statuses[key] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(statuses))
"""


@pytest.fixture(scope="module")
def in_child() -> dict[tuple[str, str], int]:
    """The exit status of every case that runs outside this process, keyed ("real", world) for
    the controls and ("mutated", case) for the leaky mutations: all in one child (one start of
    torch instead of four)."""
    cases = {("real", w): ("03", m, w, False) for w, m in REAL_WORLDS.items()}
    for case, (prefix, markers, world, *_) in MUTATIONS.items():
        if world.__name__ in LEAKY:
            cases[("mutated", case)] = (prefix, markers, world.__name__, True)
    code = json.dumps({"\t".join(k): v for k, v in cases.items()})
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(Path(__file__).parent), code],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    last = child.stdout.splitlines()[-1]  # the cells print before it
    statuses = {tuple(k.split("\t")): v for k, v in json.loads(last).items()}
    for key, status in statuses.items():  # anything but passed / AssertionError: a broken case
        assert status in (0, 3), f"{key}: exit status {status}\n{child.stderr[-3000:]}"
    return statuses


def _oom_lab(message: str | None):
    """Notebook 04's OOM lab where the batch of 8192 fits (``message`` None) or fails on a
    request other than one (8192, 1024) fp32 activation."""
    from contextlib import contextmanager

    @contextmanager
    def budget(limit, device):
        if message is not None:
            raise torch.OutOfMemoryError(message)
        yield

    return {
        "memory": types.SimpleNamespace(budget=budget),
        "train": lambda batch_size: None,
        "limit": 0,
        "device": torch.device("cpu"),
    }


# ------------------------------------------------------------------- 13: fewer bytes
PSI_13, SHAPES_13 = 131_584, [[256, 256], [256], [256, 256], [256]]
PSGD_13 = 4 * (512 + 1 * (512 + 512))  # biases whole, P and Q of the two 256 x 256 weights


def _fewer_bytes_reports(mutate: str | None = None) -> dict:
    """Notebook 13's ``run`` (scripts/fewer_bytes.py on 2 ranks) as the run reported it, with
    one claim broken by ``mutate``: "fp16 sends fp32", "no error feedback" (the mean applied
    gradient stays as far from G as one step), "fp8 gathered in bf16", "logits gathered"."""
    hooks = {
        "psi": PSI_13,
        "bf16_compress_hook": "TypeError: BF16 all reduce communication hook required CUDA 11+",
        "allreduce_hook (fp32)": {
            "calls": [["all_reduce", "float32", 4 * PSI_13]],
            "gap": 2e-7,
            "tol": 4e-5,
        },
        "fp16_compress_hook": {
            "calls": [["all_reduce", "float16", 2 * PSI_13]],
            "gap": 4e-4,
            "bound": 1e-3,
            "exact": True,
        },
        "bf16 (_compress_hook)": {
            "calls": [["all_reduce", "bfloat16", 2 * PSI_13]],
            "gap": 3e-3,
            "bound": 8e-3,
            "exact": True,
        },
    }
    if mutate == "fp16 sends fp32":
        hooks["fp16_compress_hook"]["calls"] = [["all_reduce", "float32", 4 * PSI_13]]
    gaps = [0.64 / t for t in range(1, 17)]
    if mutate == "no error feedback":
        gaps = [0.64] * 16
    hooks["powerSGD"] = {
        "steps": [{"bytes": 4 * PSI_13, "calls": 1}] * 2
        + [{"bytes": PSGD_13, "calls": 3, "one_step_gap": 0.9, "mean_gap": g} for g in gaps],
        "feedback_gap": 3e-7,
        "feedback_tol": 4e-5,
        "shapes": SHAPES_13,
        "error_bytes": 4 * PSI_13,
        "pq_bytes": 4 * 1024,
    }
    shard = 65_536 // 2
    fp8 = {"calls": [["all_reduce", "float32", 4], ["all_gather", "uint8", shard]]}
    if mutate == "fp8 gathered in bf16":
        fp8["calls"][1] = ["all_gather", "bfloat16", 2 * shard]
    fp8.update(numel=65_536, exact=True)
    b, s, v, h = 2, 16, 128, 32
    loss = {
        "local_logits": [b, s, v // 2],
        "forward": {"tp all_reduce": {"calls": 3, "bytes": 3 * 4 * b * s}},
        "backward": {"tp all_reduce": {"calls": 1, "bytes": 4 * b * s * h}},
        "gather": {"tp all_gather_into_tensor": {"calls": 1, "bytes": 4 * b * s * v}},
        **{"loss_gap": 0.0, "loss_tol": 2e-5, "grad_gap": 2e-7, "grad_tol": 2e-5},
    }
    if mutate == "logits gathered":
        loss["forward"] = loss["gather"]
    report = {"world": 2, "hooks": hooks, "fp8": fp8, "loss_parallel": loss}
    return {"run": types.SimpleNamespace(reports={0: report, 1: report})}


def _fewer_bytes_world(mutate: str | None = None) -> dict:
    """What 13's check cells read besides ``run``: the names its earlier cells define."""
    world = _fewer_bytes_reports(mutate)
    world.update(
        psi=PSI_13,
        HOOKS=["allreduce_hook (fp32)", "fp16_compress_hook", "bf16 (_compress_hook)"],
        hook_formula={
            "allreduce_hook (fp32)": 4 * PSI_13,
            "fp16_compress_hook": 2 * PSI_13,
            "bf16 (_compress_hook)": 2 * PSI_13,
        },
        psgd_formula=PSGD_13,
        matrices=[(256, 256), (256, 256)],
        b_=2,
        s_=16,
        vocab=128,
        world=2,
    )
    return world


def _schedules_world(v_sends_as_a_loop: bool = False) -> dict:
    """13's ``pipes`` (scripts/pipeline_schedules.py) as reported; with ``v_sends_as_a_loop``,
    the V schedules send across the turn of the V too (their stages placed as a loop)."""
    m, act = 4, 131_072
    runs = {}
    for name, style in (
        ("Interleaved1F1B", "loop"),
        ("LoopedBFS", "loop"),
        ("InterleavedZeroBubble", "loop"),
        ("ZBVZeroBubble", "v"),
        ("DualPipeV", "v"),
    ):
        crossing = 3 if style == "loop" or v_sends_as_a_loop else 2
        peak = 9 if name == "LoopedBFS" else 6
        runs[name] = {
            "grad_gap": 2e-7,
            "grad_tol": 5e-4,
            "sent_bytes": 2 * m * act * crossing // 2,
            "peak_bytes": peak * 393_216,
        }
    report = {"world": 2, "m": m, "stages": 4, "activation_bytes": act, "runs": runs}
    return {
        "p0": report,
        "pipes": types.SimpleNamespace(reports={0: report, 1: report}),
        "m": m,
        "act": act,
        "crossing": {"loop": 3, "v": 2},
        "style": lambda name: "v" if name in ("ZBVZeroBubble", "DualPipeV") else "loop",
    }


def _fp8_cast_world(scaled: bool = True) -> dict:
    """13's FP8 check with its tensors; without ``scaled``, ``a`` is cast with no scale."""
    f8 = torch.float8_e4m3fn
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 128, generator=g) * 1e-5, torch.randn(128, 32, generator=g) * 1e-5
    sa = (a.abs().max() / torch.finfo(f8).max) if scaled else torch.tensor(1.0)
    a8 = (a / sa).to(f8)
    err = ((a8.float() * sa) @ b - a @ b).abs()
    return {
        "F8": f8,
        "small": torch.full((4,), 1e-5),
        "a": a,
        "a8": a8,
        "err_fp8": err,
        "bound_fp8": err + 1,
    }


FEWER_HOOKS = ('assert rep["hooks"]["bf16_compress_hook"].startswith("TypeError"), rank',)
FEWER_PSGD = ('assert p["feedback_gap"] < p["feedback_tol"], (rank, p["feedback_gap"])',)
FEWER_FP8 = ('assert f["exact"], (rank, "the gathered float8 weight',)
FEWER_LOSS = ('assert r["local_logits"] == [b_, s_, vocab // world], rank',)
FEWER_PIPES = ('assert r["sent_bytes"] == 2 * m * act * crossing[style(name)] // world',)
FEWER_CAST = ("assert (err_fp8 <= bound_fp8).all()",)


@pytest.mark.parametrize(
    "markers, world",
    [
        (FEWER_HOOKS, _fewer_bytes_world),
        (FEWER_PSGD, _fewer_bytes_world),
        (FEWER_FP8, _fewer_bytes_world),
        (FEWER_LOSS, _fewer_bytes_world),
        (FEWER_PIPES, _schedules_world),
        (FEWER_CAST, _fp8_cast_world),
    ],
)
def test_13_checks_pass_in_the_world_that_was_measured(markers, world):
    """The controls for 13's mutations: the same cells pass on the reports as measured."""
    _run("13", markers, world())


def _fingerprint(rank: int, op: str, shape: int) -> str:
    return (
        f"Rank {rank} is running collective: CollectiveFingerPrint(SequenceNumber=0, "
        f"OpType={op}, TensorShape=[{shape}], TensorDtypes=Float)"
    )


def _lab_of_14(**broken) -> dict:
    """What notebook 14's lab reports (measured, torch 2.13, messages shortened), with the
    entries in ``broken`` ({"rank.key": value}) replaced: a world in which a claim is false."""
    mismatch = "Detected mismatch between collectives on ranks. "
    barriers = [{"group": "0", "seq": s, "op": "barrier", "sizes": []} for s in (1, 2)]
    reports = {
        0: {
            "skipped": "[/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms "
            "for recv operation to complete",
            "monitored": "[Rank 0]: Ranks 1 failed to pass monitoredBarrier in 2000 ms",
            "shapes": mismatch
            + _fingerprint(0, "ALLREDUCE", 4)
            + ", but "
            + _fingerprint(1, "ALLREDUCE", 5)
            + ").Collectives differ in the following aspects:   Tensor Tensor shapes: 4vs 5",
            "ops": mismatch
            + _fingerprint(0, "ALLREDUCE", 4)
            + ", but "
            + _fingerprint(1, "BROADCAST", 4)
            + ").Collectives differ in the following aspects:   Op type: ALLREDUCEvs BROADCAST",
            "flight_record": [
                {"group": "1", "seq": 1, "op": "all_reduce", "sizes": [[4]]},
                *barriers,
            ],
            "timeout_s": 2.0,
        },
        1: {
            "skipped": "ok",
            "monitored": "[/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:1432. This is typically caused by a remote worker crashing.",
            "shapes": mismatch
            + _fingerprint(1, "ALLREDUCE", 5)
            + ", but "
            + _fingerprint(0, "ALLREDUCE", 4)
            + ").Collectives differ in the following aspects:   Tensor Tensor shapes: 5vs 4",
            "ops": mismatch
            + _fingerprint(1, "BROADCAST", 4)
            + ", but "
            + _fingerprint(0, "ALLREDUCE", 4)
            + ").Collectives differ in the following aspects:   Op type: BROADCASTvs ALLREDUCE",
            "flight_record": list(barriers),
            "timeout_s": 2.0,
        },
    }
    for where, value in broken.items():
        rank, key = where.split(".")
        reports[int(rank)][key] = value
    return {"lab": types.SimpleNamespace(reports=reports), "re": re}


def _death_of_14(
    rank: int = 1,
    cause: str = "RuntimeError: rank 1: NaN in the loss at step 1, giving up",
    saw: str = "Connection closed by peer [127.0.0.1]:23702",
) -> dict:
    """Notebook 14's dead rank (measured): launch's error, the survivor's report, and torchrun's
    Root Cause block; ``rank``, ``cause``, ``saw`` replaced in a world where a claim is false."""
    root_cause = (
        f" (first observed failure):\n[0]:\n  rank      : {rank} (local_rank: {rank})\n"
        f"  exitcode  : 1 (pid: 16373)\n  traceback : Traceback (most recent call last):\n"
        f"  {cause}\n"
    )
    return {
        "died": types.SimpleNamespace(rank=rank),
        "survivor": {"step": 1, "error": saw},
        "root_cause": root_cause,
        "re": re,
    }


TIMEOUT_14 = ('assert lab.reports[1]["skipped"] == "ok"',)
MONITORED_14 = ('"no rank named"',)
DETAIL_14 = ('"TensorShape=[5]" in found["shapes"]',)
RECORD_14 = ("def on_group(record, group):",)
DEATH_14 = ("assert died.rank == 1",)


MOVE_CELL = ("moving 64 MiB costs time", "fresh = x.to(run_on, copy=True)")
PLAYBOOK_CHECK = ("the Playbook counts GPT-2 less its position table",)


def _fsdp_depth_reports(monkeypatch=None, mutate=True, reduce_in_bf16=False) -> dict:
    """Notebook 09 section 5's two ranks as ``fsdp_depth.py`` reports them on torch 2.13
    (measured: 4 layers of Psi = 66,048 in all, k = 4 micro-batches), for the cells' checks.
    ``mutate``: FSDP2 ignores ``set_requires_gradient_sync(False)`` (mode "last" reduces in every
    micro-batch and keeps no unsharded gradients), or, with ``reduce_in_bf16``, the fp32 reduce
    dtype (bf16's reduce-scatter moves 2 bytes a value)."""
    depth_script = _script("fsdp_depth")
    layers, k, psi, n = depth_script.LAYERS, depth_script.MICRO, 66_048, 2

    def comm(gathers: int, reduces: int) -> dict:
        return {
            "all_gather": {"calls": gathers * layers, "bytes": gathers * 4 * psi},
            "reduce_scatter": {"calls": reduces * layers, "bytes": reduces * 4 * psi},
        }

    def run(gathers: int, reduces: int, held: int) -> dict:
        leaves = [held] + [0] * (k - 2) + [4 * psi // n - held]
        return {"comm": comm(gathers, reduces), "held_after_micro_batch": leaves, "grad_gap": 2e-7}

    acc = {
        "every": run(2 * k, k, 4 * psi // n),
        "last": run(2 * k, 1, 4 * psi),
        "last, kept gathered": run(k + 1, 1, 8 * psi),
        "grad_tol": 6.3e-5,
    }
    red = {
        name: {
            "comm": {
                "all_gather": {"calls": 2 * layers, "bytes": gather * psi},
                "reduce_scatter": {"calls": layers, "bytes": scatter * psi},
            },
            "held": kept * psi,
        }
        for name, (gather, scatter, kept) in {
            "fp32": (8, 4, 4),
            "bf16, reduce fp32": (4, 4, 4),
            "bf16, reduce bf16": (4, 2, 2),
        }.items()
    }
    if mutate and reduce_in_bf16:
        red["bf16, reduce fp32"]["comm"]["reduce_scatter"]["bytes"] = 2 * psi
    elif mutate:
        acc["last"] = run(2 * k, k, 4 * psi // n)
    reports = {
        rank: {"psi": psi, "world": n, "accumulation": acc, "reduce_dtype": red} for rank in (0, 1)
    }
    return {"depth": types.SimpleNamespace(reports=reports), "psi_d": psi, "LAYERS": layers}


def _fsdp_reduce_dtype_ignored(monkeypatch=None, mutate=True) -> dict:
    return _fsdp_depth_reports(monkeypatch, mutate, reduce_in_bf16=True)


def _fsdp_frees_the_unsynced_gradient(monkeypatch=None, mutate=True) -> dict:
    """Mode "last" leaving what "every" leaves (its gradient resharded as if reduced), with the
    right collectives; the control: "last" a layer's gradient late (+ Psi, allowed)."""
    world = _fsdp_depth_reports(monkeypatch, mutate=False)
    psi, n = world["psi_d"], 2
    leaves = world["depth"].reports[0]["accumulation"]["last"]["held_after_micro_batch"]
    leaves[0] = 4 * psi // n if mutate else leaves[0] + 4 * psi // world["LAYERS"]
    return world


def _fsdp_keeps_a_second_gradient(monkeypatch=None, mutate=True) -> dict:
    """fp32 ZeRO-3 keeping its unsharded gradient twice (mutated: + 4 Psi, all layers), or, as
    the control, one layer's gradient still held by a reduce-scatter's gloo thread (+ Psi: how
    often depends on thread timing, so the check allows it)."""
    world = _fsdp_depth_reports(monkeypatch, mutate=False)
    psi = world["psi_d"]
    for rep in world["depth"].reports.values():
        rep["reduce_dtype"] = {k: dict(v) for k, v in rep["reduce_dtype"].items()}
        rep["reduce_dtype"]["fp32"]["held"] += 4 * psi if mutate else 4 * psi // world["LAYERS"]
    return world


FSDP_ACCUMULATION = ('want = {"every": (2 * k, k, 4 / n)',)
FSDP_REDUCE_DTYPE = ('per_psi = {"fp32": (8, 4, 4)',)
CALCULATOR_CHECK = ("the calculator's states are a real step's",)
DROPOUT_CHECK = ("dropout = nn.Dropout(p=0.5)",)
CAPSTONE_STATE = ("print(build_model()[0])",)

#: case: (notebook, lines that find the check cell, the world in which its claim is false, and
#: optionally a pattern of the assert message that must fail: the claim's own, not another's)
# --- notebook 12: ring attention, expert parallelism, HSDP, as their launches report them ---------
CP_ERROR = (
    "NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does "
    "not have a sharding strategy registered."
)


def _ring_world(**change):
    """Notebook 12's ring-attention launch on 2 ranks (B, H, S, DH = 2, 4, 64, 16, fp32), as
    measured, with ``change`` applied to every rank's report."""
    block = 2 * 4 * 32 * 16 * 4
    report = {
        **{"world": 2, "B": 2, "H": 4, "S": 64, "DH": 16, "elem": 4},
        **{"forward_gap": 6.2e-7, "forward_tol": 9.5e-6, "grad_gap": 3.6e-7, "grad_tol": 1.9e-5},
        **{
            "sent_forward": 2 * block,
            "sent_backward": 6 * block,
            "context_parallel_error": CP_ERROR,
        },
    }
    reports = {
        rank: {**report, "rank": rank, "blocks_computed": rank + 1, **change} for rank in (0, 1)
    }
    return {"ring": types.SimpleNamespace(reports=reports), "torch": torch}


def _ep_world(mutate=lambda reports: None):
    """Notebook 12's expert-parallel launch on 2 ranks (D = 8, E = 4, T = 24, fp32), as
    measured; ``mutate(reports)`` changes them in place."""
    row = 8 * 4

    def report(rank, send, recv, off, capacity=14):
        received_off = sum(recv) - recv[rank]
        return {
            **{"rank": rank, "world": 2, "D": 8, "E": 4, "T": 24, "elem": 4},
            **{"send_splits": send, "recv_splits": recv, "off_rank_tokens": off},
            "counted": {
                "counts": 16,
                "dispatch": off * row,
                "combine": received_off * row,
                "backward": (off + received_off) * row,
            },
            **{"forward_gap": 0.0, "forward_tol": 2.9e-6, "grad_gap": 1.2e-7, "grad_tol": 8.6e-6},
            **{"capacity": capacity, "padded_bytes": capacity * row, "padded_same": True},
            "list_form_error": "ProcessGroupGloo::alltoall: invalid tensor size at index 1 "
            "(expected (1, 8), got (2, 8))",
            **{"param_bytes": 4 * (36 + 2 * 280), "router_numel": 36, "expert_numel": 280},
        }

    reports = {0: report(0, [12, 12], [12, 10], 12), 1: report(1, [10, 14], [12, 14], 10)}
    mutate(reports)
    return {"ep": types.SimpleNamespace(reports=reports)}


def _dispatch_counts_own_tokens(reports):
    reports[0]["counted"]["dispatch"] = 24 * 8 * 4  # all 24 of rank 0's tokens, its own too


def _expert_gradients_off(reports):
    reports[1]["grad_gap"] = 0.5  # an expert's gradient missing the other rank's tokens


def _even_splits(reports):
    for r in reports.values():  # a router that sends every rank the same number of rows
        r["send_splits"], r["recv_splits"], r["off_rank_tokens"] = [12, 12], [12, 12], 12
        r["counted"] = {"counts": 16, "dispatch": 384, "combine": 384, "backward": 768}


def _every_rank_keeps_every_expert(reports):
    for r in reports.values():
        r["param_bytes"] = 4 * (36 + 4 * 280)


def _list_form_takes_uneven_chunks(reports):
    for r in reports.values():
        r["list_form_error"] = None


def _padding_for_free(reports):
    for r in reports.values():
        r["padded_bytes"] = r["off_rank_tokens"] * 8 * 4


def _hsdp_world(**change):
    """Notebook 12's HSDP launch on a 2 x 2 mesh (two Linear(64, 64): 8,320 parameters)."""
    psi = 8320
    groups = {0: ([0, 2], [0, 1]), 1: ([1, 3], [0, 1]), 2: ([0, 2], [2, 3]), 3: ([1, 3], [2, 3])}
    reports = {
        rank: {
            "rank": rank,
            "psi": psi,
            "groups": {"replicate": groups[rank][0], "shard": groups[rank][1]},
            "placements": ["(Replicate(), Shard(dim=0))"],
            "param_bytes": 4 * psi // 2,
            "forward_comm": {"shard allgather_base": {"calls": 2, "bytes": 4 * psi}},
            "backward_comm": {
                "shard allgather_base": {"calls": 2, "bytes": 4 * psi},
                "shard reduce_scatter_base": {"calls": 2, "bytes": 4 * psi},
                "replicate allreduce": {"calls": 2, "bytes": 4 * psi // 2},
            },
            **{"grad_gap": 2.3e-7, "grad_tol": 8.6e-6, **change},
        }
        for rank in range(4)
    }
    return {"hsdp": types.SimpleNamespace(reports=reports)}


RING_CHECK = ("block = B * H * (S // W) * DH * elem  # one rank's keys (or values)",)
CP_CHECK = ('cp_error = ring.reports[0]["context_parallel_error"]',)
EP_CHECK = ('"counts": (r["world"] - 1) * (r["E"] // r["world"]) * 8',)
PADDED_CHECK = ('r["padded_same"]',)
HSDP_CHECK = ("want_backward = {",)


MUTATIONS = {
    "00 GPUtil starts no nvidia-smi": (
        "00",
        ("GPUtil.getGPUs() for _ in range(3)",),
        _gputil_without_nvidia_smi,
    ),
    "00 CUDA's counters see CPU tensors": (
        "00",
        ("def cpu_block():", "CUDA's counters skip CPU tensors"),
        _cuda_counters_that_see_cpu_tensors,
        "CUDA's counters skip CPU tensors",
    ),
    "00 torch.cuda answers without CUDA": (
        "00",
        ("CUDA's counters skip CPU tensors",),
        _cuda_that_answers_without_cuda,
        "without CUDA these raise",
    ),
    "00 the peak counter misses the spike": (
        "00",
        ("the peak counter caught the spike",),
        _a_peak_counter_that_missed_the_spike,
        "the peak counter caught the spike",
    ),
    "00 a tick reads the peak, not the instant": (
        "00",
        ("the peak counter caught the spike",),
        _spike_ticks,
        "a tick reads what is alive at its instant",
    ),
    "01 a move that copies nothing": (
        "01",
        MOVE_CELL,
        _a_move_that_copies_nothing,
        "no-op: x itself; copy: new memory",
    ),
    "01 a no-op .to() that copies": (
        "01",
        MOVE_CELL,
        _a_no_op_that_copies,
        "no-op: x itself; copy: new memory",
    ),
    "01 copy_ writes nothing into dst": (
        "01",
        MOVE_CELL,
        _a_copy_into_dst_that_writes_nothing,
        "each copy holds x's 64 MiB",
    ),
    "03 the Playbook counts GPT-2's position table": (
        "03",
        PLAYBOOK_CHECK,
        _the_playbook_counting_positions,
        "the Playbook counts GPT-2 less its position table",
    ),
    "03 the calculator keeps one Adam moment": (
        "03",
        CALCULATOR_CHECK,
        _a_calculator_without_adams_second_moment,
        "the calculator's states are a real step's",
    ),
    "03 GPT-2 without positions keeps the table": (
        "03",
        PLAYBOOK_CHECK,
        _a_decoder_that_keeps_its_position_table,
        "the Playbook counts GPT-2 less its position table",
    ),
    "03 a real AdamW step keeps one moment": (
        "03",
        CALCULATOR_CHECK,
        _an_adamw_that_keeps_one_moment,
        "the calculator's states are a real step's",
    ),
    "04 dropout zeroes 35 % at p = 0.5": ("04", DROPOUT_CHECK, _dropout_at_a_third, "p zeroed"),
    "04 dropout ignores eval()": ("04", DROPOUT_CHECK, _dropout_that_ignores_eval, "p zeroed"),
    "09 FSDP2 reduces every micro-batch with gradient sync off": (
        "09",
        FSDP_ACCUMULATION,
        _fsdp_depth_reports,
        "('last', {",
    ),
    "09 bf16's reduce-scatter moves bf16 despite reduce_dtype=float32": (
        "09",
        FSDP_REDUCE_DTYPE,
        _fsdp_reduce_dtype_ignored,
        "(0, 'bf16, reduce fp32'",
    ),
    "09 fp32 ZeRO-3 keeps its gradient twice": (
        "09",
        FSDP_REDUCE_DTYPE,
        _fsdp_keeps_a_second_gradient,
        "(0, 'fp32'",
    ),
    "09 gradient sync off frees the unsynced gradient": (
        "09",
        FSDP_ACCUMULATION,
        _fsdp_frees_the_unsynced_gradient,
        "('last', 132096)",
    ),
    "11 Adam keeps one moment": ("11", CAPSTONE_STATE, _adam_with_one_moment, "does not fit"),
    "11 one replica fits the budget": (
        "11",
        CAPSTONE_STATE,
        _a_budget_one_replica_fits,
        "does not fit",
    ),
    "00 doctor names the wrong reason": (
        "00",
        ("caps.plan().items()",),
        _doctor_misreads_the_build,
    ),
    "01 pinning per batch is faster": (
        "01",
        ("pin_each = pin_ways", "pin_ways.timings[:2]"),
        _pinning_per_batch_pays,
    ),
    "01 a pinned copy is no faster than pageable": (
        "01",
        ("pin_each = pin_ways", "pin_ways.timings[:2]"),
        _pinned_copies_no_faster,
        "a copy from pinned memory beats pageable",
    ),
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
    "04 the batch of 8192 fits": ("04", ("train(8192)\n",), lambda: _oom_lab(None)),
    "04 the request that failed is the batch": (
        "04",
        ("train(8192)\n",),
        lambda: _oom_lab("CPU out of memory. Tried to allocate 8.00 MiB for the batch"),
    ),
    "05 cudnn.benchmark costs nothing": (
        "05",
        ("benchmark=True should pay a search",),
        _cudnn_search_that_costs_nothing,
        "benchmark=True should pay a search",
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
    "07 launch's command is wrong": ("07", COMMAND_07, _launch_built_a_wrong_command),
    "07 torchrun ran another rendezvous": ("07", COMMAND_07, _torchrun_ran_standalone),
    "07 a rank was told another world": ("07", COMMAND_07, _a_rank_told_another_world),
    "07 DataParallel's copies are detached": (
        "07",
        ("no gradient reached the model",),
        _replicas_were_detached,
    ),
    "07 DataParallel warns of a deprecation": (
        "07",
        DATA_PARALLEL_07,
        _data_parallel_that_warns,
        "DataParallel warns",
    ),
    "07 DataParallel without CUDA splits the batch": (
        "07",
        DATA_PARALLEL_07,
        _data_parallel_that_splits_without_cuda,
        "without CUDA, DataParallel did more than call the module",
    ),
    "07 no buffer switch measured at init (the old silent skip)": (
        "07",
        BUFFERS_07,
        lambda: _buffers_seen({}),
        "rank 1's running mean once DDP is built",
    ),
    "07 broadcast_buffers=False broadcasts at init": (
        "07",
        BUFFERS_07,
        lambda: _buffers_seen({**AT_INIT_213, "broadcast_buffers=False": 0.0}),
        "rank 1's running mean once DDP is built",
    ),
    "07 forward_sync_buffers=False skips the broadcast at init": (
        "07",
        BUFFERS_07,
        lambda: _buffers_seen({**AT_INIT_213, "forward_sync_buffers=False": 1.0}),
        "rank 1's running mean once DDP is built",
    ),
    "07 the bucket holds bf16 gradients": (
        "07",
        STEP_BYTES_07,
        lambda: _step_time([2 * PSI_07]),
        "not 4Ψ",
    ),
    "07 the gradients split over two buckets": (
        "07",
        STEP_BYTES_07,
        lambda: _step_time([2 * PSI_07, 2 * PSI_07]),
        "the first could overlap backward",
    ),
    "08 GPipe frees activations early": (
        "08",
        ("GPipe holds m micro-batches per stage",),
        lambda: _pipeline_activations(2, (2, 1)),
    ),
    "08 1F1B holds every micro-batch": (
        "08",
        ("GPipe holds m micro-batches per stage",),
        lambda: _pipeline_activations(8, (8, 8)),
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
    "05 the picked recipe loses the gradient": (
        "05",
        ("gap_picked = relative_gap(",),
        _picked_fp16_without_a_scaler,
    ),
    "05 capabilities() claims native bf16 on a T4": (
        "05",
        ("gap_picked = relative_gap(",),
        _native_bf16_on_a_t4,
        "capabilities() and PyTorch disagree on native bf16",
    ),
    "04 the allocator ignores PYTORCH_ALLOC_CONF": (
        "04",
        ("alloc_conf.read_back(n)",),
        _allocator_ignoring_the_new_name,
    ),
    "04 CUDA ignores PYTORCH_ALLOC_CONF": (
        "04",
        ("alloc_conf.read_back(n)",),
        _cuda_allocator_ignoring_the_new_name,
    ),
    "05 autocast saves nothing": (
        "05",
        ("def saved_for_backward(", "amp_checks.saved_for_backward("),
        _autocast_that_does_nothing,
    ),
    "05 every speed row runs fp32": (
        "05",
        ("step()  # one more call per row", "amp_checks.ran_as(step)"),
        _speed_rows_that_all_run_fp32,
        "(output dtype, matmul precision)",
    ),
    "05 deterministic mode does nothing": (
        "05",
        ("torch.isnan(fresh)", '"switched back off"'),
        _deterministic_mode_does_nothing,
    ),
    "13 fp16_compress_hook sends fp32": (
        "13",
        FEWER_HOOKS,
        lambda: _fewer_bytes_world("fp16 sends fp32"),
    ),
    "13 PowerSGD without error feedback": (
        "13",
        FEWER_PSGD,
        lambda: _fewer_bytes_world("no error feedback"),
    ),
    "13 the float8 all-gather sends bf16": (
        "13",
        FEWER_FP8,
        lambda: _fewer_bytes_world("fp8 gathered in bf16"),
    ),
    "13 loss_parallel gathers the logits": (
        "13",
        FEWER_LOSS,
        lambda: _fewer_bytes_world("logits gathered"),
    ),
    "13 a V schedule sends across its turn": (
        "13",
        FEWER_PIPES,
        lambda: _schedules_world(v_sends_as_a_loop=True),
    ),
    "13 FP8 cast without a scale": ("13", FEWER_CAST, lambda: _fp8_cast_world(scaled=False)),
    "14 the skipped all_reduce returned": (
        "14",
        TIMEOUT_14,
        lambda: _lab_of_14(**{"0.skipped": "ok"}),
        "rank 0 did not time out",
    ),
    "14 the rank that skipped it waited too": (
        "14",
        TIMEOUT_14,
        lambda: _lab_of_14(**{"1.skipped": "Timed out waiting 2000ms for recv operation"}),
        "rank 1 called nothing",
    ),
    "14 monitored_barrier names no rank": (
        "14",
        MONITORED_14,
        lambda: _lab_of_14(**{"0.monitored": "Timed out waiting 2000ms for recv operation"}),
        "no rank named",
    ),
    "14 DETAIL names one side's shape only": (
        "14",
        DETAIL_14,
        lambda: _lab_of_14(**{"1.shapes": "Detected mismatch: TensorShape=[5]"}),
    ),
    "14 DETAIL names no operation": (
        "14",
        DETAIL_14,
        lambda: _lab_of_14(**{"0.ops": _lab_of_14()["lab"].reports[0]["shapes"]}),
    ),
    "14 the flight recorder lost rank 0's all_reduce": (
        "14",
        RECORD_14,
        lambda: _lab_of_14(**{"0.flight_record": _lab_of_14()["lab"].reports[1]["flight_record"]}),
        "rank 0's all_reduce is missing",
    ),
    "14 the flight records hold the same barriers and nothing else": (
        "14",
        RECORD_14,
        lambda: _lab_of_14(**{"1.flight_record": _lab_of_14()["lab"].reports[0]["flight_record"]}),
        "rank 1 never called",
    ),
    "14 launch blames the survivor": (
        "14",
        DEATH_14,
        lambda: _death_of_14(rank=0),
        "launch blamed rank 0",
    ),
    "14 the survivor waited for a timeout": (
        "14",
        DEATH_14,
        lambda: _death_of_14(saw="Timed out waiting 3000ms for recv operation to complete"),
    ),
    "14 the Root Cause without @record's traceback": (
        "14",
        DEATH_14,
        lambda: _death_of_14(
            cause="To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        ),
        "@record's traceback is missing",
    ),
    "03 the recomputation stops early": (
        "03",
        CHECKPOINT_CHECK,
        _recompute_that_stops_early,
        "full: one more forward in a step of three",
    ),
    "03 the fused step frees no gradient": ("03", FUSED_CHECK, _fused_step_with_hooks),
    "03 the offloader keeps every storage alive": ("03", OFFLOAD_CHECK, _offloading),
    "10 the cluster counts fused attention as explicit": (
        "10",
        TP_ACTIVATIONS,
        _tp_activations,
        "the cluster's fused formula",
    ),
    "10 the 2-D mesh sends TP's traffic": ("10", CLUSTER_CHECK, _cluster_of_10),
    "10 SDPA keeps the s x s matrix": (
        "10",
        TP_ACTIVATIONS,
        lambda: _tp_activations(fused_keeps_scores=True),
        "fused",
    ),
    "12 the ring sends the keys, not the values": (
        "12",
        RING_CHECK,
        lambda: _ring_world(sent_forward=2 * 4 * 32 * 16 * 4),
    ),
    "12 the ring's backward keeps the key gradients where they are": (
        "12",
        RING_CHECK,
        lambda: _ring_world(sent_backward=4 * 2 * 4 * 32 * 16 * 4),
    ),
    "12 ring attention is not one process's": (
        "12",
        RING_CHECK,
        lambda: _ring_world(forward_gap=3e-2),
    ),
    "12 every rank attends to every block, masked or not": (
        "12",
        RING_CHECK,
        lambda: _ring_world(blocks_computed=2),
    ),
    "12 context_parallel runs on CPU ranks": (
        "12",
        CP_CHECK,
        lambda: _ring_world(context_parallel_error=None),
    ),
    "12 the dispatch counts the tokens a rank keeps": (
        "12",
        EP_CHECK,
        lambda: _ep_world(_dispatch_counts_own_tokens),
    ),
    "12 the experts' gradients are not one process's": (
        "12",
        EP_CHECK,
        lambda: _ep_world(_expert_gradients_off),
    ),
    "12 every rank sends even splits": ("12", EP_CHECK, lambda: _ep_world(_even_splits)),
    "12 every rank keeps every expert": (
        "12",
        EP_CHECK,
        lambda: _ep_world(_every_rank_keeps_every_expert),
    ),
    "12 padding costs nothing": ("12", PADDED_CHECK, lambda: _ep_world(_padding_for_free)),
    "12 the list form takes uneven chunks": (
        "12",
        PADDED_CHECK,
        lambda: _ep_world(_list_form_takes_uneven_chunks),
    ),
    "12 HSDP all-reduces whole gradients across the replicas": (
        "12",
        HSDP_CHECK,
        lambda: _hsdp_world(
            backward_comm={
                "shard allgather_base": {"calls": 2, "bytes": 4 * 8320},
                "shard reduce_scatter_base": {"calls": 2, "bytes": 4 * 8320},
                "replicate allreduce": {"calls": 2, "bytes": 4 * 8320},
            }
        ),
    ),
    "12 FSDP on 4 ranks, not HSDP": (
        "12",
        HSDP_CHECK,
        lambda: _hsdp_world(placements=["(Shard(dim=0),)"]),
    ),
}


@pytest.mark.parametrize(
    "case",
    [  # the leaky worlds run in the child process of in_child
        pytest.param(c, marks=pytest.mark.heavy) if MUTATIONS[c][2].__name__ in LEAKY else c
        for c in sorted(MUTATIONS)
    ],
)
def test_the_check_fails_when_its_claim_is_false(case, monkeypatch, request):
    prefix, markers, world, *message = MUTATIONS[case]
    if world.__name__ in LEAKY:
        in_child = request.getfixturevalue("in_child")
        assert in_child[("mutated", case)] == 3, "the check did not fail"
        return
    namespace = world(monkeypatch) if world.__code__.co_argcount else world()
    with pytest.raises(AssertionError, match=re.escape(message[0]) if message else None):
        _run(prefix, markers, namespace)


#: issue 38's worlds with the claim true: the same cells pass in them, so each mutation above
#: fails on the claim it breaks, not on a world that does not hold together
CONTROLS = {
    "00 CUDA's counters see CPU tensors": _cuda_counters_that_see_cpu_tensors,
    "00 a tick reads the peak, not the instant": _spike_ticks,
    "01 a pinned copy is no faster than pageable": _pinned_copies_no_faster,
    "03 the Playbook counts GPT-2's position table": _the_playbook_counting_positions,
    "03 the calculator keeps one Adam moment": _a_calculator_without_adams_second_moment,
    "03 the recomputation stops early": _recompute_that_stops_early,
    "10 the 2-D mesh sends TP's traffic": _cluster_of_10,
    "05 capabilities() claims native bf16 on a T4": _native_bf16_on_a_t4,
    "04 the allocator ignores PYTORCH_ALLOC_CONF": _allocator_ignoring_the_new_name,
    "04 CUDA ignores PYTORCH_ALLOC_CONF": _cuda_allocator_ignoring_the_new_name,
    "09 FSDP2 reduces every micro-batch with gradient sync off": _fsdp_depth_reports,
    "09 bf16's reduce-scatter moves bf16 despite reduce_dtype=float32": _fsdp_reduce_dtype_ignored,
    "09 fp32 ZeRO-3 keeps its gradient twice": _fsdp_keeps_a_second_gradient,
    "09 gradient sync off frees the unsynced gradient": _fsdp_frees_the_unsynced_gradient,
}


@pytest.mark.parametrize("case", sorted(CONTROLS))
def test_the_check_passes_in_the_world_where_its_claim_holds(case, monkeypatch):
    prefix, markers, *_ = MUTATIONS[case]
    _run(prefix, markers, CONTROLS[case](monkeypatch, mutate=False))


@pytest.mark.parametrize(
    "prefix, markers, world",
    [
        ("01", MOVE_CELL, lambda mp: _moving(mp)),
        ("04", DROPOUT_CHECK, lambda mp: _dropout(mp)),
        ("11", CAPSTONE_STATE, lambda mp: _capstone_state(mp)),
        *[("14", cell, lambda mp: _lab_of_14()) for cell in (TIMEOUT_14, MONITORED_14, DETAIL_14)],
        ("14", RECORD_14, lambda mp: _lab_of_14()),
        ("14", DEATH_14, lambda mp: _death_of_14()),
        # a dying rank that left bytes unread resets the connection instead (by timing)
        (
            "14",
            DEATH_14,
            lambda mp: _death_of_14(saw="Read error [127.0.0.1]:23702: Connection reset by peer"),
        ),
        ("12", RING_CHECK, lambda mp: _ring_world()),
        ("12", CP_CHECK, lambda mp: _ring_world()),
        ("12", EP_CHECK, lambda mp: _ep_world()),
        ("12", PADDED_CHECK, lambda mp: _ep_world()),
        ("12", HSDP_CHECK, lambda mp: _hsdp_world()),
    ],
)
def test_the_unmutated_worlds_pass_too(prefix, markers, world, monkeypatch):
    _run(prefix, markers, world(monkeypatch))
