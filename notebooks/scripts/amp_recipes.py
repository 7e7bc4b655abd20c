"""Three GradScaler facts of notebook 05, run and checked: a step whose gradients overflow is
skipped, the scaler's state belongs in a checkpoint, and gradient accumulation with a scaler.
fp16 autocast and an enabled GradScaler on any device (``torch.amp.GradScaler("cpu")`` is real),
so that the scaler has work to do.

    python scripts/amp_recipes.py    # from notebooks/: prints what it checked, exits 1 if not
"""

from __future__ import annotations

import io
import math

import torch
from amp_checks import practice_model
from torch import nn

from tutorial_utils import devices, models

device = devices.pick_device()
dev = device.type
px = models.mlp_batch(64, 32, device=device)
py = torch.randn(64, 4, generator=models.seeded(5)).to(device)


def fp16_loss(net: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    with torch.autocast(dev, dtype=torch.float16):
        return nn.functional.mse_loss(net(xb).float(), yb)


def skipped_step() -> None:
    """A scale so large that the fp16 gradients overflow to inf: ``scaler.step`` does not call
    ``opt.step()``, and ``scaler.update`` halves the scale."""
    net, opt = practice_model(device)
    before = [p.detach().clone() for p in net.parameters()]
    scaler = torch.amp.GradScaler(dev, init_scale=2.0**40)
    scaler.scale(fp16_loss(net, px, py)).backward()
    scaler.step(opt)  # finds inf in the gradients: skips opt.step()
    scaler.update()
    changed = any(not torch.equal(b, p) for b, p in zip(before, net.parameters(), strict=True))
    print(f"weights changed: {changed}; new scale: 2**{math.log2(scaler.get_scale()):.0f}")
    assert not changed, "the step with inf gradients was skipped"
    assert scaler.get_scale() == 2.0**39, "and the scale was halved"


def checkpoint_round_trip() -> None:
    """The scale adapts (doubled every 2 good steps here); saved and loaded, it comes back."""
    net, opt = practice_model(device)
    scaler = torch.amp.GradScaler(dev, init_scale=2.0**10, growth_interval=2)
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        scaler.scale(fp16_loss(net, px, py)).backward()
        scaler.step(opt)
        scaler.update()
    buffer = io.BytesIO()  # a file in real life: torch.save(..., "checkpoint.pt")
    states = {"model": net, "optimizer": opt, "scaler": scaler}
    torch.save({key: obj.state_dict() for key, obj in states.items()}, buffer)
    buffer.seek(0)
    resumed = torch.amp.GradScaler(dev)  # the model and the optimizer load theirs the same way
    resumed.load_state_dict(torch.load(buffer, map_location=device)["scaler"])
    print("saved scaler state:", resumed.state_dict())
    assert scaler.get_scale() == 2.0**13, "three doublings in six good steps"
    assert resumed.state_dict() == scaler.state_dict(), "scale and growth tracker restored"
    assert torch.amp.GradScaler(dev).get_scale() != resumed.get_scale(), "a fresh one differs"


def accumulated_step(net, opt, scaler, m: int) -> list[torch.Tensor]:
    """One optimizer step over m micro-batches of (px, py); returns the unscaled gradients."""
    opt.zero_grad(set_to_none=True)
    for xm, ym in zip(px.chunk(m), py.chunk(m), strict=True):
        scaler.scale(fp16_loss(net, xm, ym) / m).backward()  # gradients add up in .grad
    scaler.unscale_(opt)  # only to read the true gradients here; step() would do it anyway
    grads = [p.grad.clone() for p in net.parameters()]
    scaler.step(opt)  # once per optimizer step ...
    scaler.update()  # ... and so is update
    return grads


def accumulation_matches_the_whole_batch() -> None:
    grads_acc = accumulated_step(*practice_model(device), torch.amp.GradScaler(dev), m=4)
    grads_full = accumulated_step(*practice_model(device), torch.amp.GradScaler(dev), m=1)
    gap = max(
        ((a - b).abs().max() / b.abs().max()).item()
        for a, b in zip(grads_acc, grads_full, strict=True)
    )
    tol = 2 * 6 * 2 * 2**-11  # 2 runs x 2 Linears x 6 fp16 roundings (3 fwd, 3 bwd) each
    print(f"4 micro-batches vs the whole batch: gap {gap:.1e}, within fp16's rounding {tol:.1e}")
    assert gap < tol, f"accumulated gradients differ by {gap:.1e}"


if __name__ == "__main__":
    skipped_step()
    checkpoint_round_trip()
    accumulation_matches_the_whole_batch()
