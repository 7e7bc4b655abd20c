"""Checkers for notebook 02, creating tensors on the right device.

As in ``exercises.moving``, each checker also runs the learner's code on ``'meta'``, a
device every machine has, so a tensor created on the CPU by mistake shows up as a
device mismatch even where there is no GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .. import memory
from . import Feedback, checker
from .answers import META, checker_device

__all__ = ["check_build_on", "check_following_module"]


@checker(answers=("build",))
def check_build_on(
    build: Callable[[torch.device], nn.Module], device: torch.device | str = "cpu"
) -> Feedback:
    """Exercise 1: ``build(device)`` creates a model whose parameters start on ``device``, and
    leaves the default device as it found it.

    "Start on": the checker counts the CPU tensor memory ``build`` allocates (exactly, with
    ``memory.measure``). A model built on the CPU and then moved allocated its parameters on the
    CPU first, which for a large model is the whole model in host memory before the copy.
    """
    device = checker_device(device, "check_build_on")
    fb = Feedback(
        "build(device) creates the model on the device and leaves the default device alone"
    )
    fb.hint("which way of choosing the device for new tensors ends by itself?")
    fb.fix("def build(device):\n    with torch.device(device):\n        return nn.Sequential(...)")
    before = torch.get_default_device()
    try:
        for target in dict.fromkeys([device, META]):
            with memory.measure("cpu") as on_cpu:
                model = fb.run(f"build({str(target)!r})", build, target, returns=object)
            after = torch.get_default_device()
            fb.require(
                after == before,
                f"after build({str(target)!r}) the default device is {after}, not {before}: "
                "use `with torch.device(device):` or reset with torch.set_default_device(None)",
                brief="build changes the default device for everything that runs after it",
            )
            fb.require(
                isinstance(model, nn.Module),
                f"build must return an nn.Module, got {type(model).__name__}",
                brief="build does not return a model",
            )
            params = list(model.named_parameters())
            fb.require(bool(params), "the model has no parameters")
            off = [n for n, p in params if p.device.type != target.type]
            fb.require(
                not off,
                f"with device={str(target)!r} these parameters are elsewhere: {', '.join(off)}",
                brief="the model's parameters are not created on the device",
            )
            param_bytes = sum(p.numel() * p.element_size() for _, p in params)
            fb.require(
                target.type == "cpu" or on_cpu.peak_above_start_bytes < param_bytes // 2,
                f"with device={str(target)!r} the parameters were created on the CPU first "
                f"({on_cpu.peak_above_start_bytes:,} bytes of CPU tensors) and then moved: "
                "create them on the device",
                brief="the parameters start on the CPU and are copied over",
            )
    finally:
        torch.set_default_device(before)  # whatever the learner did, later cells get it back
    return fb


@checker(answers=("make",))
def check_following_module(
    make: Callable[[int], nn.Module], device: torch.device | str = "cpu"
) -> Feedback:
    """Exercise 2: ``make(features)`` returns a module with a registered buffer whose forward,
    given ``(batch, features)``, creates any new tensors from its inputs or parameters.

    Checked by converting the module to float64 and to bfloat16 (a new float32 tensor made with
    ``device=`` but no ``dtype=`` promotes a bfloat16 output to float32; float64 hides it), and by
    moving it to ``device`` and to ``'meta'``:
    the output must follow (same dtype and device as the input), with no device error.
    """
    device = checker_device(device, "check_following_module")
    fb = Feedback("a module whose buffers and new tensors follow its parameters")
    fb.hint(
        "a tensor kept as a plain attribute, or made inside forward with torch.ones(...), does "
        "not move with the module"
    )
    fb.fix(
        "self.register_buffer(name, tensor) in __init__; in forward make new tensors with "
        "x.new_ones(...) or torch.ones(..., device=x.device, dtype=x.dtype)"
    )
    features = 4
    module = fb.run(f"make({features})", make, features, returns=nn.Module)
    fb.expect(
        bool(list(module.buffers())),
        "the module has no buffer: add one with self.register_buffer(name, tensor)",
        brief="the module has no buffer",
    )
    fb.expect(
        bool(list(module.parameters())),
        "the module has no parameter (nn.Parameter or a layer)",
        brief="the module has no parameter",
    )
    if fb.problems:
        return fb
    targets: list[tuple[str, torch.dtype, torch.device]] = [
        ("float64 on the CPU", torch.float64, torch.device("cpu")),
        ("bfloat16 on the CPU", torch.bfloat16, torch.device("cpu")),
        (f"float32 on {device}", torch.float32, device),
        ("float32 on meta", torch.float32, META),
    ]
    for label, dtype, dev in targets:
        fb.run(f"{label}: module.to(...)", module.to, device=dev, dtype=dtype)
        stray = [n for n, b in module.named_buffers() if b.device.type != dev.type]
        fb.require(
            not stray,
            f"{label}: buffers {', '.join(stray)} did not move; register them with register_buffer",
            brief="some buffers do not move with the module",
        )
        x = torch.randn(3, features, generator=torch.Generator().manual_seed(0)).to(
            device=dev, dtype=dtype
        )
        out = fb.run(f"{label}: forward", module, x, returns=torch.Tensor)
        fb.expect(
            out.device.type == dev.type,
            f"{label}: the output is on {out.device}",
            brief="the output does not follow the module's device",
        )
        fb.expect(
            out.dtype == dtype,
            f"{label}: the output is {out.dtype}; make new tensors with x.new_* so the dtype "
            "follows",
            brief="the output does not follow the module's dtype",
        )
        fb.expect(
            tuple(out.shape) == (3, features),
            f"{label}: the output shape is {tuple(out.shape)}, expected (3, {features})",
            brief="the output has the wrong shape",
        )
        if dev.type != "meta" and out.dtype == dtype and out.shape == x.shape:
            fb.expect(
                bool(torch.isfinite(out).all()),
                f"{label}: the output has NaN or infinite values",
                brief="the output is not finite",
            )
        if fb.problems:
            break
    return fb
