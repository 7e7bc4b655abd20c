"""tools/cluster.py without starting anything: the slurm.conf it writes, and its refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import cluster as slurm  # noqa: E402


def test_two_nodes_on_this_machine_each_on_its_own_port(tmp_path):
    conf = slurm.slurm_conf(tmp_path, 17000, "myhost")
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert [line.split()[0] for line in nodes] == ["NodeName=n1", "NodeName=n2"]
    assert all("NodeHostname=myhost NodeAddr=127.0.0.1" in line for line in nodes)
    assert "Port=17001" in nodes[0] and "Port=17002" in nodes[1]
    assert "SlurmctldPort=17000" in conf and "SlurmctldHost=myhost(127.0.0.1)" in conf
    for setting in ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"):
        assert setting in conf
    # every path the daemons write is inside the cluster's folder
    paths = [v for line in conf.splitlines() for v in line.split("=")[1:] if v.startswith("/")]
    assert paths and all(p.startswith(str(tmp_path)) for p in paths), paths


def test_not_root_is_one_sentence_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 1000)
    with pytest.raises(slurm.Unavailable, match="runs its daemons as root") as info:
        slurm.start(tmp_path)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "slurm.conf").exists()


def test_missing_slurm_without_root_says_how_to_install(monkeypatch):
    monkeypatch.setattr(slurm, "missing_programs", lambda: ["slurmctld"])
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 1000)
    with pytest.raises(slurm.Unavailable, match="sudo apt-get install slurm-wlm munge"):
        slurm.ensure_installed()


def test_stop_of_a_folder_with_no_cluster_does_nothing(tmp_path):
    stopped = slurm.stop(tmp_path)
    assert stopped.daemons == {} and stopped.left == []
    assert repr(stopped) == "stopped no daemon"
    assert "no cluster running" in slurm.status(tmp_path)


def test_a_busy_port_is_refused(tmp_path, monkeypatch):
    import socket

    monkeypatch.setattr(slurm, "missing_programs", lambda: [])
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 0)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(slurm.ClusterError, match=f"port {port} is already in use"):
            slurm.start(tmp_path, port=port)


def _fake_apt(folder: Path, body: str, monkeypatch) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "apt-get"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{slurm.os.environ['PATH']}")
    monkeypatch.setattr(slurm.os, "geteuid", lambda: 0)
    return exe


def test_missing_slurm_is_installed_with_apt_as_root(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    _fake_apt(tmp_path / "bin", f'echo "$@" >> {calls}\n', monkeypatch)
    answers = iter([["slurmctld"], []])  # missing before the install, there after
    monkeypatch.setattr(slurm, "missing_programs", lambda: next(answers, []))
    slurm.ensure_installed(timeout_s=30)
    assert calls.read_text().splitlines() == [
        "update -q",
        "install -y -q --no-install-recommends slurm-wlm munge",
    ]


@pytest.mark.heavy
def test_an_apt_that_hangs_is_stopped_at_the_timeout_with_its_children(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    _fake_apt(tmp_path / "bin", f"sleep 30 &\necho $! > {pids}\nwait\n", monkeypatch)
    monkeypatch.setattr(slurm, "missing_programs", lambda: ["slurmctld"])
    with pytest.raises(slurm.Unavailable, match="did not finish in 1 s") as info:
        slurm.ensure_installed(timeout_s=1)
    assert "\n" not in str(info.value)
    child = int(pids.read_text())
    assert slurm._wait_gone([child], 5) == [], "apt's child outlived the timeout"


def test_an_apt_that_fails_says_so_in_one_sentence(tmp_path, monkeypatch):
    _fake_apt(
        tmp_path / "bin",
        "echo 'E: Unable to locate package slurm-wlm' >&2\nexit 100\n",
        monkeypatch,
    )
    monkeypatch.setattr(slurm, "missing_programs", lambda: ["slurmctld"])
    with pytest.raises(slurm.Unavailable, match="Unable to locate package slurm-wlm"):
        slurm.ensure_installed(timeout_s=10)


# --------------------------------------------------------------------------- what stop touches


def _sleeper(env: dict[str, str], exe: str = "sleep", *args: str):
    import subprocess

    return subprocess.Popen([exe, *args] if args else [exe, "60"], env=env, start_new_session=True)


def test_stop_leaves_the_learners_terminal_alone(tmp_path):
    """`make cluster` tells the learner to export SLURM_CONF; whatever they run in that terminal
    (an editor, the lab, make itself) carries it, and is not the cluster's."""
    import os

    conf = tmp_path / "slurm.conf"
    conf.write_text("# a cluster that is not running\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    terminal = _sleeper(env)
    try:
        stopped = slurm.stop(tmp_path)
        assert stopped.others == [] and terminal.poll() is None, (
            "stop killed the terminal's program"
        )
    finally:
        terminal.kill()
        terminal.wait()


@pytest.mark.heavy
def test_stop_ends_what_is_left_of_a_job_and_only_that(tmp_path):
    """A stand-in slurmstepd of this cluster (named so, carrying its SLURM_CONF) with a child that
    ignores SIGTERM: both go. Another cluster's slurmstepd and the terminal stay."""
    import os
    import shutil
    import signal
    import time

    conf = tmp_path / "slurm.conf"
    conf.write_text("# a cluster whose daemons died\n")
    stepd = tmp_path / "slurmstepd"
    shutil.copy(sys.executable, stepd)
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    import subprocess

    env = {**os.environ, "SLURM_CONF": str(conf)}
    ours = subprocess.Popen(
        [str(stepd), "-c", code], env=env, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    other = subprocess.Popen(
        [str(stepd), "-c", "import time; time.sleep(60)"],
        env={**os.environ, "SLURM_CONF": str(tmp_path / "other.conf")},
        start_new_session=True,
    )
    terminal = _sleeper(env)
    try:
        child = int(ours.stdout.readline())
        stopped = slurm.stop(tmp_path)
        assert set(stopped.others) >= {ours.pid, child}
        ours.wait(timeout=10)
        assert slurm._wait_gone([child], 5) == [], "the job's helper outlived stop"
        time.sleep(0.2)
        assert other.poll() is None and terminal.poll() is None
    finally:
        for proc in (ours, other, terminal):
            proc.kill()
            proc.wait()
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_stale_pids_file_signals_nobody_and_does_not_block_start(tmp_path, monkeypatch):
    """After a crash or a reboot the recorded PIDs may belong to other programs now."""
    import os
    import socket

    stranger = _sleeper(dict(os.environ))
    try:
        ticks = slurm._start_ticks(stranger.pid)
        (tmp_path / slurm.PIDS_FILE).write_text(
            f"slurmctld {stranger.pid}\n"  # the old format: a bare pid
            f"slurmd-n1 {stranger.pid} {ticks} {slurm._boot_id()}\n"  # the name does not match
            f"munged {stranger.pid} {ticks} another-boot\n"  # before a reboot
            f"slurmd-n2 {stranger.pid} {ticks + 1} {slurm._boot_id()}\n"  # another start time
        )
        assert slurm._recorded_pids(tmp_path) == {}
        stopped = slurm.stop(tmp_path)
        assert stopped.daemons == {} and stranger.poll() is None, "stop signalled a stranger"
        assert "no cluster running" in slurm.status(tmp_path)
        # start goes past the stale file (and stops at the busy port, before starting anything)
        monkeypatch.setattr(slurm, "missing_programs", lambda: [])
        monkeypatch.setattr(slurm.os, "geteuid", lambda: 0)
        with socket.create_server(("127.0.0.1", 0)) as busy:
            port = busy.getsockname()[1]
            with pytest.raises(slurm.ClusterError, match="is already in use"):
                slurm.start(tmp_path, port=port)
    finally:
        stranger.kill()
        stranger.wait()


def test_a_recorded_daemon_is_recognised_by_name_and_start_time(tmp_path):
    import os
    import shutil

    exe = tmp_path / "slurmctld"
    shutil.copy(shutil.which("sleep"), exe)
    daemon = _sleeper(dict(os.environ), str(exe), "60")
    try:
        ticks = slurm._start_ticks(daemon.pid)
        (tmp_path / slurm.PIDS_FILE).write_text(
            f"slurmctld {daemon.pid} {ticks} {slurm._boot_id()}\n"
        )
        assert slurm._recorded_pids(tmp_path) == {"slurmctld": daemon.pid}
        stopped = slurm.stop(tmp_path)
        assert stopped.daemons == {"slurmctld": daemon.pid} and not stopped.left
        assert daemon.wait(timeout=5) is not None
        assert not (tmp_path / slurm.PIDS_FILE).exists()
    finally:
        daemon.kill()
        daemon.wait()


# --------------------------------------------------------------------------- files and modes


def test_the_munge_key_is_created_with_its_final_modes(tmp_path, monkeypatch):
    """Created 0600 in a 0700 folder whatever the umask: never chmod'ed afterwards (between the
    write and a chmod, any local user could read it and mint root's credentials)."""
    import os
    import stat

    chmods = []
    real_chmod = os.chmod
    monkeypatch.setattr(
        slurm.os, "chmod", lambda p, m, *a, **k: (chmods.append(str(p)), real_chmod(p, m, *a, **k))
    )
    monkeypatch.setattr(slurm.Path, "chmod", lambda self, m: chmods.append(str(self)))
    old = os.umask(0)
    try:
        slurm.prepare(tmp_path / "c", 17000)
    finally:
        os.umask(old)
    keys = tmp_path / "c" / "munge-key"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "munge.key").stat().st_mode) == 0o600
    assert (keys / "munge.key").stat().st_size == 1024
    assert not [p for p in chmods if "munge-key" in p], chmods


