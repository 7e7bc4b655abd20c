"""Launch a script with torchrun from a notebook, and always get a clean ending.

Why this exists: ``!torchrun script.py`` in a cell works until something goes wrong. A rank
that crashes leaves the other one waiting in a collective; a rank that hangs keeps the cell
busy forever; interrupting the cell can leave worker processes behind (torchrun starts every
worker in its own session, so killing torchrun's process group does not reach them); a port
another job holds makes the rendezvous fail with a long traceback. ``launch`` does the same
thing as ``torchrun --standalone`` and handles those cases:

* it picks a free port itself (``--rdzv-endpoint=127.0.0.1:PORT``, the single-node form of the
  multi-node command) and checks it just before starting: a busy rendezvous port does not fail,
  torchrun waits on whatever listens there, so the check is what keeps a busy port from hanging;
* it streams every rank's output into the cell line by line, prefixed ``[rank0]`` (torchrun
  reads each rank's stdout and stderr separately, so lines of the two may swap places from one
  run to the next: a script whose output must be stable prints to one of them);
* it collects what each rank reports (a rank writes JSON to ``$TUTORIAL_REPORT_DIR/rank<R>.json``;
  ``notebooks/scripts/common.py`` has a ``report()`` that does it);
* on failure or timeout it terminates torchrun and every worker, reaps them, and raises
  ``LaunchError`` naming the failing rank and its last lines.

>>> result = launch("scripts/ddp_train.py", nproc=2, timeout=120)   # doctest: +SKIP
[rank0] epoch 0: loss on all 64 samples = 2.6645
...
launched 2 ranks: exit status 0, finished in 6.10 s wall
>>> result.reports[1]["backend"]                                       # doctest: +SKIP
'gloo'
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "LaunchError",
    "LaunchResult",
    "PortInUseError",
    "REPORT_DIR_ENV",
    "free_port",
    "launch",
    "port_is_free",
    "torchrun_command",
]

#: Environment variable naming the folder where each rank writes ``rank<R>.json``.
REPORT_DIR_ENV = "TUTORIAL_REPORT_DIR"

_PREFIX_TEMPLATE = "[rank${rank}] "
# torchrun's prefix, then (on a traceback) the "[rankN]: " torch adds itself: keep one.
_RANK_LINE = re.compile(r"^\[rank(\d+)\] ?(?:\[rank\d+\]: )?(.*)$")
_LAST_LINES = 15
# torchrun copies each rank's log file line by line, and a line it finds half written (print()
# writes the text, then the newline) is copied as it is; the newline then arrives as a line of its
# own, with its own prefix: "[rank0] done[rank0] ". _mend drops that trailing prefix.
_TRAILING_PREFIX = re.compile(r"\[rank\d+\] ?$")


def _mend(text: str) -> str:
    return _TRAILING_PREFIX.sub("", text)


class LaunchError(RuntimeError):
    """A launched job failed or timed out. ``rank``, ``returncode`` and ``last_lines`` say which and why.

    ``rank`` is the rank that failed first; after a timeout it is the rank still running when
    only one was, else ``None`` (``last_lines`` then holds every running rank's last lines).
    """

    def __init__(self, message: str, *, rank: int | None, returncode: int | None,
                 last_lines: list[str], result: LaunchResult):
        super().__init__(message)
        self.rank = rank
        self.returncode = returncode
        self.last_lines = last_lines
        self.result = result


class PortInUseError(LaunchError):
    """The rendezvous port asked for is held by another process."""


@dataclass
class LaunchResult:
    """What a finished launch left behind."""

    nproc: int
    returncode: int
    wall_seconds: float
    reports: dict[int, Any] = field(default_factory=dict)  # rank -> what that rank reported
    rank_output: dict[int, list[str]] = field(default_factory=dict)  # rank -> its lines
    launcher_output: list[str] = field(default_factory=list)  # torchrun's own lines
    port: int = 0
    command: list[str] = field(default_factory=list)
    launcher_pid: int | None = None  # torchrun's process id (gone once launch returns)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def __repr__(self) -> str:  # no timing or port: it must print the same on every run
        ranks = sorted(self.reports)
        return (
            f"LaunchResult(nproc={self.nproc}, returncode={self.returncode}, "
            f"reports from ranks {ranks})"
        )


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` and we could bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (another process could still take it: see ``launch``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def torchrun_command(script: str | os.PathLike, nproc: int = 2, args: Sequence[str] = (),
                     port: int = 29500, log_dir: str | os.PathLike | None = None,
                     python: str | None = None) -> list[str]:
    """The command ``launch`` runs: ``--standalone`` spelled out with an explicit port.

    ``--standalone`` ignores any ``--rdzv-endpoint``, so to choose the port we give the c10d
    rendezvous ourselves; for one node this is exactly what ``--standalone`` does.
    """
    cmd = [
        python or sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=notebook-{uuid.uuid4().hex[:8]}",
        "--max-restarts=0", "--tee=3",
    ]
    if log_dir is not None:
        cmd.append(f"--log-dir={log_dir}")
    return [*cmd, str(script), *map(str, args)]


def _pump(stream, lines: queue.Queue) -> None:
    """Reader thread: move lines from the pipe into a queue (the main thread prints them)."""
    for raw in iter(stream.readline, ""):
        lines.put(raw.rstrip("\n"))
    lines.put(None)


def _worker_ranks(procs: Iterable[psutil.Process]) -> dict[int, int]:
    """pid -> RANK for the worker processes among ``procs`` (read from their environment)."""
    out = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rank = p.environ().get("RANK")
            if rank is not None and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out[p.pid] = int(rank)
    return out


def _stop_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Terminate torchrun and every descendant, then reap torchrun.

    torchrun starts each worker with ``start_new_session=True``, so the workers are not in
    torchrun's process group: we list the whole tree first, ask torchrun to stop (it forwards
    the signal to its workers and waits for them), and SIGKILL whatever is left after ``grace``.
    """
    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if hasattr(os, "killpg"):  # POSIX: torchrun's own group (start_new_session below)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    else:  # Windows has no process groups of this kind
        with contextlib.suppress(psutil.Error):
            psutil.Process(proc.pid).terminate()
    _, alive = psutil.wait_procs(tree, timeout=grace)
    for p in alive:  # workers first would leave zombies under a dead parent: kill all, then reap
        with contextlib.suppress(psutil.Error):
            p.kill()
    for p in alive:
        if hasattr(os, "killpg"):
            with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
                os.killpg(p.pid, signal.SIGKILL)  # a worker's own children (its session)
    psutil.wait_procs(alive, timeout=grace)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def _read_reports(folder: Path) -> dict[int, Any]:
    reports = {}
    for path in sorted(folder.glob("rank*.json")):
        match = re.fullmatch(r"rank(\d+)\.json", path.name)
        if match:
            reports[int(match.group(1))] = json.loads(path.read_text())
    return reports


def _failed_rank(launcher_lines: list[str]) -> tuple[int | None, int | None]:
    """(rank, exit code) of the first failure from torchrun's summary, if it printed one."""
    text = "\n".join(launcher_lines)
    # The "Root Cause" block names the first failure; the others were stopped by torchrun.
    text = text.split("Root Cause", 1)[-1]
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", text, re.MULTILINE)
    code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", text, re.MULTILINE)
    return (int(rank.group(1)) if rank else None, int(code.group(1)) if code else None)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "failed"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def launch(
    script: str | os.PathLike,
    nproc: int = 2,
    args: Sequence[Any] = (),
    timeout: float = 300.0,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    echo: Callable[[str], None] | None = print,
    show_launcher_output: bool = False,
) -> LaunchResult:
    """Run ``script`` on ``nproc`` local processes with torchrun and wait for it.

    ``port``: the rendezvous port; ``None`` picks a free one (another one if the first is busy by
    the time it is checked); a given port that is busy raises ``PortInUseError`` at once.
    ``env``: extra environment variables for the ranks (``OMP_NUM_THREADS`` defaults to 1, which
    also silences torchrun's warning about it). ``echo``: called with each output line
    (``None`` keeps quiet). ``show_launcher_output``: also echo torchrun's own log lines, which
    carry timestamps and so are hidden by default; they are kept in ``result.launcher_output``.

    Returns a ``LaunchResult``; raises ``LaunchError`` when a rank fails or ``timeout`` seconds
    pass, after every process of the job has been stopped and reaped.
    """
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"no script at {script}: give a path relative to the notebook's folder")
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    if port is not None:
        if not port_is_free(port):
            result = LaunchResult(nproc=nproc, returncode=-1, wall_seconds=0.0, port=port)
            raise PortInUseError(
                f"port {port} is already in use by another process: pass port=None to pick a free one",
                rank=None, returncode=None, last_lines=[], result=result,
            )
        chosen = port
    else:
        chosen = free_port()
        for _ in range(5):
            if port_is_free(chosen):
                break
            # A busy rendezvous port does not fail fast: torchrun connects to whatever listens
            # there as if it were another node's store, and waits. So check it first.
            busy, chosen = chosen, free_port()
            if echo is not None:
                echo(f"port {busy} is busy; using another one")
        else:
            result = LaunchResult(nproc=nproc, returncode=-1, wall_seconds=0.0)
            raise PortInUseError("could not find a free port on 127.0.0.1; free some and retry",
                                 rank=None, returncode=None, last_lines=[], result=result)
    return _launch_once(script, nproc, args, timeout, chosen, env, cwd, echo, show_launcher_output)


