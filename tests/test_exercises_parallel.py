"""Checkers of notebooks 07 and 04: they pass the reference answers and catch the usual mistakes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_file
from torch import nn
from torch.nn import functional as F

from tutorial_utils import devices
from tutorial_utils.exercises import reset_attempts, shipped
from tutorial_utils.exercises.parallel import (
    DDP_EXERCISE_SHA256,
    check_allreduce_counts,
    check_bubble,
    check_ddp_script,
    check_microbatch_step,
    check_no_sync_step,
    check_sampler_padding,
    check_split_forward,
)

SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"


def test_bubble_accepts_the_formula_and_explains_mistakes():
    assert check_bubble(lambda p, m: (p - 1) / (m + p - 1)).passed
    wrong = check_bubble(lambda p, m: (p - 1) / m)
    assert not wrong.passed and "expected" in wrong.report() and wrong.hints
    untouched = check_bubble(lambda p, m: None)  # the notebook's `return None  # TODO`
    assert not untouched.passed and not untouched.answered and untouched.attempt == 0

    def forgot_return(p, m):
        (p - 1) / (m + p - 1)

    none = check_bubble(forgot_return)
    assert not none.passed and "returned None" in str(none)
    boom = check_bubble(lambda p, m: 1 / 0)
    assert not boom.passed and "ZeroDivisionError" in str(boom)


def test_sampler_padding_counts_the_repeated_samples():
    assert check_sampler_padding(22, 2).passed  # ceil(64 / 3) = 22 per rank, 66 - 64 repeated
    assert check_sampler_padding(16, 0, n=64, world=4).passed
    wrong = check_sampler_padding(21, 0)
    assert not wrong.passed and "22" in wrong.report() and wrong.hints
    assert "`per_rank` is still a placeholder (None)" in check_sampler_padding(None, None).report()


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def test_microbatch_step_passes_scaled_losses_and_names_the_factor():
    x, y = _data()
    model = _model()

    def right(model, x, y, m):
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            (F.mse_loss(model(xm), ym) / m).backward()

    def unscaled(model, x, y, m):
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            F.mse_loss(model(xm), ym).backward()

    def forgets_backward(model, x, y, m):
        model(x)

    assert check_microbatch_step(right, model, x, y, m=4).passed
    fb = check_microbatch_step(unscaled, model, x, y, m=4)
    assert not fb.passed and "4x too large" in fb.report()
    fb = check_microbatch_step(forgets_backward, model, x, y, m=4)
    assert not fb.passed and "no gradient" in fb.report()
    assert all(p.grad is None for p in model.parameters()), "the checker must not touch the model"


def _reference_params() -> torch.Tensor:
    """Single-process training on the two ranks' samples, as notebook 07 computes it."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        from ddp_train import build_data, build_model
    finally:
        sys.path.remove(str(SCRIPTS))
    from torch.utils.data import DistributedSampler

    data = build_data()
    X, Y = data.tensors
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    samplers = [
        DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=0) for r in (0, 1)
    ]
    for epoch in range(3):
        for s in samplers:
            s.set_epoch(epoch)
        shards = [list(s) for s in samplers]
        for k in range(0, len(shards[0]), 8):
            idx = shards[0][k : k + 8] + shards[1][k : k + 8]
            opt.zero_grad()
            F.mse_loss(model(X[idx]), Y[idx]).backward()
            opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.slow  # a torchrun launch of two ranks
def test_ddp_checker_reports_a_job_that_did_not_finish():
    crashed = check_ddp_script(SCRIPTS / "crash_demo.py", _reference_params(), timeout=120)
    assert (
        not crashed.passed and "did not finish" in crashed.report() and "rank 1" in crashed.report()
    )


