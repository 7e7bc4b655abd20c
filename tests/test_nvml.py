"""tutorial_utils.nvml: probe without a driver, UUID -> CUDA index mapping, init/shutdown refcount,
a hung driver. ``FakeNvml`` (tests/conftest.py) stands in for the ``pynvml`` module."""

from __future__ import annotations

import threading

import pytest
from conftest import FakeNvml, GiB, install_fake_nvml

from tutorial_utils import nvml


def test_probe_without_driver_says_why(monkeypatch):
    install_fake_nvml(monkeypatch, FakeNvml([], missing=True))
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


def test_gpus_is_the_one_loop_over_nvml_devices(fake_nvml):
    nvml.init()
    try:
        gpus = nvml.gpus()
        assert [(g.nvml_index, g.name, g.uuid, g.cuda_index) for g in gpus] == [
            (0, "NVIDIA B", "GPU-bbbb", 1),
            (1, "NVIDIA A", "GPU-aaaa", 0),
        ]
        assert nvml.memory(gpus[0]) == (3 * GiB, 80 * GiB)
        assert nvml.utilization_pct(gpus[0]) == 55.0
        assert nvml.utilization_pct(gpus[1]) is None  # not supported: not an error
        fake_nvml.fail_after = 0
        with pytest.raises(nvml.NvmlError, match="NVML query failed: GPU is lost"):
            nvml.memory(gpus[1])
    finally:
        nvml.shutdown()


def test_missing_binding_is_one_sentence(monkeypatch):
    monkeypatch.setattr(nvml, "pynvml", None)
    with pytest.raises(nvml.NvmlError, match="pip install nvidia-ml-py"):
        nvml.init()
    assert "nvidia-ml-py" in nvml.probe().reason


@pytest.mark.heavy
def test_a_hung_driver_times_out_and_a_late_answer_is_undone(monkeypatch):
    # hang_s: a hang guard (an init that waited for the driver would return after 30 s)
    fake = install_fake_nvml(monkeypatch, FakeNvml([], hang_s=30))
    with pytest.raises(nvml.NvmlError, match=r"timed out after 0\.15 s"):
        nvml.init(timeout_s=0.15)
    # issue 37: this was "< 0.55 s"; what init does is give up while the call still hangs
    assert fake.init_calls == 0, "init returned only once the driver answered: it waited"
    status = nvml.probe(timeout_s=0.15)  # waits for the lock the hung call holds: times out too
    assert not status.available and "timed out after 0.15 s" in status.reason
    fake.release.set()  # the driver answers at last
    # When the driver answers at last, what the abandoned calls did is undone: NVML is not
    # left initialised by a call nobody waits for any more.
    helpers = [t for t in threading.enumerate() if t.name.startswith("nvml ")]
    assert helpers
    for t in helpers:
        t.join(timeout=10)
    assert fake.init_calls >= 1
    assert fake.init_calls == fake.shutdown_calls and nvml._initialized == 0
