"""``python -m tutorial_utils doctor``: the learner's environment as one table.

An instructor runs it on every seat before a workshop::

    python -m tutorial_utils doctor --require gpu --require widgets

and it exits non-zero with one sentence per missing thing. In a notebook, ``doctor()`` returns
a ``DoctorReport`` that renders as a table. No check ever raises: a broken driver, a missing
NVML library or an ``nvidia-smi`` that fails each become a row saying what is missing.
"""

from __future__ import annotations

import argparse
import html
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from . import devices, nvml
from .units import format_bytes

__all__ = ["Check", "DoctorReport", "doctor", "main", "parse_requirement"]

OK, MISSING, INFO = "ok", "missing", "info"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "missing" or "info"
    detail: str


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    gpu_count: int = 0
    widgets_ok: bool = False
    nvml_ok: bool = False

    def __str__(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = [f"{'check'.ljust(width)}  status   detail", f"{'-' * width}  -------  ------"]
        lines += [f"{c.name.ljust(width)}  {c.status.ljust(7)}  {c.detail}" for c in self.checks]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colors = {OK: "#1a7f37", MISSING: "#cf222e", INFO: "#57606a"}
        rows = "".join(
            f"<tr><td>{html.escape(c.name)}</td>"
            f"<td style='color:{colors.get(c.status, '#000')};font-weight:bold'>{c.status}</td>"
            f"<td style='text-align:left'>{html.escape(c.detail)}</td></tr>"
            for c in self.checks
        )
        return (
            "<table><thead><tr><th>check</th><th>status</th><th style='text-align:left'>detail</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>"
        )

    def missing(self, requirements: Iterable[str]) -> list[str]:
        """One sentence per requirement this machine does not meet (empty when all are met)."""
        problems = []
        for req in requirements:
            kind, n = parse_requirement(req)
            if kind == "gpus" and self.gpu_count < n:
                reason = devices.cuda_unavailable_reason()
                why = f" ({reason})" if reason else ""
                problems.append(f"Needs {n} GPU(s) but found {self.gpu_count}{why}.")
            elif kind == "widgets" and not self.widgets_ok:
                problems.append(
                    "Needs ipywidgets with the JupyterLab widget extension: "
                    "pip install ipywidgets jupyterlab_widgets, then restart JupyterLab."
                )
            elif kind == "nvml" and not self.nvml_ok:
                problems.append(
                    "Needs NVML (the NVIDIA driver's management library, read through nvidia-ml-py); "
                    "see the NVML row above for why it is not working."
                )
        return problems


def parse_requirement(text: str) -> tuple[str, int]:
    """``'gpu'`` -> ``('gpus', 1)``, ``'gpus=2'`` -> ``('gpus', 2)``, ``'widgets'``, ``'nvml'``."""
    t = text.strip().lower()
    if t == "gpu":
        return "gpus", 1
    if t.startswith("gpus="):
        try:
            n = int(t.removeprefix("gpus="))
        except ValueError:
            n = -1
        if n < 1:
            raise ValueError(f"{text!r}: write gpus=N with N a whole number of at least 1, e.g. gpus=2")
        return "gpus", n
    if t in ("widgets", "nvml"):
        return t, 0
    raise ValueError(f"unknown requirement {text!r}: use gpu, gpus=N, widgets or nvml")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def where_running() -> str:
    """'Colab', 'Binder' or 'local', from the environment variables each service sets."""
    if "COLAB_RELEASE_TAG" in os.environ:
        return f"Colab ({os.environ['COLAB_RELEASE_TAG']})"
    if any(k.startswith("BINDER_") for k in os.environ):
        return "Binder"
    return "local"


def _torch_checks() -> list[Check]:
    cuda = torch.version.cuda
    build = f"CUDA {cuda}" if cuda else ("ROCm " + torch.version.hip if getattr(torch.version, "hip", None) else "CPU-only build")
    rows = [Check("torch", OK, f"{torch.__version__} ({build})")]
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        cudnn = None
    rows.append(Check("cuDNN", OK if cudnn else INFO, str(cudnn) if cudnn else "not available (needs a CUDA build and a GPU)"))
    return rows


def _gpu_checks() -> tuple[list[Check], int]:
    reason = devices.cuda_unavailable_reason()
    if reason is not None:
        return [Check("GPUs", MISSING, reason)], 0
    infos = [d for d in devices.list_devices() if d.device.type == "cuda"]
    rows = [Check(f"GPU {d.device.index}", OK, str(d).split(": ", 1)[1]) for d in infos]
    return rows or [Check("GPUs", MISSING, "CUDA works but reports no device")], len(infos)


def _nvml_check() -> tuple[Check, bool]:
    status = nvml.probe()
    if not status.available:
        return Check("NVML", MISSING, status.reason), False
    names = ", ".join(
        f"{d.name} ({format_bytes(d.used_bytes)} used of {format_bytes(d.total_bytes)})" for d in status.devices
    )
    return Check("NVML", OK, f"driver {status.driver_version}; {len(status.devices)} device(s): {names}"), True


def _nvidia_smi_check() -> Check:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return Check("nvidia-smi", MISSING, "not on PATH (comes with the NVIDIA driver)")
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=15, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("nvidia-smi", MISSING, f"could not run: {exc}")
    if proc.returncode != 0:
        first = (proc.stdout + proc.stderr).strip().splitlines()[:1]
        return Check("nvidia-smi", MISSING, f"fails with exit code {proc.returncode}: {' '.join(first)}")
    return Check("nvidia-smi", OK, f"sees {len(proc.stdout.strip().splitlines())} GPU(s)")


def _gputil_check() -> Check:
    version = _version("GPUtil")
    if version is None:
        return Check("GPUtil", INFO, "not installed (only the source guide uses it)")
    try:
        import GPUtil

        gpus = GPUtil.getGPUs()
    except ValueError as exc:  # GPUtil parses nvidia-smi's output; a failing nvidia-smi gives ValueError
        return Check("GPUtil", MISSING, f"{version}: nvidia-smi gave output GPUtil cannot parse ({exc})")
    except Exception as exc:
        return Check("GPUtil", MISSING, f"{version}: {type(exc).__name__}: {exc}")
    return Check("GPUtil", OK if gpus else INFO, f"{version}: sees {len(gpus)} GPU(s); starts nvidia-smi on every call")


def _widget_checks() -> tuple[list[Check], bool]:
    rows = []
    ipw = _version("ipywidgets")
    rows.append(Check("ipywidgets", OK if ipw else MISSING, ipw or "not installed: pip install ipywidgets"))
    ext = _version("jupyterlab_widgets")
    ext_dir = None
    if ext:
        try:
            from jupyter_core.paths import jupyter_path

            for base in jupyter_path("labextensions"):
                candidate = os.path.join(base, "@jupyter-widgets", "jupyterlab-manager")
                if os.path.isdir(candidate):
                    ext_dir = candidate
                    break
        except ImportError:
            pass
    if ext and ext_dir:
        rows.append(Check("widget extension", OK, f"jupyterlab_widgets {ext}"))
    elif ext:
        rows.append(Check("widget extension", MISSING, f"jupyterlab_widgets {ext} is installed but its lab extension files are not found"))
    elif where_running().startswith("Colab"):
        rows.append(Check("widget extension", OK, "Colab renders ipywidgets itself"))
    else:
        rows.append(Check("widget extension", MISSING, "jupyterlab_widgets not installed: pip install jupyterlab_widgets"))
    lab = _version("jupyterlab")
    rows.append(Check("JupyterLab", OK if lab else INFO, lab or "not installed here (fine on Colab or VS Code)"))
    return rows, bool(ipw) and rows[1].status == OK


def doctor() -> DoctorReport:
    """Check everything the course uses. Never raises."""
    report = DoctorReport()
    add = report.checks.append
    add(Check("where", INFO, where_running()))
    add(Check("Python", OK, f"{platform.python_version()} ({platform.system()} {platform.machine()})"))
    report.checks.extend(_torch_checks())
    gpu_rows, report.gpu_count = _gpu_checks()
    report.checks.extend(gpu_rows)
    add(Check("MPS", OK if devices.mps_available() else INFO, "available" if devices.mps_available() else "not available (Apple silicon only)"))
    nvml_row, report.nvml_ok = _nvml_check()
    add(nvml_row)
    add(_nvidia_smi_check())
    add(_gputil_check())
    try:
        import torch.distributed as dist

        backends = [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available())) if ok]
        add(Check("torch.distributed", OK if backends else MISSING, ", ".join(backends) or "no backend"))
    except Exception as exc:
        add(Check("torch.distributed", MISSING, str(exc)))
    widget_rows, report.widgets_ok = _widget_checks()
    report.checks.extend(widget_rows)
    for dist_name in ("matplotlib", "psutil"):
        v = _version(dist_name)
        add(Check(dist_name, OK if v else MISSING, v or f"not installed: pip install {dist_name}"))
    try:
        import psutil

        vm = psutil.virtual_memory()
        add(Check("CPU and RAM", INFO, f"{os.cpu_count()} logical cores, {format_bytes(vm.available)} free of {format_bytes(vm.total)}"))
    except Exception as exc:
        add(Check("CPU and RAM", INFO, f"{os.cpu_count()} logical cores; memory unknown ({exc})"))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils doctor",
        description="Show the environment the course runs in; with --require, fail unless it has what a workshop needs.",
    )
    parser.add_argument(
        "--require", action="append", default=[], metavar="WHAT",
        help="gpu, gpus=N, widgets or nvml; repeat it or separate with commas",
    )
    args = parser.parse_args(argv)
    requirements = [r for item in args.require for r in item.split(",") if r.strip()]
    try:
        for r in requirements:
            parse_requirement(r)
    except ValueError as exc:
        print(f"doctor: {exc}", file=sys.stderr)
        return 2
    report = doctor()
    print(report)
    problems = report.missing(requirements)
    if problems:
        print("\nThis machine is not ready:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    if requirements:
        print(f"\nReady: {', '.join(requirements)}.")
    return 0