def test_notebook_03_runs_the_ddp_checker_on_the_exercise_and_its_solution():
    """The checker's verdicts on ddp_exercise.py (both bugs found) and on its solution (passed)
    are cells of notebook 07, which strict nbval runs and compares in ``make test``: two torchrun
    launches a unit test would only repeat. This keeps those cells from going away unnoticed."""
    nb = json.loads((SCRIPTS.parent / "07_data_parallelism.ipynb").read_text())

    def shown(output: dict) -> str:  # printed text or a value's repr
        return "".join(output.get("text") or output.get("data", {}).get("text/plain", ""))

    cells = [
        ("".join(c["source"]), "".join(shown(o) for o in c["outputs"]))
        for c in nb["cells"]
        if c["cell_type"] == "code"
    ]
    buggy = [out for src, out in cells if 'check_ddp_script("scripts/ddp_exercise.py"' in src]
    assert buggy, "notebook 07 no longer runs check_ddp_script on scripts/ddp_exercise.py"
    # run as shipped, the exercise is not answered yet, and its saved output names no bug
    assert buggy[0].startswith("Not answered yet:") and "starting code" in buggy[0]
    assert "same order" not in buggy[0] and "world size" not in buggy[0]
    solved = [
        src
        for src, _ in cells
        if 'check_ddp_script("scripts/ddp_exercise_solution.py"' in src and "assert_passed()" in src
    ]
    assert solved, "notebook 07 no longer asserts that the DDP solution passes its checker"


def _split_forward(kind: str):
    def forward(stage0, stage1, x, d0, d1):
        h = stage0(x.to(d0))
        if kind == "detach":
            h = h.detach()
        elif kind == "data":
            h = h.data
        return stage1(h.to(d1))

    return forward


def test_split_forward_right_answer_passes() -> None:
    fb = check_split_forward(_split_forward("right"), [torch.device("cpu")] * 2)
    assert fb.passed, fb.problems


@pytest.mark.parametrize("kind", ["detach", "data"])
def test_split_forward_cut_graph_is_caught(kind: str) -> None:
    reset_attempts()
    fb = check_split_forward(_split_forward(kind), [torch.device("cpu")] * 2)
    assert not fb.passed and fb.briefs == ["stage 0 gets no gradient"]
    assert not fb.detailed and ".detach()" not in " ".join(fb.briefs)
    reset_attempts()


@pytest.mark.parametrize(
    ("forward", "problem"),
    [
        (lambda s0, s1, x, d0, d1: None, "still a placeholder"),
        (lambda s0, s1, x, d0, d1: print(end="") or None, "returned None"),
        (lambda s0, s1, x, d0, d1: s1(s0(x)).detach(), "not part of an autograd graph"),
        (lambda s0, s1, x, d0, d1: s0(x), "shape"),
        (lambda s0, s1, x, d0, d1: s1(s0(x)) * 2, "differs from stage1(stage0(x))"),
    ],
)
def test_split_forward_wrong_answers_fail(forward, problem: str) -> None:
    fb = check_split_forward(forward, [torch.device("cpu")] * 2)
    assert not fb.passed and problem in " ".join(fb.problems)


def test_split_forward_needs_two_devices() -> None:
    for bad in ([torch.device("cpu")], "cpu", torch.device("cpu"), None, ["not a device", "cpu"]):
        with pytest.raises(ValueError, match="two devices"):
            check_split_forward(_split_forward("right"), bad)


def test_split_forward_takes_the_notebooks_device_set() -> None:
    assert check_split_forward(_split_forward("right"), devices.demo_devices(2)).passed


def test_allreduce_counts_right_and_wrong() -> None:
    reset_attempts()
    assert check_allreduce_counts(8, 1).passed
    assert check_allreduce_counts(12, 3, k=4, buckets=3).passed
    first = check_allreduce_counts(1, 8)
    assert not first.passed and not first.detailed and len(first.problems) == 2
    assert "8" not in " ".join(first.briefs), "the first answer hints, it does not tell"
    assert check_allreduce_counts(1, 8).detailed
    for wrong in [(None, 1), (8, None), ("8", 1), (8.0, 1), (True, 1), (8, 0)]:
        assert not check_allreduce_counts(*wrong).passed, wrong
    reset_attempts()


def test_allreduce_counts_bad_setup_raises() -> None:
    with pytest.raises(ValueError, match="k must be"):
        check_allreduce_counts(8, 1, k=0)


def test_microbatch_step_with_one_full_batch_backward_fails():
    """Issue 25: one backward on the whole batch gives the full-batch gradients, so it passed."""
    x, y = _data()

    def full_batch(model, x, y, m):
        F.mse_loss(model(x), y).backward()

    fb = check_microbatch_step(full_batch, _model(), x, y, m=4)
    assert not fb.passed and "ran 1 backward pass(es)" in fb.report(), fb.report()


def test_microbatch_step_works_on_copies_of_the_notebooks_data():
    x, y = _data()
    kept = x.clone()

    def zeroes_x(model, x, y, m):
        x.zero_()
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            (F.mse_loss(model(xm), ym) / m).backward()

    fb = check_microbatch_step(zeroes_x, _model(), x, y, m=4)
    assert not fb.passed and "x changed its values" in fb.report() and torch.equal(x, kept)


