"""The GPU check: every notebook, the unit tests and the benchmarks, on a GPU, in one command.

    python3 tools/gpu_check.py --out "$OUT"                 # on the GPU machine (make gpu-check)
    python3 tools/gpu_check.py --out /tmp/x --allow-cpu     # the same run on a CPU, to try it

Made for the machine we validate on (one NVIDIA H200: Python 3.12, its own CUDA torch, no
Jupyter, no network): it installs the wheels that ``make gpu-wheels`` put in ``.whl/`` into a
temporary folder (``pip --no-index --target``), puts that folder and ``src/`` on PYTHONPATH
for every child process, then, each with a timeout inside one overall budget (default 330 s):

1. probe: device, compute capability, memory, driver, torch; the torch API check
   (``tools/torch_api_check.py``) against this machine's torch;
2. benchmarks (``benchmarks/gpu_bench.py``), alone on the GPU so their timings are clean;
3. every notebook top to bottom (``tools/run_notebooks.py``; outputs are not compared, every
   check cell must pass), three at a time, while the unit tests run beside them.

It writes exactly three files into ``--out``, named by device and date:
``NAME.json`` (the ``tutorial_utils.recorded`` schema: device, driver, torch, date, each
notebook's pass/fail and time, the unit tests, each benchmark figure under ``recorded.KEYS``,
the goals), ``NAME.md`` (the same for people) and ``NAME-notebooks.tar.gz`` (the executed
notebooks and every log). They are rewritten after each phase, so a run cut short still
leaves what it had. The exit status is 0 only when everything passed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gpu_wheels  # noqa: E402

SCHEMA = 1
# Longest first, so three lanes finish together (times seen on a CPU: 07 and 08 launch torchrun).
# Keyed by the part of the name before the first "_" ("03" for 03_where_memory_goes.ipynb).
NOTEBOOK_ORDER = (
    "07",
    "12",
    "11",
    "10",
    "09",
    "08",
    "13",
    "14",
    "04",
    "05",
    "06",
    "03",
    "01",
    "00",
    "02",
)


def _number(notebook: Path) -> str:
    """A notebook's number as NOTEBOOK_ORDER spells it: the part of its name before "_"."""
    return notebook.name.split("_")[0]


# Unit tests that need the development stack the GPU machine lacks (browser, JupyterLab,
# repo2docker, a kernel runner): not collected there when their module is missing, and the
# summary says which.
DEV_ONLY_TESTS = {
    "playwright": ["tests/test_browser.py"],
    "repo2docker": ["tests/test_binder.py"],
    "jupyterlab": [
        "tests/test_lab.py",
        "tests/test_doctor.py::test_require_exit_codes",  # `--require widgets` wants JupyterLab
        "tests/test_doctor.py::test_cli_end_to_end",
        "tests/test_faults.py::test_lab_token_is_in_no_command_line",  # serves a real lab
    ],
    "nbclient": [
        "tests/test_gauges.py::test_a_notebook_with_a_running_gauge_has_exactly_its_own_outputs"
    ],
    # strict nbval of 05 and 06 under ONEDNN_MAX_CPU_ISA=AVX2 (a CPU question, and nbval compares
    # with outputs saved on torch 2.13: the notebooks phase runs them there, uncompared)
    "nbval": ["tests/test_instruction_sets.py"],
}

# Tests that are not about the GPU and would take most of the check's minutes: the Slurm cluster
# (needs apt and Debian's packages, absent there: `make test-all` runs it) is left out, and the
# clean-exit test launches each script twice instead of 30 times (TUTORIAL_EXIT_RUNS).
NOT_ON_THE_GPU_MACHINE = {"tests/test_cluster.py": "a Slurm cluster; `make test-all` runs it"}
UNIT_TEST_ENV = {"TUTORIAL_EXIT_RUNS": "2"}

