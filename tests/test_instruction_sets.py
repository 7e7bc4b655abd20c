"""The course prints the same CPU numbers whatever instruction set the CPU has (issue 25, §6).

A CPU with native bf16 (AVX512-BF16, AMX: recent laptops and cloud machines) runs bf16 matrix
products in oneDNN; one without runs PyTorch's own kernels. ``ONEDNN_MAX_CPU_ISA=AVX2`` gives
the second path on a CPU of the first kind (oneDNN reads it once, at start). It cannot emulate
the other direction (native bf16 on a CPU without it), nor ATen's own vectorized kernels, which
``ATEN_CPU_CAPABILITY`` chooses. ``make test`` runs the notebooks on whatever CPU it has; this
runs notebooks 05 and 06, whose cells use bf16 on the CPU, once more under strict nbval with
oneDNN held to AVX2. On a CPU without native bf16 both runs take the same path.
"""

from __future__ import annotations

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
def test_notebooks_06_and_07_print_the_same_under_onednn_avx2():
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    args = [sys.executable, "-m", "pytest", *NOTEBOOKS, "--nbval", "--nbval-current-env"]
    args += ["--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-q", "-p", "no:cacheprovider"]
    args += ["-n", "2", "--dist", "loadfile"]
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1400)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
