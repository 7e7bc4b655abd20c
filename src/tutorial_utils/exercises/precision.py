"""Checkers for notebook 06 (mixed precision and cuDNN).

``check_fp16_survival(guess)``: the learner predicts what each number becomes in fp16
(``"inf"``, ``"0"`` or ``"ok"``); the checker converts the numbers for real and says which
predictions are wrong and why.

``check_amp_step(step)``: the learner writes one mixed-precision training step,
``step(model, optimizer, scaler, inputs, targets, device_type, dtype) -> loss``. The checker
runs it on a small seeded model with fp16 autocast and a recording ``GradScaler``, and checks
that the forward ran under autocast, the weights stayed fp32, the scaler scaled the loss,
stepped the optimizer and updated itself, and that the weights after the step match a
reference step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from . import Feedback

__all__ = ["check_amp_step", "check_fp16_survival", "fp16_fate"]

_FATES = ("inf", "0", "ok")


def fp16_fate(value: float) -> str:
    """What ``value`` becomes when stored in fp16: ``"inf"``, ``"0"`` or ``"ok"``."""
    half = torch.tensor(float(value), dtype=torch.float32).half()
    if torch.isinf(half):
        return "inf"
    if half == 0 and value != 0:
        return "0"
    return "ok"


def check_fp16_survival(guess: Mapping[float, str]) -> Feedback:
    """Compare the learner's predictions ``{value: "inf" | "0" | "ok"}`` with real fp16 conversion."""
    fb = Feedback("predict what each value becomes in fp16")
    if not isinstance(guess, Mapping) or not guess:
        fb.expect(False, "pass a dict such as {70000.0: 'inf', 1e-9: '0'}")
        return fb
    for value, said in guess.items():
        if not isinstance(said, str) or said.strip().lower() not in _FATES:
            fb.expect(False, f"{value!r}: answer 'inf', '0' or 'ok' (got {said!r})")
            continue
        truth = fp16_fate(value)
        said = said.strip().lower()
        if said != truth:
            why = {
                "inf": "it is above fp16's largest finite value, 65504",
                "0": "it is below half of fp16's smallest subnormal (about 6e-8), so it rounds to zero",
                "ok": "it lies inside fp16's range (about 6e-8 to 65504)",
            }[truth]
            fb.expect(False, f"{value!r} becomes {truth!r} in fp16, not {said!r}: {why}")
    if not fb.passed:
        fb.hint("torch.finfo(torch.float16) gives max and tiny; torch.tensor(v).half() shows the answer")
    return fb


class _RecordingScaler(torch.amp.GradScaler):
    """A real GradScaler that remembers which of its methods were called."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def scale(self, outputs):  # type: ignore[override]
        self.calls.append("scale")
        return super().scale(outputs)

    def step(self, optimizer, *args, **kwargs):  # type: ignore[override]
        self.calls.append("step")
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):  # type: ignore[override]
        self.calls.append("update")
        return super().update(new_scale)


def _setup(device: torch.device, scaler_cls: type) -> tuple[nn.Module, torch.optim.Optimizer, Any, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randn(16, 32, generator=gen).to(device)
    targets = torch.randint(0, 4, (16,), generator=gen).to(device)
    scaler = scaler_cls(device.type, init_scale=2.0**10)
    return model, optimizer, scaler, inputs, targets


def _reference_step(model, optimizer, scaler, inputs, targets, device_type, dtype):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = nn.functional.cross_entropy(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss


def check_amp_step(step: Callable[..., Any], device: str | torch.device = "cpu") -> Feedback:
    """Run the learner's ``step`` once with fp16 autocast and check it against the reference."""
    fb = Feedback("a mixed-precision training step with autocast and GradScaler")
    device = torch.device(device)
    dtype = torch.float16
    model, optimizer, scaler, inputs, targets = _setup(device, _RecordingScaler)
    ref_model = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.5)
    ref_scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)

    seen_autocast: list[bool] = []
    hook = model.register_forward_hook(
        lambda mod, args, out: seen_autocast.append(torch.is_autocast_enabled(device.type))
    )
    try:
        loss = step(model, optimizer, scaler, inputs, targets, device.type, dtype)
    except Exception as exc:  # the learner's code: report it as feedback, not a traceback
        fb.expect(False, f"your step raised {type(exc).__name__}: {exc}")
        return fb
    finally:
        hook.remove()
    _reference_step(ref_model, ref_opt, ref_scaler, inputs, targets, device.type, dtype)

    fb.expect(bool(seen_autocast), "the model's forward never ran: call model(inputs) inside your step")
    fb.expect(all(seen_autocast) and bool(seen_autocast),
              "the forward pass ran without autocast: wrap it in `with torch.autocast(device_type, dtype=dtype):`")
    fb.expect(all(p.dtype == torch.float32 for p in model.parameters()),
              "the weights are no longer fp32: do not call .half() on the model; autocast casts per op")
    fb.expect("scale" in scaler.calls, "call scaler.scale(loss).backward(), not loss.backward()")
    fb.expect("step" in scaler.calls, "call scaler.step(optimizer) instead of optimizer.step(): it unscales and skips inf steps")
    fb.expect("update" in scaler.calls, "call scaler.update() after scaler.step(optimizer)")
    fb.expect(isinstance(loss, torch.Tensor) and loss.numel() == 1, "return the loss (a one-element tensor)")
    if fb.passed:
        same = all(
            torch.allclose(p, q, rtol=1e-3, atol=1e-4)
            for p, q in zip(model.parameters(), ref_model.parameters(), strict=True)
        )
        fb.expect(same, "the weights after your step differ from the reference step: check the loss "
                        "(cross_entropy of model(inputs) and targets) and the order zero_grad, backward, step")
    return fb
