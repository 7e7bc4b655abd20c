"""tutorial_utils.nvml: probe without a driver, UUID -> CUDA index mapping, init/shutdown refcount.

``FakeNvml`` stands in for the ``pynvml`` module (nvidia-ml-py); test_monitor and test_gauges
reuse it through the ``fake_nvml`` fixture defined here.
"""

from __future__ import annotations

import types

import pytest

from tutorial_utils import nvml

GiB = 2**30


class FakeNvml(types.SimpleNamespace):
    """A small ``pynvml``: GPUs in NVML (PCI) order, each ``(name, uuid, total, used, util)``.

    ``fail_after``: the number of memory queries that succeed before every query raises
    ``NVMLError`` (``None``: never fails) -- a driver going away in the middle of a run.
    """

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self, gpus, fail_after=None, missing=False):
        super().__init__()
        self.gpus = list(gpus)
        self.fail_after = fail_after
        self.missing = missing
        self.init_calls = 0
        self.shutdown_calls = 0
        self.memory_queries = 0

    def nvmlInit(self):
        if self.missing:
            raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")
        self.init_calls += 1

    def nvmlShutdown(self):
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self):
        return b"570.1"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.gpus[h][0].encode()

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h][1]

    def nvmlDeviceGetMemoryInfo(self, h):
        self.memory_queries += 1
        if self.fail_after is not None and self.memory_queries > self.fail_after:
            raise self.NVMLError("GPU is lost")
        _, _, total, used, _ = self.gpus[h]
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, h):
        util = self.gpus[h][4]
        if util is None:
            raise self.NVMLError_NotSupported("Not Supported")
        return types.SimpleNamespace(gpu=util, memory=0)


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a FakeNvml with two GPUs whose NVML order is the reverse of torch's CUDA order."""
    fake = FakeNvml(
        [
            ("NVIDIA B", "GPU-bbbb", 80 * GiB, 3 * GiB, 55),  # NVML #0 = cuda:1
            ("NVIDIA A", "GPU-aaaa", 40 * GiB, 1 * GiB, None),  # NVML #1 = cuda:0, no utilization
        ]
    )
    monkeypatch.setattr(nvml, "_pynvml", lambda: fake)
    monkeypatch.setattr(nvml, "_initialized", 0)
    monkeypatch.setattr(nvml, "cuda_uuids", lambda: {"GPU-aaaa": 0, "GPU-bbbb": 1})
    return fake


def test_probe_without_driver_says_why(monkeypatch):
    fake = FakeNvml([], missing=True)
    monkeypatch.setattr(nvml, "_pynvml", lambda: fake)
    monkeypatch.setattr(nvml, "_initialized", 0)
    status = nvml.probe()
    assert not status.available
    assert "no NVIDIA driver" in status.reason
    assert nvml._initialized == 0


def test_probe_on_this_machine_never_raises():
    status = nvml.probe()  # no driver here; with one, devices are listed
    assert status.available or status.reason


def test_probe_maps_nvml_order_to_cuda_order(fake_nvml):
    status = nvml.probe()
    assert status.available and status.driver_version == "570.1"
    by_uuid = {d.uuid: d for d in status.devices}
    assert by_uuid["GPU-bbbb"].nvml_index == 0 and by_uuid["GPU-bbbb"].cuda_index == 1
    assert by_uuid["GPU-aaaa"].nvml_index == 1 and by_uuid["GPU-aaaa"].cuda_index == 0
    assert by_uuid["GPU-aaaa"].total_bytes == 40 * GiB
    assert fake_nvml.init_calls == 1 and fake_nvml.shutdown_calls == 1


def test_hidden_gpu_has_no_cuda_index(fake_nvml, monkeypatch):
    monkeypatch.setattr(nvml, "cuda_uuids", lambda: {"GPU-aaaa": 0})  # CUDA_VISIBLE_DEVICES=<A>
    status = nvml.probe()
    assert {d.uuid: d.cuda_index for d in status.devices} == {"GPU-bbbb": None, "GPU-aaaa": 0}


def test_init_and_shutdown_are_reference_counted(fake_nvml):
    nvml.init()
    nvml.init()
    nvml.shutdown()
    assert fake_nvml.shutdown_calls == 0  # one user is still holding NVML
    nvml.shutdown()
    assert (fake_nvml.init_calls, fake_nvml.shutdown_calls) == (1, 1)
    nvml.shutdown()  # one too many: harmless
    assert fake_nvml.shutdown_calls == 1


def test_query_failure_is_one_sentence(fake_nvml):
    fake_nvml.fail_after = 0
    status = nvml.probe()
    assert not status.available
    assert status.reason.startswith("NVML query failed") and "GPU is lost" in status.reason
    assert nvml._initialized == 0


def test_cuda_uuids_adds_gpu_prefix(fake_cuda):
    assert nvml.cuda_uuids() == {
        "GPU-00000000-0000-0000-0000-000000000000": 0,
        "GPU-00000001-0000-0000-0000-000000000000": 1,
    }
