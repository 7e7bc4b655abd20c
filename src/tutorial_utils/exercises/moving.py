"""Checkers for notebook 01, moving tensors between devices.

Each checker runs the learner's code on a device that exists on every machine. Besides the
device the notebook uses, they also use ``'meta'``: a device with shapes and dtypes but no data.
Moving a model from the CPU to ``'meta'`` replaces its ``Parameter`` objects, so it catches an
optimizer built before the move on any machine, GPU or not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import Feedback

__all__ = ["check_move_batch", "check_setup_training"]

META = torch.device("meta")


def _same_device(t: torch.Tensor, device: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same place when the current device is 0; compare types and indices."""
    if t.device.type != device.type:
        return False
    return device.index is None or t.device.index in (None, device.index)


def check_setup_training(
    setup: Callable[[torch.device], tuple[nn.Module, torch.optim.Optimizer]],
    device: torch.device | str = "cpu",
) -> Feedback:
    """Exercise 1: ``setup(device)`` returns ``(model, optimizer)`` with the model on ``device``.

    The optimizer must hold the very ``Parameter`` objects the model has after the move,
    which is only guaranteed when it is built after ``model.to(device)``.
    """
    fb = Feedback("setup(device) returns a model on the device and an optimizer over its parameters")
    targets = [torch.device(device)]
    if targets[0] != META:
        targets.append(META)  # the move that replaces Parameter objects
    for target in targets:
        try:
            result = setup(target)
        except Exception as exc:  # the learner's code: report anything it raises
            fb.expect(False, f"setup({str(target)!r}) raised {type(exc).__name__}: {exc}")
            return fb
        if not fb.expect(
            isinstance(result, tuple) and len(result) == 2,
            f"setup must return a tuple (model, optimizer), got {type(result).__name__}",
        ):
            return fb
        model, optimizer = result
        if not fb.expect(isinstance(model, nn.Module), f"the first item must be an nn.Module, got {type(model).__name__}"):
            return fb
        if not fb.expect(
            isinstance(optimizer, torch.optim.Optimizer),
            f"the second item must be a torch.optim optimizer, got {type(optimizer).__name__}",
        ):
            return fb
        params = list(model.parameters())
        if not fb.expect(bool(params), "the model has no parameters to train"):
            return fb
        off = [name for name, p in model.named_parameters() if not _same_device(p, target)]
        fb.expect(not off, f"with device={str(target)!r}, these parameters are elsewhere: {', '.join(off)}")
        model_ids = {id(p) for p in params}
        held = [p for group in optimizer.param_groups for p in group["params"]]
        stale = [p for p in held if id(p) not in model_ids]
        fb.expect(
            not stale,
            f"with device={str(target)!r}, the optimizer holds {len(stale)} tensor(s) that are not the "
            "model's parameters any more: build the optimizer after model.to(device)",
        )
        missing = model_ids - {id(p) for p in held}
        fb.expect(not missing, f"the optimizer does not train {len(missing)} of the model's parameters")
        if fb.problems:
            break
    if not fb.passed:
        fb.hint("model = ...; model.to(device); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    return fb


def check_move_batch(move: Callable[[Any, torch.device], Any], device: torch.device | str = "cpu") -> Feedback:
    """Exercise 2: ``move(batch, device)`` moves every tensor in nested dicts, lists and tuples.

    Containers keep their type, non-tensor values are returned unchanged, and every tensor
    lands on ``device`` with its dtype and values kept.
    """
    fb = Feedback("move(batch, device) moves every tensor inside dicts, lists and tuples")
    ints = torch.arange(6).reshape(2, 3)
    floats = torch.linspace(0, 1, 5, dtype=torch.float64)
    batch = {"x": ints, "pair": (floats, "label"), "items": [ints[0], {"deep": floats}, 7]}
    for target in (torch.device(device), META):
        try:
            out = move(batch, target)
        except Exception as exc:
            fb.expect(False, f"move(batch, {str(target)!r}) raised {type(exc).__name__}: {exc}")
            return fb
        if not fb.expect(isinstance(out, dict), f"a dict must come back as a dict, got {type(out).__name__}"):
            return fb
        if not fb.expect(set(out) == set(batch), f"the keys changed: {sorted(out)} instead of {sorted(batch)}"):
            return fb
        pair, items = out["pair"], out["items"]
        fb.expect(isinstance(pair, tuple) and len(pair) == 2, "a tuple must come back as a tuple of the same length")
        fb.expect(isinstance(items, list) and len(items) == 3, "a list must come back as a list of the same length")
        if fb.problems:
            return fb
        fb.expect(pair[1] == "label" and items[2] == 7, "non-tensor values (a string, an int) must be returned unchanged")
        fb.expect(isinstance(items[1], dict) and "deep" in items[1], "a dict inside a list must come back as a dict")
        if fb.problems:
            return fb
        tensors = {"x": (out["x"], ints), "pair[0]": (pair[0], floats), "items[0]": (items[0], ints[0]),
                   "items[1]['deep']": (items[1]["deep"], floats)}
        for where, (got, want) in tensors.items():
            if not fb.expect(isinstance(got, torch.Tensor), f"{where} is not a tensor any more"):
                continue
            fb.expect(_same_device(got, target), f"{where} is on {got.device}, not {target}")
            fb.expect(got.dtype == want.dtype, f"{where} changed dtype from {want.dtype} to {got.dtype}; pass only the device")
            if target.type != "meta" and got.dtype == want.dtype and got.shape == want.shape:
                fb.expect(bool(torch.equal(got.cpu(), want)), f"{where} changed its values")
        if fb.problems:
            break
    if not fb.passed:
        fb.hint("recurse: tensors -> t.to(device); dict -> {k: move(v, device)}; list/tuple -> type(b)(move(v, device) for v in b); else return b")
    return fb
