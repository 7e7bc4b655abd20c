"""Probes for the fault table (tests/test_faults.py): each sets a fault up and reports what it saw.

They only use what every version of the package has (the command line, ``launch``, ``LiveGauge``,
``doctor``), so the same probe measures the code before a fix and after it. The package they
probe is the one Python imports, so point PYTHONPATH at another checkout to measure that one::

    git archive 2329792 src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/src .venv/bin/python tests/fault_probes.py orphans KILL
    .venv/bin/python tests/fault_probes.py orphans KILL              # this checkout

Each probe returns a dict of plain values (printed as JSON by the command line). Everything a
probe starts is stopped before it returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out


def _kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _jupyter_env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp / "cfg"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "rt"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "TMPDIR": str(tmp),
    }


# --------------------------------------------------------------------------- the lab


@contextlib.contextmanager
def _lab(port: int, tmp: Path, extra_env: dict[str, str] | None = None):
    log = tmp / "lab.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [PY, "-m", "tutorial_utils", "lab", "--no-browser", "--port", str(port)],
            cwd=ROOT,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**_jupyter_env(tmp), **(extra_env or {})},
            start_new_session=True,
        )
    try:
        yield proc, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def lab_token(limit_s: float = 120.0) -> dict:
    """Start `make lab`'s launcher; once it serves, look for its token in every process's args."""
    with tempfile.TemporaryDirectory() as d:
        tmp, port = Path(d), _free_port()
        with _lab(port, tmp) as (proc, log):
            token, deadline = None, time.monotonic() + limit_s
            while time.monotonic() < deadline and proc.poll() is None:
                text = log.read_text()
                m = re.search(r"token=([0-9a-f]{16,})", text)
                if m and "is running at" in text:
                    token = m.group(1)
                    break
                time.sleep(0.3)
            time.sleep(1.0)  # every process of the lab is up by now
            holders = []
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit() and token:
                    with contextlib.suppress(OSError):
                        if token.encode() in (entry / "cmdline").read_bytes():
                            holders.append(int(entry.name))
            return {
                "served": token is not None,
                "processes_showing_the_token": len(holders),
                "token_files_left": sorted(p.name for p in tmp.glob("tutorial-lab-*")),
            }


def lab_busy_port(limit_s: float = 120.0) -> dict:
    """Something listens on the port: where does the address with the token point, and where does
    Jupyter serve?"""
    with tempfile.TemporaryDirectory() as d, socket.create_server(("127.0.0.1", 0)) as busy:
        tmp, port = Path(d), busy.getsockname()[1]
        with _lab(port, tmp) as (proc, log):
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline and proc.poll() is None:
                if "is running at" in log.read_text():
                    time.sleep(1.0)  # the launcher prints its address after Jupyter's lines
                    break
                time.sleep(0.3)
            text = log.read_text()
            printed = re.findall(r"http://127\.0\.0\.1:(\d+)/lab\?token=[0-9a-f]{16,}", text)
            served = re.findall(r"is running at:\s*\n.*?http://127\.0\.0\.1:(\d+)/", text)
            return {
                "busy_port": port,
                "token_printed_for_ports": sorted({int(p) for p in printed}),
                "jupyter_served_on": sorted({int(p) for p in served}),
                "exit_status": proc.poll(),
                "last_line": text.strip().splitlines()[-1] if text.strip() else "",
            }


def lab_bad_port_variable() -> dict:
    """`PORT=abc make lab`: what the launcher prints."""
    run = subprocess.run(
        [PY, "-m", "tutorial_utils", "lab", "--no-browser"],
        cwd=ROOT,
        env={**os.environ, "PORT": "abc"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = run.stderr.strip().splitlines()
    return {
        "exit_status": run.returncode,
        "traceback": "Traceback" in run.stderr,
        "stderr_lines": len(err),
        "last_line": err[-1] if err else "",
    }


# --------------------------------------------------------------------------- launch

_KERNEL_JOB = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(600)
"""


