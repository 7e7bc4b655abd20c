"""Every notebook and the unit tests on another torch, in a virtualenv of its own.

    python tools/torch_check.py                          # the floor, 2.11.0 (make torch-check)
    python tools/torch_check.py --torch 2.15.0           # any release (make torch-check TORCH=...)
    python tools/torch_check.py --torch 2.11.0 --nbval   # also list the cells strict nbval flags

Our pin (``constraints.txt``) is the only torch CI runs the notebooks on; pyproject promises
``torch>=2.11``. This makes (or reuses) a virtualenv with ``torch==VERSION`` from the package
index, with what that release needs in the versions it asks for (2.11 wants setuptools<82), and
every other package as ``constraints.txt`` pins it, then, in that virtualenv, one after another:

1. the torch API check (``tools/torch_api_check.py``): every torch name the course uses exists;
2. every notebook top to bottom (``tools/run_notebooks.py``): nothing is compared with the
   committed outputs, every check cell must pass. The device is whatever is here: on a machine
   without a GPU, PyPI's Linux torch is a CUDA build without a driver, as on many laptops;
3. the unit tests ``make test`` runs (``-m "not slow or guard or heavy"``);
4. with ``--nbval``, strict nbval on every notebook, to list the cells whose outputs differ
   from the committed CPU references (a report, not a failure of this check).

It writes ``torch-VERSION.json`` and ``torch-VERSION.md`` into ``--out`` (each phase's time,
each notebook's result with the failing cell) and exits 0 only when phases 1 to 3 passed.
A CUDA build is several GB: the virtualenv goes to ``.venvs/`` (git-ignored) unless ``--venv``
says where. A pip configuration that caps torch (a ``constraint`` in pip.conf) stops the
install with pip's own message: lift it for the run (``PIP_CONFIG_FILE=/dev/null``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Phase", "constraints_without", "main", "summary"]

ROOT = Path(__file__).resolve().parent.parent
FLOOR = "2.11.0"  # pyproject's torch>=2.11 (torch_api_check.TESTED_FLOOR)
NBVAL_ARGS = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]
UNIT_MARKERS = "not slow or guard or heavy"  # what make test runs
INSTALL_TIMEOUT_S = 3600  # a CUDA build is several GB to download
NOTEBOOK_TIMEOUT_S = 1800  # one notebook, all its cells (07, 08, 05, 06 take minutes on 2 cores)
TESTS_TIMEOUT_S = 1800
_VERSION = re.compile(r"\d+\.\d+(\.\d+)?([a-z]+\d+)?(\.post\d+|\.dev\d+)?(\+[\w.]+)?")


@dataclass
class Phase:
    """One step of the check: what ran, whether it passed, how long it took."""

    name: str
    passed: bool
    seconds: float
    detail: str = ""
    items: list[dict] = field(default_factory=list)

    def __repr__(self) -> str:
        state = "passed" if self.passed else "FAILED"
        detail = f", {self.detail}" if self.detail else ""
        return f"Phase({self.name}: {state} in {self.seconds:.0f} s{detail})"


def constraints_without(text: str, names: set[str]) -> str:
    """``constraints.txt`` with the pins of ``names`` dropped (every other line kept as it is)."""
    drop = {_normalize(n) for n in names}
    kept = []
    for line in text.splitlines():
        name = re.split(r"[<>=!~;\[ ]", line.split("#", 1)[0].strip(), maxsplit=1)[0]
        if _normalize(name) not in drop:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> int:
    """Run ``cmd`` in the repository with its output in ``log``; 124 when it ran out of time
    (its whole process group is killed, so no kernel or worker outlives it)."""
    with log.open("w") as sink:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=0,
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            sink.write(f"\n[torch_check] stopped after {timeout:.0f} s\n")
            return 124
        except BaseException:  # Ctrl-C: the child group goes with us
            os.killpg(proc.pid, 9)
            proc.wait()
            raise


def _tail(log: Path, n: int = 400) -> str:
    return log.read_text(errors="replace").strip()[-n:]


def _stamp(torch: str, python: str, pip_args: list[str]) -> str:
    data = [torch, python, *pip_args]
    data += [(ROOT / f).read_text() for f in ("pyproject.toml", "constraints.txt")]
    return hashlib.sha256("\0".join(data).encode()).hexdigest()


def install(venv: Path, torch: str, python: str, pip_args: list[str], logs: Path) -> Phase:
    """Make ``venv`` hold torch==``torch`` and the course's pins; reuse it when it already does."""
    start = time.monotonic()
    stamp = venv / ".torch-check-stamp"
    wanted = _stamp(torch, python, pip_args)
    if stamp.is_file() and stamp.read_text() == wanted and (venv / "bin" / "python").is_file():
        return Phase("install", True, time.monotonic() - start, f"reused {venv}")
    if not (venv / "bin" / "python").is_file():
        rc = _run([python, "-m", "venv", str(venv)], logs / "venv.log", 300)
        if rc != 0:
            return Phase("install", False, time.monotonic() - start, _tail(logs / "venv.log"))
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--progress-bar", "off"]
    rc = _run([*pip, "-q", "--upgrade", "pip"], logs / "pip-upgrade.log", 600)
    # torch first, with what it needs as its own release asks (2.11 wants setuptools<82, say)
    rc = _run([*pip, *pip_args, f"torch=={torch}"], logs / "pip-torch.log", INSTALL_TIMEOUT_S)
    if rc != 0:
        why = f"pip exit {rc} installing torch=={torch}: {_tail(logs / 'pip-torch.log')}"
        return Phase("install", False, time.monotonic() - start, why)
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, timeout=300
    )
    brought = {d["name"] for d in json.loads(listed.stdout or "[]")} | {"torch"}
    # then the course, every other package as constraints.txt pins it
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
        pins.write(constraints_without((ROOT / "constraints.txt").read_text(), brought))
    try:
        cmd = [*pip, "-c", pins.name, *pip_args, f"torch=={torch}", "-e", ".[dev]"]
        rc = _run(cmd, logs / "pip-install.log", INSTALL_TIMEOUT_S)
    finally:
        os.unlink(pins.name)
    if rc != 0:
        why = f"pip exit {rc}: {_tail(logs / 'pip-install.log')}"
        return Phase("install", False, time.monotonic() - start, why)
    stamp.write_text(wanted)
    return Phase("install", True, time.monotonic() - start, f"made {venv}")


