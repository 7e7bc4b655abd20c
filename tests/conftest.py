"""Shared fixtures: a machine with CUDA mocked present, and one with a CUDA build but no driver."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

GiB = 2**30


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend torch is a CUDA build that sees ``fake_cuda.count`` GPUs (2 by default)."""
    state = types.SimpleNamespace(count=2, total=16 * GiB, free=10 * GiB)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state.count)

    def props(index):
        if not 0 <= index < state.count:
            raise AssertionError("Invalid device id")
        return types.SimpleNamespace(
            name=f"NVIDIA Fake {index}", total_memory=state.total, major=9, minor=0,
            uuid=f"0000000{index}-0000-0000-0000-000000000000",
        )

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (state.free, state.total))
    return state


@pytest.fixture
def cuda_build_without_driver(monkeypatch):
    """A CUDA build of torch on a machine with no NVIDIA driver: is_available() warns and says False."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")

    def is_available():
        warnings.warn("CUDA initialization: Found no NVIDIA driver on your system.", UserWarning, stacklevel=2)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def broken_nvidia_smi(tmp_path, monkeypatch):
    """An ``nvidia-smi`` on PATH that fails the way it does when the driver is gone (exit 9)."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(
        "#!/bin/sh\n"
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\n"
        "exit 9\n"
    )
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    return exe
