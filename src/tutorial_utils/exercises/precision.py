"""Checkers for notebook 05 (mixed precision and cuDNN).

``check_fp16_survival(guess)``: the learner predicts what each number becomes in fp16
(``"inf"``, ``"0"`` or ``"ok"``); the checker converts the numbers for real and says which
predictions are wrong and why.

``check_accumulated_clipped_step(step)``: the bug hunt. ``step(model, optimizer, scaler,
micro_batches, device_type, dtype, max_norm) -> loss`` makes one optimizer step over several
micro-batches, with gradient clipping and a ``GradScaler``: two lessons of section 3 at once.
The checker computes the whole batch's gradient first (its own model, no scaler), then records
the gradients the optimizer really steps with, once with a ``max_norm`` that must clip and once
with one that must not: micro-batch losses added up instead of averaged pass the first and fail
the second; clipping before ``scaler.unscale_`` fails the first by the scale. Each call starts
with a previous step's gradients still in ``.grad`` (``answers.LeftoverGradients``): a step
without ``optimizer.zero_grad()`` adds to them, and its hint names the missing ``zero_grad``.
(Measuring the gradients would not show it: ``scaler.unscale_`` divides the leftover by the
scale too, so it changes them by about 1/1024; the hook sees ``.grad`` before the first backward.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import Feedback, checker
from .answers import (
    Given,
    LeftoverGradients,
    checker_device,
    describe,
    finite_number,
    tensor_number,
)

__all__ = [
    "FP16_VALUES",
    "MICRO_BATCHES",
    "check_accumulated_clipped_step",
    "check_fp16_survival",
    "fp16_fate",
]

_FATES = ("inf", "0", "ok")

FP16_VALUES = (70000.0, 60000.0, 1e-4, 1e-9)  # what notebook 05 asks about


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


class _Carried:
    """What each call of the step carried, from hooks on the checker's model: the rows and the
    autocast dtype of each forward pass (``"F"``) and each backward pass that reached the
    parameters (``"B"``), in order."""

    def __init__(self, model: nn.Module, device_type: str):
        self.device_type = device_type
        self.events: list[tuple] = []
        first = next(iter(model.parameters()))
        self.handles = [
            model.register_forward_pre_hook(self._forward),
            first.register_post_accumulate_grad_hook(lambda _: self.events.append(("B",))),
        ]

    def _forward(self, _module, args) -> None:
        on = torch.is_autocast_enabled(self.device_type)
        dtype = torch.get_autocast_dtype(self.device_type) if on else None
        rows = args[0].shape[0] if args and isinstance(args[0], torch.Tensor) else None
        self.events.append(("F", rows, dtype))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def require_one_micro_batch_each(self, fb: Feedback, rows: int, dtype: torch.dtype) -> None:
        """Each of the micro-batches: its own forward (``rows`` rows, under ``dtype`` autocast),
        then its own backward, before the next forward."""
        forwards = [e for e in self.events if e[0] == "F"]
        fb.require(
            len(forwards) == MICRO_BATCHES and all(e[1] == rows for e in forwards),
            f"the model ran {len(forwards)} forward passes on "
            f"{', '.join(str(e[1]) for e in forwards) or 'no'} rows: run one forward per "
            f"micro-batch ({MICRO_BATCHES} of {rows} rows each)",
            brief="the forward passes are not one per micro-batch",
        )
        pattern = "".join(e[0] for e in self.events)
        fb.require(
            pattern == "FB" * MICRO_BATCHES,
            f"the forward and backward passes ran as {' '.join(pattern)}, not forward, backward "
            f"for each micro-batch: call scaler.scale(loss).backward() on each micro-batch's loss "
            "inside the loop (one backward over the summed losses keeps every micro-batch's "
            "graph alive at once)",
            brief="each micro-batch does not get its own backward",
        )
        wrong = [e[2] for e in forwards if e[2] != dtype]
        seen = str(wrong[0]).replace("torch.", "") if wrong and wrong[0] else "no"
        fb.require(
            not wrong,
            f"a forward ran under {seen} autocast, not the {str(dtype).replace('torch.', '')} "
            "the step is given: use "
            "torch.autocast(device_type, dtype=dtype)",
            brief="the forward does not run under the autocast dtype it is given",
        )


def _grad_norm(params) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params])))


MICRO_BATCHES = 4  # the checker's batch of 16, in micro-batches of 4


def _whole_batch(device: torch.device) -> tuple[list[torch.Tensor], float, float]:
    """The reference, computed first on the checker's own model: the whole batch's gradients
    (fp16 autocast, no scaler, nothing clipped), their norm, and the batch's loss."""
    model, _, _, inputs, targets = _setup(device, torch.amp.GradScaler)
    with torch.autocast(device.type, dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(inputs), targets)
    loss.float().backward()
    grads = [p.grad.detach().float().clone() for p in model.parameters()]
    return grads, _grad_norm(model.parameters()), float(loss.detach())


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