def orphans(sig_name: str = "KILL", wait_s: float = 10.0) -> dict:
    """A stand-in for a kernel runs launch() on a job that hangs; the kernel is killed (a restart).
    Count the job's processes still running ``wait_s`` seconds later, and its temporary folders."""
    sig = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}[sig_name]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "t").mkdir()
        job, pids = tmp / "job.py", tmp / "pids"
        job.write_text(_KERNEL_JOB)
        code = (
            "from tutorial_utils.distributed import launch\n"
            f"launch({str(job)!r}, nproc=2, args=[{str(pids)!r}], timeout=600, echo=None)\n"
        )
        kernel = subprocess.Popen([PY, "-c", code], env={**os.environ, "TMPDIR": str(tmp / "t")})
        tree: set[int] = set()
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and kernel.poll() is None:
                if pids.exists() and len(pids.read_text().split()) == 2:
                    break
                time.sleep(0.2)
            tree = {p.pid for p in psutil.Process(kernel.pid).children(recursive=True)}
            tree |= {int(x) for x in pids.read_text().split()} if pids.exists() else set()
            os.kill(kernel.pid, sig)
            kernel.wait()
            start = time.monotonic()
            while _alive(tree) and time.monotonic() - start < wait_s:
                time.sleep(0.2)
            left = _alive(tree)
            gone_after = None if left else round(time.monotonic() - start, 1)
            return {
                "job_processes": len(tree),
                "alive_after_wait": len(left),
                "all_gone_after_s": gone_after,
                "temp_folders_left": len(list((tmp / "t").glob("launch-*"))),
            }
        finally:
            _kill(_alive(tree))
            with contextlib.suppress(OSError):
                kernel.kill()
            kernel.wait()


# Each rank answers SIGTERM by starting, after a delay, a helper that ignores SIGTERM and leaves
# in a session of its own (with an empty environment when asked: no mark of the launch), then
# exits, so the helper is an orphan at once. With "kill-subreaper", rank 0 first SIGKILLs the
# supervisor above torchrun (its grandparent), as a rank that kills its process group's leader.
_HELPER_JOB = """
import os, signal, subprocess, sys, time
helpers, ranks, delay, env_kept, kill_subreaper = sys.argv[1], sys.argv[2], float(sys.argv[3]), \\
    sys.argv[4] == "1", sys.argv[5] == "1"
HELPER = (
    "import os, signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "os.setsid()\\n"
    "with open(sys.argv[1], 'a') as f:\\n"
    "    f.write(f'{os.getpid()}\\\\n')\\n"
    "time.sleep(600)\\n"
)
def on_term(signum, frame):
    time.sleep(delay)
    subprocess.Popen([sys.executable, "-c", HELPER, helpers], env=None if env_kept else {})
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(ranks, "a") as f:
    f.write(f"{os.getpid()}\\n")
if kill_subreaper and os.environ["RANK"] == "0":
    while len(open(ranks).read().split()) < 2:
        time.sleep(0.05)
    supervisor = int(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])
    os.kill(supervisor, signal.SIGKILL)
time.sleep(600)
"""


