"""Every torch name the course uses exists on this torch; the inventory follows aliases."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import torch_api_check  # noqa: E402


@pytest.mark.slow  # imports torch.distributed, the profiler, pipelining...: a few seconds
def test_every_torch_name_and_keyword_the_course_uses_exists_here():
    result = torch_api_check.check()
    assert result["checked"] > 150, "the inventory found the course's torch calls"
    assert result["missing"] == [], result["where"]
    assert result["bad_keywords"] == []


def _fake_course(tmp_path: Path, code: str, cells: list[dict] | None = None) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text(code)
    (tmp_path / "notebooks").mkdir()
    nb = {"cells": cells or [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebooks" / "00_x.ipynb").write_text(json.dumps(nb))
    return tmp_path


def test_inventory_follows_aliases_and_reads_notebook_cells(tmp_path):
    code = (
        "import torch\nimport torch.nn as nn\nfrom torch.nn import functional as F\n"
        "def f(x):\n"
        "    return F.relu(nn.Linear(2, 2)(x), inplace=False) + torch.cuda.memory_allocated()\n"
    )
    cells = [
        {
            "cell_type": "code",
            "metadata": {},
            "source": "%%time\nfrom torch.utils.checkpoint import checkpoint\n",
        },
        {
            "cell_type": "code",
            "metadata": {},
            "source": "if True:\n    !nvidia-smi\ncheckpoint(f, 1, use_reentrant=False)\n",
        },
        {
            "cell_type": "code",
            "metadata": {"tags": ["raises-exception"]},
            "source": "nn.DataParallel(m, gpu_ids=[0])",
        },
    ]
    names, keywords = torch_api_check.inventory(_fake_course(tmp_path, code, cells))
    assert {"torch.nn.Linear", "torch.nn.functional.relu", "torch.cuda.memory_allocated"} <= set(
        names
    )
    assert "torch.utils.checkpoint.checkpoint" in names
    assert ("torch.nn.functional.relu", "inplace") in keywords
    assert ("torch.utils.checkpoint.checkpoint", "use_reentrant") in keywords
    assert not any(k == "gpu_ids" for _, k in keywords), "a cell meant to raise is left out"


def test_a_missing_name_and_a_wrong_keyword_are_reported(tmp_path):
    code = "import torch\ntorch.cuda.no_such_function()\ntorch.zeros_like(x, no_such_keyword=1)\n"
    result = torch_api_check.check(_fake_course(tmp_path, code))
    assert result["missing"] == ["torch.cuda.no_such_function"]
    assert result["where"]["torch.cuda.no_such_function"] == ["src/m.py"]


def test_resolve_walks_modules_then_attributes():
    import torch

    assert torch_api_check.resolve("torch.nn.functional.relu") is torch.nn.functional.relu
    with pytest.raises(LookupError):
        torch_api_check.resolve("torch.nn.NoSuchLayer")


def test_the_torch_floor_is_a_version_the_check_runs_on():
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=([0-9.]+)"', text).group(1)
    assert floor == torch_api_check.TESTED_FLOOR, (
        "pyproject's torch floor must be the oldest torch the API check and the notebooks run on"
    )
