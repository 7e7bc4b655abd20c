"""The fault table of issue 11 for the lab, ``launch``, ``doctor`` and the live gauge, as tests.

Each row is a fault found by using the course as a hostile user would: what the code did before
the fix, and what it does now. "Before" was measured with the same probe the row's test runs
(``tests/fault_probes.py``), on main at 2329792 (the code before this work), 2026-12-01, on a
2-core CPU machine shared with
other jobs::

    git archive 2329792 src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/src .venv/bin/python tests/fault_probes.py PROBE [ARGS]

"Now" is what the row's test asserts. ``python tests/test_faults.py`` prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import fault_probes as probe
import pytest


@dataclass(frozen=True)
class Fault:
    case: str
    probe: str  # the command line of tests/fault_probes.py that measures it
    before: str
    now: str
    test: str  # the test function below that asserts "now"


FAULTS = (
    Fault(
        "lab token visible to another user",
        "lab_token",
        "yes: 1 process (JupyterLab) has --IdentityProvider.token=<token> in /proc/PID/cmdline",
        "in no process's arguments; given in a 0600 file, deleted once the server is up",
        "test_lab_token_is_in_no_command_line",
    ),
    Fault(
        "token sent elsewhere when the port is busy",
        "lab_busy_port",
        "yes: the address with the token was printed for the busy port; Jupyter moved to the next",
        "exit 2 before anything starts: 'lab: port N is already in use on 127.0.0.1 ...'",
        "test_busy_port_is_an_error_and_no_token_is_printed",
    ),
    Fault(
        "PORT=abc make lab",
        "lab_bad_port_variable",
        "ValueError traceback, 13 lines on stderr, exit 1",
        "one sentence, exit 2",
        "test_bad_port_variable_is_one_sentence",
    ),
    Fault(
        "kernel killed (SIGKILL) during launch",
        "orphans KILL",
        "3 processes (torchrun + 2 ranks) still running 10 s later; temporary folder left",
        "no process left 10 s later (the watchdog stops them), temporary folder removed",
        "test_no_orphans_after_the_kernel_is_killed",
    ),
    Fault(
        "kernel terminated (SIGTERM) during launch",
        "orphans TERM",
        "3 processes still running 10 s later; temporary folder left",
        "no process left 10 s later, temporary folder removed",
        "test_no_orphans_after_the_kernel_is_killed",
    ),
    Fault(
        "ranks start SIGTERM-ignoring helpers from their SIGTERM handler; kernel killed",
        "orphan_helpers KILL 0.5",
        "2 helpers still running 10 s later, 3 runs of 3 (the watchdog SIGKILLed the subreaper "
        "after 1 s, inside its 2 s grace, from a snapshot taken before the helpers existed)",
        "none: the watchdog kills what it finds below the subreaper, looking again until nothing "
        "is left, and the subreaper last",
        "test_no_orphan_helpers",
    ),
    Fault(
        "the same, kernel terminated (SIGTERM)",
        "orphan_helpers TERM 0.5",
        "2 helpers still running 10 s later",
        "none",
        "test_no_orphan_helpers",
    ),
    Fault(
        "a rank SIGKILLs the subreaper; the ranks' SIGTERM handlers start helpers (no mark left)",
        "orphan_helpers kill-subreaper 0.5",
        "2 helpers still running 10 s after launch returned",
        "none: torchrun is a subreaper too, and launch sweeps from it once the supervisor dies",
        "test_no_orphan_helpers",
    ),
    Fault(
        "rank output without a final newline",
        "launch_glued_lines",
        "rank 1's line ended up as 'rank 1 progress 50%[rank0] rank 0 line 0'; rank 0 lost it",
        "each rank's lines stay its own",
        "test_each_ranks_lines_stay_its_own",
    ),
    Fault(
        "a rank writes a malformed result file",
        "launch_malformed_report",
        "raw JSONDecodeError; every rank's report lost",
        "the rank is named in result.report_errors; the other reports are kept",
        "test_malformed_report_names_the_rank_and_keeps_the_rest",
    ),
    Fault(
        "a malformed result file and a timeout",
        "launch_malformed_report true",
        "raw JSONDecodeError: the timeout was hidden",
        "LaunchError 'timed out after 30 s'; rank 0's report kept",
        "test_malformed_report_never_hides_a_timeout",
    ),
    Fault(
        "launch with a bad timeout, nproc, port or args",
        "launch_bad_arguments",
        (
            "timeout=nan: no timeout at all; timeout=0 / -5: torchrun started, then 'timed out "
            "after 0 s'; nproc=2.5: torchrun started, failed after 12.9 s; nproc='2', "
            "port='abc' / 70000: raw TypeError / OverflowError; args='--epochs 3': split into "
            "characters, silently"
        ),
        "ValueError/TypeError with one sentence, before anything starts (no process started)",
        "test_bad_launch_arguments_fail_before_anything_starts",
    ),
    Fault(
        "doctor with a hanging nvidia-smi",
        "doctor_hanging_nvidia_smi 60",
        (
            "never returned (stopped after 60 s); of the 4 nvidia-smi processes it had "
            "started, 3 were still running once it was killed"
        ),
        "returns; rows say 'timed out after N s'; nothing it started is left running",
        "test_doctor_with_a_hanging_nvidia_smi_returns_and_leaves_nothing",
    ),
    Fault(
        "doctor with an nvidia-smi printing garbage",
        "doctor_garbage_nvidia_smi",
        "ok, sees 3 GPU(s)",
        "missing: 'answers with something that is not a list of GPUs'",
        "test_doctor_with_garbage_from_nvidia_smi_and_an_empty_requirement",
    ),
    Fault(
        "doctor --require ''",
        "doctor_garbage_nvidia_smi",
        "exit 0, as if nothing were required",
        "exit 2: 'doctor: --require needs a value: ...'",
        "test_doctor_with_garbage_from_nvidia_smi_and_an_empty_requirement",
    ),
    Fault(
        "doctor with a hanging NVML",
        "doctor_hanging_nvml 60",
        "never returned (stopped after 60 s)",
        "returns; the NVML row says 'timed out after N s'",
        "test_doctor_with_a_hanging_nvml_returns",
    ),
    Fault(
        "LiveGauge with a huge period",
        "gauge huge_period",
        "OverflowError traceback on stderr; thread dead; gauge.error empty",
        "ValueError at construction: 'above the maximum of 3600 s'",
        "test_gauge_faults",
    ),
    Fault(
        "LiveGauge thread dying outside a sample",
        "gauge thread_dies",
        "traceback on stderr; thread dead; gauge.error empty, widget silent",
        "error in gauge.error and in the widget; nothing on stderr",
        "test_gauge_faults",
    ),
    Fault(
        "a source returning a malformed reading",
        "gauge malformed_reading",
        "stop() raised TypeError: unsupported operand type(s) for /: 'str' and 'int'",
        "an error row for that source; stop() returns",
        "test_gauge_faults",
    ),
)


def table() -> str:
    """The fault table in markdown."""
    lines = ["| case | before | now |", "| --- | --- | --- |"]
    lines += [f"| {f.case} | {f.before} | {f.now} |" for f in FAULTS]
    return "\n".join(lines)


def test_every_row_has_its_test_and_every_test_its_row():
    tests = {name for name in globals() if name.startswith("test_")}
    named = {f.test for f in FAULTS}
    assert named <= tests, f"rows naming no test: {named - tests}"
    assert tests - named == {"test_every_row_has_its_test_and_every_test_its_row"}
    for f in FAULTS:
        assert f.probe.split()[0] in probe.PROBES, f.probe


# --------------------------------------------------------------------------- the lab


@pytest.mark.slow
@pytest.mark.guard
def test_lab_token_is_in_no_command_line():
    seen = probe.lab_token()
    assert seen == {"served": True, "processes_showing_the_token": 0, "token_files_left": []}


@pytest.mark.heavy
def test_busy_port_is_an_error_and_no_token_is_printed():
    seen = probe.lab_busy_port()
    assert seen["token_printed_for_ports"] == [] and seen["jupyter_served_on"] == []
    assert seen["exit_status"] == 2
    assert seen["last_line"].startswith(f"lab: port {seen['busy_port']} is already in use")


def test_bad_port_variable_is_one_sentence():
    seen = probe.lab_bad_port_variable()
    assert seen["exit_status"] == 2 and not seen["traceback"] and seen["stderr_lines"] == 1
    assert seen["last_line"].startswith("lab: the port must be a whole number from 1 to 65535")


# --------------------------------------------------------------------------- launch


@pytest.mark.slow
@pytest.mark.guard
@pytest.mark.parametrize("signal_name", ["KILL", "TERM"])
def test_no_orphans_after_the_kernel_is_killed(signal_name):
    seen = probe.orphans(signal_name, wait_s=10.0)
    assert seen["job_processes"] >= 4  # torchrun, 2 ranks, the watchdog
    # "After a few seconds": 10 s, a margin for a loaded machine (typically 1-3 s: the
    # watchdog's 1 s grace after SIGTERM, then SIGKILL).
    assert seen["alive_after_wait"] == 0 and seen["temp_folders_left"] == 0


@pytest.mark.slow
@pytest.mark.guard
@pytest.mark.parametrize("case", ["KILL", "TERM", "kill-subreaper"])
def test_no_orphan_helpers(case):
    # The attack needs each rank to reach its SIGTERM handler and start a helper; on a loaded
    # machine a rank may be killed before it does (then nothing was attacked, nothing checked).
    # Retry the setup, not the verdict: the first run in which both helpers started is judged.
    for _ in range(3):
        seen = probe.orphan_helpers(case, delay_s=0.5, wait_s=10.0)
        if seen["helpers_started"] == 2:
            break
    assert seen["helpers_started"] == 2, seen  # the attack happened
    assert seen["helpers_alive_after_wait"] == 0 and seen["other_job_processes_alive"] == 0, seen
    assert seen["temp_folders_left"] == 0


@pytest.mark.slow
def test_each_ranks_lines_stay_its_own():
    seen = probe.launch_glued_lines()
    assert seen == {
        "rank0": ["rank 0 line 0", "rank 0 line 1", "rank 0 line 2"],
        "rank1": ["rank 1 progress 50%"],
    }


@pytest.mark.slow
def test_malformed_report_names_the_rank_and_keeps_the_rest():
    seen = probe.launch_malformed_report()
    assert seen["raised"] is None and seen["reports_kept"] == [0]
    assert seen["named"].startswith("rank 1 wrote a result file that is not valid JSON")


@pytest.mark.slow
def test_malformed_report_never_hides_a_timeout():
    seen = probe.launch_malformed_report(hang=True)
    assert seen["raised"] == "LaunchError" and "timed out after 30 s" in seen["first_line"]
    assert seen["reports_kept"] == [0]


def test_bad_launch_arguments_fail_before_anything_starts():
    seen = probe.launch_bad_arguments()
    for case, outcome in seen.items():
        assert outcome["outcome"].startswith(("ValueError: ", "TypeError: ")), (case, outcome)
        assert outcome["processes_started"] == 0, (case, outcome)  # issue 37: not "< 1 s"


# --------------------------------------------------------------------------- doctor


@pytest.mark.slow
def test_doctor_with_a_hanging_nvidia_smi_returns_and_leaves_nothing():
    seen = probe.doctor_hanging_nvidia_smi(120.0, "--timeout", "2")
    assert seen["returned_after_s"] is not None
    assert seen["rows"]["nvidia-smi"] == "missing did not answer: timed out after 2 s"
    assert seen["rows"]["GPUtil"] == "missing 1.4.0: nvidia-smi did not answer: timed out after 2 s"
    assert seen["nvidia_smi_processes"] == 4 and seen["left_running"] == 0


@pytest.mark.slow
def test_doctor_with_garbage_from_nvidia_smi_and_an_empty_requirement():
    seen = probe.doctor_garbage_nvidia_smi()
    assert seen["nvidia_smi_row"] == (
        "missing answers with something that is not a list of GPUs: 'Segmentation fault'"
    )
    assert seen["require_empty_exit"] == 2
    assert seen["require_empty_last_line"].startswith("doctor: --require needs a value")


@pytest.mark.slow
def test_doctor_with_a_hanging_nvml_returns():
    seen = probe.doctor_hanging_nvml(120.0, timeout_s=1.0)
    assert seen["returned_after_s"] is not None
    assert "timed out after 1 s" in seen["nvml_row"]


# --------------------------------------------------------------------------- the gauge


@pytest.mark.slow
def test_gauge_faults():
    huge = probe.gauge("huge_period")
    assert huge["raised"].startswith("ValueError: period_s=1e+300 is above the maximum of 3600 s")
    assert not huge["traceback_on_stderr"]
    dies = probe.gauge("thread_dies")
    assert dies == {
        "running": False,
        "error": "the sampling thread stopped: RuntimeError: clock went backwards",
        "in_widget": True,
        "traceback_on_stderr": False,
    }
    malformed = probe.gauge("malformed_reading")
    assert malformed == {"stop": "returned", "error_row": True, "traceback_on_stderr": False}


if __name__ == "__main__":
    print(table())
