"""The notebook-06 checkers: right answers pass, each typical mistake fails with a useful message."""

from __future__ import annotations

import torch
from torch import nn

from tutorial_utils.exercises import precision as ex


def test_fp16_fate_matches_ieee() -> None:
    assert ex.fp16_fate(70000.0) == "inf"
    assert ex.fp16_fate(65504.0) == "ok"
    assert ex.fp16_fate(1e-9) == "0"
    assert ex.fp16_fate(1e-7) == "ok"  # a subnormal, but not zero
    assert ex.fp16_fate(0.0) == "ok"


def test_fp16_survival_right_and_wrong() -> None:
    assert ex.check_fp16_survival({70000.0: "inf", 1e-9: "0", 1.0: "ok"}).passed
    fb = ex.check_fp16_survival({70000.0: "ok", 1e-9: "0"})
    assert not fb.passed
    assert any("65504" in p for p in fb.problems)
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
    assert not fb.passed and any("reference" in p for p in fb.problems)
