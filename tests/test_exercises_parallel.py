"""Checkers of notebooks 03 and 04: they pass the reference answers and catch the usual mistakes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tutorial_utils.exercises.parallel import (
    check_bubble,
    check_ddp_script,
    check_microbatch_step,
    check_sampler_padding,
)

SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"


def test_bubble_accepts_the_formula_and_explains_mistakes():
    assert check_bubble(lambda p, m: (p - 1) / (m + p - 1)).passed
    wrong = check_bubble(lambda p, m: (p - 1) / m)
    assert not wrong.passed and "expected" in str(wrong) and wrong.hints
    none = check_bubble(lambda p, m: None)
    assert not none.passed and "returned None" in str(none)
    boom = check_bubble(lambda p, m: 1 / 0)
    assert not boom.passed and "ZeroDivisionError" in str(boom)


def test_sampler_padding_counts_the_repeated_samples():
    assert check_sampler_padding(22, 2).passed  # ceil(64 / 3) = 22 per rank, 66 - 64 repeated
    assert check_sampler_padding(16, 0, n=64, world=4).passed
    wrong = check_sampler_padding(21, 0)
    assert not wrong.passed and "22" in str(wrong) and wrong.hints
    assert "set per_rank" in str(check_sampler_padding(None, None))


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
    assert not fb.passed and "4x too large" in str(fb)
    fb = check_microbatch_step(forgets_backward, model, x, y, m=4)
    assert not fb.passed and "no gradient" in str(fb)
    assert all(p.grad is None for p in model.parameters()), "the checker must not touch the model"


def _reference_params() -> torch.Tensor:
    """Single-process training on the two ranks' samples, as notebook 03 computes it."""
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
    assert not crashed.passed and "did not finish" in str(crashed) and "rank 1" in str(crashed)


def test_notebook_03_runs_the_ddp_checker_on_the_exercise_and_its_solution():
    """The checker's verdicts on ddp_exercise.py (both bugs found) and on its solution (passed)
    are cells of notebook 03, which strict nbval runs and compares in ``make test``: two torchrun
    launches a unit test would only repeat. This keeps those cells from going away unnoticed."""
    nb = json.loads((SCRIPTS.parent / "03_data_parallelism.ipynb").read_text())

    def shown(output: dict) -> str:  # printed text or a value's repr
        return "".join(output.get("text") or output.get("data", {}).get("text/plain", ""))

    cells = [
        ("".join(c["source"]), "".join(shown(o) for o in c["outputs"]))
        for c in nb["cells"]
        if c["cell_type"] == "code"
    ]
    buggy = [out for src, out in cells if 'check_ddp_script("scripts/ddp_exercise.py"' in src]
    assert buggy, "notebook 03 no longer runs check_ddp_script on scripts/ddp_exercise.py"
    assert "set_epoch" in buggy[0] and "differ from single-process training" in buggy[0]
    solved = [
        src
        for src, _ in cells
        if 'check_ddp_script("scripts/ddp_exercise_solution.py"' in src and "assert_passed()" in src
    ]
    assert solved, "notebook 03 no longer asserts that the DDP solution passes its checker"
