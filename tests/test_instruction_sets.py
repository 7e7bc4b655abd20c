"""The course prints the same CPU numbers whatever instruction set the CPU has (issue 25, §6).

A CPU with native bf16 (AVX512-BF16, AMX: recent laptops and cloud machines) runs bf16 matrix
products in oneDNN; one without runs PyTorch's own kernels. ``ONEDNN_MAX_CPU_ISA=AVX2`` gives
the second path on a CPU of the first kind (oneDNN reads it once, at start). It cannot emulate
the other direction (native bf16 on a CPU without it), nor ATen's own vectorized kernels, which
``ATEN_CPU_CAPABILITY`` chooses. ``make test`` runs the notebooks on whatever CPU it has; this
runs notebooks 05 and 06, whose cells use bf16 on the CPU, once more under strict nbval with
oneDNN held to AVX2. On a CPU without native bf16 both runs take the same path.

Notebook 05 prints, beside its speed table, whether oneDNN takes its native bf16 path here; the
probes it reads are private (``torch.ops.mkldnn._is_mkldnn_bf16_supported``, ``torch.cpu._is_*``),
so the fast test below pins what they report, with and without ``ONEDNN_MAX_CPU_ISA=AVX2``.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
from conftest import ROOT

NOTEBOOKS = [
    "notebooks/05_mixed_precision_and_cudnn.ipynb",
    "notebooks/06_capstone_make_it_fit.ipynb",
]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_notebooks_05_and_06_print_the_same_under_onednn_avx2():
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    args = [sys.executable, "-m", "pytest", *NOTEBOOKS, "--nbval", "--nbval-current-env"]
    args += ["--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-q", "-p", "no:cacheprovider"]
    args += ["-n", "2", "--dist", "loadfile"]
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1400)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


PROBES = (
    "import torch; print(torch.ops.mkldnn._is_mkldnn_bf16_supported(), "
    "torch.ops.mkldnn._is_mkldnn_fp16_supported(), torch.cpu._is_avx512_bf16_supported(), "
    "torch.cpu._is_amx_tile_supported(), torch.cpu._is_amx_fp16_supported())"
)


def _probes(**env: str) -> list[str]:
    """What PROBES prints in a process whose environment adds ``env``: a new process, since
    oneDNN reads ONEDNN_MAX_CPU_ISA once; with nothing added, this process answers itself."""
    if not env:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(PROBES, {})
        return printed.getvalue().split()
    out = subprocess.run(
        [sys.executable, "-c", PROBES],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_notebook_05s_cpu_probes_exist_and_follow_onednn_max_cpu_isa():
    """The hardware probes see the CPU; oneDNN's own bf16 path turns off under AVX2."""
    free, held = _probes(), _probes(ONEDNN_MAX_CPU_ISA="AVX2")
    assert all(v in ("True", "False") for v in free + held), (free, held)
    assert held[2:] == free[2:], "the CPU's own flags do not depend on oneDNN's limit"
    assert held[:2] == ["False", "False"], "held to AVX2, oneDNN has no native bf16 or fp16 path"
    if free[2] == "True":  # AVX512-BF16 here: oneDNN takes the native path when not held
        assert free[0] == "True", free