def test_microbatch_step_that_adds_a_parameter_gets_a_sentence():
    """Issue 25: ``zip() argument 2 is shorter`` came out of the checker."""
    x, y = _data()

    def adds(model, x, y, m):
        model.extra = nn.Parameter(torch.zeros(2))
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            (F.mse_loss(model(xm), ym) / m).backward()

    fb = check_microbatch_step(adds, _model(), x, y, m=4)
    assert not fb.passed and "changed the model's parameters" in fb.report(), fb.report()


def test_microbatch_step_with_int64_data_raises_one_sentence():
    x, y = _data()
    with pytest.raises(ValueError, match="floating-point tensors, not torch.int64"):
        check_microbatch_step(lambda *a: None, _model(), x.long(), y, m=4)


def test_split_forward_on_a_device_this_machine_lacks_raises_one_sentence(
    cuda_build_without_driver,
):
    """Issue 25: ``['cpu', 'cuda']`` on a machine without CUDA raised torch's own error."""
    with pytest.raises(devices.DeviceUnavailableError, match="CUDA is not available"):
        check_split_forward(lambda *a: None, ["cpu", "cuda"])


# --- issue 20 §5/§6: exercises that need thought, bug hunts that give nothing away ------------


def test_the_shipped_ddp_exercise_is_the_one_the_checker_knows():
    """check_ddp_script treats ddp_exercise.py as shipped ("not answered yet") by its hash:
    whoever edits the exercise must update DDP_EXERCISE_SHA256."""
    import hashlib

    digest = hashlib.sha256((SCRIPTS / "ddp_exercise.py").read_bytes()).hexdigest()
    assert digest == DDP_EXERCISE_SHA256


def test_ddp_exercise_as_shipped_is_not_an_attempt_and_names_no_bug():
    fb = check_ddp_script(SCRIPTS / "ddp_exercise.py", _reference_params())
    assert not fb.passed and not fb.answered and fb.attempt == 0
    assert "set_epoch" not in fb.report() and "same order" not in fb.report()


