"""tools/torch_check.py: another torch in a virtualenv of its own; the pins, the arguments, the
report. (The run itself downloads a torch: make torch-check, not CI.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import torch_check  # noqa: E402


def test_only_the_pins_of_what_torch_brought_are_dropped():
    # torch 2.11 asks for setuptools<82, the pins hold 84.2.1: pip refused the whole install
    text = (ROOT / "constraints.txt").read_text()
    kept = torch_check.constraints_without(text, {"torch", "setuptools", "typing-extensions"})
    dropped = set(text.splitlines()) - set(kept.splitlines())
    assert {line.split("==")[0] for line in dropped} == {"torch", "setuptools", "typing_extensions"}
    assert len(kept.splitlines()) == len(text.splitlines()) - 3
    assert torch_check.constraints_without("torchvision==1.0\n", {"torch"}) == "torchvision==1.0\n"
    assert torch_check.constraints_without("Torch == 2.13.0 ; python_version>'3'\n", {"torch"}) == (
        "\n"
    )


def test_the_default_is_the_floor_pyproject_promises():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"torch>=2.11"' in text and torch_check.FLOOR.startswith("2.11.")
    import torch_api_check

    assert torch_check.FLOOR.startswith(torch_api_check.TESTED_FLOOR + ".")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--torch", "latest"], "--torch takes a release such as 2.11.0, not 'latest'"),
        (["--python", "/no/such/python"], "does not run: give a Python 3.10 or newer"),
        (["notebooks/99_missing.ipynb"], "no such notebook: notebooks/99_missing.ipynb"),
    ],
)
def test_bad_arguments_are_one_sentence(args, says, capsys):
    with pytest.raises(SystemExit) as exc:
        torch_check.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and not any("Traceback" in line for line in err)


def test_the_summary_names_each_phase_and_the_failing_cell():
    report = {
        "torch": "2.11.0",
        "date": "2026-12-01",
        "venv": "/v",
        "command": "python tools/torch_check.py --torch 2.11.0",
        "environment": {"torch": "2.11.0+cu130", "cuda": "13.0", "cuda_available": False},
        "phases": [
            {"name": "install", "passed": True, "seconds": 300.0, "detail": "made /v", "items": []},
            {
                "name": "notebooks",
                "passed": False,
                "seconds": 600.0,
                "detail": "7/8 passed",
                "items": [
                    {"name": "00_start_here.ipynb", "passed": True, "seconds": 20.0},
                    {
                        "name": "04_out_of_memory.ipynb",
                        "passed": False,
                        "seconds": 90.0,
                        "cell": 89,
                        "error": "KeyError: 'make_big'",
                    },
                ],
            },
        ],
    }
    text = torch_check.summary(report)
    assert text.startswith("# torch 2.11.0: notebooks and unit tests, 2026-12-01")
    assert "torch 2.11.0+cu130 (CUDA 13.0, GPU available: False)" in text
    assert "| notebooks | **FAILED** | 600 s | 7/8 passed |" in text
    assert "| 04_out_of_memory.ipynb | **FAILED** | 90 s | cell 89: KeyError: 'make_big' |" in text
    assert repr(torch_check.Phase("install", True, 3.2, "reused /v")) == (
        "Phase(install: passed in 3 s, reused /v)"
    )


def test_the_virtualenvs_are_ignored_by_git():
    assert ".venvs/" in (ROOT / ".gitignore").read_text().split()
