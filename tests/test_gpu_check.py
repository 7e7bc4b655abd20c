"""tools/gpu_check.py: three files named by device and date, children that die with it, a
summary people can read, and a report the notebooks can show."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402

from tutorial_utils import recorded  # noqa: E402

H200 = {
    "name": "NVIDIA H200",
    "kind": "cuda",
    "gpu_count": 1,
    "compute_capability": [9, 0],
    "total_bytes": 150_000_000_000,
    "driver": "580.159.03",
}


def _report(check: gpu_check.Check) -> dict:
    check.report.update(
        device=H200,
        torch="2.11.0+cu130",
        cuda_version="13.0",
        python="3.12.3",
        notebooks=[
            {"name": "00_start_here.ipynb", "passed": True, "seconds": 12.0},
            {
                "name": "05_mixed_precision_and_cudnn.ipynb",
                "passed": False,
                "seconds": 30.0,
                "cell": 45,
                "error": "AssertionError: bf16 autocast should beat fp32",
            },
        ],
        unit_tests={
            "passed": True,
            "exit": 0,
            "summary": "612 passed in 41.2s",
            "seconds": 41.2,
            "not collected": [],
            "failures": [],
        },
        torch_api={"torch": "2.11.0+cu130", "checked": 181, "missing": [], "bad_keywords": []},
        goals=[
            {
                "goal": "bf16 autocast step vs fp32 without TF32 >= 2.5",
                "status": "missed",
                "value": 2.1,
                "by": "16% short",
                "key": "amp_speed",
                "figure": "bf16_vs_fp32",
            }
        ],
        results={
            "oom_message": {
                "key": "oom_message",
                "title": "A real CUDA OOM message",
                "text": "CUDA out of memory. Tried to allocate 3.00 GiB.",
            }
        },
    )
    return check.report


def test_three_files_named_by_device_and_date(tmp_path):
    check = gpu_check.Check(tmp_path / "out", 60, tmp_path / "work")
    check.write()  # before the probe: the device is not known yet
    assert len(list((tmp_path / "out").iterdir())) == 3
    _report(check)
    (check.logs / "unit-tests.log").write_text("612 passed\n")
    check.write()
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    date = check.report["date"]
    assert files == [
        f"nvidia-h200-{date}-notebooks.tar.gz",
        f"nvidia-h200-{date}.json",
        f"nvidia-h200-{date}.md",
    ]
    import tarfile

    with tarfile.open(tmp_path / "out" / files[0]) as tar:
        names = tar.getnames()
    assert f"nvidia-h200-{date}/logs/unit-tests.log" in names
    assert f"nvidia-h200-{date}/report.json" in names


def test_the_notebooks_read_a_run_the_check_wrote(tmp_path):
    check = gpu_check.Check(tmp_path / "out", 60, tmp_path / "work")
    _report(check)
    check.write()
    shown = recorded.show("oom_message", results_dir=tmp_path / "out")
    assert str(shown).startswith("Recorded on NVIDIA H200, compute capability 9.0, torch 2.11.0")
    assert "Tried to allocate 3.00 GiB" in str(shown)


def test_a_file_the_check_did_not_write_is_left_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("mine")
    check = gpu_check.Check(out, 60, tmp_path / "work")
    check.write()
    _report(check)
    check.write()
    assert (out / "README.md").read_text() == "mine"
    assert len(list(out.iterdir())) == 4


def test_summary_says_what_failed_and_the_goals(tmp_path):
    check = gpu_check.Check(tmp_path / "out", 60, tmp_path / "work")
    text = gpu_check.summary(_report(check))
    assert text.startswith("# GPU check: NVIDIA H200, ")
    assert "compute capability 9.0, 139.7 GiB, 1 GPU(s), driver 580.159.03" in text
    assert (
        "| 05_mixed_precision_and_cudnn.ipynb | **FAILED** | 30 s | cell 45: AssertionError" in text
    )
    assert "| bf16 autocast step vs fp32 without TF32 >= 2.5 | missed by 16% short | 2.1 |" in text
    assert "181 torch names" in text and "(**incomplete**" in text
    assert "```\nCUDA out of memory. Tried to allocate 3.00 GiB.\n```" in text


@pytest.mark.slow  # starts two Python processes
def test_a_child_past_its_time_is_killed_with_its_own_children(tmp_path):
    check = gpu_check.Check(tmp_path / "out", 60, tmp_path / "work")
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    rc, log = check.child("sleeper", [sys.executable, "-c", code], timeout=3)
    # 124: stopped at its timeout (a child left to finish its 60 s sleep would exit 0); issue 37:
    # not also "it took < 30 s"
    assert rc == 124 and "stopped after 3 s" in log
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the grandchild outlived the check's timeout")


@pytest.mark.slow  # the probe imports torch in a child process
def test_without_a_gpu_the_check_refuses_in_one_sentence(tmp_path, monkeypatch):
    import torch  # asked here, not in a second child that would import torch again

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    check = gpu_check.Check(tmp_path / "out", 300, tmp_path / "work")
    check.env["PYTHONPATH"] = str(ROOT / "src")
    why = gpu_check.probe(check, require_gpu=True)
    assert why.startswith("make gpu-check needs 1 GPU(s), but ")
    assert check.report["device"]["kind"] == "cpu"


def test_bad_arguments_are_one_sentence(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", "x", "--budget-s", "10"])
    assert "--budget-s must be more than 30 seconds" in capsys.readouterr().err


def test_the_order_runs_the_longest_notebooks_first():
    names = sorted(gpu_check._number(p) for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert sorted(gpu_check.NOTEBOOK_ORDER) == names
    assert json.loads(json.dumps(gpu_check.DEV_ONLY_TESTS))  # plain data, shown in the report


@pytest.mark.slow  # starts Python processes and waits for a signal to land
def test_sigterm_stops_the_check_its_children_and_its_workers_at_once(tmp_path):
    # before: a SIGTERM waited for the worker threads, which went on starting notebooks
    import signal
    import subprocess

    pidfile = tmp_path / "child.pid"
    script = f"""
