"""The notebook 02 checkers accept the reference answers and reject the common mistakes."""

from __future__ import annotations

import torch
from torch import nn

from tutorial_utils.exercises.creating import check_build_on, check_following_module


def _build_ref(device):
    with torch.device(device):
        return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))


def test_build_on_reference_passes():
    assert check_build_on(_build_ref).passed
    assert torch.get_default_device() == torch.device("cpu")


def test_build_on_leaking_default_device_fails_and_is_reset():
    def leaky(device):
        torch.set_default_device(device)
        return nn.Linear(2, 2)

    fb = check_build_on(leaky)
    assert not fb.passed and "default device is meta" in fb.report()
    assert torch.get_default_device() == torch.device("cpu")


def test_build_on_cpu_only_fails():
    fb = check_build_on(lambda device: nn.Linear(2, 2))
    assert not fb.passed and "elsewhere" in fb.report()


class Good(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.register_buffer("offset", torch.arange(features, dtype=torch.float32))

    def forward(self, x):
        noise_free = x.new_ones(x.shape)
        return x * self.weight + self.offset + noise_free


class PlainAttribute(Good):
    def __init__(self, features):
        super().__init__(features)
        del self.offset
        self.offset = torch.arange(features, dtype=torch.float32)  # not a buffer: never moves


class CpuInForward(Good):
    def forward(self, x):
        return x * self.weight + self.offset + torch.ones(x.shape)


def test_following_module_reference_passes():
    fb = check_following_module(Good)
    assert fb.passed, fb.report()


def test_following_module_mistakes():
    assert "no buffer" in check_following_module(PlainAttribute).report()
    fb = check_following_module(CpuInForward)
    # a float32 tensor made on the CPU: bfloat16 promotes to float32 (before meta raises)
    assert not fb.passed and "bfloat16 on the CPU: the output is torch.float32" in fb.report()
    assert "new_ones" in fb.report()
    assert "no parameter" in check_following_module(lambda f: nn.ReLU()).report()
