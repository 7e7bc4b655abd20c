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


def _good(model, optimizer, scaler, inputs, targets, device_type, dtype):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = nn.functional.cross_entropy(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


def test_amp_step_reference_passes() -> None:
    ex.check_amp_step(_good).assert_passed()


def test_amp_step_without_autocast_or_scaler_fails() -> None:
    def plain(model, optimizer, scaler, inputs, targets, device_type, dtype):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    fb = ex.check_amp_step(plain)
    assert not fb.passed
    text = str(fb)
    assert "autocast" in text and "scaler.scale" in text and "scaler.step" in text


def test_amp_step_with_half_model_fails() -> None:
    def halved(model, optimizer, scaler, inputs, targets, device_type, dtype):
        model.half()
        return _good(model, optimizer, scaler, inputs.half(), targets, device_type, dtype)

    fb = ex.check_amp_step(halved)
    assert not fb.passed
    assert any("fp32" in p or "raised" in p for p in fb.problems)


def test_amp_step_without_update_fails() -> None:
    def no_update(model, optimizer, scaler, inputs, targets, device_type, dtype):
        optimizer.zero_grad()
        with torch.autocast(device_type, dtype=dtype):
            loss = nn.functional.cross_entropy(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        return loss

    fb = ex.check_amp_step(no_update)
    assert not fb.passed and any("update" in p for p in fb.problems)


def test_amp_step_wrong_loss_fails() -> None:
    def wrong_loss(model, optimizer, scaler, inputs, targets, device_type, dtype):
        optimizer.zero_grad()
        with torch.autocast(device_type, dtype=dtype):
            loss = model(inputs).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    fb = ex.check_amp_step(wrong_loss)
    assert not fb.passed and any("this batch's loss is" in p for p in fb.problems)

    def wrong_loss_returns_right_one(model, optimizer, scaler, inputs, targets, device_type, dtype):
        wrong_loss(model, optimizer, scaler, inputs, targets, device_type, dtype)
        with torch.no_grad(), torch.autocast(device_type, dtype=dtype):
            return nn.functional.cross_entropy(model(inputs), targets)

    fb = ex.check_amp_step(wrong_loss_returns_right_one)
    assert not fb.passed and any("reference" in p or "batch's loss" in p for p in fb.problems)


def _clip_step(*, unscale: bool, clip: bool, use_scaler: bool = True):
    def step(model, optimizer, scaler, inputs, targets, device_type, dtype, max_norm):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=dtype):
            loss = nn.functional.cross_entropy(model(inputs), targets)
        if not use_scaler:
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            return loss
        scaler.scale(loss).backward()
        if unscale:
            scaler.unscale_(optimizer)
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        return loss

    return step


def test_clipped_step_right_answer_passes() -> None:
    fb = ex.check_clipped_step(_clip_step(unscale=True, clip=True))
    assert fb.passed, fb.problems


def test_clipping_before_unscale_is_caught_and_explained() -> None:
    reset_attempts()
    first = ex.check_clipped_step(_clip_step(unscale=False, clip=True))
    assert not first.passed and not first.detailed
    assert "unscale_" not in first.briefs[0], "the first answer is a hint, not the fix"
    assert "1024x smaller" in first.problems[0] and "before scaler.unscale_" in first.problems[0]
    second = ex.check_clipped_step(_clip_step(unscale=False, clip=True))
    assert second.detailed and "unscale_" in second.fixes[0]
    reset_attempts()


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        (_clip_step(unscale=True, clip=False), "above max_norm"),
        (_clip_step(unscale=False, clip=False, use_scaler=False), "use the scaler"),
        (lambda *args: None, "still a placeholder"),  # a step that does nothing yet
    ],
)
def test_clipped_step_wrong_answers_fail(step, problem: str) -> None:
    fb = ex.check_clipped_step(step)
    assert not fb.passed and problem in " ".join(fb.problems)


def test_amp_step_that_zeroes_its_targets_fails() -> None:
    """Issue 25: ``targets.zero_()`` passed: the reference ran after the step, on the same
    (zeroed) targets. The reference now runs first, and the step gets copies."""

    def zeroes_targets(model, optimizer, scaler, inputs, targets, device_type, dtype):
        targets.zero_()
        return _good(model, optimizer, scaler, inputs, targets, device_type, dtype)

    fb = ex.check_amp_step(zeroes_targets)
    assert not fb.passed and "targets changed its values" in str(fb), str(fb)


def test_clipped_step_with_a_wrong_loss_fails() -> None:
    """Issue 25: the clipping check read only the gradients; a wrong returned loss passed."""
    right = _clip_step(unscale=True, clip=True)

    def wrong_loss(*args):
        right(*args)
        return torch.tensor(0.5)

    fb = ex.check_clipped_step(wrong_loss)
    assert not fb.passed and "this batch's loss is" in str(fb), str(fb)


def test_fp16_survival_with_values_none_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match="values must be a non-empty list of finite numbers"):
        ex.check_fp16_survival({1.0: "ok"}, values=None)
