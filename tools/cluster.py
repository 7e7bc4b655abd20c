"""A real two-node Slurm cluster on this one machine: start it, see it, stop it.

    python tools/cluster.py start      # munged, slurmctld, slurmd -N n1, slurmd -N n2
    python tools/cluster.py status     # sinfo, squeue
    python tools/cluster.py stop       # every daemon it started, by PID, and any job left

``make cluster`` and ``make cluster-stop`` run the first and the last. The tests use the same
code (``tests/test_cluster.py``), so what a learner starts by hand is what the suite runs.

How it is built (Debian's ``slurm-wlm`` 22.05 and ``munge``; ``install`` fetches them with apt,
as root). Everything lives in one folder (``.cluster/`` for ``make cluster``, a temporary one in
the tests): a MUNGE key and socket of its own, a ``slurm.conf`` declaring two nodes ``n1`` and
``n2`` that are both this machine (``NodeHostname=<this host> NodeAddr=127.0.0.1``, each slurmd
on its own port), the controller's state, each node's spool, and every log. Nothing is written
to ``/etc`` and nothing listens beyond 127.0.0.1's ports. ``ProctrackType=proctrack/linuxproc``
and ``TaskPlugin=task/none``: no cgroups, which a container or a laptop may not give us.

Only the standard library: this runs with any ``python3``, before or without the course's venv.
Every external call has a timeout. Nothing started here is left behind by ``stop``: it ends
each daemon by the PID it recorded, then any process (a job step, a rank) still carrying this
cluster's ``SLURM_CONF`` in its environment.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import socket
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
PIDS_FILE = "pids"  # name pid, one a line: what stop() ends
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


def slurm_conf(folder: Path, port: int, hostname: str) -> str:
    """The slurm.conf of the two-node cluster (every path inside ``folder``)."""
    cpus = os.cpu_count() or 1
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={port + 1 + k} "
        f"CPUs={cpus} State=UNKNOWN"
        for k, name in enumerate(NODES)
    )
    return f"""\
# Written by tools/cluster.py: two nodes, n1 and n2, that are both this machine.
ClusterName=course
SlurmctldHost={hostname}(127.0.0.1)
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
    with (cluster.folder / PIDS_FILE).open("a") as f:
        f.write(f"{name} {proc.pid}\n")
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


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


def processes_of(conf: Path, job_id: int | str | None = None) -> list[int]:
    """Every process whose environment names this cluster's slurm.conf: its daemons, job steps
    and ranks (with ``job_id``: only the processes of that job, on any node)."""
    needles = [f"SLURM_CONF={conf}".encode()]
    if job_id is not None:
        needles.append(f"SLURM_JOB_ID={job_id}".encode())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if all(n in env for n in needles) and _alive(int(entry)):
            found.append(int(entry))
    return sorted(found)


def _job_processes(conf: Path) -> list[int]:
    """The processes of any job of this cluster (they carry SLURM_JOB_ID; the daemons do not)."""
    out = []
    for pid in processes_of(conf):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if b"\0SLURM_JOB_ID=" in b"\0" + f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


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
    folder = Path(folder).resolve()
    if (folder / PIDS_FILE).exists() and any(_alive(p) for p in _recorded_pids(folder).values()):
        raise ClusterError(
            f"a cluster is already running from {folder}: `python tools/cluster.py stop` first"
        )
    if port is None:
        port = free_base_port()
    busy = [p for p in range(port, port + 1 + len(NODES)) if not _port_free(p)]
    if busy:
        raise ClusterError(
            f"port {busy[0]} is already in use: pass another --port (it needs {port} to "
            f"{port + len(NODES)} free)"
        )
    for sub in ("munge", "munge-key", "state", "run", "log", *(f"spool/{n}" for n in NODES)):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / PIDS_FILE).unlink(missing_ok=True)
    hostname = socket.gethostname().split(".")[0]
    cluster = Cluster(folder=folder, port=port, hostname=hostname)
    cluster.conf.write_text(slurm_conf(folder, port, hostname))
    (folder / "plugstack.conf").write_text("")  # no SPANK plugins from /etc/slurm
    # The key is secret (root only); the socket's folder is not, so that a learner who is not
    # root can submit jobs to a cluster started with sudo.
    key = folder / "munge-key" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    os.chmod(folder / "munge-key", 0o700)
    for path in (folder, folder / "munge"):
        os.chmod(path, 0o755)
    try:
        _spawn(
            "munged",
            [
                _program("munged"),
                "--foreground",
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
    path = folder / PIDS_FILE
    if not path.exists():
        return {}
    pids = {}
    for line in path.read_text().splitlines():
        name, _, pid = line.partition(" ")
        if pid.strip().isdigit():
            pids[name] = int(pid)
    return pids


@dataclass
class Stopped:
    """What ``stop`` ended: the daemons (by the PIDs it recorded) and any other process found."""

    daemons: dict[str, int]
    others: list[int]
    left: list[int]

    def __repr__(self) -> str:
        text = f"stopped {', '.join(sorted(self.daemons)) or 'no daemon'}"
        if self.others:
            text += f" and {len(self.others)} job process(es) left by the cluster"
        if self.left:
            text += f"; STILL RUNNING: {self.left}"
        return text


def stop(cluster: Cluster | str | os.PathLike | None = None, timeout_s: float = 20.0) -> Stopped:
    """Cancel every job, then end each daemon by its recorded PID (TERM, then KILL), then any
    process still carrying this cluster's SLURM_CONF. Safe to call twice."""
    if not isinstance(cluster, Cluster):
        folder = Path(cluster or DEFAULT_FOLDER).resolve()
        cluster = Cluster(folder=folder, port=0, pids=_recorded_pids(folder))
    daemons = {n: p for n, p in cluster.pids.items() if _alive(p)}
    if "slurmctld" in daemons and cluster.conf.exists():
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            cluster.run("scancel", "--user=root", timeout_s=10)
            # running jobs end within KillWait (10 s); wait for their processes, not longer
            _wait_gone(_job_processes(cluster.conf), 12)
    order = [n for n in ("slurmd-n1", "slurmd-n2", "slurmctld", "munged") if n in daemons]
    order += [n for n in daemons if n not in order]
    for name in order:  # the nodes first, the controller next, munged last
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemons[name], signal.SIGTERM)
    left = _wait_gone(list(daemons.values()), timeout_s / 2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    others = [p for p in processes_of(cluster.conf) if p not in daemons.values()]
    for pid in others:  # a job step or rank the daemons did not take down with them
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
            scripts = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"
            print("\nSubmit the course's script to it (same terminal):")
            print(f"  export SLURM_CONF={cluster.conf}")
            print(f'  export PATH="{Path(sys.executable).parent}:$PATH"   # its torchrun')
            print(f"  cd {scripts}")
            print("  sbatch --wait --gpus-per-node=0 --cpus-per-task=1 slurm_ddp.sbatch")
            print("  cat ddp-train-*.out")
            print("Stop it with: make cluster-stop")
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
