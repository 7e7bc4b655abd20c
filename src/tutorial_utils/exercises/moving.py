"""Checkers for notebook 01, moving tensors between devices.

Each checker runs the learner's code on a device that exists on every machine. Besides the
device the notebook uses, they also use ``'meta'``: a device with shapes and dtypes but no data,
where a tensor left behind on the CPU raises or stays behind, as it would with a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import Feedback, checker
from .answers import META, Given, checker_device, describe, same_device, tensor_number

__all__ = ["check_accuracy_on_device", "check_move_batch"]


def _compare(fb: Feedback, got: Any, want: Any, where: str, target: torch.device) -> None:
    """Record every way ``got`` differs from ``want`` moved to ``target``."""
    if isinstance(want, torch.Tensor):
        if not fb.expect(
            isinstance(got, torch.Tensor),
            f"{where} is not a tensor any more ({describe(got)})",
            brief="some tensors were replaced by something else",
        ):
            return
        if not fb.expect(  # a subclass may answer True to torch.equal: compare plain tensors
            type(got) in (torch.Tensor, torch.nn.Parameter),
            f"{where} is {describe(type(got).__name__)}, a subclass of torch.Tensor: keep the "
            "tensors as they are, moved with .to(device)",
            brief="some tensors were replaced by tensor subclasses",
        ):
            return
        fb.expect(
            same_device(got, target),
            f"{where} is on {got.device}, not {target}",
            brief="some tensors are not on the device",
        )
        fb.expect(
            got.dtype == want.dtype,
            f"{where} changed dtype from {want.dtype} to {got.dtype}; pass only the device",
            brief="some tensors changed dtype",
        )
        if not fb.expect(
            got.shape == want.shape,
            f"{where} changed shape from {tuple(want.shape)} to {tuple(got.shape)}",
            brief="some tensors changed shape",
        ):
            return
        if target.type != "meta" and got.device.type != "meta" and got.dtype == want.dtype:
            fb.expect(
                bool(torch.equal(got.cpu(), want)),
                f"{where} changed its values",
                brief="some tensors changed their values",
            )
        return
    if isinstance(want, dict):
        if not fb.expect(
            type(got) is dict,
            f"a dict must come back as a dict, got {type(got).__name__} at {where}",
            brief="a container changed its type",
        ):
            return
        keys = list(got)
        if not fb.expect(
            all(type(k) is str for k in keys) and set(keys) == set(want),
            f"the keys of {where} changed: {describe(keys)} instead of {sorted(want)}",
            brief="the keys of a dict changed",
        ):
            return
        for key, value in want.items():
            _compare(fb, got[key], value, f"{where}[{key!r}]", target)
        return
    if isinstance(want, (list, tuple)):
        kind = type(want).__name__
        if not fb.expect(
            type(got) is type(want) and len(got) == len(want),
            f"a {kind} must come back as a {kind} of the same length, got "
            f"{describe(got)} at {where}",
            brief="a container changed its type or length",
        ):
            return
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _compare(fb, g, w, f"{where}[{i}]", target)
        return
    fb.expect(
        type(got) is type(want) and got == want,
        f"non-tensor values (a string, an int) must be returned unchanged: {where} is "
        f"{describe(got)}, not {want!r}",
        brief="non-tensor values changed",
    )


@checker(answers=("move",))
def check_move_batch(
    move: Callable[[Any, torch.device], Any], device: torch.device | str = "cpu"
) -> Feedback:
    """Exercise 1: ``move(batch, device)`` moves every tensor in nested dicts, lists and tuples.

    Containers keep their type, non-tensor values are returned unchanged, and every tensor
    lands on ``device`` with its dtype, shape and values kept. ``move`` gets a copy of the
    batch; the result is compared with the checker's own, and changing the copy in place fails.
    """
    device = checker_device(device, "check_move_batch")
    fb = Feedback("move(batch, device) moves every tensor inside dicts, lists and tuples")
    fb.hint("a batch is a tree: handle a tensor, a dict, a list or tuple, and anything else")
    fb.fix(
        "recurse: tensors -> t.to(device); dict -> {k: move(v, device)}; "
        "list/tuple -> type(b)(move(v, device) for v in b); else return b"
    )
    ints = torch.arange(6).reshape(2, 3)
    floats = torch.linspace(0, 1, 5, dtype=torch.float64)
    batch = {"x": ints, "pair": (floats, "label"), "items": [ints[0], {"deep": floats}, 7]}
    for target in dict.fromkeys([device, META]):
        out = fb.run(
            f"move(batch, {str(target)!r})", move, Given("batch", batch), target, returns=object
        )
        fb.require(
            type(out) is dict,
            f"a dict must come back as a dict, got {type(out).__name__}",
            brief="the batch came back as another kind of container",
        )
        fb.require(
            all(type(k) is str for k in out) and set(out) == set(batch),
            f"the keys changed: {describe(list(out))} instead of {sorted(batch)}",
            brief="the keys of the dict changed",
        )
        for key, value in batch.items():  # the top level is named by its keys: x, pair, items
            _compare(fb, out[key], value, key, target)
        if fb.problems:
            break
    return fb


# -----------------------------------------------------------------------------
# Exercise 2: debug an evaluation loop that only works on the CPU


def _accuracy_setup() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A seeded classifier (on the CPU: the function under test moves it) and CPU batches."""
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    batches = [
        (torch.randn(n, 6, generator=gen), torch.randint(0, 3, (n,), generator=gen))
        for n in (8, 8, 5)  # a short last batch, as a DataLoader yields
    ]
    return model, batches


