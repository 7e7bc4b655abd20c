"""A real two-node Slurm cluster on this one machine: start it, see it, stop it.

    python tools/cluster.py start      # munged, slurmctld, slurmd -N n1, slurmd -N n2
    python tools/cluster.py status     # sinfo, squeue
    python tools/cluster.py stop       # its jobs (scancel), then its daemons by PID

``make cluster`` and ``make cluster-stop`` run the first and the last. The tests use the same
code (``tests/test_cluster.py``), so what a learner starts by hand is what the suite runs.

How it is built (Debian's ``slurm-wlm`` 22.05 and ``munge``; ``install`` fetches them with apt,
as root). Everything lives in one folder (``.cluster/`` for ``make cluster``, a temporary one in
the tests): a MUNGE key and socket of its own, a ``slurm.conf`` declaring two nodes ``n1`` and
``n2`` that are both this machine (``NodeHostname=<this host> NodeAddr=<loopback>``, each slurmd
on its own port), the controller's state, each node's spool, and every log. Nothing is written
to ``/etc``. ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: no cgroups,
which a container or a laptop may not give us.

What listens: slurmctld on the port given (17000 by default) and each slurmd on the next two.
Slurm 22.05 binds them to every interface unless ``CommunicationParameters=NoCtldInAddrAny,
NoInAddrAny`` is set, and then it binds to the address *this host's name resolves to* (not to
``NodeAddr``). So when the host name resolves to a loopback address (``/etc/hosts`` on most
machines: 127.0.0.1, or Debian's 127.0.1.1), the cluster uses that address everywhere and the
three daemons listen on it only (measured with ``ss -ltnp``: ``127.0.0.1:17000-17002``). When
it resolves to a network address, binding there would expose the daemons and break the nodes'
``NodeAddr``, so the daemons keep Slurm's default, every interface (``0.0.0.0:17000-17002``),
and ``start`` says so. ``srun`` also listens, on ephemeral ports, for the time of a step; munged
listens on its Unix socket only. MUNGE authenticates every message, and the key is created
0600 in a 0700 folder (never readable by anyone else, not even for a moment). Whoever holds the
key, or can answer on munged's socket, can mint root's credentials (SlurmUser is root), so a key,
a key folder, a socket folder or any other file or folder of the cluster that this user does
not own or that others can write is refused with one sentence: in a shared sticky folder
(``--folder /tmp/x``) another user may have made them first.

Only the standard library: this runs with any ``python3``, before or without the course's venv.
Every external call has a timeout. ``stop`` ends only what the cluster started: its jobs through
Slurm (``scancel``), then what is left of them (the descendants of this cluster's
``slurmstepd`` and the sessions they run in), then each daemon by the PID it recorded, checked
against the process's name and start time, so a stale ``pids`` file (after a crash or a reboot)
never signals a process that merely reuses a PID. A learner's terminal that exported
``SLURM_CONF``, and the programs started from it, are not the cluster's and are left alone.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Cluster",
    "ClusterError",
    "NODES",
    "Unavailable",
    "ensure_installed",
    "missing_programs",
    "start",
    "status",
    "stop",
]

NODES = ("n1", "n2")
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scontrol")
PACKAGES = ("slurm-wlm", "munge")
DEFAULT_FOLDER = Path(__file__).resolve().parent.parent / ".cluster"
DEFAULT_PORT = 17000  # slurmctld; the nodes' slurmd listen on the next two ports
PIDS_FILE = "pids"  # "name pid start-time boot-id", one a line: what stop() ends
CALL_TIMEOUT_S = 30.0


class ClusterError(RuntimeError):
    """The cluster did not come up (or go down); the message says why and where the logs are."""


class Unavailable(ClusterError):
    """Slurm cannot be had here (not root, no apt, no network); one sentence says which."""


@dataclass
class Cluster:
    """A running two-node cluster: where it lives, its daemons, and how long it took to start."""

    folder: Path
    port: int
    pids: dict[str, int] = field(default_factory=dict)  # daemon name -> pid
    start_seconds: float = 0.0
    hostname: str = ""
    loopback: str | None = None  # the address the daemons listen on; None: every interface

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.folder / "log"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment a client (sbatch, sinfo, srun) needs to talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *args: str, timeout_s: float = CALL_TIMEOUT_S) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster (output captured, text)."""
        return subprocess.run(
            list(args), env=self.env(), capture_output=True, text=True, timeout=timeout_s
        )

    def logs(self, lines: int = 25) -> str:
        """The last lines of every daemon's log: what to read when something went wrong."""
        out = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path} (last {len(text)} lines)")
            out += text
        return "\n".join(out)

    def __repr__(self) -> str:
        return (
            f"Cluster(nodes={list(NODES)}, conf={str(self.conf)!r}, "
            f"daemons={sorted(self.pids)}, started in {self.start_seconds:.1f} s)"
        )


