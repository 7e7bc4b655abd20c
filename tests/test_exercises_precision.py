"""The notebook-06 checkers: right answers pass, each typical mistake fails with a useful reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tutorial_utils.exercises import precision as ex
from tutorial_utils.exercises import reset_attempts


def test_fp16_fate_matches_ieee() -> None:
    assert ex.fp16_fate(70000.0) == "inf"
    assert ex.fp16_fate(65504.0) == "ok"
    assert ex.fp16_fate(1e-9) == "0"
    assert ex.fp16_fate(1e-7) == "ok"  # a subnormal, but not zero
    assert ex.fp16_fate(0.0) == "ok"


def test_fp16_survival_right_and_wrong() -> None:
    right = {70000.0: "inf", 60000.0: "ok", 1e-4: "ok", 1e-9: "0"}
    assert ex.check_fp16_survival(right).passed
    assert ex.check_fp16_survival({70000.0: "inf", 1e-9: " 0", 1.0: "OK"}, [70000.0, 1e-9]).passed
    fb = ex.check_fp16_survival(right | {70000.0: "ok"})
    assert not fb.passed
    assert any("65504" in p for p in fb.problems)
    assert not ex.check_fp16_survival(right | {1.0: "inf"}).passed  # extra values are checked too
    missing = ex.check_fp16_survival({70000.0: "inf"})
    assert not missing.passed and "60000.0, 0.0001, 1e-09 is missing" in str(missing)
    assert not ex.check_fp16_survival({1.0: "TODO"}).passed
    assert not ex.check_fp16_survival({}).passed


def _acc_step(*, average: bool = True, unscale: bool = True, clip: bool = True, loss_back=None):
    """One step over micro-batches; each flag off is one typical mistake."""

    def step(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for inputs, targets in micro_batches:
            with torch.autocast(device_type, dtype=dtype):
                loss = nn.functional.cross_entropy(model(inputs), targets)
            if average:
                loss = loss / len(micro_batches)
            scaler.scale(loss).backward()
            total += loss.item() if average else loss.item() / len(micro_batches)
        if unscale:
            scaler.unscale_(optimizer)
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        return total if loss_back is None else loss_back

    return step


def _step_per_micro_batch(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
    for inputs, targets in micro_batches:  # an optimizer step per micro-batch: no accumulation
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=dtype):
            loss = nn.functional.cross_entropy(model(inputs), targets) / len(micro_batches)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
    return loss


def _last_micro_batch_only(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
    total = 0.0
    for inputs, targets in micro_batches:
        optimizer.zero_grad(set_to_none=True)  # inside the loop: drops the earlier micro-batches
        with torch.autocast(device_type, dtype=dtype):
            loss = nn.functional.cross_entropy(model(inputs), targets) / len(micro_batches)
        scaler.scale(loss).backward()
        total += loss.item()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total


def test_accumulated_clipped_step_right_answer_passes() -> None:
    fb = ex.check_accumulated_clipped_step(_acc_step())
    assert fb.passed, fb.problems


def test_the_shipped_bug_is_caught_and_the_first_answer_is_a_hint() -> None:
    reset_attempts()
    shipped = _acc_step(average=False, unscale=False)  # what the notebook's exercise cell holds
    first = ex.check_accumulated_clipped_step(shipped)
    assert not first.passed and not first.detailed
    shown = repr(first)  # what the notebook saves: the brief and the hint
    assert "unscale_" not in shown and "len(micro_batches)" not in shown, shown
    assert "before scaler.unscale_" in first.problems[0]
    second = ex.check_accumulated_clipped_step(shipped)
    assert second.detailed and "len(micro_batches)" in second.fixes[0]
    reset_attempts()


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        (_acc_step(unscale=False), "before scaler.unscale_"),  # averaged, clipped too early
        (_acc_step(average=False), "added up, not averaged"),  # passes the clipping run
        (_acc_step(clip=False), "clip them with nn.utils.clip_grad_norm_"),
        (_step_per_micro_batch, "stepped 4 times"),
        (_last_micro_batch_only, "points elsewhere than the whole batch's"),
        (_acc_step(loss_back=torch.tensor(0.5)), "this batch's loss is"),
        (lambda *args: None, "still a placeholder"),
    ],
)
def test_accumulated_clipped_step_wrong_answers_fail(step, problem: str) -> None:
    fb = ex.check_accumulated_clipped_step(step)
    assert not fb.passed and problem in " ".join(fb.problems), fb.problems


def test_a_step_that_changes_its_micro_batches_fails() -> None:
    right = _acc_step()

    def zeroes_targets(model, optimizer, scaler, micro_batches, *rest):
        loss = right(model, optimizer, scaler, micro_batches, *rest)
        micro_batches[0][1].zero_()
        return loss

    fb = ex.check_accumulated_clipped_step(zeroes_targets)
    assert not fb.passed and "changed" in fb.report(), fb.report()


def test_fp16_survival_with_values_none_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match="values must be a non-empty list of finite numbers"):
        ex.check_fp16_survival({1.0: "ok"}, values=None)
