"""The notebook-06 checkers: right answers pass, each typical mistake fails with a useful reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tutorial_utils.exercises import precision as ex


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny steps run faster on one thread, above all on a busy machine (no thread contention)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