# --------------------------------------------------------------------------- installing


def missing_programs() -> list[str]:
    """The Slurm and MUNGE programs this machine lacks (empty when all are there)."""
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def ensure_installed(timeout_s: float = 600.0) -> None:
    """Install slurm-wlm and munge with apt when missing; raise ``Unavailable`` if we cannot."""
    if not missing_programs():
        return
    if os.geteuid() != 0:
        raise Unavailable(
            "Slurm is not installed and installing it needs root: run `sudo apt-get install "
            "slurm-wlm munge` (Debian/Ubuntu) first"
        )
    if shutil.which("apt-get") is None:
        raise Unavailable(
            "Slurm is not installed and this machine has no apt-get: install Slurm and MUNGE "
            "with your system's package manager"
        )
    print(
        f"installing the system packages {' and '.join(PACKAGES)} with apt-get "
        f"(missing: {', '.join(missing_programs())}); at most {timeout_s:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + timeout_s
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
    ):
        left = deadline - time.monotonic()
        try:
            done = _run_group(cmd, env, max(left, 1.0))
        except subprocess.TimeoutExpired:
            raise Unavailable(
                f"`{' '.join(cmd)}` did not finish in {timeout_s:.0f} s (no network?): install "
                "slurm-wlm and munge by hand"
            ) from None
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
            raise Unavailable(
                f"`{' '.join(cmd)}` failed ({tail}): install slurm-wlm and munge by hand"
            )
    if missing_programs():
        raise Unavailable(
            f"apt installed {' and '.join(PACKAGES)} but {', '.join(missing_programs())} "
            "is still missing: check the packages"
        )


