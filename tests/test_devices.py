import pytest
import torch

from tutorial_utils import devices
from tutorial_utils.devices import DeviceUnavailableError


def test_cpu_only_build_answers_without_raising():
    # This machine (and CI) has the CPU build of torch 2.13.0.
    if torch.version.cuda is not None:
        pytest.skip("needs the CPU build of torch")
    assert devices.gpu_count() == 0
    assert not devices.has_gpu()
    assert devices.pick_device() == torch.device("cpu")
    assert "no CUDA support" in devices.cuda_unavailable_reason()
    infos = devices.list_devices()
    assert [i.device.type for i in infos] == ["cpu"]
    assert "logical cores" in str(infos[0])


def test_pick_cuda_on_cpu_build_says_why():
    if torch.version.cuda is not None:
        pytest.skip("needs the CPU build of torch")
    with pytest.raises(
        DeviceUnavailableError, match="CUDA is not available: this torch build has no CUDA"
    ):
        devices.pick_device("cuda")
    with pytest.raises(DeviceUnavailableError, match="needs 1 GPU"):
        devices.require_gpu(why="the bandwidth cell")


def test_mocked_two_gpus(fake_cuda):
    assert devices.gpu_count() == 2
    assert devices.pick_device() == torch.device("cuda", 0)
    assert devices.pick_device("cuda:1") == torch.device("cuda", 1)
    assert devices.pick_device("cuda") == torch.device("cuda", 0)
    infos = [i for i in devices.list_devices() if i.device.type == "cuda"]
    assert [i.name for i in infos] == ["NVIDIA Fake 0", "NVIDIA Fake 1"]
    assert infos[0].total_bytes == 16 * 2**30 and infos[0].free_bytes == 10 * 2**30
    assert "10.00 GiB free of 16.00 GiB" in str(infos[0])
    ds = devices.demo_devices(2)
    assert not ds.stand_ins and list(ds) == [torch.device("cuda", 0), torch.device("cuda", 1)]
    devices.require_gpu(2)


def test_mocked_gpu_index_out_of_range(fake_cuda):
    with pytest.raises(DeviceUnavailableError, match=r"has 2 GPU\(s\) \(cuda:0 to cuda:1\)"):
        devices.pick_device("cuda:3")
    with pytest.raises(DeviceUnavailableError, match="needs 4 GPU"):
        devices.require_gpu(4)


def test_mem_get_info_failing_leaves_free_unknown(fake_cuda, monkeypatch):
    def fail(index=None):
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "mem_get_info", fail)
    info = devices.list_devices()[0]
    assert info.free_bytes is None and info.total_bytes == 16 * 2**30


def test_cuda_build_without_driver(cuda_build_without_driver):
    reason = devices.cuda_unavailable_reason()
    assert "no usable GPU" in reason and "Found no NVIDIA driver" in reason
    assert devices.pick_device() == torch.device("cpu")
    assert devices.gpu_count() == 0


def test_cuda_visible_devices_empty(fake_cuda, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "empty string" in devices.cuda_unavailable_reason()
    assert devices.gpu_count() == 0
    assert devices.pick_device() == torch.device("cpu")


def test_demo_devices_stand_ins_without_gpus():
    if torch.version.cuda is not None:
        pytest.skip("needs the CPU build of torch")
    ds = devices.demo_devices(2)
    assert ds.stand_ins and list(ds) == [torch.device("cpu")] * 2
    assert "CPU stand-ins" in repr(ds)
    with pytest.raises(ValueError, match="at least one device"):
        devices.demo_devices(0)


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("gpu", ValueError, "not a device this course uses"),
        ("cuda:x", ValueError, "not a device"),
        ("tpu", ValueError, "not a device"),
        (-1, ValueError, "0 or more"),
        (1.5, TypeError, "not float"),
        (True, TypeError, "not bool"),
    ],
)
def test_bad_device_specs(spec, error, match):
    with pytest.raises(error, match=match):
        devices.parse_device(spec)


def test_env_override(monkeypatch, fake_cuda):
    monkeypatch.setenv("TUTORIAL_DEVICE", "cpu")
    assert devices.pick_device() == torch.device("cpu")


# ---------------------------------------------------------------- issue 11: small validation gaps


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_has_gpu_needs_a_whole_number_of_gpus(n):
    # before: has_gpu(0) and has_gpu(-1) were True on a CPU machine ("at least 0 GPUs")
    with pytest.raises(ValueError, match="number of GPUs, a whole number of 1 or more"):
        devices.has_gpu(n)


@pytest.mark.parametrize("n", [1.5, 0, -2, None])
def test_require_gpu_needs_a_whole_number_of_gpus(n):
    # before: require_gpu(1.5) compared 0 >= 1.5 and blamed the machine
    with pytest.raises(ValueError, match="number of GPUs"):
        devices.require_gpu(n)


@pytest.mark.parametrize("index", [10**30, 128, 2**63])
def test_parse_device_refuses_an_absurd_index_in_one_sentence(index):
    # before: parse_device(10**30) raised torch's own overflow error from deep inside
    with pytest.raises(ValueError, match="far above any machine's GPU count"):
        devices.parse_device(index)


def test_parse_device_keeps_the_largest_index_torch_can_store():
    assert devices.parse_device(127) == torch.device("cuda", 127)


def test_pick_device_allows_every_device_type_the_course_knows_meta_included():
    assert devices.pick_device("meta") == torch.device("meta")
    assert devices.pick_device("auto").type != "meta"