@checker(answers=("step",))
def check_accumulated_clipped_step(
    step: Callable[..., Any], device: str | torch.device = "cpu"
) -> Feedback:
    """Run the learner's step twice (a ``max_norm`` that must clip, one that must not), each
    time from a model whose ``.grad`` still holds a previous step's gradients, and compare the
    gradients the optimizer stepped with against the whole batch's, clipped."""
    device = checker_device(device, "check_accumulated_clipped_step", allowed=("cuda", "cpu"))
    fb = Feedback("one optimizer step over micro-batches, clipped, with a GradScaler")
    fb.hint(
        "compare what the optimizer steps with to the whole batch's gradient: what share of it "
        "does each micro-batch's backward add, and what does .grad hold right after a scaled "
        "backward?"
    )
    fb.fix(
        "divide each micro-batch's loss by len(micro_batches) before scaler.scale(...).backward(); "
        "after the loop: scaler.unscale_(optimizer), clip_grad_norm_, then scaler.step(optimizer) "
        "and scaler.update() once"
    )
    want_grads, true_norm, true_loss = _whole_batch(device)
    for max_norm in (0.5 * true_norm, 2.0 * true_norm):  # must clip; must not
        want_norm = min(true_norm, max_norm)
        model, optimizer, scaler, inputs, targets = _setup(device, _RecordingScaler)
        micro = list(zip(inputs.chunk(MICRO_BATCHES), targets.chunk(MICRO_BATCHES), strict=True))
        stepped: list[list[torch.Tensor]] = []
        optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, model=model, stepped=stepped: stepped.append(
                [p.grad.detach().float().clone() for p in model.parameters()]
            )
        )
        carried = _Carried(model, device.type)
        # .grad as the previous step leaves it: a step without zero_grad adds to it
        leftover = LeftoverGradients(list(model.parameters()), want_grads)
        loss = fb.run(
            f"your step (max_norm {max_norm:.3g})",
            step,
            model,
            optimizer,
            scaler,
            Given("micro_batches", micro),
            device.type,
            torch.float16,
            max_norm,
        )
        leftover.remove()
        leftover.require_cleared(fb, f"your step (max_norm {max_norm:.3g})")
        fb.require(
            scaler.calls.count("scale") == MICRO_BATCHES and "step" in scaler.calls,
            f"use the scaler: scaler.scale(loss).backward() for each of the {MICRO_BATCHES} "
            "micro-batches, and scaler.step(optimizer)",
            brief="the scaler was not used for every backward and for the step",
        )
        carried.remove()
        fb.require(
            len(stepped) == 1,
            f"the optimizer stepped {len(stepped)} times: step once, after the last micro-batch",
            brief="the optimizer did not step exactly once",
        )
        carried.require_one_micro_batch_each(fb, len(inputs) // MICRO_BATCHES, torch.float16)
        got = _flat(stepped[0])
        got_norm = float(got.norm())
        fb.require(
            math.isfinite(got_norm) and got_norm > 0,
            "the gradients were zero or not finite when the optimizer stepped",
            brief="the gradients were not usable",
        )
        cosine = float(got @ _flat(want_grads) / (got_norm * true_norm))
        fb.expect(
            cosine > 0.99,
            f"the gradient the optimizer used points elsewhere than the whole batch's (cosine "
            f"{cosine:.3f}): every micro-batch must add to it, none may be lost or clipped alone",
            brief="the gradient is not the whole batch's",
        )
        ratio = got_norm / want_norm
        fb.expect(
            ratio > 0.5,
            f"the optimizer stepped with gradients of norm {got_norm:.3g}, about {1 / ratio:.0f}x "
            f"smaller than {want_norm:.3g} (max_norm {max_norm:.3g}): they were clipped while "
            f"still multiplied by the scale ({scaler.get_scale():.0f}), before "
            "scaler.unscale_(optimizer)",
            brief="the gradients the optimizer used are far smaller than they should be",
        )
        fb.expect(
            ratio < 1.05,
            f"with max_norm {max_norm:.3g} the optimizer stepped with gradients of norm "
            f"{got_norm:.3g}, {ratio:.1f}x the whole batch's clipped ({want_norm:.3g})"
            + (
                f": the {MICRO_BATCHES} micro-batch losses were added up, not averaged"
                if got_norm > 1.5 * true_norm
                else ": clip them with nn.utils.clip_grad_norm_(model.parameters(), max_norm)"
            ),
            brief="the gradients the optimizer used are larger than they should be",
        )
        fb.expect(
            scaler.calls.count("update") == 1,
            f"scaler.update() ran {scaler.calls.count('update')} times: once, after scaler.step",
            brief="the scaler was not updated exactly once",
        )
        _expect_batch_loss(fb, loss, true_loss)
        if fb.problems:
            break
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
        f"loss is {want:.4f}: return the whole batch's cross_entropy (the micro-batches' mean)",
        brief="the loss you return is not the batch's loss",
    )
