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

``check_clipped_step(step)``: the bug hunt. ``step(model, optimizer, scaler, inputs, targets,
device_type, dtype, max_norm) -> loss`` clips the gradients with a scaler. The checker records
the gradients' norm when the optimizer really steps: clipped before ``scaler.unscale_`` it is
the scale (1024 here) times too small.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import Feedback, checker
from .answers import Given, checker_device, describe, finite_number, tensor_number

__all__ = [
    "FP16_VALUES",
    "check_amp_step",
    "check_clipped_step",
    "check_fp16_survival",
    "fp16_fate",
]

_FATES = ("inf", "0", "ok")

FP16_VALUES = (70000.0, 60000.0, 1e-4, 1e-9)  # what notebook 06 asks about


def fp16_fate(value: float) -> str:
    """What ``value`` becomes when stored in fp16: ``"inf"``, ``"0"`` or ``"ok"``."""
    half = torch.tensor(float(value), dtype=torch.float32).half()
    if torch.isinf(half):
        return "inf"
    if half == 0 and value != 0:
        return "0"
    return "ok"


_WHY = {
    "inf": "it is above fp16's largest finite value, 65504",
    "0": "it is below half of fp16's smallest subnormal (about 6e-8), so it rounds to zero",
    "ok": "it lies inside fp16's range (about 6e-8 to 65504)",
}


