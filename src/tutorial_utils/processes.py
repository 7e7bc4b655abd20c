"""Child processes that never outlive the process that started them, and tools that always return.

Why this exists: a learner restarts the kernel all the time, and a restart kills the kernel's
process (SIGTERM, then SIGKILL) without running any ``finally`` block. Whatever the kernel had
started in a session of its own (torchrun does, and starts each rank in yet another one) used to
keep running, with its temporary files. And an external tool that hangs (``nvidia-smi`` on a
wedged driver) hangs whoever waits for it. Three tools:

* :func:`tied_to_parent` -- wraps a command so that, on Linux, it gets SIGTERM when the thread
  that started it dies (``prctl(PR_SET_PDEATHSIG)``, set by a tiny Python that then execs the
  command); elsewhere the command is returned as it is. Not a ``preexec_fn``: Python runs that
  between fork and exec, where it can deadlock on a lock another thread held at the fork (seen:
  ``doctor`` hung in one run of eight while a second thread was importing GPUtil).
* :class:`Watchdog` -- a small separate process holding the read end of a pipe whose write end
  only we hold. However we die, the kernel closes that end; the watchdog then stops the process
  trees it was told about (the ranks torchrun started in their own sessions included) and removes
  the folders it was given. When we finish normally, :meth:`Watchdog.finish` lets it go quietly.
* :func:`temporary_folder` -- a temporary folder that is removed when the ``with`` block ends,
  and by a watchdog (its own, or one given) if we die inside the block: ``launch`` keeps its
  rank logs and reports in one (``launch-*``), capstone 2's grader the learner's step and plan
  (``capstone2-*``).
* :func:`contained` -- wraps a command so that nothing it starts outlives it, however it detached
  (Linux): a tiny supervisor becomes a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so a
  process that leaves its parent, even in a session of its own, is reparented to the supervisor
  instead of to init; once the command ends, the supervisor stops (SIGTERM, then SIGKILL after a
  grace period) and reaps every process still below it, then exits with the command's status.
  The command itself is made a subreaper too, so what its children leave stays below it even
  if a process of the job kills the supervisor.
* :func:`sweep` -- how the watchdog and ``launch`` stop a job: SIGTERM, a grace period, then
  rounds of SIGKILL on a *fresh* look each time (descendants of the subreapers, processes
  carrying the launch's mark, members of the sessions seen) until a look finds nothing, and the
  subreapers last. A helper a rank starts from its SIGTERM handler after the first look is
  found by a later one, and it cannot land on init while its subreaper still runs.
* :func:`run` -- ``subprocess.run`` with a timeout that also kills what the tool itself started
  (``subprocess.run`` kills only the direct child, then waits for the pipe that a grandchild still
  holds open) and reaps everything before it returns.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

__all__ = [
    "Watchdog",
    "contained",
    "run",
    "stop_tree",
    "sweep",
    "temporary_folder",
    "tied_to_parent",
]

_POLL_S = 0.2  # how often the watchdog refreshes the list of processes it guards

# Runs in the child, before the command: arm the parent-death signal, give up if the parent is
# already gone (it died between fork and prctl), then become the command (the setting survives
# exec). -S -I: no site import, no environment variables read; about 20 ms.
_TIE = (
    "import ctypes, os, sys\n"
    "parent, sig = int(sys.argv[1]), int(sys.argv[2])\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != parent:\n"
    "    sys.exit(128 + sig)\n"
    "os.execv(sys.argv[3], sys.argv[4:])  # argv[0] stays what the caller gave\n"
)


def _resolve(cmd: Sequence[str]) -> tuple[list[str], str | None]:
    """``cmd`` as strings and, on Linux, its program's path (looked up on ``PATH`` here, so a
    missing one raises ``FileNotFoundError`` in the caller); elsewhere the path is None."""
    cmd = [str(part) for part in cmd]
    if not cmd:
        raise ValueError("the command is empty; give the program to run and its arguments")
    if not sys.platform.startswith("linux"):
        return cmd, None
    exe = shutil.which(cmd[0])
    if exe is None:
        raise FileNotFoundError(f"{cmd[0]!r} was not found on PATH")
    return cmd, exe


def tied_to_parent(cmd: Sequence[str], sig: int = signal.SIGTERM) -> list[str]:
    """``cmd`` wrapped so that (on Linux) it gets ``sig`` when the thread that starts it dies.

    Pass the result to ``subprocess.Popen`` in place of ``cmd``. The program is looked up on
    ``PATH`` here, so a missing one still raises ``FileNotFoundError`` in the caller. Elsewhere
    than Linux the command comes back unchanged (the :class:`Watchdog` covers every system).
    """
    cmd, exe = _resolve(cmd)
    if exe is None:  # not Linux: the command as it is
        return cmd
    return [sys.executable, "-S", "-I", "-c", _TIE, str(os.getpid()), str(int(sig)), exe, *cmd]


# The supervisor of `contained`: tied to its parent like _TIE, a child subreaper, single-threaded
# (so a plain fork is safe). It forks the command (tied to the supervisor in turn), passes SIGTERM
# and SIGINT on, waits for it, then stops and reaps whatever is left below it.
_CONTAIN = r"""
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
parent, sig, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
libc.prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans below us become our children
if os.getppid() != parent:
    sys.exit(128 + sig)