@checker(answers=("accuracy",))
def check_accuracy_on_device(
    accuracy: Callable[[nn.Module, list, torch.device], Any],
    device: torch.device | str = "cpu",
) -> Feedback:
    """Exercise 2: ``accuracy(model, batches, device)`` returns a 0-dim tensor on ``device``.

    The value is checked on ``device`` against a reference; ``'meta'`` (where a tensor left on the
    CPU raises, or stays behind, as on a GPU) checks that every tensor follows the device.
    """
    device = checker_device(device, "check_accuracy_on_device")
    fb = Feedback("accuracy(model, batches, device) runs on the device and returns a tensor there")
    fb.hint("on the device, every tensor the loop uses or makes must be there too")
    fb.fix(
        "x, y = x.to(device), y.to(device)  (keep what .to() returns), and "
        "correct = torch.zeros((), device=device)"
    )
    model, batches = _accuracy_setup()
    with torch.no_grad():
        hits = sum(int((model(x).argmax(dim=1) == y).sum()) for x, y in batches)
    expected = hits / sum(len(y) for _, y in batches)
    for where in dict.fromkeys([device, META]):
        model, batches = _accuracy_setup()
        with torch.no_grad():
            out = fb.run(
                f"accuracy(model, batches, {str(where)!r})", accuracy, model, batches, where
            )
        fb.require(
            isinstance(out, torch.Tensor),
            f"it returned {describe(out)}; return a 0-dim tensor on the device (an .item() per "
            "batch makes a GPU wait at every batch)",
            brief="it does not return a tensor",
        )
        fb.require(
            same_device(out, where),
            f"with device={str(where)!r} the result is on {out.device}: a tensor in the loop was "
            "created on the CPU and stayed there",
            brief="the result is not on the device",
        )
        fb.require(
            out.dim() == 0,
            f"the result has shape {tuple(out.shape)}, not () (0-dim)",
            brief="the result is not a single number",
        )
        fb.require(
            out.is_floating_point(),
            f"the result is {out.dtype}: divide to get a share",
            brief="the result is not a share",
        )
        if where.type != "meta":
            value = tensor_number(out)
            fb.require(
                value is not None and abs(value - expected) < 1e-6,
                f"the accuracy is {describe(value)}; the right value is {expected:.4f} (over "
                "every sample of every batch, the short last one included)",
                brief="the value is wrong",
            )
    return fb
