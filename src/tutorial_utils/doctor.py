"""``python -m tutorial_utils doctor``: the learner's environment as one table.

An instructor runs it on every seat before a workshop::

    python -m tutorial_utils doctor --require gpu --require widgets

and it exits non-zero with one sentence per missing thing. In a notebook, ``doctor()`` returns
a ``DoctorReport`` that renders as a table. No check ever raises: a broken driver, a missing
NVML library or an ``nvidia-smi`` that fails each become a row saying what is missing.

No check hangs either: the calls outside Python (NVML, ``nvidia-smi``, GPUtil's ``nvidia-smi``)
run side by side, each with a timeout (``timeout_s``, 10 s by default); one that does not
answer in time becomes a row saying "timed out after 10 s", and no ``nvidia-smi`` process it
started is left running.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import importlib.metadata
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import psutil

from . import monitor, nvml, processes
from .units import format_bytes

__all__ = ["Check", "DEFAULT_TIMEOUT_S", "DoctorReport", "doctor", "main", "parse_requirement"]

OK, MISSING, INFO = "ok", "missing", "info"
#: Seconds each call outside Python (NVML, nvidia-smi, GPUtil) may take before its row says so.
DEFAULT_TIMEOUT_S = 10.0
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]+$")


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
                loaded = _load_torch()
                reason = loaded[1].cuda_unavailable_reason() if loaded[0] else loaded[2]
                why = f" ({reason})" if reason else ""
                problems.append(f"Needs {n} GPU(s) but found {self.gpu_count}{why}.")
            elif kind == "widgets" and not self.widgets_ok:
                problems.append(
                    "Needs ipywidgets with the JupyterLab widget extension: "
                    "pip install ipywidgets jupyterlab_widgets, then restart JupyterLab."
                )
            elif kind == "nvml" and not self.nvml_ok:
                problems.append(
                    "Needs NVML (the NVIDIA driver's management library, read through "
                    "nvidia-ml-py); see the NVML row above for why it is not working."
                )
        return problems


def parse_requirement(text: str) -> tuple[str, int]:
    """``'gpu'`` -> ``('gpus', 1)``, ``'gpus=2'`` -> ``('gpus', 2)``, ``'widgets'``, ``'nvml'``."""
    if not isinstance(text, str):
        raise TypeError(f"a requirement is text: gpu, gpus=N, widgets or nvml; got {text!r}")
    t = text.strip().lower()
    if t == "gpu":
        return "gpus", 1
    if t.startswith("gpus="):
        try:
            n = int(t.removeprefix("gpus="))
        except ValueError:
            n = -1
        if n < 1:
            raise ValueError(
                f"{text!r}: write gpus=N with N a whole number of at least 1, e.g. gpus=2"
            )
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


def _load_torch():
    """``(torch, devices, "")``, or ``(None, None, why)`` when torch cannot be imported.

    Imported here, not at the top of the module: the doctor is what a learner runs when torch
    is missing or broken (a wrong wheel, a half-finished install), and it must say so in a row.
    """
    try:
        import torch

        from . import devices
    except Exception as exc:  # ImportError, OSError from a broken library, anything: a row
        text = str(exc).strip().splitlines()
        return None, None, f"{type(exc).__name__}: {text[0] if text else 'no message'}"
    return torch, devices, ""


def _torch_checks() -> list[Check]:
    import torch

    cuda = torch.version.cuda
    build = (
        f"CUDA {cuda}"
        if cuda
        else (
            "ROCm " + torch.version.hip if getattr(torch.version, "hip", None) else "CPU-only build"
        )
    )
    rows = [Check("torch", OK, f"{torch.__version__} ({build})")]
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        cudnn = None
    rows.append(
        Check(
            "cuDNN",
            OK if cudnn else INFO,
            str(cudnn) if cudnn else "not available (needs a CUDA build and a GPU)",
        )
    )
    return rows


def _gpu_checks() -> tuple[list[Check], int]:
    from . import devices

    reason = devices.cuda_unavailable_reason()
    if reason is not None:
        return [Check("GPUs", MISSING, reason)], 0
    infos = [d for d in devices.list_devices() if d.device.type == "cuda"]
    rows = [Check(f"GPU {d.device.index}", OK, str(d).split(": ", 1)[1]) for d in infos]
    return rows or [Check("GPUs", MISSING, "CUDA works but reports no device")], len(infos)


def _nvml_check(timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[Check, bool]:
    status = nvml.probe(timeout_s)
    if not status.available:
        return Check("NVML", MISSING, status.reason), False
    names = ", ".join(
        f"{d.name} ({format_bytes(d.used_bytes)} used of {format_bytes(d.total_bytes)})"
        for d in status.devices
    )
    return Check(
        "NVML", OK, f"driver {status.driver_version}; {len(status.devices)} device(s): {names}"
    ), True


def _nvidia_smi_check(timeout_s: float = DEFAULT_TIMEOUT_S) -> Check:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return Check("nvidia-smi", MISSING, "not on PATH (comes with the NVIDIA driver)")
    try:
        proc = processes.run(
            [exe, "--query-gpu=index,uuid,name", "--format=csv,noheader"], timeout_s
        )
    except subprocess.TimeoutExpired:
        return Check("nvidia-smi", MISSING, f"did not answer: timed out after {timeout_s:g} s")
    except OSError as exc:
        return Check("nvidia-smi", MISSING, f"could not run: {exc}")
    if proc.returncode != 0:
        first = (proc.stdout + proc.stderr).strip().splitlines()[:1]
        return Check(
            "nvidia-smi", MISSING, f"fails with exit code {proc.returncode}: {' '.join(first)}"
        )
    lines = [line for line in proc.stdout.strip().splitlines() if line.strip()]
    for line in lines:  # "0, GPU-5d6c..., NVIDIA H100 80GB HBM3"
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit() or not _UUID.match(fields[1]):
            return Check(
                "nvidia-smi",
                MISSING,
                f"answers with something that is not a list of GPUs: {line.strip()[:80]!r}",
            )
    if not lines:
        return Check("nvidia-smi", INFO, "answers, but lists no GPU")
    return Check("nvidia-smi", OK, f"sees {len(lines)} GPU(s)")


def _gputil_check(timeout_s: float = DEFAULT_TIMEOUT_S) -> Check:
    version = _version("GPUtil")
    if version is None:
        return Check("GPUtil", INFO, "not installed (only the source guide uses it)")
    if shutil.which("nvidia-smi") is None:  # GPUtil finds nothing to run: it sees no GPU
        return Check("GPUtil", INFO, f"{version}: sees 0 GPU(s); starts nvidia-smi on every call")
    try:
        gpus = monitor.gputil_gpus(timeout_s)
    except monitor.SourceError as exc:
        return Check("GPUtil", MISSING, f"{version}: {exc}")
    except Exception as exc:
        return Check("GPUtil", MISSING, f"{version}: {type(exc).__name__}: {exc}")
    return Check(
        "GPUtil",
        OK if gpus else INFO,
        f"{version}: sees {len(gpus)} GPU(s); starts nvidia-smi on every call",
    )


def _in_background(fn: Callable[[], object], name: str, limit_s: float) -> Callable[[], object]:
    """Start ``fn()`` in a thread now; the returned function waits at most ``limit_s`` for it.

    Each call is bounded by its own timeout already; ``limit_s`` is the last line of defence (a
    lock inside a library we do not own): past it, the row says so instead of waiting forever.
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except Exception as exc:  # the checks never raise; a bug still becomes a row
            box["value"] = exc

    thread = threading.Thread(target=target, name=f"doctor {name}", daemon=True)
    thread.start()

    def result() -> object:
        thread.join(limit_s)
        if thread.is_alive():
            return Check(name, MISSING, f"did not answer: gave up after {limit_s:g} s")
        return box["value"]

    return result