def _run_group(
    cmd: list[str], env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own: on timeout its whole group is killed (apt's
    children included), not only ``cmd``."""
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _program(name: str) -> str:
    found = shutil.which(name) or (str(Path("/usr/sbin", name)))
    return found


# --------------------------------------------------------------------------- configuration


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(first: int = 17000, last: int = 60000) -> int:
    """A port P such that P, P+1 and P+2 are free now (the controller and the two nodes)."""
    for base in range(first, last, 10):
        if all(_port_free(base + k) for k in range(1 + len(NODES))):
            return base
    raise ClusterError(f"no three free ports between {first} and {last}: free some")


def loopback_address(hostname: str) -> str | None:
    """The loopback address ``hostname`` resolves to (IPv4), or ``None`` when it resolves to a
    network address (or not at all). Slurm binds there with ``NoInAddrAny``: see the top."""
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    addresses = [info[4][0] for info in infos]
    if addresses and all(a.startswith("127.") for a in addresses):
        return addresses[0]
    return None


def slurm_conf(folder: Path, port: int, hostname: str, loopback: str | None = None) -> str:
    """The slurm.conf of the two-node cluster (every path inside ``folder``).

    ``loopback``: the loopback address this host's name resolves to (``loopback_address``); the
    daemons then listen on it only. ``None``: Slurm's default, every interface, and the nodes
    are reached at 127.0.0.1."""
    cpus = os.cpu_count() or 1
    addr = loopback or "127.0.0.1"
    bind = "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny\n" if loopback else ""
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={hostname} NodeAddr={addr} Port={port + 1 + k} "
        f"CPUs={cpus} State=UNKNOWN"
        for k, name in enumerate(NODES)
    )
    return f"""\
# Written by tools/cluster.py: two nodes, n1 and n2, that are both this machine.
ClusterName=course
{bind}SlurmctldHost={hostname}({addr})
SlurmctldPort={port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a requeued job waits before it may start again (Slurm's default: 120 s)
AuthInfo=socket={folder}/munge/munge.socket,cred_expire=20
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/run/slurmctld.pid
SlurmdPidFile={folder}/run/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
PlugStackConfig={folder}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=600
JobRequeue=1
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


# --------------------------------------------------------------------------- processes

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(name: str, cmd: list[str], cluster: Cluster, tied: bool) -> int:
    log = (cluster.log_dir / f"{name}.out").open("ab")
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=cluster.env(),
        start_new_session=True,  # a Ctrl-C in the learner's terminal does not reach it
        preexec_fn=_die_with_parent if tied else None,
        cwd=cluster.folder,
    )
    log.close()
    cluster.pids[name] = proc.pid
    # The start time (clock ticks since boot) and the boot's id make the record unique: a PID
    # reused after the daemon died, or after a reboot, does not match it.
    started = _start_ticks(proc.pid)
    with (cluster.folder / PIDS_FILE).open("a") as f:
        f.write(f"{name} {proc.pid} {started} {_boot_id()}\n")
    return proc.pid


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state is [0], ppid [1], session [3],
    start time [19]), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = list(pids)
    while left and time.monotonic() < deadline:
        for pid in left:
            _reap(pid)
        left = [p for p in left if _alive(p)]
        if left:
            time.sleep(0.1)
    return left


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def processes_of(conf: Path, job_id: int | str | None = None) -> list[int]:
    """Every process whose environment names this cluster's slurm.conf (with ``job_id``: only
    those of that job). A diagnostic for the tests, never a list of what to kill: a learner's
    terminal that exported ``SLURM_CONF`` and everything started from it match too."""
    needles = [f"SLURM_CONF={conf}".encode()]
    if job_id is not None:
        needles.append(f"SLURM_JOB_ID={job_id}".encode())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        env = _environ(int(entry))
        if all(n in env for n in needles) and _alive(int(entry)):
            found.append(int(entry))
    return sorted(found)


def job_processes(conf: Path) -> list[int]:
    """What is left of this cluster's jobs: each ``slurmstepd`` it started (found by its name and
    by the ``SLURM_CONF`` its slurmd gave it), every descendant of one, and every process in a
    session one of them runs in (a helper that left its parent but kept the job's session).

    Never a process merely carrying ``SLURM_CONF``: the learner's terminal exports it too."""
    table: dict[int, tuple[int, int]] = {}  # pid -> (parent, session)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[0] != "Z":
                table[int(entry)] = (int(fields[1]), int(fields[3]))
    needle = f"SLURM_CONF={conf}".encode()
    found = {pid for pid in table if _comm(pid) == "slurmstepd" and needle in _environ(pid)}
    frontier = list(found)
    while frontier:  # descendants
        parent = frontier.pop()
        kids = [pid for pid, (ppid, _) in table.items() if ppid == parent and pid not in found]
        found.update(kids)
        frontier += kids
    sessions = {table[pid][1] for pid in found} - {0, os.getsid(0)}
    found |= {pid for pid, (_, sid) in table.items() if sid in sessions}
    found.discard(os.getpid())
    return sorted(found)


# --------------------------------------------------------------------------- start / stop


def _wait_idle(cluster: Cluster, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        for name, pid in cluster.pids.items():
            if not _alive(pid):
                raise ClusterError(
                    f"{name} (pid {pid}) exited while the cluster was starting; its log:\n"
                    + cluster.logs()
                )
        try:
            done = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", timeout_s=10)
            text = done.stdout.strip()
        except subprocess.TimeoutExpired:
            text = "(sinfo did not answer within 10 s)"
        states = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        if all(states.get(n) == "idle" for n in NODES):
            return text
        time.sleep(0.3)
    raise ClusterError(
        f"the nodes were not idle after {timeout_s:.0f} s (sinfo says: {text or 'nothing'}); "
        "the daemons' logs:\n" + cluster.logs()
    )


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _refuse_unsafe(path: Path, what: str, st: os.stat_result | None = None) -> None:
    """Raise ``ClusterError`` (one sentence) unless ``path`` is this user's own and no one else
    can write it: whoever owns or can write a file the daemons read as root (the MUNGE key, its
    socket's folder, slurm.conf) can mint root's credentials or run code as root."""
    st = st if st is not None else path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise ClusterError(
            f"{what} {path} is a symbolic link, which the cluster never makes: remove it, or "
            "choose another --folder"
        )
    if st.st_uid != os.geteuid():
        raise ClusterError(
            f"{what} {path} belongs to {_owner(st.st_uid)}, not to this user, so it may hold what "
            "they put there: remove it, or choose a --folder of your own"
        )
    if st.st_mode & 0o022:
        raise ClusterError(
            f"{what} {path} can be written by other users (mode {stat.S_IMODE(st.st_mode):04o}), "
            "so it may hold what they put there: remove it, or choose a --folder of your own"
        )


def _own_folder(path: Path, what: str, mode: int = 0o755) -> None:
    """``path`` created with ``mode`` (whatever the umask), or checked with ``_refuse_unsafe``
    if it is already there."""
    old_umask = os.umask(0o777 & ~mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        _refuse_unsafe(path, what)
        if not path.is_dir():
            raise ClusterError(f"{what} {path} is not a folder: remove it") from None
    finally:
        os.umask(old_umask)


def _write_own(path: Path, text: str) -> None:
    """Write ``path`` (0644) if it is this user's own or new; refuse one another user made.

    Checked on the opened file (``fstat``), so a file planted between a check and the write is
    refused too; ``O_NOFOLLOW``: a planted symbolic link is never followed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:  # ELOOP: a symbolic link; EISDIR: a folder
        raise ClusterError(f"cannot write {path} ({exc.strerror}): remove it") from None
    with os.fdopen(fd, "w") as f:
        _refuse_unsafe(path, "the file", os.fstat(fd))
        f.truncate()
        f.write(text)


def _make_key(folder: Path) -> Path:
    """The MUNGE key, created 0600 in a folder created 0700: with it anyone can mint root's
    credentials (SlurmUser=root), so it is never readable by others, not even for a moment.

    A key folder or key that another user owns, or that others can write, is refused (one
    sentence): in a shared folder (``--folder`` on a /tmp-like folder) another user could have
    made ``munge-key/munge.key`` first, with contents they know. A key or folder of ours that
    others can only read (an older version made them so) is replaced, not chmod'ed."""
    keys = folder / "munge-key"
    old_umask = os.umask(0o077)
    try:
        try:
            os.mkdir(keys, 0o700)
        except FileExistsError:
            _refuse_unsafe(keys, "the MUNGE key's folder")
            if not keys.is_dir():
                raise ClusterError(f"{keys} is not a folder: remove it") from None
            if keys.stat().st_mode & 0o077:  # ours, readable by others: an older version's
                shutil.rmtree(keys)
                os.mkdir(keys, 0o700)
        key = keys / "munge.key"
        with contextlib.suppress(FileNotFoundError):
            _refuse_unsafe(key, "the MUNGE key")
            if key.stat().st_mode & 0o077:
                key.unlink()
        try:
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return key  # our own key, 0600, from an earlier start: keep it
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
    finally:
        os.umask(old_umask)
    return key


def _check_top_folder(folder: Path) -> None:
    """The cluster's folder must be ours; if others can write it, it must be sticky (like /tmp),
    so that they cannot rename or replace what we make in it."""
    st = folder.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ClusterError(
            f"the cluster's folder {folder} is not a folder: choose another --folder"
        )
    if st.st_uid != os.geteuid():
        raise ClusterError(
            f"the cluster's folder {folder} belongs to {_owner(st.st_uid)}, not to this user, "
            "who could replace what the daemons read: choose a --folder of your own"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ClusterError(
            f"the cluster's folder {folder} can be written by other users and is not sticky (mode "
            f"{stat.S_IMODE(st.st_mode):04o}), so they could replace what the daemons read: "
            "choose a --folder of your own"
        )


def prepare(folder: Path, port: int) -> Cluster:
    """Write the cluster's folder: the MUNGE key, slurm.conf and the daemons' folders.

    ``folder`` is created (0755) when missing; an existing one keeps its own mode (a /tmp-like
    folder keeps its sticky bit). Everything in it that the daemons read or write as root must
    be this user's own and writable by no one else, or ``ClusterError`` says which (one
    sentence). Nothing is started."""
    folder = Path(folder)
    if not folder.exists():
        old_umask = os.umask(0o022)
        try:
            folder.mkdir(parents=True, mode=0o755)
        finally:
            os.umask(old_umask)
    _check_top_folder(folder)
    _make_key(folder)
    # The socket's folder: whoever could write it could put a socket of their own there and
    # answer for munged. Not secret, so that a learner who is not root can submit jobs to a
    # cluster started with sudo: 0755.
    _own_folder(folder / "munge", "MUNGE's socket folder")
    os.chmod(folder / "munge", 0o755)  # ours and written by no one else (checked): loosen only
    for sub in ("state", "run", "log", "spool", *(f"spool/{n}" for n in NODES)):
        _own_folder(folder / sub, "the cluster's folder")
    _write_own(folder / PIDS_FILE, "")  # emptied: what start() spawns is appended
    hostname = socket.gethostname().split(".")[0]
    full = loopback_address(socket.gethostname())
    loopback = full if full is not None and full == loopback_address(hostname) else None
    cluster = Cluster(folder=folder, port=port, hostname=hostname, loopback=loopback)
    _write_own(cluster.conf, slurm_conf(folder, port, hostname, loopback))
    _write_own(folder / "plugstack.conf", "")  # no SPANK plugins from /etc/slurm
    return cluster


def start(
    folder: str | os.PathLike | None = None,
    port: int | None = None,
    timeout_s: float = 60.0,
    tied_to_parent: bool = False,
) -> Cluster:
    """Start munged, slurmctld and two slurmd; return once ``sinfo`` shows both nodes idle.

    ``folder``: where everything lives (a new temporary folder when ``None``); it must hold no
    running cluster. ``port``: the controller's port (the nodes take the next two); ``None``
    picks three free ones. ``tied_to_parent``: the daemons get SIGTERM if this process dies
    (the tests use it; ``make cluster`` does not, the cluster must outlive ``make``).
    On any failure everything started so far is stopped before ``ClusterError`` is raised.
    """
    if os.geteuid() != 0:
        raise Unavailable("the course's cluster runs its daemons as root: run it as root")
    if missing_programs():
        raise Unavailable(
            f"{', '.join(missing_programs())} missing: `python tools/cluster.py install` "
            "(as root) installs slurm-wlm and munge with apt"
        )
    began = time.monotonic()
    if folder is None:
        folder = tempfile.mkdtemp(prefix="course-cluster-")
        os.chmod(folder, 0o755)  # ours, just made: a learner who is not root reaches the socket
    folder = Path(folder).resolve()
    running = _recorded_pids(folder)  # only the daemons still alive as recorded
    if running:
        raise ClusterError(
            f"a cluster is already running from {folder} ({', '.join(sorted(running))}): "
            "`python tools/cluster.py stop` first"
        )
    if port is None:
        port = free_base_port()
    busy = [p for p in range(port, port + 1 + len(NODES)) if not _port_free(p)]
    if busy:
        raise ClusterError(
            f"port {busy[0]} is already in use: pass another --port (it needs {port} to "
            f"{port + len(NODES)} free)"
        )
    cluster = prepare(folder, port)
    key = folder / "munge-key" / "munge.key"
    try:
        _spawn(
            "munged",
            [
                _program("munged"),
                "--foreground",
                # --force waives munged's own checks of the key, the socket and the folders
                # above them. prepare() makes the same checks on the cluster's folder (ours, and
                # written by no one else), but munged also refuses to start when a folder
                # above its files belongs to a user other than root (munge 0.5.15: "PRNG seed
                # dir is insecure: invalid ownership of "/home/<learner>""), which is where
                # `sudo make cluster` runs from a learner's clone: that learner runs this as
                # root already. A stale socket after a crash does not need --force (munged
                # takes it over through its lock file: measured).
                "--force",
                f"--key-file={key}",
                f"--socket={folder}/munge/munge.socket",
                f"--pid-file={folder}/munge/munged.pid",
                f"--log-file={cluster.log_dir}/munged.log",
                f"--seed-file={folder}/munge-key/munged.seed",
            ],
            cluster,
            tied_to_parent,
        )
        _wait_for(lambda: (folder / "munge" / "munge.socket").exists(), 10, "munged", cluster)
        _spawn(
            "slurmctld",
            [_program("slurmctld"), "-D", "-i", "-f", str(cluster.conf)],
            cluster,
            tied_to_parent,
        )
        for name in NODES:
            _spawn(
                f"slurmd-{name}",
                [_program("slurmd"), "-D", "-N", name, "-f", str(cluster.conf)],
                cluster,
                tied_to_parent,
            )
        _wait_idle(cluster, max(timeout_s - (time.monotonic() - began), 1.0))
    except BaseException:
        stop(cluster)
        raise
    cluster.start_seconds = time.monotonic() - began
    return cluster


def _wait_for(cond, timeout_s: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise ClusterError(f"{what} did not start within {timeout_s:.0f} s; logs:\n{cluster.logs()}")


def _recorded_pids(folder: Path) -> dict[str, int]:
    """The daemons recorded in ``folder``'s pids file that are still those very processes: same
    PID, same program name, same start time, same boot. A stale line (the daemon died, the
    machine rebooted, the PID now belongs to another program) is left out."""
    path = folder / PIDS_FILE
    if not path.is_file():
        return {}
    boot = _boot_id()
    pids = {}
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
            continue  # an older format, or garbage: not proof of anything
        name, pid, started, boot_id = parts[0], int(parts[1]), int(parts[2]), parts[3]
        program = name.split("-")[0]  # slurmd-n1 -> slurmd
        if program not in ("munged", "slurmctld", "slurmd") or boot_id != boot:
            continue
        if _alive(pid) and _start_ticks(pid) == started and _comm(pid) == program:
            pids[name] = pid
    return pids


@dataclass
class Stopped:
    """What ``stop`` ended: the daemons (by the PIDs it recorded) and the jobs' processes."""

    daemons: dict[str, int]
    others: list[int]
    left: list[int]

    def __repr__(self) -> str:
        text = f"stopped {', '.join(sorted(self.daemons)) or 'no daemon'}"
        if self.others:
            text += f" and {len(self.others)} process(es) of its jobs"
        if self.left:
            text += f"; STILL RUNNING: {self.left}"
        return text


def _job_ids(cluster: Cluster) -> list[str]:
    with contextlib.suppress(subprocess.TimeoutExpired, OSError):
        done = cluster.run("squeue", "-h", "-o", "%A", timeout_s=10)
        return [j for j in done.stdout.split() if j.isdigit()]
    return []


def stop(cluster: Cluster | str | os.PathLike | None = None, timeout_s: float = 20.0) -> Stopped:
    """Cancel the cluster's jobs with ``scancel``, end what is left of them (``job_processes``),
    then end each daemon by its recorded PID (TERM, then KILL). Safe to call twice.

    Only what the cluster started is signalled: a daemon only while its PID still names the
    process recorded at start (name and start time), a job's process only as a descendant of
    this cluster's ``slurmstepd`` or a member of its session."""
    if not isinstance(cluster, Cluster):
        folder = Path(cluster or DEFAULT_FOLDER).resolve()
        cluster = Cluster(folder=folder, port=0, pids=_recorded_pids(folder))
        daemons = dict(cluster.pids)
    else:
        recorded = _recorded_pids(cluster.folder)
        daemons = {n: p for n, p in cluster.pids.items() if recorded.get(n) == p}
    others: list[int] = []
    if "slurmctld" in daemons and cluster.conf.exists():
        jobs = _job_ids(cluster)
        if jobs:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                cluster.run("scancel", *jobs, timeout_s=10)
            # running jobs end within KillWait (10 s); wait for their processes, not longer
            _wait_gone(job_processes(cluster.conf), 12)
    for _ in range(3):  # what scancel did not end (a helper that ignores SIGTERM, say)
        found = [p for p in job_processes(cluster.conf) if p not in others]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        others += found
        _wait_gone(found, 5)
    order = [n for n in ("slurmd-n1", "slurmd-n2", "slurmctld", "munged") if n in daemons]
    order += [n for n in daemons if n not in order]
    for name in order:  # the nodes first, the controller next, munged last
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemons[name], signal.SIGTERM)
    left = _wait_gone(list(daemons.values()), timeout_s / 2)
    for pid in left:
        if _alive(pid) and _comm(pid) in ("munged", "slurmctld", "slurmd"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    left = _wait_gone(left + others, timeout_s / 2)
    if not left:
        (cluster.folder / PIDS_FILE).unlink(missing_ok=True)
    return Stopped(daemons=daemons, others=others, left=left)


def status(folder: str | os.PathLike | None = None) -> str:
    """What ``sinfo`` and ``squeue`` say about the cluster in ``folder``, or why they cannot."""
    folder = Path(folder or DEFAULT_FOLDER).resolve()
    pids = _recorded_pids(folder)
    running = {n: p for n, p in pids.items() if _alive(p)}
    if not running:
        return f"no cluster running from {folder}: `make cluster` starts one"
    cluster = Cluster(folder=folder, port=0, pids=running)
    lines = [f"daemons: {', '.join(f'{n} (pid {p})' for n, p in sorted(running.items()))}"]
    for cmd in (["sinfo"], ["squeue"]):
        try:
            done = cluster.run(*cmd, timeout_s=10)
            lines.append(done.stdout.rstrip() or done.stderr.rstrip())
        except subprocess.TimeoutExpired:
            lines.append(f"{cmd[0]} did not answer within 10 s")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status", "install"])
    parser.add_argument("--folder", default=str(DEFAULT_FOLDER), help="default: .cluster/")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="slurmctld's port; slurmd take +1, +2"
    )
    args = parser.parse_args(argv)
    try:
        if args.action == "install":
            ensure_installed()
            print("slurm-wlm and munge are installed")
        elif args.action == "start":
            ensure_installed()
            cluster = start(args.folder, port=args.port)
            print(f"two-node Slurm cluster up in {cluster.start_seconds:.1f} s: nodes n1, n2 idle")
            print(cluster.run("sinfo").stdout.rstrip())
            ports = f"{cluster.port}-{cluster.port + len(NODES)}"
            if cluster.loopback:
                print(f"Its daemons listen on {cluster.loopback}:{ports} only.")
            else:
                print(
                    f"This host's name does not resolve to a loopback address, so its daemons "
                    f"listen on every interface (0.0.0.0:{ports}; MUNGE authenticates each "
                    "message): firewall those ports, or map the name to 127.0.1.1 in /etc/hosts"
                )
            repo = Path(__file__).resolve().parent.parent
            print("\nSubmit the course's script to it (same terminal):")
            print(f"  export SLURM_CONF={cluster.conf}")
            print(f'  export PATH="{Path(sys.executable).parent}:$PATH"   # its torchrun')
            print(f"  cd {repo / 'notebooks' / 'scripts'}")
            print("  sbatch --wait --gpus-per-node=0 --cpus-per-task=1 slurm_ddp.sbatch")
            print("  cat ddp-train-*.out")
            print(f"Stop it with: make -C {repo} cluster-stop")
        elif args.action == "stop":
            print(stop(args.folder))
        else:
            print(status(args.folder))
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