def probe(python: str, logs: Path, env: dict) -> dict:
    code = (
        "import json, platform, torch; print(json.dumps({'torch': torch.__version__, "
        "'cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available(), "
        "'python': platform.python_version()}))"
    )
    rc = _run([python, "-c", code], logs / "probe.log", 300, env)
    lines = [x for x in (logs / "probe.log").read_text().splitlines() if x.startswith("{")]
    return json.loads(lines[-1]) if rc == 0 and lines else {"error": _tail(logs / "probe.log")}


def api_check(python: str, logs: Path, env: dict) -> Phase:
    start = time.monotonic()
    rc = _run([python, "tools/torch_api_check.py"], logs / "torch-api.log", 600, env)
    return Phase(
        "torch API check", rc == 0, time.monotonic() - start, _tail(logs / "torch-api.log", 200)
    )


def notebooks(python: str, names: list[Path], work: Path, env: dict) -> Phase:
    start = time.monotonic()
    items = []
    for path in names:
        report = work / "reports" / f"{path.stem}.json"
        report.parent.mkdir(parents=True, exist_ok=True)
        cmd = [python, "tools/run_notebooks.py", "--output-dir", str(work / "notebooks")]
        cmd += ["--report", str(report), str(path)]
        began = time.monotonic()
        rc = _run(cmd, work / "logs" / f"notebook-{path.stem}.log", NOTEBOOK_TIMEOUT_S, env)
        if report.is_file():
            entry = json.loads(report.read_text())[0]
        else:
            why = "stopped: over its time" if rc == 124 else f"exit {rc}, no report"
            entry = {"name": path.name, "passed": False, "error": why}
            entry["seconds"] = round(time.monotonic() - began, 1)
        items.append(entry)
        print(f"  {entry['name']:45} {'passed' if entry['passed'] else 'FAILED'}", flush=True)
    passed = sum(e["passed"] for e in items)
    ok = passed == len(items) > 0
    return Phase("notebooks", ok, time.monotonic() - start, f"{passed}/{len(items)} passed", items)


def _pytest_summary(log: Path) -> str:
    lines = [x.strip("= ") for x in log.read_text(errors="replace").splitlines() if x.strip()]
    found = [x for x in lines if re.search(r"\d+ (passed|failed|error)", x)]
    return (found or lines or ["no output"])[-1]


def unit_tests(python: str, logs: Path, env: dict) -> Phase:
    start = time.monotonic()
    log = logs / "unit-tests.log"
    cmd = [python, "-m", "pytest", "tests", "-q", "-p", "no:nbval", "-m", UNIT_MARKERS]
    cmd += ["-n", "2", "--dist", "loadfile"]
    rc = _run(cmd, log, TESTS_TIMEOUT_S, env)
    failures = re.findall(r"^(?:FAILED|ERROR) (\S+)", log.read_text(errors="replace"), re.M)
    items = [{"test": f} for f in failures[:50]]
    return Phase("unit tests", rc == 0, time.monotonic() - start, _pytest_summary(log), items)