me = os.getpid()
child = os.fork()
if child == 0:
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)
    # The command is a subreaper too (kept across exec): what its own children leave behind
    # stays below it, where a sweep from its pid finds it, even if this supervisor is killed.
    libc.prctl(36, 1, 0, 0, 0)
    if os.getppid() != me:
        os._exit(128 + signal.SIGTERM)
    os.execv(sys.argv[4], sys.argv[5:])
def pass_on(signum, frame):
    try:
        os.kill(child, signum)
    except OSError:
        pass
signal.signal(signal.SIGTERM, pass_on)
signal.signal(signal.SIGINT, pass_on)
devnull = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):  # the caller reads the command's output to its end: do not hold it open
    os.dup2(devnull, fd)
_, status = os.waitpid(child, 0)
def below():
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = [], [me]
    while frontier:
        kids = [p for p, pp in parents.items() if pp == frontier[-1]]
        frontier.pop()
        found += kids
        frontier += kids
    return found
def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
for stop_sig in (signal.SIGTERM, signal.SIGKILL):
    end = time.monotonic() + (grace if stop_sig == signal.SIGTERM else 10.0)
    for pid in below():
        try:
            os.kill(pid, stop_sig)
        except OSError:
            pass
    while True:
        reap()
        left = below()
        if not left or time.monotonic() > end:
            break
        if stop_sig == signal.SIGKILL:
            for pid in left:  # reparented to us since the last round
                try:
                    os.kill(pid, stop_sig)
                except OSError:
                    pass
        time.sleep(0.02)
    if not left:
        break
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(me, os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def contained(cmd: Sequence[str], grace_s: float = 2.0, sig: int = signal.SIGTERM) -> list[str]:
    """``cmd`` wrapped so that (on Linux) nothing it starts outlives it, and it dies with us.

    Pass the result to ``subprocess.Popen`` in place of ``cmd``. Like :func:`tied_to_parent`,
    the wrapper gets ``sig`` when the thread that starts it dies. When the command ends, every
    process still running below it (a grandchild in a session of its own that ignores SIGTERM
    included: it was reparented to the wrapper) gets SIGTERM, then SIGKILL after ``grace_s``,
    and is reaped before the wrapper exits with the command's status. Elsewhere than Linux the
    command comes back unchanged.
    """
    cmd, exe = _resolve(cmd)
    if exe is None:  # not Linux: the command as it is
        return cmd
    return [
        sys.executable,
        "-S",
        "-I",
        "-c",
        _CONTAIN,
        str(os.getpid()),
        str(int(sig)),
        str(float(grace_s)),
        exe,
        *cmd,
    ]


def stop_tree(procs: Sequence[psutil.Process], grace_s: float = 3.0) -> list[int]:
    """SIGTERM ``procs`` (and the process group each leads), SIGKILL what is left after ``grace_s``.

    Returns the pids that were still alive after the SIGKILL and a second wait (normally none).
    A process that is a group leader (torchrun's ranks each lead their own session) also has its
    group signalled, so what it started itself (data-loader workers) goes with it.
    """
    me = os.getpgrp() if hasattr(os, "getpgrp") else None
    procs = [p for p in procs if p.pid != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            with contextlib.suppress(psutil.Error, OSError):
                leads_group = hasattr(os, "killpg") and os.getpgid(p.pid) == p.pid != me
                if leads_group and p.is_running():
                    os.killpg(p.pid, sig)
                else:
                    p.send_signal(sig)
        _, procs = psutil.wait_procs(procs, timeout=grace_s)
        if not procs:
            break
    return [p.pid for p in procs]


def _as_process(p: int | psutil.Process) -> psutil.Process | None:
    if isinstance(p, psutil.Process):
        return p
    try:
        return psutil.Process(int(p))
    except (psutil.Error, ValueError):
        return None


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(p: psutil.Process, sig: int, own_group: int | None) -> None:
    """``sig`` to ``p``, and to the process group it leads (what it started itself goes too)."""
    with contextlib.suppress(psutil.Error, OSError):
        if not p.is_running():
            return
        if hasattr(os, "killpg") and os.getpgid(p.pid) == p.pid != own_group:
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)


def _marked(p: psutil.Process, marks: Sequence[tuple[str, str]]) -> bool:
    env = p.environ()
    return any(env.get(variable) == value for variable, value in marks)


def sweep(
    roots: Sequence[int | psutil.Process],
    also: Sequence[int | psutil.Process] = (),
    marks: Sequence[tuple[str, str]] = (),
    grace_s: float = 1.0,
    limit_s: float = 20.0,
) -> list[int]:
    """Stop everything below ``roots`` (and ``also``, and every process whose environment has one
    of ``marks``), then the ``roots``; return the pids still alive after ``limit_s`` (normally
    none).

    The roots are subreapers (``contained``'s supervisor): whatever leaves its parent lands on
    them, so they are killed last, once a fresh look below them finds nothing. First SIGTERM to
    all (and to the groups they lead), ``grace_s`` to exit; then rounds of SIGKILL, each on a
    fresh snapshot (descendants of the roots and of ``also``, marked processes, and every
    process in a session one of them was seen in), until a snapshot is empty: a process started
    after the first look (from a SIGTERM handler, say) is found by a later one. Then the roots,
    then one last look for what was marked or in those sessions.
    """
    me = os.getpid()
    own_group = os.getpgrp() if hasattr(os, "getpgrp") else None
    own_sessions = {0, os.getsid(0)} if hasattr(os, "getsid") else {0}
    root_procs = {p.pid: p for p in map(_as_process, roots) if p is not None and p.pid != me}
    known = {p.pid: p for p in map(_as_process, also) if p is not None and p.pid != me}
    sessions: set[int] = set()

    def look() -> dict[int, psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for p in [*root_procs.values(), *known.values()]:
            if not _running(p):  # gone (its pid may be another process's by now)
                continue
            with contextlib.suppress(psutil.Error):
                for child in p.children(recursive=True):
                    found[child.pid] = child
        found.update({pid: p for pid, p in known.items() if _running(p)})
        if marks or sessions:
            for p in psutil.process_iter():
                if p.pid in found or p.pid in root_procs or p.pid == me:
                    continue
                with contextlib.suppress(psutil.Error, OSError):
                    if os.getsid(p.pid) in sessions or (marks and _marked(p, marks)):
                        found[p.pid] = p
        found.pop(me, None)
        for pid in [*found, *root_procs]:
            with contextlib.suppress(OSError, AttributeError):
                sid = os.getsid(pid)
                if sid not in own_sessions:
                    sessions.add(sid)
        for pid in root_procs:
            found.pop(pid, None)
        return {pid: p for pid, p in found.items() if _running(p)}

    deadline = time.monotonic() + limit_s
    first = look()
    for p in [*first.values(), *root_procs.values()]:
        _signal(p, signal.SIGTERM, own_group)
    end_of_grace = time.monotonic() + grace_s
    while time.monotonic() < end_of_grace:
        if not look() and not any(_running(p) for p in root_procs.values()):
            break
        time.sleep(0.05)
    while time.monotonic() < deadline:
        found = look()
        if not found:
            break
        for p in found.values():
            _signal(p, signal.SIGKILL, own_group)
        psutil.wait_procs(list(found.values()), timeout=0.2)
    for p in root_procs.values():
        _signal(p, signal.SIGKILL, own_group)
    psutil.wait_procs(list(root_procs.values()), timeout=max(0.5, deadline - time.monotonic()))
    root_procs.clear()  # below them now: what landed on init; only marks and sessions find it
    for p in look().values():
        _signal(p, signal.SIGKILL, own_group)
    left = [*look().values()]
    psutil.wait_procs(left, timeout=1.0)
    return [p.pid for p in left if _running(p)]


def run(cmd: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``cmd``, capture its output as text, and never wait more than ``timeout_s`` seconds.

    On timeout the command and everything it started are killed and reaped, then
    ``subprocess.TimeoutExpired`` is raised. ``OSError`` when it cannot be started.
    """
    proc = subprocess.Popen(
        tied_to_parent(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own group: a timeout kills its children too
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    # The group is dead, so the pipes reach end of file at once.
    with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
        proc.communicate(timeout=5)


class Watchdog:
    """A separate process that cleans up after us if we die before :meth:`finish`.

    >>> dog = Watchdog()                      # doctest: +SKIP
    >>> dog.guard(job.pid)                     # that process and every descendant it starts
    >>> dog.remove_on_death(tmp_folder)
    >>> ...                                    # wait for the job
    >>> dog.finish()                           # we cleaned up ourselves: it exits quietly

    The watchdog runs in a session of its own (so killing our process group does not kill it)
    and needs only psutil; it exits as soon as it has cleaned up or been told to finish.
    """

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tutorial_utils.processes"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, line: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()

    def guard(self, pid: int) -> None:
        """Stop process ``pid`` and all its descendants if we die."""
        self._send(f"pid {int(pid)}")

    def stop_marked(self, mark: str, variable: str = "TUTORIAL_LAUNCH_MARK") -> None:
        """Also stop, if we die, every process whose environment has ``variable=mark``.

        That reaches what left the guarded tree (a process whose parent died is no longer
        anyone's descendant) as long as it kept the environment it was started with.
        """
        if not mark or any(c.isspace() for c in mark + variable):
            raise ValueError("the mark and its variable must be words without spaces")
        self._send(f"mark {variable} {mark}")

    def remove_on_death(self, path: str | os.PathLike) -> None:
        """Delete the folder ``path`` (after the processes are stopped) if we die."""
        self._send(f"path {os.fspath(path)}")

    def finish(self, timeout_s: float = 5.0) -> None:
        """We are done and have cleaned up: the watchdog exits without touching anything."""
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self._send("done")
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@contextlib.contextmanager
def temporary_folder(prefix: str, watchdog: Watchdog | None = None) -> Iterator[Path]:
    """A new temporary folder (``tempfile.TemporaryDirectory(prefix=prefix)``), removed when the
    block ends and, if this process dies inside the block (a kernel restart runs no ``finally``),
    by ``watchdog``: the one given (``launch`` passes the one that guards its job), or one of
    its own, started here and let go at the end.

    >>> with temporary_folder("capstone2-") as folder:       # doctest: +SKIP
    ...     (folder / "step.py").write_text(source)
    """
    own = watchdog is None
    dog = Watchdog() if own else watchdog
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            dog.remove_on_death(tmp)
            yield Path(tmp)
    finally:
        if own:
            dog.finish()


def _read_orders(stream, orders: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        orders.put(line.rstrip("\n"))
    orders.put(None)  # end of file: every write end of the pipe is closed


def _watch(stream) -> None:
    """The watchdog's loop: read orders until "done" (exit) or end of file (clean up, exit)."""
    guarded: dict[int, psutil.Process] = {}
    roots: set[int] = set()  # the pids we were told to guard; the rest were found below them
    paths: list[str] = []
    marks: list[tuple[str, str]] = []
    orders: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_orders, args=(stream, orders), daemon=True).start()
    while True:
        try:
            order = orders.get(timeout=_POLL_S)
        except queue.Empty:
            order = ""
        if order is None:  # our parent is gone
            break
        kind, _, arg = order.partition(" ")
        if kind == "done":
            return
        if kind == "pid":
            with contextlib.suppress(psutil.Error, ValueError):
                guarded[int(arg)] = psutil.Process(int(arg))
                roots.add(int(arg))
        elif kind == "path":
            paths.append(arg)
        elif kind == "mark":
            variable, _, value = arg.partition(" ")
            marks.append((variable, value))
        _add_descendants(guarded)
    _add_descendants(guarded)
    # Nobody waits for a clean ending any more: a short grace, then SIGKILL, looking again until
    # nothing is left, the guarded roots (subreapers) last.
    sweep(
        [p for pid, p in guarded.items() if pid in roots],
        also=[p for pid, p in guarded.items() if pid not in roots],
        marks=marks,
        grace_s=1.0,
    )
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _add_descendants(guarded: dict[int, psutil.Process]) -> None:
    # Kept fresh while the job runs: once their parent is killed, processes are reparented
    # and can no longer be found from it.
    for p in list(guarded.values()):
        with contextlib.suppress(psutil.Error):
            for child in p.children(recursive=True):
                guarded.setdefault(child.pid, child)


if __name__ == "__main__":  # the watchdog process started by Watchdog()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the notebook is not for us
    _watch(sys.stdin)
    sys.exit(0)