def _widget_checks() -> tuple[list[Check], bool]:
    rows = []
    ipw = _version("ipywidgets")
    rows.append(
        Check("ipywidgets", OK if ipw else MISSING, ipw or "not installed: pip install ipywidgets")
    )
    ext = _version("jupyterlab_widgets")
    ext_dir = None
    if ext:
        try:  # deferred: jupyter_core comes with Jupyter, which some machines do not have
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
        rows.append(
            Check(
                "widget extension",
                MISSING,
                f"jupyterlab_widgets {ext} is installed but its lab extension files are not found",
            )
        )
    elif where_running().startswith("Colab"):
        rows.append(Check("widget extension", OK, "Colab renders ipywidgets itself"))
    else:
        rows.append(
            Check(
                "widget extension",
                MISSING,
                "jupyterlab_widgets not installed: pip install jupyterlab_widgets",
            )
        )
    lab = _version("jupyterlab")
    rows.append(
        Check(
            "JupyterLab",
            OK if lab else INFO,
            lab or "not installed here (fine on Colab or VS Code)",
        )
    )
    return rows, bool(ipw) and rows[1].status == OK


#: The longest a check may take: a tool that has not answered in ten minutes will not.
MAX_TIMEOUT_S = 600.0


def _check_timeout(timeout_s: object) -> float:
    """``timeout_s`` checked once for ``doctor()`` and ``--timeout``: a positive number of
    seconds no larger than ``MAX_TIMEOUT_S`` (a thread's wait overflows far below 1e308)."""
    if isinstance(timeout_s, bool) or not (
        isinstance(timeout_s, (int, float))
        and math.isfinite(timeout_s)
        and 0 < timeout_s <= MAX_TIMEOUT_S
    ):
        raise ValueError(
            f"timeout_s must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}; "
            f"got {timeout_s!r}"
        )
    return float(timeout_s)


