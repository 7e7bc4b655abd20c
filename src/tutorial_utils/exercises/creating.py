"""Checkers for notebook 02, creating tensors on the right device.

As in ``exercises.moving``, each checker also runs the learner's code on ``'meta'``, a
device every machine has, so a tensor created on the CPU by mistake shows up as a
device mismatch even where there is no GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from . import Feedback

__all__ = ["check_build_on", "check_following_module", "check_shape_tensor"]

META = torch.device("meta")


def _run(fb: Feedback, what: str, fn: Callable, *args):
    """Call the learner's code; on an exception record it as a problem and return None."""
    try:
        return fn(*args)
    except Exception as exc:  # the learner's code: report anything it raises
        fb.expect(False, f"{what} raised {type(exc).__name__}: {exc}")
        return None


def check_shape_tensor(shape_tensor: Callable[[torch.Tensor], torch.Tensor]) -> Feedback:
    """Exercise 1 (the guide's broken snippet, fixed): ``shape_tensor(t)`` returns ``t.shape`` as
    a 1-D int64 tensor on ``t``'s device."""
    fb = Feedback("shape_tensor(t) returns t's shape as an int64 tensor on t's device")
    cases = [torch.zeros(2, 3), torch.zeros(4, 5, 6, dtype=torch.float64, device=META)]
    for t in cases:
        out = _run(fb, f"shape_tensor(a {t.device} tensor)", shape_tensor, t)
        if out is None:
            break
        if not fb.expect(isinstance(out, torch.Tensor), f"expected a tensor, got {type(out).__name__}"):
            break
        fb.expect(out.device == t.device, f"for a tensor on {t.device} the result is on {out.device}: pass device=t.device")
        fb.expect(out.dtype == torch.int64, f"the result has dtype {out.dtype}; sizes are whole numbers (int64)")
        fb.expect(tuple(out.shape) == (t.dim(),), f"the result has shape {tuple(out.shape)}, expected ({t.dim()},)")
        if t.device.type != "meta" and not fb.problems:
            fb.expect(out.tolist() == list(t.shape), f"the values are {out.tolist()}, expected {list(t.shape)}")
        if fb.problems:
            break
    if not fb.passed:
        fb.hint("t.get_device() is an int (-1 on the CPU); use t.shape and t.device")
    return fb


def check_build_on(build: Callable[[torch.device], nn.Module], device: torch.device | str = "cpu") -> Feedback:
    """Exercise 2: ``build(device)`` creates a model whose parameters start on ``device``, and
    leaves the default device as it found it."""
    fb = Feedback("build(device) creates the model on the device and leaves the default device alone")
    before = torch.get_default_device()
    try:
        targets = [torch.device(device)] + ([META] if torch.device(device) != META else [])
        for target in targets:
            model = _run(fb, f"build({str(target)!r})", build, target)
            after = torch.get_default_device()
            if not fb.expect(
                after == before,
                f"after build({str(target)!r}) the default device is {after}, not {before}: "
                "use `with torch.device(device):` or reset with torch.set_default_device(None)",
            ):
                break
            if model is None:
                break
            if not fb.expect(isinstance(model, nn.Module), f"build must return an nn.Module, got {type(model).__name__}"):
                break
            params = list(model.named_parameters())
            fb.expect(bool(params), "the model has no parameters")
            off = [n for n, p in params if p.device.type != target.type]
            fb.expect(not off, f"with device={str(target)!r} these parameters are elsewhere: {', '.join(off)}")
            if fb.problems:
                break
    finally:
        torch.set_default_device(before)  # whatever the learner did, later cells get the default back
    if not fb.passed:
        fb.hint("def build(device):\n    with torch.device(device):\n        return nn.Sequential(...)")
    return fb


def check_following_module(make: Callable[[int], nn.Module], device: torch.device | str = "cpu") -> Feedback:
    """Exercise 3: ``make(features)`` returns a module with a registered buffer whose forward,
    given ``(batch, features)``, creates any new tensors from its inputs or parameters.

    Checked by converting the module to float64 and by moving it to ``device`` and to ``'meta'``:
    the output must follow (same dtype and device as the input), with no device error.
    """
    fb = Feedback("a module whose buffers and new tensors follow its parameters")
    features = 4
    module = _run(fb, f"make({features})", make, features)
    if module is None:
        return fb
    if not fb.expect(isinstance(module, nn.Module), f"make must return an nn.Module, got {type(module).__name__}"):
        return fb
    fb.expect(bool(list(module.buffers())), "the module has no buffer: add one with self.register_buffer(name, tensor)")
    fb.expect(bool(list(module.parameters())), "the module has no parameter (nn.Parameter or a layer)")
    if fb.problems:
        return fb
    targets: list[tuple[str, torch.dtype, torch.device]] = [
        ("float64 on the CPU", torch.float64, torch.device("cpu")),
        (f"float32 on {device}", torch.float32, torch.device(device)),
        ("float32 on meta", torch.float32, META),
    ]
    for label, dtype, dev in targets:
        module.to(device=dev, dtype=dtype)
        stray = [n for n, b in module.named_buffers() if b.device.type != dev.type]
        if not fb.expect(not stray, f"{label}: buffers {', '.join(stray)} did not move; register them with register_buffer"):
            break
        x = torch.randn(3, features, generator=torch.Generator().manual_seed(0)).to(device=dev, dtype=dtype)
        out = _run(fb, f"{label}: forward", module, x)
        if out is None:
            fb.hint("a tensor made inside forward with torch.ones(...) lands on the default device; "
                    "use x.new_ones(...) or torch.ones(..., device=x.device, dtype=x.dtype)")
            break
        if not fb.expect(isinstance(out, torch.Tensor), f"{label}: forward must return a tensor"):
            break
        fb.expect(out.device.type == dev.type, f"{label}: the output is on {out.device}")
        fb.expect(out.dtype == dtype, f"{label}: the output is {out.dtype}; make new tensors with x.new_* so the dtype follows")
        fb.expect(tuple(out.shape) == (3, features), f"{label}: the output shape is {tuple(out.shape)}, expected (3, {features})")
        if fb.problems:
            break
    return fb
