"""The course's tolerances hold on every CPU math path and still catch a wrong sharding (issue 30).

The bounds live in ``notebooks/scripts/common.py`` (``sum_bound``, ``relative_gap``) and beside
each check. Here: the values the CPU paths produced (stored: this CPU cannot take every path,
``make cpu-paths`` measures the ones it can) fail the old bounds and pass the new ones by 10x,
and the mistakes a sharded program makes (no gradient average, another rank's shard) fail them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import load_file
from torch import nn

SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"
sys.path.insert(0, str(SCRIPTS))  # the scripts import common by name, as torchrun runs them
common = load_file(SCRIPTS / "common.py", "common")

# fsdp_shard.py, weights after one Adam step against one process: max |difference| on an Intel
# Xeon (issue 30's table; this machine measured the same 1.18e-5 with nothing set, 1.03e-5 with
# ATEN_CPU_CAPABILITY=default and 1.2e-6 with MKL_CBWR=COMPATIBLE, on 2026-12-02).
FSDP_ADAM_WEIGHT_GAPS = {"MKL AVX-512": 1.18e-5, "ATen default": 1.03e-5, "MKL AVX2": 7.5e-6}
OLD_FSDP_BOUND = 1e-5  # what notebook 07 asserted before: chosen from what one machine printed


def test_a_sum_bound_is_two_orders_of_n_roundings():
    assert common.sum_bound(1) == 2 * 2.0**-24
    assert common.sum_bound(4 * 512 + 16) == pytest.approx(2.46e-4, rel=1e-3)
    assert common.sum_bound(3, rounding=common.BF16_ROUNDING) == 6 * 2.0**-8


def test_relative_gap_is_in_units_of_the_largest_value_and_refuses_lists_that_do_not_match():
    weight, bias = torch.tensor([100.0, -50.0]), torch.tensor([1e-3])  # a bias that cancelled
    # its own value is 100 % off, but that is 1e-5 of the largest: rounding, not a mistake
    gap = common.relative_gap([weight + torch.tensor([1.0, 0]), bias * 0], [weight, bias])
    assert gap == pytest.approx(0.01, rel=1e-6)
    assert common.relative_gap([bias * 2], [bias]) == pytest.approx(1.0)
    assert common.relative_gap([torch.zeros(2)], [torch.zeros(2)]) == 0.0
    with pytest.raises(ValueError, match="2 tensors compared with 1"):
        common.relative_gap([weight, bias], [weight])


def test_within_books_the_pair_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("TUTORIAL_TOLERANCE_LOG", raising=False)
    assert common.within("x", 1.0, 2.0) and not common.within("x", 2.0, 1.0)
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("TUTORIAL_TOLERANCE_LOG", str(log))
    common.within("x", 0.5, 1.0)
    assert '"name": "x"' in log.read_text() and '"gap": 0.5' in log.read_text()


def test_the_old_fsdp_bound_failed_on_cpu_paths_where_the_new_ones_hold():
    fsdp = load_file(SCRIPTS / "fsdp_shard.py", "fsdp_shard")
    weight_tol = 2 * fsdp.LR  # fsdp_shard.main: Adam's first step moves a weight less than lr
    for path, gap in FSDP_ADAM_WEIGHT_GAPS.items():
        if path != "MKL AVX2":
            assert not gap < OLD_FSDP_BOUND, path  # what a learner's Xeon saw fail
        assert 10 * gap < weight_tol, path


def _mlp_and_batch(width: int = 512, depth: int = 4, batch: int = 16):
    fsdp = load_file(SCRIPTS / "fsdp_shard.py", "fsdp_shard")
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    return fsdp, fsdp.build_model(width=width, depth=depth), x, y


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_wrong_sharding_fails_the_gradient_check_a_right_one_passes():
    fsdp, model, x, y = _mlp_and_batch()
    tol = common.sum_bound(fsdp.DEPTH * fsdp.WIDTH + len(x))  # fsdp_shard.main's bound
    full = _grads(model, x, y)
    halves = [_grads(model, x[:8], y[:8]), _grads(model, x[8:], y[8:])]
    averaged = [(a + b) / 2 for a, b in zip(*halves, strict=True)]  # what FSDP's reduce does
    summed = [a + b for a, b in zip(*halves, strict=True)]  # a rank that skips the average
    swapped = [torch.cat([g[len(g) // 2 :], g[: len(g) // 2]]) for g in averaged]  # wrong shard
    right = common.relative_gap(averaged, full)
    assert right * 10 < tol, (right, tol)
    assert common.relative_gap(summed, full) > 100 * tol
    assert common.relative_gap(swapped, full) > 100 * tol


def test_adam_turns_a_rounding_sized_gradient_difference_into_a_visible_weight_difference():
    lr, eps = 1e-3, 1e-8  # fsdp_shard.py's lr, Adam's default eps
    g = torch.tensor([1e-8, 1e-3])  # one gradient near eps, one far above it
    nudged = g + torch.tensor([1e-9, 1e-9])  # a difference one reordered sum can make

    def one_step(grad: torch.Tensor) -> torch.Tensor:
        w = torch.zeros(2, requires_grad=True)
        opt = torch.optim.Adam([w], lr=lr, eps=eps)
        w.grad = grad.clone()
        opt.step()
        return w.detach()

    gap = (one_step(g) - one_step(nudged)).abs()
    assert gap[0] > OLD_FSDP_BOUND, gap  # near eps: 2.5 % of lr, over the old bound
    assert gap[1] < 1e-9, gap  # far above eps: nothing to see
    assert gap.max() < 2 * lr  # the new bound: Adam's step is less than lr on either side


def test_the_weight_check_after_adam_catches_a_wrong_weight_shard_not_a_wrong_gradient():
    # Adam's step is below lr whatever the gradient: after it, two runs' weights are within
    # 2 lr even when one had a wrong gradient. The gradient check above catches that; the
    # weight check catches a rank that holds another rank's rows of the weights.
    fsdp, model, x, y = _mlp_and_batch()
    weight = next(model.parameters()).detach()
    rows = len(weight) // 2
    swapped = torch.cat([weight[rows:], weight[:rows]])
    assert (swapped - weight).abs().max().item() > 10 * 2 * fsdp.LR


@pytest.mark.parametrize(
    ("script", "bounds"),
    [
        ("pipeline_gpipe.py", lambda m: [m.grad_tolerance()]),
        ("tensor_parallel.py", lambda m: list(m.tolerances()) + list(m.tolerances(2))),
    ],
)
def test_every_scripted_bound_is_far_below_what_a_missing_average_costs(script, bounds):
    module = load_file(SCRIPTS / script, Path(script).stem)
    for tol in bounds(module):
        # a missing average is off by a whole gradient (2 ranks: 100 %); each bound is made of
        # fp32 roundings of the sums involved and stays below 1 % of that
        assert 2.0**-24 < tol < 1e-2, (script, tol)


def test_the_bf16_bound_is_six_roundings_per_layer_and_below_a_missing_average():
    zero = load_file(SCRIPTS / "zero_stages.py", "zero_stages")
    tol = 6 * zero.LAYERS * common.BF16_ROUNDING
    assert tol == pytest.approx(0.0703, rel=1e-3)
    assert tol < 0.5 / 5  # a missing average (relative gap 1.0 on 2 ranks) fails by far


def test_the_old_forward_peak_rule_failed_on_a_run_that_the_hook_count_settles():
    # Notebook 09 used to compare the forward peaks of ZeRO-2 and ZeRO-3 (a window in which
    # gloo's threads may or may not have freed a buffer) and accept 2 or 3 layers apart, within
    # one activation. A fresh clone on an Intel Xeon saw 1 layer (issue 30: "(263168, 263168)").
    layer, activation = 4 * (256 * 256 + 256), 16 * 256 * 4
    kept = 263168  # the stored difference: one layer
    old_rule = [n for n in (2, 3) if abs(kept - n * layer) <= activation + 64]
    assert old_rule == []  # the old check failed on a correct run
    # The new one reads the bytes held as each layer starts, a point the code fixes, and asserts
    # them exactly: tests/test_sharding_scripts.py and notebook 09 section 1.