def doctor(timeout_s: float = DEFAULT_TIMEOUT_S) -> DoctorReport:
    """Check everything the course uses. Never raises, never hangs.

    ``timeout_s``: seconds each call outside Python (NVML, nvidia-smi, GPUtil) may take; they run
    side by side, so a machine where all three hang still answers after about ``timeout_s``.
    """
    timeout_s = _check_timeout(timeout_s)
    # Imports happen here, in one thread: importing GPUtil (distutils, through setuptools' hook)
    # in one thread while another forks or imports was seen to hang the doctor.
    with contextlib.suppress(ImportError):
        importlib.import_module("GPUtil")
    limit_s = 2 * timeout_s + 5  # each check may wait out its timeout, then clean up
    nvml_result = _in_background(lambda: _nvml_check(timeout_s), "NVML", limit_s)
    smi_result = _in_background(lambda: _nvidia_smi_check(timeout_s), "nvidia-smi", limit_s)
    gputil_result = _in_background(lambda: _gputil_check(timeout_s), "GPUtil", limit_s)
    report = DoctorReport()
    add = report.checks.append
    add(Check("where", INFO, where_running()))
    add(
        Check(
            "Python", OK, f"{platform.python_version()} ({platform.system()} {platform.machine()})"
        )
    )
    torch, devices, torch_problem = _load_torch()
    if torch is None:
        add(
            Check(
                "torch",
                MISSING,
                f"cannot be imported ({torch_problem}); reinstall the course's pin: "
                "pip install -c constraints.txt torch (or make lab, which does it)",
            )
        )
        add(Check("GPUs", MISSING, "unknown: torch cannot be imported (see the torch row)"))
    else:
        report.checks.extend(_torch_checks())
        gpu_rows, report.gpu_count = _gpu_checks()
        report.checks.extend(gpu_rows)
        add(
            Check(
                "MPS",
                OK if devices.mps_available() else INFO,
                "available" if devices.mps_available() else "not available (Apple silicon only)",
            )
        )
    nvml_value = nvml_result()
    if isinstance(nvml_value, Check):  # gave up waiting
        nvml_value = (nvml_value, False)
    if isinstance(nvml_value, Exception):
        nvml_value = (Check("NVML", MISSING, f"{type(nvml_value).__name__}: {nvml_value}"), False)
    nvml_row, report.nvml_ok = nvml_value  # type: ignore[misc]
    add(nvml_row)
    for name, result in (("nvidia-smi", smi_result), ("GPUtil", gputil_result)):
        value = result()
        add(value if isinstance(value, Check) else Check(name, MISSING, f"{value!r}"))
    try:
        if torch is None:
            raise RuntimeError("unknown: torch cannot be imported (see the torch row)")
        import torch.distributed as dist

        backends = [
            b
            for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()))
            if ok
        ]
        add(
            Check(
                "torch.distributed",
                OK if backends else MISSING,
                ", ".join(backends) or "no backend",
            )
        )
    except Exception as exc:
        add(Check("torch.distributed", MISSING, str(exc)))
    widget_rows, report.widgets_ok = _widget_checks()
    report.checks.extend(widget_rows)
    for dist_name in ("matplotlib", "psutil"):
        v = _version(dist_name)
        add(Check(dist_name, OK if v else MISSING, v or f"not installed: pip install {dist_name}"))
    try:
        vm = psutil.virtual_memory()
        add(
            Check(
                "CPU and RAM",
                INFO,
                f"{os.cpu_count()} logical cores, "
                f"{format_bytes(vm.available)} free of {format_bytes(vm.total)}",
            )
        )
    except Exception as exc:
        add(Check("CPU and RAM", INFO, f"{os.cpu_count()} logical cores; memory unknown ({exc})"))
    return report


def _requirements(items: Sequence[str]) -> list[str]:
    """``--require`` values, split at commas and checked; an empty one is an error."""
    pieces = [r.strip() for item in items for r in item.split(",")]
    if any(not r for r in pieces):
        raise ValueError("--require needs a value: gpu, gpus=N, widgets or nvml (got an empty one)")
    for r in pieces:
        parse_requirement(r)
    return pieces


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    try:
        return _check_timeout(value)
    except ValueError:
        raise ValueError(
            f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}; "
            f"got {text!r}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils doctor",
        description="Show the environment the course runs in; "
        "with --require, fail unless it has what a workshop needs.",
    )
    parser.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="WHAT",
        help="gpu, gpus=N, widgets or nvml; repeat it or separate with commas",
    )
    parser.add_argument(
        "--timeout",
        default=str(DEFAULT_TIMEOUT_S),
        metavar="SECONDS",
        help=f"how long NVML and nvidia-smi may take to answer (default {DEFAULT_TIMEOUT_S:g})",
    )
    args = parser.parse_args(argv)
    try:
        requirements = _requirements(args.require)
        timeout_s = _seconds(args.timeout)
    except ValueError as exc:
        print(f"doctor: {exc}", file=sys.stderr)
        return 2
    report = doctor(timeout_s)
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