def _launch_once(script: Path, nproc: int, args: Sequence[Any], timeout: float, port: int,
                 env: dict[str, str] | None, cwd: str | os.PathLike | None,
                 echo: Callable[[str], None] | None, show_launcher_output: bool) -> LaunchResult:
    with tempfile.TemporaryDirectory(prefix="launch-") as tmp:
        report_dir = Path(tmp) / "reports"
        report_dir.mkdir()
        child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        child_env.update({
            REPORT_DIR_ENV: str(report_dir),
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": _PREFIX_TEMPLATE,
            "PYTHONUNBUFFERED": "1",  # stream each line as it is printed (and keep it if killed)
        })
        cmd = torchrun_command(script, nproc, [str(a) for a in args], port, Path(tmp) / "logs")
        result = LaunchResult(nproc=nproc, returncode=-1, wall_seconds=0.0, port=port, command=cmd)
        tails: dict[int, deque[str]] = {}
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, bufsize=1, env=child_env, cwd=cwd, start_new_session=True,
        )
        result.launcher_pid = proc.pid
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
        reader.start()
        deadline = start + timeout
        timed_out = False
        try:
            while True:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    timed_out = True
                    break
                try:
                    line = lines.get(timeout=min(remaining, 0.2))
                except queue.Empty:
                    continue
                if line is None:
                    break
                match = _RANK_LINE.match(line)
                if match:
                    rank, text = int(match.group(1)), _mend(match.group(2))
                    result.rank_output.setdefault(rank, []).append(text)
                    tails.setdefault(rank, deque(maxlen=_LAST_LINES)).append(text)
                    if echo is not None:
                        echo(f"[rank{rank}] {text}")
                else:
                    result.launcher_output.append(line)
                    if echo is not None and show_launcher_output:
                        echo(line)
            hung: dict[int, int] = {}
            if timed_out:
                with contextlib.suppress(psutil.Error):
                    hung = _worker_ranks(psutil.Process(proc.pid).children(recursive=True))
                _stop_tree(proc)
            else:
                proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except BaseException:  # KeyboardInterrupt (the stop button) included: never leave orphans
            _stop_tree(proc)
            raise
        finally:
            reader.join(timeout=2.0)
            if proc.stdout is not None:
                proc.stdout.close()
        result.wall_seconds = time.perf_counter() - start
        result.returncode = proc.returncode if proc.returncode is not None else -1
        result.reports = _read_reports(report_dir)

    if timed_out:
        # Every rank still running is listed: the one that hangs and the ones waiting for it in a
        # collective look the same from outside, so their last lines are what tells them apart.
        ranks = sorted(set(hung.values()))
        rank = ranks[0] if len(ranks) == 1 else None
        if ranks:
            last = [f"[rank{r}] {x}" for r in ranks for x in tails.get(r, ["(no output)"])]
            who = f"rank {', '.join(map(str, ranks))} still running; their last lines"
        else:
            last = result.launcher_output[-_LAST_LINES:]
            who = "no rank had started; last lines of torchrun"
        raise LaunchError(
            f"{script.name} timed out after {timeout:g} s and every process was stopped ({who}):\n"
            + "\n".join(f"  {x}" for x in last),
            rank=rank, returncode=result.returncode, last_lines=last, result=result,
        )
    if result.returncode != 0:
        rank, code = _failed_rank(result.launcher_output)
        last = list(tails.get(rank, [])) if rank is not None else result.launcher_output[-_LAST_LINES:]
        who = f"rank {rank} {_describe_exit(code)}" if rank is not None else (
            f"torchrun exited with status {result.returncode}")
        raise LaunchError(
            f"{script.name} failed: {who}. Last lines:\n" + "\n".join(f"  {x}" for x in last),
            rank=rank, returncode=code if code is not None else result.returncode,
            last_lines=last, result=result,
        )
    if echo is not None:
        echo(f"launched {nproc} ranks: exit status 0, finished in {result.wall_seconds:.2f} s wall")
    return result
