"""tools/peak_memory.py: the peak of a whole process tree, children included; the exit status."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import peak_memory  # noqa: E402

MiB = 2**20
# Touch every page of a 150 MiB buffer (so it is resident), hold it, then exit.
HOLD = "b = bytearray(150 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(1.5)"


@pytest.mark.slow  # child processes that hold memory for a second
def test_counts_a_process_that_holds_memory():
    peak = peak_memory.measure([sys.executable, "-c", HOLD], interval_s=0.05)
    assert peak.returncode == 0
    assert peak.peak_rss_bytes >= 150 * MiB
    if peak.peak_pss_bytes is not None:  # Linux
        assert 140 * MiB <= peak.peak_pss_bytes <= peak.peak_rss_bytes
    assert peak.samples >= 5


@pytest.mark.slow  # child processes that hold memory for a second
def test_counts_grandchildren_too():
    """The buffer lives in a grandchild (as a torchrun rank does): the tree's peak includes it."""
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {HOLD!r}], check=True)"
    peak = peak_memory.measure([sys.executable, "-c", spawn], interval_s=0.05)
    assert peak.returncode == 0
    assert peak.peak_processes >= 2
    assert peak.peak_rss_bytes >= 150 * MiB


def test_passes_the_exit_status_through():
    peak = peak_memory.measure([sys.executable, "-c", "raise SystemExit(3)"])
    assert peak.returncode == 3
    assert "exit status 3" in str(peak)


@pytest.mark.parametrize(
    ("command", "interval", "message"),
    [([], 0.1, "give the command to run"), (["true"], 0, "interval must be a positive number")],
)
def test_bad_input_is_one_sentence(command, interval, message):
    with pytest.raises(ValueError, match=message):
        peak_memory.measure(command, interval)


def test_command_line_writes_json(tmp_path, capsys):
    out = tmp_path / "peak.json"
    code = peak_memory.main(["--json", str(out), "--", sys.executable, "-c", "pass"])
    assert code == 0
    assert '"peak_rss_bytes"' in out.read_text()
    assert "peak RSS" in capsys.readouterr().err