@pytest.mark.slow  # two torchrun launches
def test_ddp_checker_finds_both_bugs_of_the_exercise(tmp_path):
    """The exercise with a learner's comment added (not the shipped file any more) still has
    both bugs: the checker must name the shuffle first, then both in detail. It used to be
    shown by notebook 07's saved output, which now gives nothing away."""
    import shutil

    for name in ("common.py", "ddp_train.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    text = (SCRIPTS / "ddp_exercise.py").read_text()
    (tmp_path / "ddp_exercise.py").write_text(text + "# I looked at it\n")
    reset_attempts()
    fb = check_ddp_script(tmp_path / "ddp_exercise.py", _reference_params(), timeout=180)
    assert fb.answered and not fb.passed and fb.attempt == 1
    assert "same order every epoch" in repr(fb) and "1 more problem" in repr(fb)
    assert "set_epoch" in fb.report() and "world size" in fb.report()
    reset_attempts()


def _acc_right(model, x, y, k):
    pieces = list(zip(x.chunk(k), y.chunk(k), strict=True))
    with model.no_sync():
        for xm, ym in pieces[:-1]:
            (F.mse_loss(model(xm), ym) / k).backward()
    xm, ym = pieces[-1]
    (F.mse_loss(model(xm), ym) / k).backward()


def _acc_plain(model, x, y, k):  # right gradients, one all-reduce per micro-batch
    for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
        (F.mse_loss(model(xm), ym) / k).backward()


def _acc_never_syncs(model, x, y, k):  # every backward inside no_sync
    with model.no_sync():
        _acc_plain(model, x, y, k)


def _acc_unscaled(model, x, y, k):
    pieces = list(zip(x.chunk(k), y.chunk(k), strict=True))
    with model.no_sync():
        for xm, ym in pieces[:-1]:
            F.mse_loss(model(xm), ym).backward()
    F.mse_loss(model(pieces[-1][0]), pieces[-1][1]).backward()


def _acc_one_backward(model, x, y, k):  # the full-batch gradients, but no accumulation
    F.mse_loss(model(x), y).backward()


def _acc_steps(model, x, y, k):
    _acc_right(model, x, y, k)
    torch.optim.SGD(model.parameters(), lr=0.1).step()


def test_no_sync_step_passes_the_loop_on_a_real_ddp_model():
    import torch.distributed as dist

    assert check_no_sync_step(_acc_right, k=4).passed
    assert check_no_sync_step(_acc_right, k=1).passed
    assert not dist.is_initialized(), "the checker must destroy the group it created"


@pytest.mark.parametrize(
    ("accumulate", "problem"),
    [
        (_acc_plain, "all-reduces ran for a model whose gradients fill"),
        (_acc_never_syncs, "no all-reduce ran"),
        (_acc_unscaled, "4x too large"),
        (_acc_one_backward, "run one per micro-batch"),
        (_acc_steps, "the weights changed"),
    ],
)
def test_no_sync_step_fails_wrong_loops(accumulate, problem):
    fb = check_no_sync_step(accumulate, k=4)
    assert not fb.passed and fb.answered and problem in fb.report(), fb.report()


def test_no_sync_step_placeholder_is_not_an_attempt():
    def accumulate(model, x, y, k):
        return None  # TODO

    fb = check_no_sync_step(accumulate, k=4)
    assert not fb.answered and fb.attempt == 0 and "no_sync" not in fb.report().split("Hint")[0]


def test_no_sync_step_bad_k_raises_one_sentence():
    with pytest.raises(ValueError, match="k must be"):
        check_no_sync_step(_acc_right, k=0)


def _uneven():
    g = torch.Generator().manual_seed(5)
    return torch.randn(10, 16, generator=g), torch.randn(10, 4, generator=g)


def _from_source(source: str, name: str, tmp_path):
    """A function defined in a file, as a notebook cell defines it (its source readable)."""

    path = tmp_path / f"{name}_cell.py"
    path.write_text("from torch.nn import functional as F\n" + source)
    return getattr(load_file(path), name)


def _shipped_def(name: str, tmp_path):
    """Notebook 08's exercise cell's ``def name``, as the notebook ships it."""
    import ast

    (notebook,) = (SCRIPTS.parent).glob("08_*.ipynb")
    for source in shipped.exercise_cells(notebook):
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return _from_source(ast.get_source_segment(source, node) + "\n", name, tmp_path)
    raise AssertionError(f"notebook 08 ships no exercise cell defining {name}")


def _mb_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4))


def test_uneven_microbatches_need_weights_by_size():
    x, y = _uneven()

    def weighted(model, x, y, m):
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            (F.mse_loss(model(xm), ym) * len(xm) / len(x)).backward()

    def divided_by_m(model, x, y, m):  # section 3's loop, retyped: an attempt, and wrong here
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            loss = F.mse_loss(model(xm), ym)
            (loss / m).backward()

    assert check_microbatch_step(weighted, _mb_model(), x, y, m=4).passed
    fb = check_microbatch_step(divided_by_m, _mb_model(), x, y, m=4)
    assert not fb.passed and fb.answered and "[3, 3, 3, 1]" in fb.report(), fb.report()


def test_microbatch_start_is_not_an_attempt_only_where_it_is_wrong(tmp_path):
    start = _shipped_def("microbatch_step", tmp_path)
    x, y = _uneven()
    fb = check_microbatch_step(start, _mb_model(), x, y, m=4)
    assert not fb.passed and not fb.answered and fb.attempt == 0
    assert "Fix:" not in fb.report() and "len(xm)" not in fb.report()
    ex, ey = _data()  # equal micro-batches: the same code is a right answer
    assert check_microbatch_step(start, _model(), ex, ey, m=4).passed


def test_split_forward_as_shipped_is_not_an_attempt(tmp_path):
    start = _shipped_def("split_forward", tmp_path)
    fb = check_split_forward(start, [torch.device("cpu")] * 2)
    assert not fb.passed and not fb.answered and fb.attempt == 0
    assert "detach" not in fb.report() and "no gradient" not in fb.report()
    assert not check_split_forward(_split_forward("detach"), [torch.device("cpu")] * 2).passed


def test_shipped_code_ignores_comments_and_sees_code(tmp_path):
    def same(model, x, y, m):  # only comments differ
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            (F.mse_loss(model(xm), ym) / m).backward()  # TODO

    def other(model, x, y, m):
        for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True):
            (F.mse_loss(model(xm), ym) / len(x)).backward()

    start = _shipped_def("microbatch_step", tmp_path)
    assert shipped.is_shipped(start)
    assert shipped.is_shipped(same)
    assert not shipped.is_shipped(other)
    assert not shipped.is_shipped("not a function")


