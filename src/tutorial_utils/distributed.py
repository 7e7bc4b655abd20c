"""Launch a script with torchrun from a notebook, and always get a clean ending.

Why this exists: ``!torchrun script.py`` in a cell works until something goes wrong. A rank
that crashes leaves the other one waiting in a collective; a rank that hangs keeps the cell
busy forever; interrupting the cell or restarting the kernel can leave worker processes behind
(torchrun starts every worker in its own session, so killing torchrun's process group does not
reach them); a port another job holds makes the rendezvous wait on a stranger; and
``torchrun --standalone`` listens on every interface with a rendezvous that unpickles what its
store holds (below). ``launch`` runs the same job on one machine and handles those cases:

* it checks its arguments first (a bad ``nproc``, ``timeout`` or port is one sentence, before
  anything starts), and refuses a folder where a file is named like a standard-library module
  (``queue.py`` next to the script would replace the real ``queue`` in every rank);
* it picks a free port itself (``--master-addr=127.0.0.1 --master-port=PORT``, the static
  rendezvous) and checks it just before starting: a busy rendezvous port does not fail,
  torchrun waits on whatever listens there, so the check is what keeps a busy port from hanging;
* it streams every rank's output into the cell line by line, prefixed ``[rank0]``; a line a rank
  leaves without its newline stays that rank's (torchrun reads each rank's stdout and stderr
  separately, so lines of the two may swap places from one run to the next: a script whose
  output must be stable prints to one of them);
* it keeps the last ``KEEP_LINES`` lines of each rank's output (``result.rank_output``) and
  counts the ones it dropped (``result.dropped_lines``), so a rank that prints without end cannot
  fill the notebook's memory; a line longer than ``MAX_LINE_CHARS`` is cut;
* it collects what each rank reports (a rank writes JSON to ``$TUTORIAL_REPORT_DIR/rank<R>.json``;
  ``notebooks/scripts/common.py`` has a ``report()`` that does it); a malformed file is named,
  with its rank, in ``result.report_errors``, and the other ranks' reports are kept;
* on failure or timeout it terminates torchrun and every worker, reaps them, and raises
  ``LaunchError`` naming the failing rank and its last lines; a rank that dies only after every
  rank wrote its report (a crash at exit) does not lose the result: ``launch`` returns it, and
  ``result.exit_problem`` says which rank died and how;
* nothing the job started outlives ``launch``, however it detached: on Linux torchrun runs under
  a child subreaper (``processes.contained``) that stops and reaps every process left below it,
  and torchrun is a subreaper itself, so a rank that kills the supervisor still leaves its
  orphans where ``launch`` finds them (it sweeps at once when the supervisor dies); on every
  system the processes that carry this launch's mark in their environment are stopped, looking
  again until none is left (``processes.sweep``), before ``launch`` returns;
* if the notebook's process dies while the job runs (a kernel restart: SIGTERM or SIGKILL, no
  ``finally`` runs), a watchdog process (``tutorial_utils.processes``) stops the job and removes
  its temporary folder within a second or two.

What listens while a job runs (measured with ``ss -ltnp``, torch 2.13; ``tests/test_distributed.py``
checks it on every run): torchrun's store on ``127.0.0.1:PORT`` and each rank's gloo socket on
127.0.0.1, nothing on any other address. ``torchrun --standalone`` (and a plain ``torchrun`` on
one node without ``--master-port``) uses the c10d rendezvous instead, and then two stores listen
on **every interface** for the whole job (``*:PORT``, and the workers' ``MASTER_PORT``): a
``TCPStore`` server binds the wildcard address whatever host it is given, and the c10d
rendezvous handler reads its state from that store with ``pickle.loads``
(``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``), so whoever reaches the port
while the job runs can make torchrun run their code. So ``launch``:

* uses the static rendezvous (``--rdzv-backend=static --master-addr=127.0.0.1``), which reads
  no pickle: ranks are given, not negotiated, and the agent exchanges JSON;
* binds that store to 127.0.0.1 itself: torchrun has no option or variable for the address
  its store binds (``--master-addr``, ``--local-addr``, ``MASTER_ADDR`` only say where clients
  connect), but ``TCPStore(..., multi_tenant=True, master_listen_fd=fd)`` serves a socket
  already bound to 127.0.0.1, and the static rendezvous's own ``TCPStore(..., multi_tenant=True)``
  on the same port then shares that server. ``launch`` does this in the process that runs
  torchrun's own ``main`` (``python -m tutorial_utils.distributed`` followed by torchrun's
  arguments). ``result.command`` is the plain torchrun command: typed by hand it runs the same
  job with the same rendezvous, but its store then listens on every interface;
* sets ``GLOO_SOCKET_IFNAME`` to the loopback interface, so the ranks' gloo sockets listen on
  127.0.0.1 even where this machine's name resolves to a network address (gloo binds there
  otherwise). On GPUs, NCCL's bootstrap opens a socket of its own on the interface NCCL picks
  (``NCCL_SOCKET_IFNAME=lo`` keeps it on loopback; not measured here, no GPU).

Loopback keeps other machines out, not other users of this machine: the store is not
authenticated (but nothing written to it is unpickled). Several machines (``torchrun
--nnodes=2``, ``notebooks/scripts/slurm_ddp.sbatch``) cannot do this: the rendezvous node's
store must be reached by the others, so it listens on every interface for the whole job, and
with ``--rdzv-backend=c10d`` (the Slurm script's) torchrun's c10d rendezvous handler unpickles
the store's state. Run them on a network you trust, with the rendezvous port firewalled from
everything else (docs/troubleshooting.md, section 13).

The torchrun command is ``result.command`` (a list, as ``subprocess`` takes it) and
``result.command_line`` (one string to print); ``torchrun_command`` builds the same list.

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
import math
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .processes import Watchdog, contained, sweep, temporary_folder

__all__ = [
    "KEEP_LINES",
    "LaunchError",
    "LaunchResult",
    "MAX_LINE_CHARS",
    "PortInUseError",
    "REPORT_DIR_ENV",
    "free_port",
    "launch",
    "port_is_free",
    "torchrun_command",
]

#: Environment variable naming the folder where each rank writes ``rank<R>.json``.
REPORT_DIR_ENV = "TUTORIAL_REPORT_DIR"
#: Lines of each rank's output a result keeps (the last ones); the others are counted.
KEEP_LINES = 10_000
#: Characters of one line that are kept; the rest of a longer line is cut (and counted).
MAX_LINE_CHARS = 16_384
# Every process of a launch inherits this mark; whatever still carries it at the end is stopped.
_MARK_ENV = "TUTORIAL_LAUNCH_MARK"
_ORPHAN_GRACE_S = 2.0  # SIGTERM, then this long, then SIGKILL, for what a job leaves behind

# torchrun puts this before every line it copies from a rank. Two control characters no script
# prints, so a rank's line that arrives glued to another's (a line left without its newline)
# can still be cut at the right place.
_PREFIX_TEMPLATE = "\x1e${rank}\x1f"
_MARK = re.compile(r"\x1e(\d+)\x1f")
_TORCH_PREFIX = re.compile(r"^\[rank\d+\]: ")  # what torch adds itself to a rank's traceback
_LAST_LINES = 15
_LOOPBACK = "127.0.0.1"  # where the store, and the ranks' gloo sockets, listen
_MAX_PROCS_PER_CORE = 4  # nproc above this many per logical core is refused
_MAX_TIMEOUT_S = (
    86_400.0  # a day: a longer wait overflows a thread's timeout, and no lesson needs it
)


class LaunchError(RuntimeError):
    """A launched job failed or timed out; ``rank``, ``returncode``, ``last_lines`` say which, why.

    ``rank`` is the rank that failed first; after a timeout it is the rank still running when
    only one was, else ``None`` (``last_lines`` then holds every running rank's last lines).
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None,
        returncode: int | None,
        last_lines: list[str],
        result: LaunchResult,
    ):
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
    # the torchrun command (run by torchrun's own main, its store bound to 127.0.0.1 first)
    command: list[str] = field(default_factory=list)
    launcher_pid: int | None = None  # the launcher process (on Linux the supervisor of torchrun)
    report_errors: dict[int, str] = field(default_factory=dict)  # rank -> why its file was bad
    dropped_lines: dict[int, int] = field(default_factory=dict)  # rank -> lines not kept
    # Set when the job's exit status is not 0 although every rank wrote its report: which rank
    # died after writing its result, and how (a crash at exit). The reports are complete.
    exit_problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def command_line(self) -> str:
        """The torchrun command, as one line a shell accepts (``shlex.join``)."""
        return shlex.join(self.command)

    def __repr__(self) -> str:  # no timing or port: it must print the same on every run
        text = (
            f"LaunchResult(nproc={self.nproc}, returncode={self.returncode}, "
            f"reports from ranks {sorted(self.reports)}"
        )
        if self.report_errors:
            text += f", malformed reports from ranks {sorted(self.report_errors)}"
        if self.exit_problem:
            text += f", {self.exit_problem}"
        dropped = sum(self.dropped_lines.values())
        if dropped:
            text += f", {dropped:,} lines of output dropped (the last {KEEP_LINES:,} per rank kept)"
        return text + ")"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` and we could bind it."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be a whole number from 1 to 65535; got {port!r}")
    return _port_problem(port, host) is None


def _port_problem(port: int, host: str = "127.0.0.1") -> str | None:
    """Why ``port`` cannot be used for the rendezvous, or ``None`` when it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except PermissionError:
            return f"port {port} needs administrator rights on this machine"
        except OSError:
            return f"port {port} is already in use by another process"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (another process could still take it: see ``launch``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def torchrun_command(
    script: str | os.PathLike,
    nproc: int = 2,
    args: Sequence[str] = (),
    port: int = 29500,
    log_dir: str | os.PathLike | None = None,
) -> list[str]:
    """The torchrun command of ``launch``: one node, the static rendezvous on ``127.0.0.1:port``.

    Not ``--standalone``: that picks the c10d rendezvous, which unpickles what its store holds,
    and its store listens on every interface (see the top of this module). ``launch`` passes a
    ``log_dir`` in its temporary folder (torchrun keeps each rank's output there). The same
    arguments give the same list, so a notebook can print it:

    >>> cmd = torchrun_command("scripts/ddp_train.py", 2, ["--epochs", "3"])
    >>> for part in (cmd[1:6], cmd[6:10], cmd[10:]):
    ...     print(" ".join(part))
    -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --rdzv-backend=static
    --master-addr=127.0.0.1 --master-port=29500 --max-restarts=0 --tee=3
    scripts/ddp_train.py --epochs 3
    """
    script = _script_path(script)
    args = _check_job(nproc, args, port, port_may_be_none=False)
    if log_dir is not None and (
        isinstance(log_dir, bytes) or not isinstance(log_dir, (str, os.PathLike))
    ):
        raise TypeError(f"log_dir must be a folder's path or None; got {log_dir!r}")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=static",  # given ranks: nothing is unpickled (c10d's state is a pickle)
        f"--master-addr={_LOOPBACK}",
        f"--master-port={port}",  # without a port, one node would switch to c10d
        "--max-restarts=0",
        "--tee=3",
    ]
    if log_dir is not None:
        cmd.append(f"--log-dir={log_dir}")
    return [*cmd, str(script), *args]


# --------------------------------------------------------------------------- checking arguments


def _script_path(script: Any) -> Path:
    if isinstance(script, (bytes, bytearray)) or not isinstance(script, (str, os.PathLike)):
        raise TypeError(
            f"script must be the path of a Python file, e.g. 'scripts/ddp_train.py'; got {script!r}"
        )
    return Path(script)


def _shadowing_file(folder: Path) -> Path | None:
    """A file or package in ``folder`` named like a standard-library module, if there is one.

    Python puts the script's folder first on ``sys.path`` (and ``python -m`` the current one), so
    such a file is imported instead of the real module by torch and by everything else.
    """
    names = getattr(sys, "stdlib_module_names", frozenset())
    with contextlib.suppress(OSError):
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith((".", "_")):
                continue
            stem = entry.name[:-3] if entry.name.endswith(".py") else None
            if entry.is_dir() and (entry / "__init__.py").is_file():
                stem = entry.name
            if stem in names:
                return entry
    return None


def _check_folders(script: Path) -> None:
    for folder in dict.fromkeys([script.resolve().parent, Path.cwd().resolve()]):
        found = _shadowing_file(folder)
        if found is not None:
            module = found.name.removesuffix(".py")
            raise RuntimeError(
                f"{found} has the name of Python's standard module '{module}', and every rank "
                f"would import it instead of the real one: rename it (e.g. my_{found.name})"
            )


def _check_job(nproc: Any, args: Any, port: Any, *, port_may_be_none: bool) -> list[str]:
    """``nproc``, ``args`` and ``port`` as both ``launch`` and ``torchrun_command`` take them:
    one sentence for the first bad one; ``args`` back as strings."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a whole number of processes, at least 1; got {nproc!r}")
    cores = os.cpu_count() or 1
    limit = max(8, _MAX_PROCS_PER_CORE * cores)
    if nproc > limit:
        raise ValueError(
            f"nproc={nproc} is far more than this machine's {cores} cores can run "
            f"(at most {limit} here): use one process per GPU, or 2 on a CPU"
        )
    if not (port is None and port_may_be_none) and (
        isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
    ):
        raise ValueError(
            f"port must be a whole number from 1 to 65535, or None to pick a free one; got {port!r}"
        )
    if isinstance(args, (str, bytes)) or not isinstance(args, Iterable):
        raise TypeError(f"args must be a list of arguments, e.g. ['--epochs', '3']; got {args!r}")
    out = []
    for a in args:
        if isinstance(a, (bytes, bytearray)) or not isinstance(a, (str, int, float, os.PathLike)):
            raise TypeError(
                f"each argument must be text, a number or a path, e.g. ['--epochs', '3']; got {a!r}"
            )
        text = os.fspath(a) if isinstance(a, os.PathLike) else str(a)
        if "\0" in text:
            raise ValueError(
                f"argument {text!r} contains a NUL character, which no program can receive"
            )
        out.append(text)
    return out


def _check_arguments(
    script: Path, nproc: Any, args: Any, timeout: Any, port: Any, echo: Any = None
) -> list[str]:
    """Raise one sentence for the first bad argument of ``launch``; return ``args`` as strings."""
    if "\0" in str(script):
        raise ValueError(f"the script's path contains a NUL character: {str(script)!r}")
    if not script.is_file():
        raise FileNotFoundError(
            f"no script at {script}: give a path relative to the notebook's folder"
        )
    arg_list = _check_job(nproc, args, port, port_may_be_none=True)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not (math.isfinite(timeout) and 0 < timeout <= _MAX_TIMEOUT_S):
        raise ValueError(
            f"timeout must be a positive, finite number of seconds, at most {_MAX_TIMEOUT_S:g} "
            "(a day); "
            f"got {timeout!r}"
        )
    if echo is not None and not callable(echo):
        raise TypeError(
            f"echo must be a function called with each line (print) or None; got {echo!r}"
        )
    return arg_list


def _choose_port(port: int | None, echo: Callable[[str], None] | None) -> int:
    if port is not None:
        problem = _port_problem(port)
        if problem:
            raise PortInUseError(
                f"{problem}: pass port=None to pick a free one",
                rank=None,
                returncode=None,
                last_lines=[],
                result=LaunchResult(nproc=0, returncode=-1, wall_seconds=0.0, port=port),
            )
        return port
    chosen = free_port()
    for _ in range(5):
        if port_is_free(chosen):
            return chosen
        # A busy rendezvous port does not fail fast: torchrun connects to whatever listens
        # there as if it were another node's store, and waits. So check it first.
        busy, chosen = chosen, free_port()
        if echo is not None:
            echo(f"port {busy} is busy; using another one")
    raise PortInUseError(
        "could not find a free port on 127.0.0.1; free some and retry",
        rank=None,
        returncode=None,
        last_lines=[],
        result=LaunchResult(nproc=0, returncode=-1, wall_seconds=0.0),
    )


# --------------------------------------------------------------------------- reading the output


class _Lines:
    """Cut torchrun's output into each rank's own lines.

    torchrun copies each rank's stdout and stderr line by line, with the rank's mark in front.
    A line it finds half written (the text is there, its newline not yet) is copied as it is,
    and the rest comes later with a second mark; meanwhile another rank's line may be glued
    behind it. So: a piece followed by another mark on the same line had no newline, and it is
    kept until that rank's next piece (on the same stream) completes it.
    """

    def __init__(self) -> None:
        self._partial: dict[tuple[str, int], str] = {}

    def feed(self, stream: str, line: str, ended: bool) -> list[tuple[int | None, str]]:
        """``line`` without its newline; ``ended``: it had one. Returns finished lines."""
        pieces = _MARK.split(line)
        out: list[tuple[int | None, str]] = []
        if pieces[0]:  # torchrun's own output (before any mark)
            out.append((None, pieces[0]))
        marks = list(zip(pieces[1::2], pieces[2::2], strict=True))
        for k, (rank_text, text) in enumerate(marks):
            key = (stream, int(rank_text))
            text = self._partial.pop(key, "") + text
            if k < len(marks) - 1 or not ended:  # no newline after it (yet)
                self._partial[key] = text
            else:
                out.append((key[1], _TORCH_PREFIX.sub("", text)))
        return out

    def flush(self) -> list[tuple[int | None, str]]:
        """Lines still waiting for their newline (the rank ended or hangs): as they are."""
        out = [(rank, _TORCH_PREFIX.sub("", text)) for (_, rank), text in self._partial.items()]
        self._partial.clear()
        return out


def _pump(stream, name: str, lines: queue.Queue, closing: threading.Event) -> None:
    """Reader thread: move lines from one pipe into the queue (the main thread prints them).

    A line longer than ``MAX_LINE_CHARS`` keeps its start; the rest is read and thrown away, so
    one endless line cannot fill the memory. The queue is bounded: when the main thread falls
    behind, this thread waits (and torchrun with it), unless the job is being stopped.
    """

    def put(item) -> bool:
        while True:
            try:
                lines.put(item, timeout=0.1)
                return True
            except queue.Full:
                if closing.is_set():
                    return False

    with contextlib.suppress(ValueError, OSError):  # the pipe was closed while the job stopped
        while raw := stream.readline(MAX_LINE_CHARS):
            ended = raw.endswith("\n")
            text = raw[:-1] if ended else raw
            if not ended and len(raw) >= MAX_LINE_CHARS:  # an overlong line: skip its rest
                cut = 0
                while more := stream.readline(MAX_LINE_CHARS):
                    if more.endswith("\n"):
                        cut, ended = cut + len(more) - 1, True
                        break
                    cut += len(more)
                if cut:
                    text += f" [... {cut:,} more characters cut]"
            if not put((name, text, ended)):
                return
    put(None)


def _worker_ranks(procs: Iterable[psutil.Process]) -> dict[int, int]:
    """pid -> RANK for the worker processes among ``procs`` (read from their environment)."""
    out = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rank = p.environ().get("RANK")
            if rank is not None and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out[p.pid] = int(rank)
    return out


class _Job:
    """The processes of one launch, and how to stop all of them (``processes.sweep``).

    The roots are the supervisor (``contained``) and torchrun, both subreapers on Linux: what a
    rank leaves behind lands on one of them, so a sweep from them finds it even after a rank
    killed the supervisor. The mark finds what left in its own session off Linux."""

    def __init__(self, proc: subprocess.Popen, mark: str) -> None:
        self.proc = proc
        self.mark = mark
        self.roots: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            self.roots.append(psutil.Process(proc.pid))
        self.torchrun: psutil.Process | None = None

    def find_torchrun(self) -> None:
        """Remember torchrun (the supervisor's child) once it exists; a no-op off Linux."""
        if self.torchrun is not None or not self.roots or not _contained_here():
            return
        with contextlib.suppress(psutil.Error):
            children = self.roots[0].children()
            if children:
                self.torchrun = children[0]
                self.roots.append(children[0])

    def stop(self, grace: float = _ORPHAN_GRACE_S) -> list[int]:
        """Stop every process of the job (roots last) and reap torchrun's launcher."""
        self.find_torchrun()
        left = sweep(self.roots, marks=[(_MARK_ENV, self.mark)], grace_s=grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        return left


def _contained_here() -> bool:
    return sys.platform.startswith("linux")


def _read_reports(folder: Path) -> tuple[dict[int, Any], dict[int, str]]:
    """Each rank's report, and for a file that is not valid JSON, why (the others are kept)."""
    reports: dict[int, Any] = {}
    errors: dict[int, str] = {}
    for path in sorted(folder.glob("rank*.json")):
        match = re.fullmatch(r"rank(\d+)\.json", path.name)
        if not match:
            continue
        rank = int(match.group(1))
        try:
            reports[rank] = json.loads(path.read_text())
        except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError included
            errors[rank] = (
                f"rank {rank} wrote a result file that is not valid JSON ({exc}); "
                "its report is left out"
            )
    return reports, errors


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


# --------------------------------------------------------------------------- torchrun on loopback


def _loopback_interface() -> str | None:
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS)."""
    with contextlib.suppress(OSError):
        for name, addresses in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == _LOOPBACK for a in addresses):
                return name
    return None


def _runner(cmd: list[str]) -> list[str]:
    """What ``launch`` starts for the torchrun command ``cmd``: torchrun's own ``main`` with the
    same arguments, in a process that first binds the store to 127.0.0.1 (``_run_torchrun``)."""
    return [sys.executable, "-m", "tutorial_utils.distributed", *cmd[3:]]


def _run_torchrun(argv: list[str]) -> None:
    """torchrun (``torch.distributed.run.main(argv)``) with its static store on 127.0.0.1 only.

    A ``TCPStore`` server binds every interface, unless it is handed a socket already bound
    (``master_listen_fd``). With ``multi_tenant=True`` every ``TCPStore`` of this process on the
    same port shares one server, so the static rendezvous's own store, created inside
    torchrun with ``multi_tenant=True``, reuses the one made here (checked by
    ``tests/test_distributed.py``, which lists what listens during a launch).
    """
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import main as torchrun

    args = get_args_parser().parse_args(argv)
    static = args.rdzv_backend == "static" and not args.standalone and args.nnodes == "1"
    if not static or args.master_addr != _LOOPBACK or args.master_port is None:
        raise SystemExit(
            "this runs one node's static rendezvous on 127.0.0.1 only: give --nnodes=1 "
            "--rdzv-backend=static --master-addr=127.0.0.1 --master-port=PORT"
        )
    port = args.master_port
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore itself does
        sock.bind((_LOOPBACK, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise SystemExit(
            f"port {port} on {_LOOPBACK} was taken just before torchrun started ({exc.strerror}): "
            "launch again, with port=None to pick a free one"
        ) from None
    store = TCPStore(
        _LOOPBACK,
        port,
        is_master=True,
        timeout=timedelta(seconds=60),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=sock.detach(),  # the server owns the socket from here on
    )
    try:
        torchrun(argv)
    finally:
        del store


# --------------------------------------------------------------------------- launch


def launch(
    script: str | os.PathLike,
    nproc: int = 2,
    args: Sequence[Any] = (),
    timeout: float = 300.0,
    *,
    port: int | None = None,
    echo: Callable[[str], None] | None = print,
) -> LaunchResult:
    """Run ``script`` on ``nproc`` local processes with torchrun and wait for it.

    ``args``: the script's arguments, a list (``['--epochs', '3']``). ``timeout``: seconds before
    every process is stopped. ``port``: the rendezvous port; ``None`` picks a free one (another
    one if the first is busy by the time it is checked); a given port that is busy raises
    ``PortInUseError`` at once. ``echo``: called with each output line (``None`` keeps quiet);
    torchrun's own log lines carry timestamps, so they are kept in ``result.launcher_output``
    and not echoed. The ranks run with ``OMP_NUM_THREADS=1``.

    Returns a ``LaunchResult``; raises ``LaunchError`` when a rank fails or ``timeout`` seconds
    pass, after every process of the job has been stopped and reaped. Bad arguments raise
    ``ValueError``/``TypeError``/``FileNotFoundError`` before anything starts, and a folder with
    a file named like a standard-library module (``queue.py``) raises ``RuntimeError``.
    """
    script = _script_path(script)
    arg_list = _check_arguments(script, nproc, args, timeout, port, echo)
    _check_folders(script)
    chosen = _choose_port(port, echo)
    return _launch_once(script, nproc, arg_list, float(timeout), chosen, echo)


def _launch_once(
    script: Path,
    nproc: int,
    args: list[str],
    timeout: float,
    port: int,
    echo: Callable[[str], None] | None,
) -> LaunchResult:
    watchdog = Watchdog()  # first: if we die from here on, it cleans up after us
    try:
        return _run_job(script, nproc, args, timeout, port, echo, watchdog)
    finally:
        watchdog.finish()


def _run_job(
    script: Path,
    nproc: int,
    args: list[str],
    timeout: float,
    port: int,
    echo: Callable[[str], None] | None,
    watchdog: Watchdog,
) -> LaunchResult:
    with temporary_folder("launch-", watchdog) as tmp:
        report_dir = tmp / "reports"
        report_dir.mkdir()
        child_env = dict(os.environ)
        mark = uuid.uuid4().hex
        watchdog.stop_marked(mark, _MARK_ENV)
        loopback = _loopback_interface()
        if loopback is not None:  # gloo listens on the address the host name resolves to else
            child_env["GLOO_SOCKET_IFNAME"] = loopback
        child_env.update(
            {
                _MARK_ENV: mark,
                "OMP_NUM_THREADS": "1",  # also silences torchrun's warning about it
                REPORT_DIR_ENV: str(report_dir),
                "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": _PREFIX_TEMPLATE,
                # stream each line as it is printed (and keep it if the rank is killed)
                "PYTHONUNBUFFERED": "1",
            }
        )
        cmd = torchrun_command(script, nproc, args, port, tmp / "logs")
        result = LaunchResult(nproc=nproc, returncode=-1, wall_seconds=0.0, port=port, command=cmd)
        tails: dict[int, deque[str]] = {}
        kept: dict[int, deque[str]] = {}
        start = time.perf_counter()
        proc = subprocess.Popen(
            # Linux: torchrun gets SIGTERM if this thread dies, and runs under a subreaper that
            # stops and reaps whatever the job leaves behind before it exits
            contained(_runner(cmd), grace_s=_ORPHAN_GRACE_S),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # its own pipe: a rank's stdout and stderr lines never mix
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=child_env,
            start_new_session=True,
        )
        watchdog.guard(proc.pid)
        result.launcher_pid = proc.pid
        job = _Job(proc, mark)
        lines: queue.Queue[tuple[str, str, bool] | None] = queue.Queue(maxsize=10_000)
        closing = threading.Event()
        readers = [
            threading.Thread(target=_pump, args=(pipe, name, lines, closing), daemon=True)
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))
        ]
        for reader in readers:
            reader.start()
        splitter = _Lines()

        def take(found: list[tuple[int | None, str]]) -> None:
            for rank, text in found:
                if rank is None:
                    result.launcher_output.append(text)
                    if len(result.launcher_output) > 2 * KEEP_LINES:  # torchrun's own: its tail
                        del result.launcher_output[:KEEP_LINES]
                    continue
                lines_of_rank = kept.setdefault(rank, deque(maxlen=KEEP_LINES))
                if len(lines_of_rank) == KEEP_LINES:
                    result.dropped_lines[rank] = result.dropped_lines.get(rank, 0) + 1
                lines_of_rank.append(text)
                tails.setdefault(rank, deque(maxlen=_LAST_LINES)).append(text)
                if echo is not None:
                    echo(f"[rank{rank}] {text}")

        deadline = start + timeout
        timed_out = False
        swept = False
        hung: dict[int, int] = {}
        try:
            open_streams = len(readers)
            while open_streams:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    timed_out = True
                    break
                job.find_torchrun()
                if not swept and proc.poll() is not None:
                    # The supervisor is gone while the job's output is still open: it was killed
                    # (by a rank, say), and nothing stops what it left. Stop it now.
                    swept = True
                    job.stop()
                try:
                    item = lines.get(timeout=min(remaining, 0.2))
                except queue.Empty:
                    continue
                if item is None:
                    open_streams -= 1
                    continue
                take(splitter.feed(*item))
            if timed_out:
                with contextlib.suppress(psutil.Error):
                    hung = _worker_ranks(psutil.Process(proc.pid).children(recursive=True))
                job.stop()
            else:
                proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except BaseException:  # KeyboardInterrupt (the stop button) included: never leave orphans
            job.stop()
            raise
        finally:
            closing.set()
            for reader in readers:
                reader.join(timeout=2.0)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        while True:  # lines that arrived while the job was being stopped
            try:
                item = lines.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                take(splitter.feed(*item))
        take(splitter.flush())
        result.rank_output = {rank: list(found) for rank, found in sorted(kept.items())}
        job.stop()  # what escaped the subreapers (or every leftover, off Linux)
        result.wall_seconds = time.perf_counter() - start
        result.returncode = proc.returncode if proc.returncode is not None else -1
        result.reports, result.report_errors = _read_reports(report_dir)
    if echo is not None:
        for message in result.report_errors.values():
            echo(message)

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
            rank=rank,
            returncode=result.returncode,
            last_lines=last,
            result=result,
        )
    if result.returncode != 0:
        rank, code = _failed_rank(result.launcher_output)
        complete = sorted(result.reports) == list(range(nproc)) and not result.report_errors
        if complete:
            # Every rank wrote its result before one died: a crash at exit, not a failed job.
            who = f"rank {rank}" if rank is not None else "a rank"
            how = _describe_exit(code) if rank is not None else "died"
            result.exit_problem = f"{who} {how} after writing its result"
            if echo is not None:
                echo(
                    f"warning: {result.exit_problem} (a crash at exit); every rank's result is kept"
                )
            return result
        last = (
            list(tails.get(rank, [])) if rank is not None else result.launcher_output[-_LAST_LINES:]
        )
        who = (
            f"rank {rank} {_describe_exit(code)}"
            if rank is not None
            else f"torchrun exited with status {result.returncode}"
        )
        raise LaunchError(
            f"{script.name} failed: {who}. Last lines:\n" + "\n".join(f"  {x}" for x in last),
            rank=rank,
            returncode=code if code is not None else result.returncode,
            last_lines=last,
            result=result,
        )
    if echo is not None:
        echo(f"launched {nproc} ranks: exit status 0, finished in {result.wall_seconds:.2f} s wall")
    return result


if __name__ == "__main__":  # what launch starts: torchrun, its store bound to 127.0.0.1
    _run_torchrun(sys.argv[1:])
