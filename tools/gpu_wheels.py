"""The wheels the GPU machine lacks: fetch them here (``make gpu-wheels``), check them anywhere.

``make gpu-check`` assumes only this of the machine it runs on (``TARGET``): Python 3.12, its own
build of torch, numpy, matplotlib, psutil, nvidia-ml-py and pytest, each with what it needs, and
no network. The machine we validate on (one NVIDIA H200) has more (hypothesis, attrs,
pytest-xdist, ...), but nothing more is counted on: everything else the check needs travels with
the working tree as wheels in ``.whl/`` (git-ignored), installed there with ``--no-index`` into a
folder of its own that comes first on the path.

Three lists decide what travels; all of them live in this file or beside it:

* ``NEEDED``: what the check imports on top of torch: the package's own dependencies
  (``pyproject.toml``), the notebook runner (nbclient, nbformat, ipykernel) and the unit tests'
  runner (pytest with pytest-xdist, pytest-timeout and hypothesis).
* ``ON_TARGET``: ``TARGET`` and what those packages need (read from their metadata). A wheel of
  one of these does not travel: the machine's own build is the one to test (torch above all).
* ``tools/gpu_wheels.txt``: the wheels that travel, pinned to ``constraints.txt``'s versions.

``tests/test_gpu_wheels.py`` checks in CI that the dependency closure of ``NEEDED`` (read
from the installed packages' metadata, markers evaluated for Python 3.12 on Linux x86_64) is
covered by ``gpu_wheels.txt`` plus ``ON_TARGET``, and that ``ON_TARGET`` holds nothing that
``TARGET`` does not bring: a missing wheel fails a unit test here, not the GPU run there.

    python tools/gpu_wheels.py download        # fetch every wheel into .whl/ (needs PyPI)
    python tools/gpu_wheels.py check           # .whl/ holds exactly the listed wheels
    python tools/gpu_wheels.py closure         # print the closure and what covers each package
    python tools/gpu_wheels.py verify          # after installing them: is every need met here?
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "tools" / "gpu_wheels.txt"
WHEEL_DIR = ROOT / ".whl"
PYTHON_VERSION = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# Markers as on the GPU machine, to read which requirements apply there.
TARGET_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
RUNNER = ("nbclient", "nbformat", "ipykernel")
# The unit tests: pytest's plugins that pyproject's settings use (-n, timeout) and hypothesis.
TEST_RUNNER = ("pytest", "pytest-xdist", "pytest-timeout", "hypothesis")
# All the check assumes of the GPU machine (docs/results/README.md says the same).
TARGET = ("torch", "numpy", "matplotlib", "psutil", "nvidia-ml-py", "pytest")
# TARGET and what it needs, limited to names that can appear in our closure (PEP 503 names).
# tests/test_gpu_wheels.py checks that each is TARGET or needed by it.
ON_TARGET = frozenset(
    {
        "contourpy",
        "cycler",
        "filelock",
        "fonttools",
        "fsspec",
        "iniconfig",
        "jinja2",
        "kiwisolver",
        "markupsafe",
        "matplotlib",
        "mpmath",
        "networkx",
        "numpy",
        "nvidia-ml-py",
        "packaging",
        "pillow",
        "pluggy",
        "psutil",
        "pygments",
        "pyparsing",
        "pytest",
        "python-dateutil",
        "setuptools",
        "sympy",
        "torch",
        "typing-extensions",
    }
)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """``{normalized name: version}`` of the wheels that travel."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version.strip():
            raise ValueError(f"{path.name} line {number}: write NAME==VERSION, not {raw!r}")
        pins[normalize(name.strip())] = version.strip()
    return pins


def read_constraints(path: Path = ROOT / "constraints.txt") -> dict[str, str]:
    """``{normalized name: version}`` from the tested pins."""
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalize(name)] = version.strip()
    return pins


def needed() -> list[str]:
    """The roots: pyproject's dependencies (their names), the notebook and the test runners."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0] for dep in project["dependencies"]]
    return sorted({normalize(n) for n in (*names, *RUNNER, *TEST_RUNNER)})


def closure(roots: list[str], stop: frozenset[str] = ON_TARGET) -> dict[str, str]:
    """``{package: who needs it}`` for every distribution the roots need on the target,
    read from the metadata of the packages installed here (``.venv``, the tested pins).
    The walk does not go below a package in ``stop`` (installed there with its own needs)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: dict[str, str] = {}
    todo = [(normalize(r), "needed") for r in roots]
    while todo:
        name, parent = todo.pop()
        if name in seen:
            continue
        seen[name] = parent
        if name in stop:
            continue  # installed there with its own dependencies (torch: its own CUDA build)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            raise LookupError(
                f"{name} (needed by {parent}) is not installed here, so its dependencies "
                "cannot be read: run `make .venv/.installed-stamp` first"
            ) from None
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(TARGET_MARKERS):
                continue
            todo.append((normalize(req.name), name))
    return seen