def test_notebook_03_shows_sbatch_lines_that_are_in_the_script():
    """Notebook 07 quotes the essentials of slurm_ddp.sbatch in a markdown block: each quoted
    line must still be a line of the script."""
    nb = json.loads((SCRIPTS.parent / "07_data_parallelism.ipynb").read_text())
    text = next(
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "markdown"
        and "essentials of `scripts/slurm_ddp.sbatch`" in "".join(c["source"])
    )
    quoted = text.split("```bash\n")[-1].split("```")[0].splitlines()
    script = (SCRIPTS / "slurm_ddp.sbatch").read_text().splitlines()
    assert len(quoted) >= 10
    missing = [line for line in quoted if line not in script]
    assert not missing, missing


@pytest.mark.slow
def test_no_sync_checker_never_hangs_when_its_ddp_models_are_freed(tmp_path):
    """Freeing a DDP model whose comm-hook callback still waits for the GIL used to destroy the
    gloo group from inside the reducer's destructor, which joined gloo's thread with the GIL held:
    a hang that `make test` met under load (pytest-timeout cannot interrupt it). Before the fix,
    a minute of this loop beside two busy cores hung (seen twice); now the checker drains the
    group first.
    """
    import subprocess

    script = tmp_path / "loop.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import test_exercises_parallel as t\n"
        "from tutorial_utils.exercises import reset_attempts\n"
        "from tutorial_utils.exercises.parallel import check_no_sync_step\n"
        "fns = [t._acc_right, t._acc_plain, t._acc_never_syncs, t._acc_unscaled,\n"
        "       t._acc_one_backward, t._acc_steps]\n"
        "import time\n"
        "end = time.monotonic() + 60\n"
        "while time.monotonic() < end:\n"
        "    for f in fns:\n"
        "        reset_attempts()\n"
        "        check_no_sync_step(f, k=4)\n"
        "print('done')\n"
    )
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=150
        )
    except subprocess.TimeoutExpired:
        pytest.fail("check_no_sync_step hung: a DDP model freed with its group's work pending")
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert run.returncode == 0 and "done" in run.stdout, run.stderr[-2000:]


# ------------------------------------------------ notebook 08: the pipeline model and its counts
# Notebook 08 shows its simulator as an illustration and cites the replay; the claims are here.


def _pipeline_timing():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import pipeline_timing
    finally:
        sys.path.remove(str(SCRIPTS))
    return pipeline_timing


def _bubble(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_gpipe_simulator_with_equal_stages_gives_the_bubble_formula(p, m):
    pt = _pipeline_timing()
    events = pt.gpipe_schedule([1.0] * p, [2.0] * p, m)  # backward twice forward
    idle = [pt.idle_fraction(events, s) for s in range(p)]
    # a few dozen float64 additions of small whole numbers: exact, or within 1e-12
    assert all(abs(x - _bubble(p, m)) < 1e-12 for x in idle), (p, m, idle)


def _orders_1f1b(p: int, m: int) -> list[list[str]]:
    """Stage s: p - s warm-up forwards, then one backward and one forward in turn, as
    torch.distributed.pipelining's Schedule1F1B recorded them in notebook 08 (p = 2, m = 8)."""
    orders = []
    for s in range(p):
        warm = min(p - s, m)
        order = [f"F{i}" for i in range(warm)]
        for i in range(m):
            order.append(f"B{i}")
            if warm + i < m:
                order.append(f"F{warm + i}")
        orders.append(order)
    return orders


def test_the_1f1b_orders_here_are_the_ones_notebook_08_recorded():
    assert _orders_1f1b(2, 8) == [
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7".split(),
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7".split(),
    ]


@pytest.mark.parametrize("backward", [1.0, 2.0])
@pytest.mark.parametrize("p, m", [(2, 8), (2, 4), (4, 8)])
def test_replay_gives_the_formula_for_gpipe_and_1f1b(p, m, backward):
    pt = _pipeline_timing()
    gpipe = [[f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)]] * p
    for orders in (gpipe, _orders_1f1b(p, m)):
        idle = pt.replay(orders, 1.0, backward)
        assert all(abs(x - _bubble(p, m)) < 1e-12 for x in idle), (orders, idle)


