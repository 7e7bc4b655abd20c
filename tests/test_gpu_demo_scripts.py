"""The GPU-only demo scripts notebooks 01 and 05 run (issue 20 §3, "Compact"):
notebooks/scripts/transfer_gpu.py (01) and cudnn_benchmark.py (05).

Without CUDA each demo must refuse in one sentence (the notebook never calls them then, but a
learner running the script does), and every demo the notebook calls must exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import load_file

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SCRIPT = NOTEBOOKS / "scripts" / "transfer_gpu.py"


def _module():
    return load_file(SCRIPT, "transfer_gpu")


def _called_by_notebook() -> set[str]:
    cells = json.loads((NOTEBOOKS / "01_moving_tensors.ipynb").read_text())["cells"]
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return set(re.findall(r"transfer_gpu\.(\w+)\(", text))


DEMOS = sorted(_called_by_notebook())


def test_the_notebook_calls_demos_that_exist():
    module = _module()
    assert len(DEMOS) >= 7, DEMOS
    assert all(callable(getattr(module, name, None)) for name in DEMOS), DEMOS


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
@pytest.mark.parametrize("name", DEMOS)
def test_each_demo_refuses_in_one_sentence_without_cuda(name):
    with pytest.raises(RuntimeError, match=r"^these demos need a CUDA GPU .*Colab$"):
        getattr(_module(), name)()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_running_the_script_without_cuda_exits_1_with_one_line(capsys):
    assert _module().main() == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("these demos need a CUDA GPU") and "\n" not in err


def _cudnn_script():
    return load_file(NOTEBOOKS / "scripts" / "cudnn_benchmark.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_the_cudnn_measurement_refuses_in_one_sentence_without_cuda(capsys):
    module = _cudnn_script()
    with pytest.raises(RuntimeError, match=r"^this measurement needs a CUDA GPU with cuDNN"):
        module.benchmark_modes()
    assert module.main() == 1 and "\n" not in capsys.readouterr().err.strip()
    assert torch.backends.cudnn.benchmark is False