def uncovered(lock: dict[str, str] | None = None) -> dict[str, str]:
    """Packages of the closure that neither travel nor are on the target: ``{name: parent}``."""
    lock = read_lock() if lock is None else lock
    return {
        name: parent
        for name, parent in sorted(closure(needed()).items())
        if name not in lock and name not in ON_TARGET
    }


def _wheel_name(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return normalize(name), version


def check(folder: Path = WHEEL_DIR, lock: dict[str, str] | None = None) -> list[str]:
    """Problems with ``folder`` against the lock (an empty list when it is complete)."""
    lock = read_lock() if lock is None else lock
    if not folder.is_dir():
        return [f"{folder} does not exist: run `make gpu-wheels` first (here, with PyPI)"]
    have: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.whl")):
        name, version = _wheel_name(path)
        have.setdefault(name, []).append(version)
    problems = []
    for name, version in sorted(lock.items()):
        found = have.get(name, [])
        if version not in found:
            problems.append(f"missing {name}=={version} (found: {', '.join(found) or 'none'})")
    for name, versions in sorted(have.items()):
        if name not in lock:
            problems.append(f"unlisted wheel {name} {', '.join(versions)}: remove it")
        elif len(versions) > 1:
            problems.append(f"{name} has {len(versions)} versions; keep one")
    return problems


def download(folder: Path = WHEEL_DIR, timeout: int = 600) -> None:
    """Fetch every wheel of the lock for CPython 3.12 on manylinux x86_64 into ``folder``."""
    lock = read_lock()
    folder.mkdir(exist_ok=True)
    for stale in folder.glob("*.whl"):
        if _wheel_name(stale) not in lock.items():
            stale.unlink()
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    binary = {n: v for n, v in lock.items() if n not in SDIST_ONLY}
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
        req.write("".join(f"{n}=={v}\n" for n, v in sorted(binary.items())))
        req.flush()
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--only-binary=:all:", "--python-version", PYTHON_VERSION]
            + ["--implementation", "cp", *platform_args, "-d", str(folder), "-r", req.name],
            check=True,
            timeout=timeout,
        )
    for name in SDIST_ONLY:
        if name in lock:  # pure Python, published as a source archive only: build its wheel
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder)]
                + [f"{name}=={lock[name]}"],
                check=True,
                timeout=timeout,
            )


SDIST_ONLY = ("gputil",)  # GPUtil 1.4.0 (2018) has no wheel on PyPI


def _wheel_requirements(path: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA."""
    import zipfile

    with zipfile.ZipFile(path) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        text = whl.read(meta).decode("utf-8", "replace")
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def unmet(folder: Path = WHEEL_DIR) -> list[str]:
    """Requirements of the listed wheels that this environment does not meet, one sentence each.

    Run where the wheels are installed (their folder on ``sys.path``): a package missing there,
    or present in a version outside the range a wheel asks for, is named with who needs it.
    """
    from importlib import metadata

    from packaging.requirements import Requirement

    problems = []
    for path in sorted(folder.glob("*.whl")):
        owner = _wheel_name(path)[0]
        for text in _wheel_requirements(path):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                version = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                problems.append(f"{owner} needs {req}, which is not installed here")
                continue
            if req.specifier and not req.specifier.contains(version, prereleases=True):
                problems.append(f"{owner} needs {req}, but {req.name} {version} is installed")
    return problems


def size_bytes(folder: Path = WHEEL_DIR) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("download", "check", "closure", "verify"))
    parser.add_argument("--dir", type=Path, default=WHEEL_DIR, help="the wheel folder")
    args = parser.parse_args(argv)
    if args.command == "closure":
        lock = read_lock()
        for name, parent in sorted(closure(needed()).items()):
            where = (
                "travels" if name in lock else ("on the target" if name in ON_TARGET else "MISSING")
            )
            print(f"{name:28} {where:14} (needed by {parent})")
        return 1 if uncovered(lock) else 0
    if args.command == "verify":
        problems = unmet(args.dir)
        for problem in problems:
            print(problem)
        if not problems:
            print("every requirement of the listed wheels is met here")
        return 1 if problems else 0
    if args.command == "download":
        missing = uncovered()
        if missing:
            print(f"gpu_wheels.txt misses: {', '.join(missing)}", file=sys.stderr)
            return 1
        if shutil.which("git") and args.dir == WHEEL_DIR:  # wheels are never committed
            probe = ["git", "-C", str(ROOT), "check-ignore", "-q", ".whl/probe.whl"]
            if subprocess.run(probe, timeout=30).returncode != 0:
                print(".whl/ is not ignored by git: add it to .gitignore", file=sys.stderr)
                return 1
        download(args.dir)
    problems = check(args.dir)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        n = len(list(args.dir.glob("*.whl")))
        print(f"{args.dir}: {n} wheels, {size_bytes(args.dir) / 2**20:.1f} MiB, as listed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