def test_replay_sees_an_order_that_does_not_pipeline():
    """Stage 0 waiting for each backward before the next forward: no overlap, a bigger bubble."""
    pt = _pipeline_timing()
    m = 8
    serial = [x for i in range(m) for x in (f"F{i}", f"B{i}")]
    idle = pt.replay([serial, serial], 1.0, 2.0)
    assert min(idle) > 0.4 > _bubble(2, m)


def test_measured_steps_put_both_ranks_on_one_clock():
    pt = _pipeline_timing()
    run = {"steps": [[("F", 0, 10.0, 10.5, 0.5)], [("F", 0, 20.0, 20.4, 0.3)]]}
    later = {"steps": [[("F", 0, 10.6, 11.0, 0.4)], [("F", 0, 20.5, 21.0, 0.5)]]}
    reports = {0: {"runs": {"1": run}}, 1: {"runs": {"1": later}}}
    first, second = pt.measured_steps(reports, 1)
    assert [e[:3] + (e[5],) for e in first] == [(0, "F", 0, 0.5), (1, "F", 0, 0.4)]
    assert [t for e in first for t in e[3:5]] == pytest.approx([0.0, 0.5, 0.6, 1.0])
    assert pt.span(second) == pytest.approx(1.0)
    assert pt.overlap_seconds(first) == 0.0
    assert pt.idle_fraction(first, 1) == pytest.approx(0.6)


def _by_hand_reports(m_steps: dict[int, list[tuple]]) -> dict:
    """pipeline_by_hand.py's reports on a CPU: per m, one step of (kind, i, start, end, cpu) per
    rank, the same on both ranks shifted by ``lag`` seconds."""
    runs = {r: {} for r in range(2)}
    for m, (events, lag) in m_steps.items():
        for r in range(2):
            shifted = [(k, i, a + r * lag, b + r * lag, c) for k, i, a, b, c in events]
            runs[r][str(m)] = {"steps": [shifted]}
    return {r: {"runs": runs[r], "device": "cpu"} for r in range(2)}


def test_by_hand_summary_says_the_stages_overlapped_when_each_had_a_core():
    pt = _pipeline_timing()
    one = ([("F", 0, 0.0, 1.0, 1.0)], 1.0)  # m=1: rank 1 starts when rank 0 ends
    two = ([("F", 0, 0.0, 0.5, 0.5), ("F", 1, 0.5, 1.0, 0.5)], 0.5)  # m=2: they overlap
    text = pt.by_hand_summary(_by_hand_reports({1: one, 2: two}))
    assert "m=2, took 0.75x the time of m=1" in text, text
    assert "each rank had its core (100%" in text and "so the stages overlapped" in text, text


def test_by_hand_summary_blames_a_shared_core():
    pt = _pipeline_timing()
    one = ([("F", 0, 0.0, 1.0, 1.0)], 1.0)
    two = ([("F", 0, 0.0, 1.0, 0.5), ("F", 1, 1.0, 2.0, 0.5)], 1.0)  # a core half the time
    text = pt.by_hand_summary(_by_hand_reports({1: one, 2: two}))
    assert "had a core for only 50%" in text and "took turns" in text, text


def test_by_hand_summary_explains_a_larger_m_that_was_slower():
    """08 c20: m=4 overlapped, m=8 paid more CPU time and longer gaps between computations; the
    summary says so for m=8 too, from the numbers, and best_pipeline picks m=4."""
    pt = _pipeline_timing()
    one = ([("F", 0, 0.0, 1.0, 1.0)], 1.0)  # 2 s: rank 1 starts when rank 0 ends
    four = ([("F", i, 0.25 * i, 0.25 * i + 0.25, 0.25) for i in range(4)], 0.25)  # 1.25 s
    eight = (  # 8 slices of 0.2 s CPU (1.6x one batch), each followed by a 0.1 s gap: 2.6 s
        [("F", i, 0.3 * i, 0.3 * i + 0.2, 0.2) for i in range(8)],
        0.3,
    )
    reports = _by_hand_reports({1: one, 4: four, 8: eight})
    text = pt.by_hand_summary(reports)
    assert pt.best_pipeline(reports) == 4
    assert "the best pipeline, m=4, took 0.62x" in text, text
    assert "m=8 took 1.30x (formula 0.56x)" in text, text
    assert "8 micro-batches cost 1.60x the CPU time of one batch" in text, text
    assert "From m=4 to m=8 the formula saves" in text and "took 1350 ms longer" in text, text