def test_a_key_once_readable_by_others_is_replaced(tmp_path):
    import os
    import stat

    keys = tmp_path / "munge-key"
    keys.mkdir(mode=0o755)
    (keys / "munge.key").write_bytes(b"x" * 1024)
    os.chmod(keys / "munge.key", 0o644)
    slurm._make_key(tmp_path)
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "munge.key").stat().st_mode) == 0o600
    assert (keys / "munge.key").read_bytes() != b"x" * 1024


def test_start_keeps_the_mode_of_the_folder_it_is_given(tmp_path):
    import os
    import stat

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    slurm.prepare(shared, 17000)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


@pytest.mark.parametrize(
    ("resolved", "listens"),
    [("127.0.0.1", "127.0.0.1"), ("127.0.1.1", "127.0.1.1"), ("192.0.2.7", None)],
)
def test_the_daemons_listen_on_loopback_when_the_host_name_resolves_there(
    tmp_path, monkeypatch, resolved, listens
):
    monkeypatch.setattr(slurm.socket, "getaddrinfo", lambda *a, **k: [(2, 1, 6, "", (resolved, 0))])
    cluster = slurm.prepare(tmp_path, 17000)
    conf = cluster.conf.read_text()
    assert cluster.loopback == listens
    if listens:
        assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in conf
        assert f"NodeAddr={listens} " in conf and f"({listens})" in conf
    else:  # Slurm would bind the network address: it keeps every interface, reached on 127.0.0.1
        assert "CommunicationParameters" not in conf and "NodeAddr=127.0.0.1 " in conf