def orphan_helpers(
    case: str = "KILL", delay_s: float = 0.5, wait_s: float = 10.0, env_kept: bool = False
) -> dict:
    """Ranks that start SIGTERM-ignoring helpers from their SIGTERM handler (``delay_s`` later).

    ``case`` "KILL" / "TERM": the kernel stand-in running launch() gets that signal (a restart);
    "kill-subreaper": the kernel lives and rank 0 SIGKILLs the supervisor above torchrun. Count
    the helpers still running ``wait_s`` seconds after the kernel died (or after launch
    returned), and every other process of the job."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "t").mkdir()
        job, helpers, ranks = tmp / "job.py", tmp / "helpers", tmp / "ranks"
        job.write_text(_HELPER_JOB)
        kill_subreaper = case == "kill-subreaper"
        args = [str(helpers), str(ranks), str(delay_s), "1" if env_kept else "0"]
        args.append("1" if kill_subreaper else "0")
        code = (
            "from tutorial_utils.distributed import launch, LaunchError\n"
            "try:\n"
            f"    launch({str(job)!r}, nproc=2, args={args!r}, timeout=600, echo=None)\n"
            "except LaunchError:\n"
            "    pass\n"
        )
        kernel = subprocess.Popen([PY, "-c", code], env={**os.environ, "TMPDIR": str(tmp / "t")})
        tree: set[int] = set()

        def pids(path: Path) -> set[int]:
            return {int(x) for x in path.read_text().split()} if path.exists() else set()

        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and kernel.poll() is None:
                if len(pids(ranks)) == 2:
                    break
                time.sleep(0.1)
            if kill_subreaper:
                kernel.wait(timeout=120)  # launch returns once torchrun is gone
            else:
                time.sleep(0.5)
                tree = {p.pid for p in psutil.Process(kernel.pid).children(recursive=True)}
                os.kill(kernel.pid, {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}[case])
                kernel.wait()
            start = time.monotonic()
            while time.monotonic() - start < wait_s:
                if len(pids(helpers)) >= 2 and not _alive(pids(helpers) | tree):
                    break
                time.sleep(0.2)
            return {
                "helpers_started": len(pids(helpers)),
                "helpers_alive_after_wait": len(_alive(pids(helpers))),
                "other_job_processes_alive": len(_alive((tree | pids(ranks)) - pids(helpers))),
                "temp_folders_left": len(list((tmp / "t").glob("launch-*"))),
            }
        finally:
            _kill(_alive(tree | pids(ranks) | pids(helpers)))
            with contextlib.suppress(OSError):
                kernel.kill()
            kernel.wait()


def _job(body: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="probe-"))
    path = folder / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


def launch_glued_lines() -> dict:
    """Rank 1 leaves a line without its newline; rank 0 prints three lines after it."""
    from tutorial_utils.distributed import launch

    job = _job(
        """
        import sys, time
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        dist.barrier()
        if rank == 1:
            sys.stdout.write("rank 1 progress 50%")
            sys.stdout.flush()
        time.sleep(1.0)
        if rank == 0:
            for i in range(3):
                print(f"rank 0 line {i}", flush=True)
                time.sleep(0.3)
        dist.barrier()
        dist.destroy_process_group()
        """
    )
    result = launch(job, nproc=2, timeout=120, echo=None)
    return {"rank0": result.rank_output.get(0, []), "rank1": result.rank_output.get(1, [])}


def launch_malformed_report(hang: bool = False) -> dict:
    """Rank 1 writes half a JSON file (and, with ``hang``, then hangs past the timeout)."""
    from tutorial_utils.distributed import launch

    job = _job(
        f"""
        import os, time
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        folder = os.environ["TUTORIAL_REPORT_DIR"]
        with open(os.path.join(folder, f"rank{{rank}}.json"), "w") as f:
            f.write('{{"rank": 0}}' if rank == 0 else '{{"rank": 1, "loss": ')
        if rank == 1 and {hang}:
            time.sleep(600)
        dist.barrier()
        dist.destroy_process_group()
        """
    )
    try:
        result = launch(job, nproc=2, timeout=30 if hang else 120, echo=None)
    except Exception as exc:
        kept = getattr(getattr(exc, "result", None), "reports", None)
        return {
            "raised": type(exc).__name__,
            "first_line": str(exc).splitlines()[0] if str(exc) else "",
            "reports_kept": sorted(kept) if kept is not None else None,
        }
    return {
        "raised": None,
        "reports_kept": sorted(result.reports),
        "named": getattr(result, "report_errors", {}).get(1, ""),
    }


def launch_bad_arguments() -> dict:
    """launch() with each bad argument: what it raised, how many processes it started first."""
    from tutorial_utils.distributed import launch

    job = _job("print('hello')\n")
    cases = {
        "timeout=nan": {"timeout": float("nan")},
        "timeout=0": {"timeout": 0},
        "timeout=-5": {"timeout": -5},
        "nproc=2.5": {"nproc": 2.5, "timeout": 60},
        "nproc='2'": {"nproc": "2"},
        "port='abc'": {"port": "abc"},
        "port=70000": {"port": 70000},
        "args='--epochs 3'": {"args": "--epochs 3", "timeout": 60},
    }
    out = {}
    real_popen = subprocess.Popen
    for name, kwargs in cases.items():
        started = []  # every process launch() starts goes through subprocess.Popen

        def popen(*args, _started=started, **popen_kwargs):
            _started.append(args[0] if args else popen_kwargs.get("args"))
            return real_popen(*args, **popen_kwargs)

        start = time.monotonic()
        subprocess.Popen = popen
        try:
            launch(job, echo=None, **kwargs)
            what = "returned"
        except Exception as exc:
            what = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90] if str(exc) else ''}"
        finally:
            subprocess.Popen = real_popen
        out[name] = {
            "outcome": what,
            "processes_started": len(started),
            "after_s": round(time.monotonic() - start, 1),  # reported, not asserted
        }
    return out


# --------------------------------------------------------------------------- doctor


def _hanging_nvidia_smi(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pids = folder / "pids"
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho $$ >> {pids}\nsleep 1000 &\necho $! >> {pids}\nwait\n")
    exe.chmod(0o755)
    return pids


def doctor_hanging_nvidia_smi(limit_s: float = 60.0, *extra: str) -> dict:
    """An nvidia-smi that never answers (it starts a child and waits). How long does
    `python -m tutorial_utils doctor` take, and what is left running once it is over?"""
    with tempfile.TemporaryDirectory() as d:
        bin_dir = Path(d) / "bin"
        pids_file = _hanging_nvidia_smi(bin_dir)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        start = time.monotonic()
        proc = subprocess.Popen(
            [PY, "-m", "tutorial_utils", "doctor", *extra],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            out, _ = proc.communicate(timeout=limit_s)
            took = round(time.monotonic() - start, 1)
        except subprocess.TimeoutExpired:
            proc.kill()  # only doctor itself: what it started is what we count
            took, out = None, ""
        time.sleep(1.0)
        pids = [int(x) for x in pids_file.read_text().split()] if pids_file.exists() else []
        left = _alive(pids)
        _kill(left)  # they may hold doctor's output pipe open
        if took is None:
            out, _ = proc.communicate()
        rows = {
            line.split()[0]: " ".join(line.split()[1:])
            for line in out.splitlines()
            if line.startswith(("nvidia-smi", "GPUtil"))
        }
        return {
            "returned_after_s": took,
            "rows": rows,
            "nvidia_smi_processes": len(pids),
            "left_running": len(left),
        }


def doctor_garbage_nvidia_smi() -> dict:
    """An nvidia-smi that prints three lines of garbage and exits 0; and `doctor --require ''`."""
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "nvidia-smi"
        exe.write_text("#!/bin/sh\necho 'Segmentation fault'\necho '???'\necho 'core dumped'\n")
        exe.chmod(0o755)
        env = {**os.environ, "PATH": f"{d}{os.pathsep}{os.environ['PATH']}"}
        run = subprocess.run(
            [PY, "-m", "tutorial_utils", "doctor"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    row = next((line for line in run.stdout.splitlines() if line.startswith("nvidia-smi")), "")
    empty = subprocess.run(
        [PY, "-m", "tutorial_utils", "doctor", "--require", ""],
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = (empty.stdout + empty.stderr).strip().splitlines()
    return {
        "nvidia_smi_row": " ".join(row.split()[1:]),
        "require_empty_exit": empty.returncode,
        "require_empty_last_line": last[-1] if last else "",
    }


def doctor_hanging_nvml(limit_s: float = 60.0, timeout_s: float | None = None) -> dict:
    """NVML that never answers (nvmlInit blocks, as on a wedged driver): does doctor() return?

    ``timeout_s`` is passed to ``doctor()`` when given (only versions with the fix take it).
    """
    call = "doctor()" if timeout_s is None else f"doctor(timeout_s={timeout_s!r})"
    code = (
        "import time, pynvml\n"
        "pynvml.nvmlInit = lambda *a, **k: time.sleep(1000)\n"
        "from tutorial_utils.doctor import doctor\n"
        f"print(next(c.detail for c in {call}.checks if c.name == 'NVML'))\n"
    )
    start = time.monotonic()
    try:
        run = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return {"returned_after_s": None, "nvml_row": None}
    return {
        "returned_after_s": round(time.monotonic() - start, 1),
        "nvml_row": run.stdout.strip() or run.stderr.strip()[-200:],
    }


# --------------------------------------------------------------------------- the gauge

_GAUGE = {
    "huge_period": (
        "g = LiveGauge(sources=['psutil'], period_s=1e300).start()\n"
        "time.sleep(0.5)\n"
        "print(json.dumps({'running': g.running, 'error': g.error}))\n"
        "g.stop()\n"
    ),
    "thread_dies": (
        "def boom(self, now):\n"
        "    raise RuntimeError('clock went backwards')\n"
        "gauges._Schedule.advance = boom\n"
        "g = LiveGauge(sources=['psutil'], period_s=0.02).start()\n"
        "time.sleep(0.5)\n"
        "print(json.dumps({'running': g.running, 'error': g.error,\n"
        "                  'in_widget': 'clock went backwards' in g.widget.value}))\n"
        "g.stop()\n"
    ),
    "malformed_reading": (
        "class Bad(Source):\n"
        "    name = 'bad'\n"
        "    def read(self):\n"
        "        return [Reading('dev', used_bytes='12 MiB', total_bytes=2**30)]\n"
        "g = LiveGauge(sources=[Bad(), 'psutil'], period_s=0.02).start()\n"
        "time.sleep(0.3)\n"
        "g.stop()\n"
        "rows = [r.text for r in g._rows.values() if r.source == 'bad']\n"
        "error_row = any('unavailable' in t for t in rows)\n"
        "print(json.dumps({'stop': 'returned', 'error_row': error_row}))\n"
    ),
}


def gauge(case: str) -> dict:
    """A LiveGauge fault in a fresh process: what it printed on stderr, and what it said."""
    code = (
        "import json, time\n"
        "from tutorial_utils import gauges\n"
        "from tutorial_utils.gauges import LiveGauge\n"
        "from tutorial_utils.monitor import Reading, Source\n"
        "try:\n" + textwrap.indent(_GAUGE[case], "    ") + "except Exception as exc:\n"
        "    print(json.dumps({'raised': f'{type(exc).__name__}: {exc}'}))\n"
    )
    run = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    lines = run.stdout.strip().splitlines()
    seen = json.loads(lines[-1]) if lines else {}
    seen["traceback_on_stderr"] = "Traceback" in run.stderr
    return seen


PROBES = {
    "lab_token": lab_token,
    "lab_busy_port": lab_busy_port,
    "lab_bad_port_variable": lab_bad_port_variable,
    "orphans": orphans,
    "orphan_helpers": orphan_helpers,
    "launch_glued_lines": launch_glued_lines,
    "launch_malformed_report": launch_malformed_report,
    "launch_bad_arguments": launch_bad_arguments,
    "doctor_hanging_nvidia_smi": doctor_hanging_nvidia_smi,
    "doctor_garbage_nvidia_smi": doctor_garbage_nvidia_smi,
    "doctor_hanging_nvml": doctor_hanging_nvml,
    "gauge": gauge,
}


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PROBES:
        print(f"usage: fault_probes.py PROBE [ARGS...]; probes: {', '.join(PROBES)}")
        sys.exit(2)
    args = [json.loads(a) if re.fullmatch(r"[\d.]+|true|false", a) else a for a in sys.argv[2:]]
    print(json.dumps(PROBES[sys.argv[1]](*args), indent=1))
