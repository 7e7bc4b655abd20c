"""tutorial_utils.monitor: each source says if it can read, reads bytes, fails in one sentence."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest
import torch
from conftest import FakeNvml, GiB, alive, fake_program, install_fake_nvml, wait_until

from tutorial_utils import monitor
from tutorial_utils.monitor import (
    GPUtilSource,
    NvmlSource,
    PsutilSource,
    Reading,
    SourceError,
    TorchSource,
    make_source,
)

MiB = 2**20


def _write_exe(path, body: str):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """An nvidia-smi that answers GPUtil's query for two GPUs (memory in MiB, load in %)."""
    _write_exe(
        tmp_path / "nvidia-smi",
        "echo '0, GPU-bbbb, 55, 81920, 3072, 78848, 570.1, NVIDIA B, 123, Disabled, Disabled, 40'\n"
        "echo '1, GPU-aaaa, 0, 40960, 1024, 39936, 570.1, NVIDIA A, 124, Disabled, Disabled, 35'\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


# ------------------------------------------------------------------ interface


def test_every_named_source_has_the_interface():
    for name in monitor.SOURCE_NAMES:
        src = make_source(name)
        assert src.name == name
        assert not src.available and "open()" in src.reason  # nothing read before open()
        src.open()
        assert src.available or src.reason  # unavailable always says why
        try:
            if src.available:
                assert all(isinstance(r, Reading) for r in src.read())
            else:
                with pytest.raises(SourceError):
                    src.read()
        finally:
            src.close()


def test_make_source_rejects_unknown_name():
    with pytest.raises(ValueError, match="choose from torch, nvml, gputil, psutil"):
        make_source("nvidia-smi")


def test_reading_parts_in_binary_units():
    r = Reading(
        "cuda:0",
        used_bytes=GiB,
        reserved_bytes=2 * GiB,
        total_bytes=16 * GiB,
        peak_bytes=3 * GiB,
        utilization_pct=42,
    )
    assert [text for _, text in r.parts()] == [
        "1.00 GiB used",
        "2.00 GiB reserved",
        "of 16.00 GiB",
        "peak 3.00 GiB",
        "42% busy",
    ]
    assert r.parts(peak_bytes=4 * GiB)[3] == ("peak", "peak 4.00 GiB")
    assert Reading("x").parts() == []
    # a process's CPU % is of one core (142% = its threads used 1.42 cores): shown in cores
    # (issue 20 §6: "142% busy" read as more than the machine)
    assert Reading("process", utilization_pct=142, utilization_of="one core").parts() == [
        ("busy", "1.4 cores busy")
    ]
    assert Reading("p", utilization_pct=100, utilization_of="one core").parts()[0][1] == (
        "1.0 core busy"
    )
    assert Reading("system", utilization_pct=15, utilization_of="2 cores").parts() == [
        ("busy", "15% of 2 cores")
    ]


def test_the_process_row_shows_its_cpu_in_cores_and_the_system_row_of_all_cores():
    src = PsutilSource()
    src.open()
    process, system = src.read()
    assert process.utilization_of == "one core" and system.utilization_of.endswith(" cores")
    assert any(text.endswith(" busy") and "%" not in text for _, text in process.parts())
    assert any(text.endswith(system.utilization_of) for _, text in system.parts())


def test_nvml_without_a_driver_is_absent_not_broken():
    from tutorial_utils import nvml

    if nvml.probe().available:
        pytest.skip("this machine has an NVIDIA driver")
    src = NvmlSource()
    src.open()
    assert not src.available
    assert src.absent == ("was not found" in src.reason or "found no GPU" in src.reason)


# ------------------------------------------------------------------ psutil


def test_psutil_reads_process_and_system():
    src = PsutilSource()
    src.open()
    assert src.available
    process, system = src.read()
    assert process.label == "process" and system.label == "system"
    assert process.used_bytes == pytest.approx(psutil.Process().memory_info().rss, rel=0.2)
    assert 0 < system.used_bytes <= system.total_bytes == psutil.virtual_memory().total
    assert process.utilization_pct >= 0


def test_psutil_error_becomes_source_error(monkeypatch):
    src = PsutilSource()
    src.open()

    def denied():
        raise psutil.AccessDenied(os.getpid())

    monkeypatch.setattr(src._proc, "memory_info", denied)
    with pytest.raises(SourceError, match="psutil failed"):
        src.read()


def test_psutil_missing_process_is_unavailable():
    src = PsutilSource(pid=2**22 + 12345)  # above Linux's pid_max
    src.open()
    assert not src.available and "psutil cannot see the process" in src.reason


# ------------------------------------------------------------------ NVML


def test_nvml_without_driver_is_unavailable_with_reason():
    src = NvmlSource()
    src.open()
    if src.available:  # a machine with an NVIDIA driver
        src.close()
        pytest.skip("NVML works on this machine")
    assert "NVIDIA driver" in src.reason
    with pytest.raises(SourceError):
        src.read()
    src.close()


def test_nvml_rows_in_cuda_order_with_utilization(fake_nvml):
    src = NvmlSource()
    src.open()
    assert src.available
    a, b = src.read()
    assert a.label == "NVML cuda:0 (NVIDIA A)" and a.used_bytes == GiB and a.total_bytes == 40 * GiB
    assert a.utilization_pct is None  # NotSupported is not an error
    assert b.label == "NVML cuda:1 (NVIDIA B)" and b.utilization_pct == 55
    src.close()
    assert fake_nvml.shutdown_calls == 1


def test_nvml_failing_mid_run_raises_source_error(fake_nvml):
    fake_nvml.fail_after = 2  # one full read of two GPUs, then the driver goes away
    src = NvmlSource()
    src.open()
    assert len(src.read()) == 2
    with pytest.raises(SourceError, match="NVML query failed: GPU is lost"):
        src.read()
    src.close()


# ------------------------------------------------------------------ GPUtil


def test_gputil_without_nvidia_smi_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nvidia-smi
    src = GPUtilSource()
    src.open()
    assert not src.available and "nvidia-smi is not on PATH" in src.reason


def test_gputil_broken_nvidia_smi_becomes_source_error(broken_nvidia_smi):
    import GPUtil

    with pytest.raises(ValueError):  # what the guide's code meets on a broken driver
        GPUtil.getGPUs()
    src = GPUtilSource()
    src.open()
    assert src.available
    with pytest.raises(SourceError, match="GPUtil raised ValueError"):
        src.read()


def test_gputil_reads_mib_as_bytes_and_maps_uuid(fake_nvidia_smi, monkeypatch):
    monkeypatch.setattr(monitor.nvml, "cuda_uuids", lambda: {"GPU-aaaa": 0, "GPU-bbbb": 1})
    src = GPUtilSource()
    src.open()
    b, a = src.read()  # nvidia-smi (PCI) order
    assert (b.label, b.used_bytes, b.total_bytes, b.utilization_pct) == (
        "GPUtil cuda:1",
        3072 * MiB,
        80 * GiB,
        55,
    )
    assert (a.label, a.used_bytes) == ("GPUtil cuda:0", 1024 * MiB)
    assert src.last_call_s > 0 and a.note.endswith("ms per call (one nvidia-smi process)")


# ------------------------------------------------------------------ torch


def test_torch_source_on_cpu_counts_new_tensors_exactly():
    src = TorchSource()
    src.open()
    if not src.available:
        pytest.fail(f"the CPU torch source should work: {src.reason}")
    try:
        (before,) = src.read()
        x = torch.empty(4 * MiB, dtype=torch.uint8)
        (during,) = src.read()
        del x
        (after,) = src.read()
    finally:
        src.close()
    assert before.label == "cpu (exact)"
    assert during.used_bytes - before.used_bytes == 4 * MiB
    assert after.used_bytes == before.used_bytes
    assert after.peak_bytes >= before.used_bytes + 4 * MiB


def test_torch_source_reads_each_cuda_device(fake_allocator, monkeypatch):
    gpu = fake_allocator
    gpu.alloc(5 * MiB, 1)  # before open(): not part of the source's peak
    gpu.alloc(-5 * MiB, 1)
    src = TorchSource()
    src.open()
    assert src.available, src.reason
    gpu.alloc(1 * MiB, 0)
    gpu.alloc(6 * MiB, 1)
    gpu.alloc(-4 * MiB, 1)
    gpu.reserved[1] = 8 * MiB  # the cache keeps the blocks it once held
    rows = src.read()
    assert [r.label for r in rows] == ["cuda:0", "cuda:1"]
    assert (rows[0].used_bytes, rows[0].reserved_bytes, rows[0].peak_bytes) == (MiB, MiB, MiB)
    assert (rows[1].used_bytes, rows[1].reserved_bytes, rows[1].peak_bytes) == (
        2 * MiB,
        8 * MiB,
        6 * MiB,
    )
    assert rows[0].total_bytes == 16 * GiB

    def lost(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "memory_allocated", lost)
    with pytest.raises(SourceError, match="torch could not read cuda:0"):
        src.read()
    src.close()


def test_nvml_that_does_not_answer_makes_the_source_unavailable(monkeypatch):
    # hang_s: a hang guard (a source that waited for the driver would open after 30 s)
    fake = FakeNvml([("NVIDIA A", "GPU-aaaa", GiB, 0, 1)], hang_s=30)
    install_fake_nvml(monkeypatch, fake)
    src = NvmlSource(timeout_s=0.1)
    src.open()
    # issue 37: this was "open() took < 0.45 s"; what it does is give up on the hung call
    assert fake.init_calls == 0, "open() returned only once the driver answered: it waited"
    assert not src.available and "timed out after 0.1 s" in src.reason
    fake.release.set()  # the driver answers at last
    src.close()


@pytest.mark.timeout(60)  # the hang guard (120x the 0.5 s timeout): a read that waits fails here
@pytest.mark.heavy
def test_gputil_with_a_hung_nvidia_smi_times_out_and_leaves_nothing_running(hanging_nvidia_smi):
    import GPUtil

    src = GPUtilSource(timeout_s=0.5)
    src.open()
    assert src.available
    with pytest.raises(SourceError, match=r"nvidia-smi did not answer: timed out after 0\.5 s"):
        src.read()  # the message comes from the timeout's path: the read gave up on the hang
    pids = [int(x) for x in hanging_nvidia_smi.pids.read_text().split()]
    assert len(pids) == 2  # nvidia-smi and the child it started
    assert wait_until(lambda: alive(pids) == [], timeout_s=3), alive(pids)
    assert GPUtil.GPUtil.Popen is subprocess.Popen  # GPUtil is left as it was


def test_gputil_output_that_is_not_a_gpu_list_is_an_error(tmp_path, monkeypatch):
    # twelve fields GPUtil parses happily, but no GPU: a wrapper printing something else
    fake_program(
        tmp_path / "bin",
        "nvidia-smi",
        "echo '0, not-a-uuid, 0, nan, 0, 0, ?, ?, ?, ?, ?, 0'\n",
        monkeypatch,
    )
    src = GPUtilSource()
    src.open()
    with pytest.raises(SourceError, match="not a GPU list"):
        src.read()


def test_gputil_missing_nvidia_smi_is_said_not_hidden(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # GPUtil alone would answer "no GPU"
    with pytest.raises(SourceError, match="nvidia-smi could not be run"):
        monitor.gputil_gpus()


@pytest.mark.parametrize(
    ("cause", "absent"),
    [("NVMLError_LibraryNotFound", True), ("NVMLError_DriverNotLoaded", True), ("Other", False)],
)
def test_nvml_on_a_machine_without_an_nvidia_gpu_is_absent_not_an_error(monkeypatch, cause, absent):
    """Issue 20 §6: a CPU machine where NVML's library is installed but no driver is loaded got
    a red "unavailable" row; that machine simply has no NVIDIA GPU. A real failure stays red."""
    from tutorial_utils import monitor, nvml

    def init(timeout_s):
        raise nvml.NvmlError("NVML failed to start") from type(cause, (Exception,), {})()

    monkeypatch.setattr(monitor.nvml, "init", init)
    src = monitor.NvmlSource()
    src.open()
    assert not src.available and src.absent is absent