# --------------------------------------------------------------------------- what others planted

NOBODY = 65534  # the user `nobody` (Debian, Ubuntu, Fedora): owns nothing of ours


def _as_nobody(path: Path) -> None:
    """Give ``path`` to another user, as if they had made it (needs root to chown)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("planting a file as another user needs root (to chown it)")
    os.chown(path, NOBODY, NOBODY)


def _shared(tmp_path: Path) -> Path:
    """A folder every user may create in, like /tmp (sticky, 1777): what --folder allows."""
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    return shared


def _one_sentence(error: Exception) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("planted", ["key and folder", "key only"])
def test_a_munge_key_another_user_planted_is_refused(tmp_path, planted):
    """Issue 37 item 5: user nobody makes munge-key/munge.key (0600, contents they know) in a
    shared sticky folder before root starts the cluster there. Before: the key was kept, and
    anyone with it can mint root's credentials. Now: refused, in one sentence, and untouched."""
    import os

    shared = _shared(tmp_path)
    keys = shared / "munge-key"
    keys.mkdir(mode=0o700)
    known = b"known to nobody" * 64
    (keys / "munge.key").write_bytes(known)
    os.chmod(keys / "munge.key", 0o600)
    _as_nobody(keys / "munge.key")
    if planted == "key and folder":
        _as_nobody(keys)
    with pytest.raises(slurm.ClusterError) as info:
        slurm.prepare(shared, 17000)
    text = _one_sentence(info.value)
    assert "belongs to user nobody (uid 65534), not to this user" in text, text
    assert str(keys if planted == "key and folder" else keys / "munge.key") in text
    assert (keys / "munge.key").read_bytes() == known  # refused, not adopted or overwritten
    assert not (shared / "slurm.conf").exists(), "nothing is written after a refusal"


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777], ids=oct)
@pytest.mark.parametrize("what", ["munge-key", "munge"])
def test_a_key_or_socket_folder_others_can_write_is_refused(tmp_path, what, mode):
    """The key's folder and munged's socket folder: whoever can write there can swap the key, or
    put a socket of their own where the daemons ask munged to vouch for a user."""
    import os

    folder = tmp_path / "c"
    folder.mkdir()
    (folder / what).mkdir()
    os.chmod(folder / what, mode)
    with pytest.raises(slurm.ClusterError) as info:
        slurm.prepare(folder, 17000)
    text = _one_sentence(info.value)
    assert f"{folder / what} can be written by other users (mode {mode:04o})" in text, text
    assert os.stat(folder / what).st_mode & 0o777 == mode, "refused, not chmod'ed"