@checker(answers=("guess",))
def check_fp16_survival(
    guess: Mapping[float, str], values: Sequence[float] = FP16_VALUES
) -> Feedback:
    """Compare the learner's predictions ``{value: "inf" | "0" | "ok"}`` with real fp16 conversion.

    Every number in ``values`` must have a prediction (deleting a hard one does not pass);
    predictions for other numbers are checked too.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(
            f"check_fp16_survival: values must be a non-empty list of finite numbers, not "
            f"{describe(values)}"
        )
    asked = [finite_number(v) for v in values]
    if not asked or any(v is None for v in asked):
        raise ValueError("check_fp16_survival: values must be a non-empty list of finite numbers")
    fb = Feedback("predict what each value becomes in fp16")
    fb.hint("torch.finfo(torch.float16) gives the largest value (max) and the smallest (tiny)")
    fb.fix("torch.tensor(v).half() shows the answer for each v")
    fb.require(
        isinstance(guess, Mapping) and len(guess) > 0,
        "pass a dict such as {70000.0: 'inf', 1e-9: '0'}",
        brief="the answer is not a dict of predictions",
    )
    predictions: dict[float, object] = {}
    for key, said in guess.items():
        number = finite_number(key)
        fb.require(
            number is not None,
            f"the keys are the numbers to predict, not {describe(key)}",
            brief="some keys are not numbers",
        )
        predictions[number] = said
    missing = [v for v in asked if v not in predictions]
    fb.expect(
        not missing,
        f"predict every value: {', '.join(repr(v) for v in missing)} is missing",
        brief="some values have no prediction",
    )
    for value in list(dict.fromkeys(asked)) + [v for v in predictions if v not in asked]:
        if value not in predictions:
            continue
        said = predictions[value]
        answer = str.lower(str.strip(said)) if isinstance(said, str) else None
        if not fb.expect(
            answer in _FATES,
            f"{value!r}: answer 'inf', '0' or 'ok' (got {describe(said)})",
            brief="some predictions are not 'inf', '0' or 'ok'",
        ):
            continue
        truth = fp16_fate(value)
        fb.expect(
            answer == truth,
            f"{value!r} becomes {truth!r} in fp16, not {answer!r}: {_WHY[truth]}",
            brief="some predictions are wrong",
        )
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


def _setup(
    device: torch.device, scaler_cls: type
) -> tuple[nn.Module, torch.optim.Optimizer, Any, torch.Tensor, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):  # seed the model without touching the learner's RNG
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


@checker(answers=("step",))
def check_amp_step(step: Callable[..., Any], device: str | torch.device = "cpu") -> Feedback:
    """Run the learner's ``step`` once with fp16 autocast and check it against the reference.

    The reference step runs first, on its own copies; the learner's step gets copies of the
    inputs and targets, and changing them (``targets.zero_()``) fails."""
    device = checker_device(device, "check_amp_step", allowed=("cuda", "cpu"))
    fb = Feedback("a mixed-precision training step with autocast and GradScaler")
    fb.hint(
        "mixed precision takes two tools: autocast around the forward pass, and the GradScaler "
        "around the backward pass and the optimizer step"
    )
    fb.fix(
        "optimizer.zero_grad(set_to_none=True)\n"
        "with torch.autocast(device_type, dtype=dtype):\n"
        "    loss = nn.functional.cross_entropy(model(inputs), targets)\n"
        "scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()\nreturn loss"
    )
    dtype = torch.float16
    model, optimizer, scaler, inputs, targets = _setup(device, _RecordingScaler)
    ref_model = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.5)
    ref_scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
    ref_loss = _reference_step(
        ref_model, ref_opt, ref_scaler, inputs.clone(), targets.clone(), device.type, dtype
    )

    seen_autocast: list[bool] = []
    hook = model.register_forward_hook(
        lambda mod, args, out: seen_autocast.append(torch.is_autocast_enabled(device.type))
    )
    try:
        loss = fb.run(
            "your step",
            step,
            model,
            optimizer,
            scaler,
            Given("inputs", inputs),
            Given("targets", targets),
            device.type,
            dtype,
        )
    finally:
        hook.remove()

    fb.expect(
        bool(seen_autocast),
        "the model's forward never ran: call model(inputs) inside your step",
        brief="the model never ran",
    )
    fb.expect(
        all(seen_autocast) and bool(seen_autocast),
        "the forward pass ran without autocast: wrap it in "
        "`with torch.autocast(device_type, dtype=dtype):`",
        brief="the forward pass ran without autocast",
    )
    fb.expect(
        all(p.dtype == torch.float32 for p in model.parameters()),
        "the weights are no longer fp32: do not call .half() on the model; autocast casts per op",
        brief="the weights are no longer fp32",
    )
    fb.expect(
        "scale" in scaler.calls,
        "call scaler.scale(loss).backward(), not loss.backward()",
        brief="the loss was not scaled before the backward pass",
    )
    fb.expect(
        "step" in scaler.calls,
        "call scaler.step(optimizer) instead of optimizer.step(): it unscales and skips inf steps",
        brief="the optimizer was not stepped through the scaler",
    )
    fb.expect(
        "update" in scaler.calls,
        "call scaler.update() after scaler.step(optimizer)",
        brief="the scaler never adjusts its scale",
    )
    if loss is None:
        fb.fail(
            "your step returned None: is `return loss` missing?",
            brief="your step does not return the loss",
        )
    is_loss = isinstance(loss, torch.Tensor) and loss.numel() == 1
    fb.require(
        is_loss,
        f"return the loss (a one-element tensor), not {describe(loss)}",
        brief="your step does not return the loss",
    )
    value = tensor_number(loss)
    fb.expect(
        value is not None
        and math.isclose(value, float(ref_loss.detach()), rel_tol=1e-2, abs_tol=1e-3),
        f"the loss you return is {describe(value)}, but this batch's loss is "
        f"{float(ref_loss.detach()):.4f}: return the cross_entropy of model(inputs) and targets",
        brief="the loss you return is not the batch's loss",
    )
    if fb.passed:
        same = all(
            torch.allclose(p, q, rtol=1e-3, atol=1e-4)
            for p, q in zip(model.parameters(), ref_model.parameters(), strict=True)
        )
        fb.expect(
            same,
            "the weights after your step differ from the reference step: check the loss "
            "(cross_entropy of model(inputs) and targets) and the order zero_grad, backward, step",
            brief="the weights after your step are not what one training step gives",
        )
    return fb


def _grad_norm(params) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params])))


def _true_grad_norm(device: torch.device) -> tuple[float, float]:
    """The unclipped gradient norm of the checker's model on its batch, fp16 autocast, and the
    batch's loss."""
    model, _, _, inputs, targets = _setup(device, torch.amp.GradScaler)
    with torch.autocast(device.type, dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.float().backward()
    return _grad_norm(model.parameters()), float(loss.detach())


@checker(answers=("step",))
def check_clipped_step(step: Callable[..., Any], device: str | torch.device = "cpu") -> Feedback:
    """Run the learner's clipping step once and check the gradients the optimizer stepped with,
    and that the loss it returns is this batch's (computed first, from the checker's copy)."""
    device = checker_device(device, "check_clipped_step", allowed=("cuda", "cpu"))
    fb = Feedback("gradient clipping with a GradScaler")
    fb.hint(
        "after scaler.scale(loss).backward(), what is in .grad: the gradients, or something "
        "else? Compare the norm the optimizer steps with to max_norm"
    )
    fb.fix(
        "call scaler.unscale_(optimizer) after backward and before clip_grad_norm_; "
        "scaler.step(optimizer) then does not unscale a second time"
    )
    true_norm, true_loss = _true_grad_norm(device)
    max_norm = 0.5 * true_norm  # so that a right step must clip
    model, optimizer, scaler, inputs, targets = _setup(device, _RecordingScaler)
    stepped: list[float] = []
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: stepped.append(_grad_norm(model.parameters()))
    )
    loss = fb.run(
        "your step",
        step,
        model,
        optimizer,
        scaler,
        Given("inputs", inputs),
        Given("targets", targets),
        device.type,
        torch.float16,
        max_norm,
    )
    fb.require(
        "scale" in scaler.calls and "step" in scaler.calls,
        "use the scaler: scaler.scale(loss).backward() and scaler.step(optimizer)",
        brief="the scaler was not used for backward and step",
    )
    fb.require(
        len(stepped) == 1,
        f"the optimizer stepped {len(stepped)} times: step once, through scaler.step(optimizer)",
        brief="the optimizer did not step exactly once",
    )
    got = stepped[0]
    fb.require(
        math.isfinite(got),
        "the gradients were not finite when the optimizer stepped",
        brief="the gradients were not finite",
    )
    fb.expect(
        got > 0.5 * max_norm,
        f"the optimizer stepped with gradients of norm {got:.3g}, {max_norm / got:.0f}x smaller "
        f"than max_norm ({max_norm:.3g}): they were clipped while still multiplied by the scale "
        f"({scaler.get_scale():.0f}), before scaler.unscale_(optimizer)",
        brief="the gradients the optimizer used are far smaller than max_norm",
    )
    fb.expect(
        got < 1.01 * max_norm,
        f"the optimizer stepped with gradients of norm {got:.3g}, above max_norm ({max_norm:.3g}): "
        "clip them with nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
        brief="the gradients were not clipped",
    )
    fb.expect(
        "update" in scaler.calls,
        "call scaler.update() after scaler.step(optimizer)",
        brief="the scaler never adjusts its scale",
    )
    _expect_batch_loss(fb, loss, true_loss)
    return fb


def _expect_batch_loss(fb: Feedback, loss: object, want: float) -> None:
    """The step must return this batch's loss, a one-element tensor (or number): ``want``."""
    if isinstance(loss, torch.Tensor):
        value = tensor_number(loss) if loss.numel() == 1 else None
    else:
        value = finite_number(loss)
    fb.expect(
        value is not None and math.isclose(value, want, rel_tol=1e-2, abs_tol=1e-3),
        f"the loss you return is {describe(loss if value is None else value)}, but this batch's "
        f"loss is {want:.4f}: return the cross_entropy of model(inputs) and targets",
        brief="the loss you return is not the batch's loss",
    )
