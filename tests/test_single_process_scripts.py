"""The one-process scripts that notebooks 00 and 02 run (notebooks/scripts/), without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_file

SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"


def _run(name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=SCRIPTS.parent,
    )


@pytest.mark.slow  # a fresh Python that imports torch
def test_allocator_vs_nvml_without_a_gpu_exits_1_with_one_sentence():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: notebook 00 runs the script for real")
    run = _run("allocator_vs_nvml.py")
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "no CUDA GPU: this script shows PyTorch's counters on cuda:0"
    ]


@pytest.mark.slow  # a fresh Python per setting, each importing torch
def test_cuda_visible_devices_checks_what_each_child_sees():
    run = _run("cuda_visible_devices.py")
    assert run.returncode == 0, run.stderr
    assert "CUDA_VISIBLE_DEVICES=''       -> 0 GPU(s)" in run.stdout
    assert run.stdout.strip().splitlines()[-1].startswith("Checked: ")


def _script(name: str):
    return load_file(SCRIPTS / name)


@pytest.mark.parametrize(
    ("child", "why"),
    [
        (lambda setting: (None, []), "the child found CUDA_VISIBLE_DEVICES=None"),
        (lambda setting: (setting, ["GPU-hidden"]), "expected []"),
    ],
    ids=["a child without its setting", "a GPU that the setting should hide"],
)
def test_cuda_visible_devices_fails_when_a_child_sees_the_wrong_thing(
    monkeypatch, capsys, child, why
):
    """02's check moved into the script (issue 20 §5): it must still be able to fail."""
    script = _script("cuda_visible_devices.py")
    monkeypatch.setattr(script, "visible_gpus", child)
    assert script.main() == 1
    assert why in capsys.readouterr().err


@pytest.mark.slow  # a fresh Python that imports torch
def test_amp_recipes_checks_pass_without_a_gpu():
    """Notebook 05 points to scripts/amp_recipes.py for a skipped step, the scaler in a
    checkpoint and accumulation; its asserts must hold on a CPU (GradScaler("cpu"))."""
    run = _run("amp_recipes.py")
    assert run.returncode == 0, run.stderr
    assert "weights changed: False; new scale: 2**39" in run.stdout