def test_a_socket_folder_another_user_owns_is_refused(tmp_path):
    shared = _shared(tmp_path)
    (shared / "munge").mkdir(mode=0o755)
    _as_nobody(shared / "munge")
    with pytest.raises(slurm.ClusterError, match="MUNGE's socket folder .* belongs to user nobody"):
        slurm.prepare(shared, 17000)


@pytest.mark.parametrize("name", ["slurm.conf", "plugstack.conf", "pids"])
def test_a_file_another_user_planted_in_a_shared_folder_is_refused(tmp_path, name):
    """slurm.conf names programs slurmctld runs as root (Prolog=...), plugstack.conf loads
    plugins into it: whoever owns the file can rewrite it after we wrote it."""
    shared = _shared(tmp_path)
    (shared / name).write_text("# theirs\n")
    _as_nobody(shared / name)
    with pytest.raises(slurm.ClusterError, match=f"{name} belongs to user nobody") as info:
        slurm.prepare(shared, 17000)
    _one_sentence(info.value)
    assert (shared / name).read_text() == "# theirs\n"


def test_a_cluster_folder_others_can_write_must_be_sticky_and_ours(tmp_path):
    import os

    open_folder = tmp_path / "open"
    open_folder.mkdir()
    os.chmod(open_folder, 0o777)  # others could rename munge-key away and put theirs there
    with pytest.raises(slurm.ClusterError, match="is not sticky"):
        slurm.prepare(open_folder, 17000)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _as_nobody(theirs)
    with pytest.raises(slurm.ClusterError, match="belongs to user nobody"):
        slurm.prepare(theirs, 17000)


def test_the_command_line_refuses_a_planted_key_in_one_sentence(tmp_path, monkeypatch, capsys):
    """`python tools/cluster.py start --folder SHARED` as root: one line on stderr, exit 1, no
    traceback, nothing started (the Slurm programs need not be installed for the refusal)."""
    import os

    shared = _shared(tmp_path)
    (shared / "munge-key").mkdir(mode=0o700)
    _as_nobody(shared / "munge-key")
    monkeypatch.setattr(slurm, "ensure_installed", lambda *a, **k: None)
    monkeypatch.setattr(slurm, "missing_programs", lambda: [])
    spawned = []
    monkeypatch.setattr(slurm, "_spawn", lambda *a, **k: spawned.append(a))
    code = slurm.main(["start", "--folder", str(shared), "--port", str(slurm.free_base_port())])
    err = capsys.readouterr().err
    assert code == 1 and not spawned
    assert err.startswith("error: the MUNGE key's folder ") and err.count("\n") == 1, err
    assert "Traceback" not in err and os.stat(shared / "munge-key").st_uid == NOBODY
