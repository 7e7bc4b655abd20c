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