def strict_nbval(python: str, logs: Path, env: dict) -> Phase:
    start = time.monotonic()
    log = logs / "nbval.log"
    cmd = [python, "-m", "pytest", "notebooks", *NBVAL_ARGS, "-q", "-p", "no:cacheprovider"]
    cmd += ["-n", "2", "--dist", "loadfile"]
    rc = _run(cmd, log, TESTS_TIMEOUT_S, env)
    text = log.read_text(errors="replace")
    cells = sorted(set(re.findall(r"^FAILED (notebooks/\S+::Cell \d+)", text, re.M)))
    items = [{"cell": c} for c in cells]
    return Phase("strict nbval", rc == 0, time.monotonic() - start, _pytest_summary(log), items)


def summary(report: dict) -> str:
    """The run as markdown: the torch it ran, each phase, each notebook."""
    env = report.get("environment", {})
    lines = [
        f"# torch {report['torch']}: notebooks and unit tests, {report['date']}",
        "",
        f"- torch {env.get('torch', '?')} (CUDA {env.get('cuda')}, GPU available: "
        f"{env.get('cuda_available')}), Python {env.get('python', '?')}, venv `{report['venv']}`",
        f"- command: `{report['command']}`",
        "",
        "| phase | result | time | detail |",
        "| --- | --- | --- | --- |",
    ]
    for p in report["phases"]:
        detail = " ".join(p["detail"].split())[:160].replace("|", "\\|")
        result = "passed" if p["passed"] else "**FAILED**"
        lines.append(f"| {p['name']} | {result} | {p['seconds']:.0f} s | {detail} |")
    for p in report["phases"]:
        if p["name"] == "notebooks":
            lines += [
                "",
                "| notebook | result | time | failing cell |",
                "| --- | --- | --- | --- |",
            ]
            for n in p["items"]:
                where = (f"cell {n['cell']}: " if "cell" in n else "") + n.get("error", "")
                where = " ".join(where.split())[:200].replace("|", "\\|")
                result = "passed" if n["passed"] else "**FAILED**"
                lines.append(f"| {n['name']} | {result} | {n.get('seconds', 0):.0f} s | {where} |")
        elif p["items"]:
            lines += ["", f"{p['name']}:"] + [f"- {next(iter(i.values()))}" for i in p["items"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default=FLOOR, help=f"a torch release (default {FLOOR})")
    parser.add_argument("--python", default=sys.executable, help="makes the virtualenv")
    parser.add_argument("--venv", type=Path, help="default: .venvs/torch-VERSION-pyX.Y")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "torch-check")
    parser.add_argument("--pip-arg", action="append", default=[], help="passed to pip install")
    parser.add_argument(
        "--cpu", action="store_true", help="hide every GPU (CUDA_VISIBLE_DEVICES='')"
    )
    parser.add_argument("--nbval", action="store_true", help="also run strict nbval (a report)")
    parser.add_argument("--skip", action="append", default=[], choices=("notebooks", "tests"))
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: all of them")
    args = parser.parse_args(argv)
    if not _VERSION.fullmatch(args.torch):
        parser.error(f"--torch takes a release such as {FLOOR}, not {args.torch!r}")
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    try:
        pyver = subprocess.run(
            [args.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        parser.error(f"--python {args.python} does not run: give a Python 3.10 or newer")
    venv = (args.venv or ROOT / ".venvs" / f"torch-{args.torch}-py{pyver}").absolute()
    stem = f"torch-{args.torch}"
    work = args.out / stem
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    names = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    report = {
        "torch": args.torch,
        "date": dt.date.today().isoformat(),
        "venv": str(venv),
        "command": " ".join(["python tools/torch_check.py", *(argv or sys.argv[1:])]),
        "phases": [],
    }

    def record(phase: Phase) -> None:
        report["phases"].append(asdict(phase))
        (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / f"{stem}.md").write_text(summary(report))
        print(repr(phase), flush=True)

    phase = install(venv, args.torch, args.python, args.pip_arg, logs)
    record(phase)
    if not phase.passed:
        print(f"torch_check: the install failed; see {logs / 'pip-install.log'}", file=sys.stderr)
        return 1
    python = str(venv / "bin" / "python")
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    if args.cpu:  # every phase, so that strict nbval compares like with like
        env["CUDA_VISIBLE_DEVICES"] = ""
    report["environment"] = probe(python, logs, env)
    if "error" in report["environment"] or not report["environment"]["torch"].startswith(
        args.torch
    ):
        record(Phase("probe", False, 0.0, json.dumps(report["environment"])))
        return 1
    record(api_check(python, logs, env))
    if "notebooks" not in args.skip:
        record(notebooks(python, names, work, env))
    if "tests" not in args.skip:
        record(unit_tests(python, logs, env))
    if args.nbval:
        nbval = strict_nbval(python, logs, env)
        nbval.name = "strict nbval (report only)"
        record(nbval)
    ok = all(p["passed"] for p in report["phases"] if not p["name"].startswith("strict nbval"))
    print(summary(report))
    print(f"torch_check: wrote {stem}.json and {stem}.md into {args.out}; logs in {logs}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