_PROBE = r"""
import json, platform, sys, time
t0 = time.perf_counter()
import torch
from tutorial_utils import devices
info = {"torch": torch.__version__, "cuda_version": torch.version.cuda,
        "python": platform.python_version()}
caps = devices.capabilities()
cc = list(caps.compute_capability) if caps.compute_capability else None
info["device"] = {"name": caps.name, "kind": caps.kind, "gpu_count": caps.gpu_count,
                  "compute_capability": cc, "total_bytes": caps.total_bytes}
info["plan"] = caps.plan()
try:
    import pynvml
    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()
    info["device"]["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
    pynvml.nvmlShutdown()
except Exception as exc:
    info["device"]["driver"] = f"unknown ({type(exc).__name__})"
if sys.argv[1] == "require-gpu":
    try:
        devices.require_gpu(why="make gpu-check")
    except devices.DeviceUnavailableError as exc:
        info["refused"] = str(exc)
info["seconds"] = round(time.perf_counter() - t0, 1)
print(json.dumps(info))
"""


class Check:
    """One run: a deadline, child processes that die with it, and the report it builds."""

    def __init__(self, out: Path, budget_s: float, work: Path) -> None:
        self.out = out
        self.start = time.monotonic()
        self.deadline = self.start + budget_s
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        self.procs: set[subprocess.Popen] = set()
        self.stopping = False  # set on SIGTERM/SIGINT: no new child starts after it
        self.lock = threading.RLock()  # RLock: the signal handler may run while it is held
        self.written: set[str] = set()
        self.write_lock = threading.RLock()
        self.report: dict = {
            "schema": SCHEMA,
            "date": dt.date.today().isoformat(),
            "complete": False,
            "results": {},
            "notebooks": [],
            "warnings": [],
            "phases": {},
        }

    # ------------------------------------------------------------------ children
    def left(self, reserve: float = 0.0) -> float:
        return self.deadline - time.monotonic() - reserve

    def child(self, name: str, cmd: list[str], timeout: float) -> tuple[int, str]:
        """Run ``cmd`` in its own process group with the check's environment; its output goes
        to ``logs/NAME.log`` and comes back. On timeout the whole group is killed."""
        log = self.logs / f"{name}.log"
        timeout = max(1.0, timeout)
        with log.open("w") as sink:
            with self.lock:  # a stop between this check and the start could miss the child
                if self.stopping:
                    return 130, "not started: the check is stopping"
                proc = subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=self.env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    process_group=0,  # a group, not a session: the caller's kill still reaches it
                )
                self.procs.add(proc)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                rc = 124
                sink.write(f"\n[gpu_check] stopped after {timeout:.0f} s (its time budget)\n")
            finally:
                with self.lock:
                    self.procs.discard(proc)
        return rc, log.read_text(errors="replace")

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def kill_all(self) -> None:
        with self.lock:
            self.stopping = True
            procs = list(self.procs)
        for proc in procs:
            self._kill(proc)

    def phase(self, name: str, seconds: float) -> None:
        self.report["phases"][name] = round(seconds, 1)
        self.write()

    # ------------------------------------------------------------------ output
    @property
    def stem(self) -> str:
        name = self.report.get("device", {}).get("name") or "unknown-device"
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"
        return f"{slug}-{self.report['date']}"

    def write(self) -> None:
        """(Re)write the three files; safe to call at any point, from any thread."""
        with self.write_lock:
            self._write()

    def _write(self) -> None:
        self.report["seconds"] = round(time.monotonic() - self.start, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        names = {f"{self.stem}.json", f"{self.stem}.md", f"{self.stem}-notebooks.tar.gz"}
        for old in self.written - names:  # renamed once the device is known: keep three files
            (self.out / old).unlink(missing_ok=True)
        self.written = names
        (self.out / f"{self.stem}.json").write_text(json.dumps(self.report, indent=1) + "\n")
        (self.out / f"{self.stem}.md").write_text(summary(self.report))
        archive = self.out / f"{self.stem}-notebooks.tar.gz"
        tmp = archive.with_suffix(".part")
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(self.work.rglob("*")):
                if path.is_file():
                    tar.add(path, arcname=f"{self.stem}/{path.relative_to(self.work)}")
            data = json.dumps(self.report, indent=1).encode()
            info = tarfile.TarInfo(f"{self.stem}/report.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tmp.replace(archive)


# ---------------------------------------------------------------------- the phases


def install_wheels(check: Check, wheels: Path) -> str | None:
    """Install the wheels into a temporary site folder; None when done, else why not."""
    problems = gpu_wheels.check(wheels)
    if problems:
        return "the wheel folder is not as tools/gpu_wheels.txt lists: " + "; ".join(problems)
    site = check.work.parent / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--no-cache-dir", "--disable-pip-version-check", "--target", str(site)]
    cmd += [str(p) for p in sorted(wheels.glob("*.whl"))]
    rc, log = check.child("install", cmd, min(120.0, check.left(60)))
    if rc != 0:
        return f"pip could not install the wheels (exit {rc}): {log.strip()[-300:]}"
    paths = [str(site), str(ROOT / "src")] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    check.env["PYTHONPATH"] = os.pathsep.join(paths)
    rc, log = check.child(
        "verify", [sys.executable, "tools/gpu_wheels.py", "verify", "--dir", str(wheels)], 60
    )
    if rc != 0:
        unmet = [line for line in log.splitlines() if " needs " in line]
        missing = [line for line in unmet if "not installed" in line]
        if missing or not unmet:
            return "this machine lacks what the wheels need: " + "; ".join(missing or [log[-300:]])
        check.report["warnings"] += unmet  # a version outside a range: try it, say so
    check.env["PYTHONUNBUFFERED"] = "1"
    check.env.setdefault("PYTHONHASHSEED", "0")
    return None


def probe(check: Check, require_gpu: bool) -> str | None:
    rc, log = check.child(
        "probe",
        [sys.executable, "-c", _PROBE, "require-gpu" if require_gpu else "any"],
        min(90.0, check.left(60)),
    )
    lines = [line for line in log.splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        return f"the probe failed (exit {rc}): {log.strip()[-400:]}"
    info = json.loads(lines[-1])
    for key in ("torch", "cuda_version", "python", "device", "plan"):
        check.report[key] = info[key]
    if info.get("refused"):
        return info["refused"]
    rc, log = check.child(
        "torch-api", [sys.executable, "tools/torch_api_check.py", "--json"], check.left(60)
    )
    lines = [line for line in log.splitlines() if line.startswith("{")]
    if lines:
        check.report["torch_api"] = json.loads(lines[-1])
    else:
        check.report["torch_api"] = {"error": f"exit {rc}: {log.strip()[-300:]}"}
    return None


def benchmarks(check: Check, budget_s: float) -> None:
    out = check.work / "bench"
    cmd = [sys.executable, "benchmarks/gpu_bench.py", "--out", str(out)]
    cmd += ["--budget-s", str(round(budget_s))]
    rc, log = check.child("benchmarks", cmd, budget_s + 30)
    path = out / "gpu-bench.json"
    if path.is_file():
        bench = json.loads(path.read_text())
        check.report["results"] = bench["results"]
        check.report["goals"] = bench["goals"]
    else:
        check.report["warnings"].append(f"the benchmarks wrote nothing (exit {rc}); see the log")
    check.report["benchmarks_exit"] = rc


def notebooks(check: Check, names: list[Path], workers: int, reserve: float) -> None:
    out = check.work / "notebooks"
    reports = check.work / "notebook-reports"
    reports.mkdir(exist_ok=True)
    results: dict[str, dict] = {}

    def one(path: Path) -> None:
        timeout = check.left(reserve)
        if timeout <= 5:
            results[path.name] = {"name": path.name, "passed": False, "error": "not run: no time"}
            return
        report = reports / f"{path.stem}.json"
        cmd = [sys.executable, "tools/run_notebooks.py", "--output-dir", str(out)]
        cmd += ["--report", str(report), "--timeout", str(int(min(300, timeout))), str(path)]
        started = time.monotonic()
        rc, _ = check.child(f"notebook-{path.stem}", cmd, timeout)
        if report.is_file():
            results[path.name] = json.loads(report.read_text())[0]
        else:
            why = "stopped by the check's time budget" if rc == 124 else f"exit {rc}, no report"
            results[path.name] = {
                "name": path.name,
                "passed": False,
                "error": why,
                "seconds": round(time.monotonic() - started, 1),
            }
        with check.lock:
            check.report["notebooks"] = [results[p.name] for p in names if p.name in results]
        check.write()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, names))


def unit_test_command(
    pythonpath: str, workers: int, found: Callable[[str, str], bool] | None = None
) -> tuple[list[str], list[str]]:
    """The pytest command for this machine, and the tests it leaves out (with what they need).

    ``found(module, pythonpath)`` says whether a module imports with the wheels' folder on the
    path: the check's own process does not have that folder, so it must not ask itself."""
    found = found or _module_found
    cmd = [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"]
    cmd += ["-m", "not browser", "-o", "addopts="]
    skipped = []
    for test, why in NOT_ON_THE_GPU_MACHINE.items():
        cmd += ["--ignore", test]
        skipped.append(f"{test} ({why})")
    for module, tests in DEV_ONLY_TESTS.items():
        if found(module, pythonpath):
            continue
        for test in tests:
            cmd += ["--deselect" if "::" in test else "--ignore", test]
            skipped.append(f"{test} (needs {module})")
    if workers > 1 and found("xdist", pythonpath):
        cmd += ["-n", str(workers), "--dist", "loadfile"]
    return cmd, skipped


def unit_tests(check: Check, reserve: float, workers: int) -> None:
    cmd, skipped = unit_test_command(check.env.get("PYTHONPATH", ""), workers)
    check.env.update(UNIT_TEST_ENV)
    started = time.monotonic()
    rc, log = check.child("unit-tests", cmd, check.left(reserve))
    tail = [line for line in log.strip().splitlines() if line.strip()][-1:] or [""]
    check.report["unit_tests"] = {
        "passed": rc == 0,
        "exit": rc,
        "summary": tail[0].strip("= "),
        "not collected": skipped,
        "seconds": round(time.monotonic() - started, 1),
        "failures": re.findall(r"^FAILED (\S+)", log, flags=re.M)[:30],
    }
    check.write()


def _module_found(module: str, pythonpath: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    env = dict(os.environ, PYTHONPATH=pythonpath)
    try:
        return subprocess.run([sys.executable, "-c", code], env=env, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


# ---------------------------------------------------------------------- the summary


def _table(columns: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def summary(report: dict) -> str:
    """The run as markdown: where, what passed, the goals, every benchmark table."""
    dev = report.get("device", {})
    cc = dev.get("compute_capability")
    lines = [
        f"# GPU check: {dev.get('name', 'unknown device')}, {report['date']}",
        "",
        f"- device: {dev.get('name', '?')}"
        + (f", compute capability {cc[0]}.{cc[1]}" if cc else "")
        + (f", {dev['total_bytes'] / 2**30:.1f} GiB" if dev.get("total_bytes") else "")
        + f", {dev.get('gpu_count', 0)} GPU(s), driver {dev.get('driver', '?')}",
        f"- torch {report.get('torch', '?')} (CUDA {report.get('cuda_version')}), "
        f"Python {report.get('python', '?')}",
        f"- {report.get('seconds', 0):.0f} s in all"
        + ("" if report.get("complete") else " (**incomplete**: the run stopped early)")
        + "; phases: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in report.get("phases", {}).items()),
        "",
    ]
    for warning in report.get("warnings", []):
        lines.append(f"> **{warning}**")
    if report.get("refused"):
        lines += [f"**Not run**: {report['refused']}", ""]
    if report.get("notebooks"):
        lines += ["## Notebooks (run top to bottom; every check cell must pass)", ""]
        rows = [
            [
                n["name"],
                "passed" if n["passed"] else "**FAILED**",
                f"{n.get('seconds', 0):.0f} s",
                (f"cell {n['cell']}: " if "cell" in n else "") + n.get("error", ""),
            ]
            for n in report["notebooks"]
        ]
        lines += _table(["notebook", "result", "time", "error"], rows) + [""]
    if "unit_tests" in report:
        ut = report["unit_tests"]
        lines += [
            "## Unit tests",
            "",
            f"{'passed' if ut['passed'] else '**FAILED**'}: {ut['summary']} "
            f"({ut['seconds']:.0f} s)",
        ]
        if ut.get("not collected"):
            lines.append("Not collected here: " + ", ".join(ut["not collected"]))
        lines += [f"- {f}" for f in ut.get("failures", [])] + [""]
    api = report.get("torch_api")
    if api:
        lines += ["## torch API check", ""]
        if "error" in api:
            lines.append(f"**failed to run**: {api['error']}")
        else:
            lines.append(
                f"{api['checked']} torch names used by the package, notebooks and scripts; "
                f"{len(api['missing'])} missing on torch {api['torch']}"
                + (": " + ", ".join(api["missing"]) if api["missing"] else "")
            )
        lines.append("")
    if report.get("goals"):
        lines += ["## Goals (issue 10)", ""]
        rows = [
            [
                g["goal"],
                g["status"] + (f" by {g['by']}" if g.get("by") else ""),
                g.get("value", g.get("why", "")),
            ]
            for g in report["goals"]
        ]
        lines += _table(["goal", "status", "value"], rows) + [""]
    for key, res in report.get("results", {}).items():
        lines += [f"## {key}: {res.get('title', '')}", ""]
        if res.get("skipped"):
            lines.append(res["skipped"])
        if res.get("error"):
            lines.append(f"**failed**: {res['error']}")
        if res.get("columns"):
            lines += _table(res["columns"], res.get("rows", []))
        if res.get("text"):
            lines += ["", "```", res["text"], "```"]
        if res.get("note"):
            lines += ["", res["note"]]
        lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- main


def stop_on_signals(check: Check, tmp: Path) -> None:
    """SIGTERM or SIGINT (the caller's timeout, Ctrl-C): kill every child, start no new one,
    write the three files with what there is, and exit at once."""

    def stop(signum, _frame):
        check.kill_all()
        check.report["warnings"].append(f"stopped by signal {signum}")
        check.write()
        shutil.rmtree(tmp, ignore_errors=True)
        # os._exit, not sys.exit: the worker threads must not keep the process alive (and
        # start the next notebook) after the caller asked it to stop
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the three files go")
    parser.add_argument("--wheels", type=Path, default=gpu_wheels.WHEEL_DIR)
    parser.add_argument("--budget-s", type=float, default=330.0, help="the whole run's time")
    parser.add_argument("--bench-s", type=float, default=110.0, help="the benchmarks' share")
    parser.add_argument("--workers", type=int, default=3, help="notebooks run at once")
    parser.add_argument("--test-workers", type=int, default=6, help="pytest-xdist workers")
    parser.add_argument("--allow-cpu", action="store_true", help="run even without a GPU")
    parser.add_argument("--skip", action="append", default=[], choices=("bench", "tests"))
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: all of them")
    args = parser.parse_args(argv)
    if not args.budget_s > 30:
        parser.error(f"--budget-s must be more than 30 seconds, not {args.budget_s}")
    if args.workers < 1 or args.test_workers < 1:
        parser.error("--workers and --test-workers are whole numbers of 1 or more")
    names = args.notebooks or sorted(
        (ROOT / "notebooks").glob("[0-9]*.ipynb"),
        key=lambda p: NOTEBOOK_ORDER.index(_number(p)) if _number(p) in NOTEBOOK_ORDER else 99,
    )
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    check = Check(args.out, args.budget_s, tmp / "run")
    stop_on_signals(check, tmp)
    try:
        t = time.monotonic()
        why = install_wheels(check, args.wheels) or probe(check, not args.allow_cpu)
        check.phase("install and probe", time.monotonic() - t)
        if why:
            check.report["refused"] = why
            check.write()
            print(f"gpu_check: {why}", file=sys.stderr)
            return 2
        print(f"gpu_check: {check.report['device']['name']}, torch {check.report['torch']}")
        if "bench" not in args.skip:
            t = time.monotonic()
            benchmarks(check, min(args.bench_s, check.left(150)))
            check.phase("benchmarks", time.monotonic() - t)
        t = time.monotonic()
        threads = [threading.Thread(target=notebooks, args=(check, names, args.workers, 10.0))]
        if "tests" not in args.skip:
            threads.append(
                threading.Thread(target=unit_tests, args=(check, 10.0, args.test_workers))
            )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        check.phase("notebooks and unit tests", time.monotonic() - t)
        check.report["complete"] = True
    finally:
        check.kill_all()
        check.write()
        shutil.rmtree(tmp, ignore_errors=True)
    nb_ok = all(n["passed"] for n in check.report["notebooks"]) and check.report["notebooks"]
    tests_ok = "tests" in args.skip or check.report.get("unit_tests", {}).get("passed")
    bench_ok = "bench" in args.skip or check.report.get("benchmarks_exit") == 0
    print(summary(check.report))
    print(f"gpu_check: wrote {check.stem}.json, .md and -notebooks.tar.gz into {args.out}")
    return 0 if nb_ok and tests_ok and bench_ok else 1


if __name__ == "__main__":
    sys.exit(main())
