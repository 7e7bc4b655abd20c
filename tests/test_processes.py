"""tutorial_utils.processes: tools that always return, children that die with their parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import alive, wait_until

from tutorial_utils import processes
from tutorial_utils.processes import tied_to_parent


def test_run_returns_the_output():
    done = processes.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


@pytest.mark.heavy
def test_run_kills_what_the_command_started_when_time_is_up(tmp_path):
    """Independent of load: the timeout must fire after the grandchild exists (its pid is
    written), and on a loaded machine that can take longer than any fixed timeout. So each try
    doubles the timeout until one fires after the pid file is there; every try must still end
    in time with nothing left behind."""
    pid_file = tmp_path / "pid"
    # The grandchild keeps the output pipe open: subprocess.run would wait for it forever.
    cmd = [
        "sh",
        "-c",
        f"sleep 1000 & echo $! > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; wait",
    ]
    timeout = 0.5
    while True:
        # run() must not wait for the pipe the grandchild holds (1000 s): the test's own timeout
        # (pyproject.toml, 300 s) stops that hang; what run() did is checked below
        with pytest.raises(subprocess.TimeoutExpired):
            processes.run(cmd, timeout_s=timeout)
        assert psutil.Process().children(recursive=True) == []
        if pid_file.exists():
            break
        assert timeout < 64, "the shell never started its grandchild"
        timeout *= 2
    # SIGKILLed (with its whole group) before run() raised; gone within moments
    assert wait_until(lambda: alive([int(pid_file.read_text())]) == [])


def test_run_cannot_start_a_missing_program():
    with pytest.raises(OSError):
        processes.run(["/no/such/program"], timeout_s=5)


@pytest.mark.heavy
def test_stop_tree_stops_a_process_that_ignores_sigterm():
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(1000)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout.readline() == "ready\n"
    stubborn.terminate()
    time.sleep(0.3)
    assert alive([stubborn.pid]) == [stubborn.pid]  # SIGTERM alone does not stop it
    assert processes.stop_tree([psutil.Process(stubborn.pid)], grace_s=0.3) == []
    assert alive([stubborn.pid]) == []
    stubborn.wait(timeout=5)


@pytest.mark.heavy
def test_a_finished_watchdog_leaves_everything_alone(tmp_path):
    job = subprocess.Popen(["sleep", "1000"])
    folder = tmp_path / "keep"
    folder.mkdir()
    dog = processes.Watchdog()
    try:
        dog.guard(job.pid)
        dog.remove_on_death(folder)
        time.sleep(0.3)
        dog.finish()
        assert alive([dog.pid]) == []  # it exited, and finish() reaped it
        assert job.poll() is None and folder.is_dir()
    finally:
        job.kill()
        job.wait()


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_the_watchdog_cleans_up_when_its_parent_dies(tmp_path, how):
    folder = tmp_path / "scratch"
    code = (
        "import subprocess, sys, time\n"
        "from tutorial_utils.processes import Watchdog\n"
        "dog = Watchdog()\n"
        "job = subprocess.Popen(['sh', '-c', 'sleep 1000 & sleep 1000 & wait'],\n"
        "                       start_new_session=True)\n"
        "dog.guard(job.pid)\n"
        f"dog.remove_on_death({str(folder)!r})\n"
        "print(dog.pid, job.pid, flush=True)\n"
        "time.sleep(1000)\n"
    )
    folder.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    dog_pid, job_pid = map(int, parent.stdout.readline().split())
    time.sleep(0.5)  # the watchdog has seen the job's children
    family = [job_pid, *(p.pid for p in psutil.Process(job_pid).children())]
    assert len(family) == 3
    os.kill(parent.pid, how)
    parent.wait()
    assert wait_until(lambda: alive([*family, dog_pid]) == [] and not folder.exists())


def test_tied_to_parent_arms_the_parent_death_signal_and_runs_the_command():
    if not sys.platform.startswith("linux"):
        pytest.skip("a parent-death signal is a Linux feature")
    # The command itself reads the setting back: it survived the exec.
    code = (
        "import ctypes\n"
        "sig = ctypes.c_int()\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
        "print(sig.value)\n"
    )
    cmd = tied_to_parent([sys.executable, "-c", code], signal.SIGUSR1)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, str(int(signal.SIGUSR1)))


def test_a_tool_started_from_a_thread_dies_with_its_parent():
    if not sys.platform.startswith("linux"):
        pytest.skip("a parent-death signal is a Linux feature")
    # A parent starts `sleep` through processes.run in a second thread, then is SIGKILLed:
    # nothing runs a finally block, yet the sleep must not outlive it.
    code = (
        "import os, sys, threading, time\n"
        "from tutorial_utils import processes\n"
        "args = (['sleep', '300'], 600)\n"
        "threading.Thread(target=processes.run, args=args, daemon=True).start()\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    assert wait_until(
        lambda: (
            [c for c in psutil.Process(parent.pid).children(recursive=True) if c.name() == "sleep"]
            != []
        )
    )
    (child,) = [
        c for c in psutil.Process(parent.pid).children(recursive=True) if c.name() == "sleep"
    ]
    parent.kill()
    parent.wait()
    assert wait_until(lambda: alive([child.pid]) == [])


def test_tied_to_parent_refuses_a_missing_program_in_the_caller():
    with pytest.raises(FileNotFoundError, match="not found on PATH"):
        tied_to_parent(["no-such-program-here", "--help"])
    with pytest.raises(ValueError, match="command is empty"):
        tied_to_parent([])


def test_nothing_in_the_package_uses_a_preexec_fn():
    # Python runs a preexec_fn between fork and exec; with a second thread (doctor's checks, a
    # gauge, ipykernel's own) the child can deadlock there and Popen never returns.
    src = Path(processes.__file__).parent
    offenders = [
        f"{path.name}:{n}"
        for path in src.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "preexec_fn=" in line
    ]
    assert offenders == []