def test_held_activations_count_one_microbatch_per_forward_until_backward():
    """What notebook 08's check rests on: the saved-tensor hook books each micro-batch's
    activations once, holds them until its backward, and frees them all after."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import pipeline_gpipe as pg
    finally:
        sys.path.remove(str(SCRIPTS))
    part = pg.stage_layers(pg.build_model(), 0, 2)
    x, y = pg.batch()
    m = 4
    one = pg.one_microbatch_bytes(part, 0, 2, x, y, m)
    assert one == 5 * (len(x) // m) * pg.WIDTH * 4  # the input and 4 Tanh outputs, fp32
    held = pg.HeldActivations(part.parameters())
    with held.hooks():
        outs = [part(xm) for xm in x.chunk(m)]
    assert held.live == held.peak == m * one
    for out in outs:
        out.sum().backward()
    del outs
    assert held.live == 0


# --- notebook 07 after the v2 move (issue 32): one FSDP2 pointer, and its timing script ---


def _nb07_sources() -> list[str]:
    nb = json.loads((SCRIPTS.parent / "07_data_parallelism.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"]]


def test_notebook_07_mentions_fsdp2_once_as_a_pointer_to_09():
    """FSDP2 is taught in 09 only: 07 may name it in one line, and that line points to 09."""
    lines = [ln for src in _nb07_sources() for ln in src.splitlines() if "FSDP2" in ln]
    assert len(lines) == 1 and "notebook 09" in lines[0], lines


def test_notebook_07_cites_no_old_numbers():
    """The v2 renumbering moved 08's DDP internals here: no "notebook 08, section 8" is left, the
    one "notebook 03" points to its calculator (torchtitan's 8B figures live there, issue 38), and
    the section it points to for buffers exists."""
    text = "\n".join(_nb07_sources())
    assert "notebook 08, section" not in text
    assert text.count("notebook 03") == text.count("notebook 03, section 9") == 1
    nb03 = json.loads((SCRIPTS.parent / "03_where_memory_goes.ipynb").read_text())
    assert any("".join(c["source"]).startswith("## 9. Will it fit?") for c in nb03["cells"])
    assert "## 4. DDP, seen from the inside" in text and "are in section 4" in text


@pytest.mark.slow  # a torchrun launch of two ranks
def test_ddp_step_time_reports_one_bucket_and_both_timings():
    from tutorial_utils.distributed import launch

    result = launch(SCRIPTS / "ddp_step_time.py", 2, [], 300, echo=None)
    assert result.returncode == 0, result
    for rep in result.reports.values():
        assert rep["world"] == 2 and rep["params"] == 4 * (1024 * 1024 + 1024)
        assert rep["buckets"] == 1, "the gradients must fit one bucket: nothing overlaps backward"
        assert rep["bucket_bytes"] == [4 * rep["params"]], "the hook saw every fp32 gradient once"
        assert rep["message_bytes"] == 32 * 2**20
        assert all(rep[k] > 0 for k in ("allreduce_s", "sync", "no_sync"))


def test_ddp_trace_reads_only_the_training_threads_backward_and_launches(tmp_path):
    """07 §4 counts bucket launches on the thread that ran DDP's forward: an all-reduce launched
    from another thread, or an event that is not a complete ("X") one, must not count."""
    ddp_trace = load_file(SCRIPTS / "ddp_trace.py")
    grad = "autograd::engine::evaluate_function: AddmmBackward0"
    events = [
        {"ph": "X", "name": "DistributedDataParallel.forward", "tid": 1, "ts": 10, "dur": 5},
        {"ph": "X", "name": grad, "tid": 1, "ts": 20, "dur": 1},
        {"ph": "X", "name": "c10d::allreduce_", "tid": 1, "ts": 22, "dur": 1},
        {"ph": "X", "name": "c10d::allreduce_", "tid": 2, "ts": 23, "dur": 1},  # another thread
        {"ph": "B", "name": "c10d::allreduce_", "tid": 1, "ts": 24},  # not a complete event
        {"ph": "X", "name": "gloo:all_reduce", "tid": 3, "ts": 25, "dur": 4},
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = ddp_trace.read_trace(path)
    assert trace["start"] == 10
    assert [e["ts"] for e in trace["launches"]] == [22]
    assert [e["ts"] for e in trace["layer_grads"]] == [20] == [e["ts"] for e in trace["backward"]]
    assert [e["tid"] for e in trace["transfers"]] == [3]