import sys, threading, time
from pathlib import Path
sys.path.insert(0, {str(ROOT / "tools")!r})
import gpu_check
tmp = Path({str(tmp_path)!r}) / "tmp"
check = gpu_check.Check(Path({str(tmp_path / "out")!r}), 600, tmp / "run")
gpu_check.stop_on_signals(check, tmp)
code = "import os, time; open({str(pidfile)!r}, 'a').write(str(os.getpid()) + chr(10)); "
sleeper = [sys.executable, "-c", code + "time.sleep(60)"]
def worker():
    for i in range(5):  # like the notebook lanes: one child after another
        check.child(f"s{{i}}", sleeper, 60)
threading.Thread(target=worker).start()
print("ready", flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    time.sleep(1)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 1, "no new child started after the signal"
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(files) == 3 and files[1].endswith(".json")
    assert "stopped by signal 15" in (tmp_path / "out" / files[1]).read_text()


def test_without_jupyterlab_every_test_that_serves_a_lab_is_left_out():
    # before: tests/test_faults.py's lab-token test ran there and failed with served: False
    cmd, skipped = gpu_check.unit_test_command("SITE", 6, found=lambda m, _p: m != "jupyterlab")
    lab = "tests/test_faults.py::test_lab_token_is_in_no_command_line"
    assert cmd[cmd.index(lab) - 1] == "--deselect"
    assert f"{lab} (needs jupyterlab)" in skipped
    assert "tests/test_lab.py" in cmd
    assert all("(needs jupyterlab)" in s for s in skipped if "(needs " in s)


def test_the_slurm_cluster_and_300_launches_stay_off_the_gpu_machine():
    # before: the check ran tests/test_cluster.py (apt as root, no network there) and the
    # clean-exit test's 30 launches of each of 10 scripts, far past its minutes
    cmd, skipped = gpu_check.unit_test_command("SITE", 6, found=lambda m, _p: True)
    assert cmd[cmd.index("tests/test_cluster.py") - 1] == "--ignore"
    assert any(s.startswith("tests/test_cluster.py (") for s in skipped)
    runs = gpu_check.UNIT_TEST_ENV["TUTORIAL_EXIT_RUNS"]
    assert int(runs) <= 3
    assert (
        'os.environ.get("TUTORIAL_EXIT_RUNS"'
        in (ROOT / "tests" / "test_distributed.py").read_text()
    )


def test_xdist_is_looked_for_where_the_wheels_are():
    # before: the check asked its own process, which lacks the wheels' folder, so a machine
    # without pytest-xdist of its own ran the unit tests serially though the wheel travelled
    asked = []

    def found(module, pythonpath):
        asked.append((module, pythonpath))
        return module == "xdist"

    cmd, _ = gpu_check.unit_test_command("/tmp/site:src", 6, found)
    assert ("xdist", "/tmp/site:src") in asked
    assert cmd[cmd.index("-n") : cmd.index("-n") + 4] == ["-n", "6", "--dist", "loadfile"]
    cmd, _ = gpu_check.unit_test_command("/tmp/site:src", 6, lambda m, p: False)
    assert "-n" not in cmd


def test_every_test_left_out_without_its_module_exists():
    # a renamed test would silently run (and fail) on the GPU machine again
    for tests in gpu_check.DEV_ONLY_TESTS.values():
        for test in tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), test
            assert not name or f"def {name}(" in (ROOT / path).read_text(), test


def test_every_test_that_runs_nbval_is_left_out_where_nbval_is_missing():
    # the GPU machine has no nbval: a test that starts pytest with nbval fails there with
    # "unrecognized arguments" (seen in the dry run on torch 2.11): it must be in the nbval list
    left_out = set(gpu_check.DEV_ONLY_TESTS["nbval"]) | set(gpu_check.NOT_ON_THE_GPU_MACHINE)
    needle = '"--' + 'nbval"'  # (spelled in two parts so that this file does not match)
    tests = (ROOT / "tests").glob("test_*.py")
    runs_nbval = {f"tests/{p.name}" for p in tests if needle in p.read_text()}
    assert runs_nbval, "the scan found no test that runs nbval: is the pattern stale?"
    assert runs_nbval <= left_out, runs_nbval - left_out
