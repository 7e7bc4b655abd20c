"""The device matrix, tested on the CPU: every hardware decision a notebook makes, per machine.

``fake_machine(key)`` mocks torch itself (``torch.version.cuda``, ``torch.cuda.is_available``,
``device_count``, ``get_device_properties``, ``mem_get_info``, ``torch.backends.mps``) as each
machine a learner has would answer, so ``devices.capabilities()`` is tested end to end: from
torch's answers to the decision a notebook reads. The tests are grouped notebook by notebook.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from tutorial_utils import devices, models
from tutorial_utils.devices import MACHINES, SPEED_CLAIMS, Capabilities

GiB = 2**30
MiB = 2**20
ALL = list(MACHINES)
CUDA_MACHINES = [k for k, c in MACHINES.items() if c.kind == "cuda"]


@pytest.fixture
def fake_machine(monkeypatch):
    """Make torch answer as machine ``key`` of ``MACHINES`` would; returns the expected value."""

    def install(key: str) -> Capabilities:
        want = MACHINES[key]
        cuda = want.kind == "cuda"
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.delenv("TUTORIAL_DEVICE", raising=False)
        monkeypatch.setattr(torch.version, "cuda", "12.8" if cuda else None)
        monkeypatch.setattr(torch.version, "hip", None, raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: want.gpu_count)

        def props(index: int = 0):
            if not cuda or not 0 <= index < want.gpu_count:
                raise AssertionError("Invalid device id")
            major, minor = want.compute_capability
            return types.SimpleNamespace(
                name=want.name, total_memory=want.total_bytes, major=major, minor=minor
            )

        def mem_get_info(index=None):
            if not cuda:
                raise AssertionError("Torch not compiled with CUDA enabled")
            return (want.total_bytes - 500 * MiB, want.total_bytes)

        monkeypatch.setattr(torch.cuda, "get_device_properties", props)
        monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: want.kind == "mps")
        return want

    return install


# ---------------------------------------------------------------- from torch's answers to the value


@pytest.mark.parametrize("key", ALL)
def test_capabilities_end_to_end(fake_machine, key):
    want = fake_machine(key)
    caps = devices.capabilities()
    assert (caps.kind, caps.gpu_count, caps.compute_capability, caps.total_bytes) == (
        want.kind,
        want.gpu_count,
        want.compute_capability,
        want.total_bytes,
    )
    if want.kind != "cpu":  # the CPU's name is the processor's
        assert caps.name == want.name
    assert caps.plan() == want.plan()
    assert devices.pick_device() == want.device


@pytest.mark.parametrize("key", ALL)
def test_tutorial_device_cpu_forces_the_cpu_plan_everywhere(fake_machine, monkeypatch, key):
    fake_machine(key)
    monkeypatch.setenv("TUTORIAL_DEVICE", "cpu")
    caps = devices.capabilities()
    assert caps.kind == "cpu" and caps.amp_dtype == torch.bfloat16 and not caps.grad_scaler


def test_a_t4_is_never_planned_with_bf16_even_though_torch_says_bf16_is_supported(
    fake_machine, monkeypatch
):
    fake_machine("t4")
    # torch.cuda.is_bf16_supported() counts emulation: True on a T4. The plan must not follow it.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    caps = devices.capabilities()
    assert caps.amp_dtype == torch.float16 and caps.grad_scaler
    assert not caps.expects_speedup("bf16 autocast")


@pytest.mark.parametrize(("key", "emulated"), [("t4", True), ("h200", True), ("t4", False)])
def test_05_is_bf16_supported_counts_emulation_and_capabilities_does_not(
    fake_machine, monkeypatch, key, emulated
):
    """05 c15's claim, run: PyTorch's own ``is_bf16_supported`` (not mocked) on a mocked
    device of compute capability 7.5 says True by default, because a bf16 tensor can be made
    there (emulation), and False with ``including_emulation=False``; ``capabilities()`` follows
    the second. From 8.0 both are True."""
    want = fake_machine(key)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    made = []  # the probe PyTorch runs for emulation: can a bf16 tensor be made on the device?
    monkeypatch.setattr(
        torch.cuda, "_check_bf16_tensor_supported", lambda d: made.append(d) or emulated
    )
    native = want.compute_capability >= (8, 0)
    assert torch.cuda.is_bf16_supported() is (native or emulated)
    assert torch.cuda.is_bf16_supported(including_emulation=False) is native
    assert made == ([] if native else [0]), "only below 8.0 does PyTorch probe for emulation"
    caps = devices.capabilities()
    assert caps.native_bf16 is native
    assert caps.amp_dtype == (torch.bfloat16 if native else torch.float16)


def test_hidden_gpus_give_the_cpu_plan(fake_machine, monkeypatch):
    fake_machine("h200")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.capabilities().kind == "cpu"


# ---------------------------------------------------------------- 00: start here


@pytest.mark.parametrize("key", ALL)
def test_00_gpu_cells_run_only_on_cuda_and_the_demo_tensor_fits(fake_machine, key):
    want = fake_machine(key)
    caps = devices.capabilities()
    assert caps.cuda is (want.kind == "cuda") is devices.has_gpu()
    assert caps.demo_tensor_bytes <= 4 * GiB
    if caps.cuda:
        assert caps.demo_tensor_bytes <= caps.total_bytes // 8, "room for everything else"
        assert "caching allocator" in caps.memory_note
    else:
        assert caps.demo_tensor_bytes == 256 * MiB
        assert "counting tensor storages" in caps.memory_note


def test_00_demo_tensor_on_a_t4_is_an_eighth_of_15_gib():
    assert Capabilities.machine("t4").demo_tensor_bytes == 15 * GiB // 8
    assert Capabilities.machine("h200").demo_tensor_bytes == 4 * GiB


# ---------------------------------------------------------------- 01 and 02: moving, creating


@pytest.mark.parametrize("key", ALL)
def test_01_02_device_and_the_two_gpu_branch(fake_machine, key):
    want = fake_machine(key)
    caps = devices.capabilities()
    assert caps.device == want.device == devices.pick_device("auto")
    # 01's `with torch.cuda.device(1)` cell and 02's renumbering cell need two GPUs
    assert caps.multi_gpu is (want.gpu_count >= 2) is devices.has_gpu(2)
    assert caps.demo_devices(2) == devices.demo_devices(2)


# ---------------------------------------------------------------- 07 and 04: several devices


@pytest.mark.parametrize(
    ("key", "branch", "backend", "real_devices"),
    [
        ("cpu", "pass_through", "gloo", False),
        ("mps", "pass_through", "gloo", False),
        ("t4", "one_gpu", "gloo", False),
        ("h200", "one_gpu", "gloo", False),
        ("2x_t4", "replicas", "nccl", True),
        ("2x_a100", "replicas", "nccl", True),
    ],
)
def test_03_04_parallel_branches(fake_machine, key, branch, backend, real_devices):
    fake_machine(key)
    caps = devices.capabilities()
    assert caps.data_parallel_branch == branch
    assert caps.ddp_backend(2) == backend
    pair = caps.demo_devices(2)
    assert pair == devices.demo_devices(2)
    assert pair.stand_ins is not real_devices
    if real_devices:
        assert [d.index for d in pair] == [0, 1], "one GPU per rank / per pipeline stage"
    assert caps.ddp_backend(4) == "gloo", "NCCL needs a GPU per process"


# ---------------------------------------------------------------- 04 and 07: memory and budgets


@pytest.mark.parametrize("key", ALL)
def test_05_07_memory_is_measured_where_it_can_be_exact(fake_machine, key):
    want = fake_machine(key)
    caps = devices.capabilities()
    if want.kind == "cuda":
        assert caps.memory_device == torch.device("cuda", 0)
        assert caps.oom_lab_headroom_bytes == 128 * MiB, "block rounding on a GPU"
        assert caps.capstone_shape == (256, 128)
    else:  # MPS has no peak counter: CPU tensors, said so
        assert caps.memory_device == torch.device("cpu")
        assert caps.oom_lab_headroom_bytes == 40 * MiB
        assert caps.capstone_shape == (64, 64)
    if want.kind == "mps":
        assert "MPS has no peak-memory counter" in caps.memory_note


def _forward_bytes_on_meta(model: nn.Module, batch: torch.Tensor) -> int:
    """Bytes of every module output in one forward pass, built and run on the meta device."""
    total = 0

    def hook(_module, _inputs, output):
        nonlocal total
        outs = output if isinstance(output, tuple) else (output,)
        total += sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        model(batch)
    finally:
        for h in handles:
            h.remove()
    return total


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _step_bytes(model: nn.Module, batch: torch.Tensor, extra_activation_bytes: int = 0) -> int:
    """An upper bound of one step's transient memory: every module output kept for backward,
    and as much again for the gradients flowing back through them."""
    return 2 * (_forward_bytes_on_meta(model, batch) + extra_activation_bytes)


@pytest.mark.slow  # the first forward pass on the meta device loads its kernels: 2-10 s
@pytest.mark.parametrize("key", CUDA_MACHINES)
def test_07_capstone_run_fits_every_gpu_with_room_to_spare(key):
    caps = Capabilities.machine(key)
    batch, seq = caps.capstone_shape
    model = models.TinyTransformer(vocab=1000, d_model=64, n_heads=4, n_layers=4, n_classes=5)
    model, tokens = model.to("meta"), torch.zeros(batch, seq, dtype=torch.long, device="meta")
    heads, layers = 4, 4
    attention = layers * 2 * batch * heads * seq * seq * 4  # scores and probabilities, fp32
    # parameters, gradients, Adam's two moments; one step's activations
    need = 4 * _param_bytes(model) + _step_bytes(model, tokens, attention)
    assert need < 2 * GiB
    assert caps.fits(need, share=0.25), f"{need / GiB:.2f} GiB on a {caps.name}"


@pytest.mark.slow
@pytest.mark.parametrize("key", CUDA_MACHINES)
def test_06_speed_table_fits_every_gpu_with_room_to_spare(key):
    caps = Capabilities.machine(key)
    width, hidden, batch = caps.speed_shape
    model = models.MLP(d_in=width, d_hidden=hidden, d_out=width, depth=4).to("meta")
    x = torch.zeros(batch, width, device="meta")
    # 06 keeps four speed models (fp32, TF32, bf16, fp16) with their gradients (SGD keeps no
    # state) and runs one step at a time
    need = 4 * 2 * _param_bytes(model) + _step_bytes(model, x)
    assert caps.fits(need, share=0.5), f"{need / GiB:.2f} GiB on a {caps.name}"


def test_budget_helpers_on_a_t4():
    t4 = Capabilities.machine("t4")
    assert t4.budget_bytes(0.5) == int(7.5 * GiB)
    assert t4.fits(14 * GiB, share=1.0) and not t4.fits(14 * GiB)  # 90% of 15 GiB is 13.5 GiB
    assert Capabilities.machine("cpu").fits(10**15), "no GPU to fill"


@pytest.mark.parametrize("share", [0, -0.1, 1.5, float("nan"), True, "half"])
def test_budget_share_is_a_fraction(share):
    with pytest.raises(ValueError, match=r"fraction of the GPU's memory in \(0, 1\]"):
        Capabilities.machine("t4").budget_bytes(share)


def test_budget_bytes_off_cuda_is_one_sentence():
    with pytest.raises(ValueError, match="needs a CUDA GPU and this is cpu"):
        Capabilities.machine("cpu").budget_bytes(0.5)
    with pytest.raises(ValueError, match="whole number of bytes"):
        Capabilities.machine("t4").fits(-1)


# ---------------------------------------------------------------- 06: mixed precision and cuDNN


@pytest.mark.parametrize(
    ("key", "amp_dtype", "scaler", "tf32", "claims"),
    [
        ("cpu", torch.bfloat16, False, False, set()),
        ("mps", torch.float16, True, False, set()),
        ("t4", torch.float16, True, False, {"fp16 autocast", "cudnn.benchmark"}),
        ("v100", torch.float16, True, False, {"fp16 autocast", "cudnn.benchmark"}),
        ("a100", torch.bfloat16, False, True, set(SPEED_CLAIMS)),
        ("h100", torch.bfloat16, False, True, set(SPEED_CLAIMS)),
        ("h200", torch.bfloat16, False, True, set(SPEED_CLAIMS)),
        ("2x_t4", torch.float16, True, False, {"fp16 autocast", "cudnn.benchmark"}),
    ],
)
def test_06_precision_plan(fake_machine, key, amp_dtype, scaler, tf32, claims):
    fake_machine(key)
    caps = devices.capabilities()
    assert caps.amp_dtype == amp_dtype
    assert caps.grad_scaler is scaler
    assert caps.tf32 is tf32
    assert {c for c in SPEED_CLAIMS if caps.expects_speedup(c)} == claims
    # autocast in the plan's dtype is expected to pay off exactly where its claim is made
    claim = {torch.float16: "fp16 autocast", torch.bfloat16: "bf16 autocast"}[amp_dtype]
    assert caps.amp_speedup_expected is (claim in claims)


def test_06_every_speed_assert_names_the_capability_it_needs():
    t4 = Capabilities.machine("t4")
    assert t4.needs("bf16 autocast") == (
        "bf16 autocast is faster than fp32 only with native bf16 (compute capability 8.0 or newer)"
    )
    assert "compute capability 8.0" in t4.needs("TF32")
    assert "Tensor Cores" in t4.needs("fp16 autocast")
    with pytest.raises(ValueError, match="unknown speed claim 'fp8'"):
        t4.expects_speedup("fp8")


def test_the_autocast_and_scaler_the_plan_names_work_on_this_torch():
    """What a CPU learner runs: autocast in the plan's dtype, and GradScaler only where planned."""
    caps = Capabilities.machine("cpu")
    model = models.MLP(d_in=8, d_hidden=8, d_out=2)
    with torch.autocast(caps.device.type, dtype=caps.amp_dtype):
        out = model(torch.ones(4, 8))
    assert out.dtype == caps.amp_dtype
    scaler = torch.amp.GradScaler(caps.device.type, enabled=caps.grad_scaler)
    assert scaler.is_enabled() is caps.grad_scaler


# ---------------------------------------------------------------- the table itself


def test_unknown_machine_is_one_sentence():
    with pytest.raises(ValueError, match="unknown machine 'tpu'"):
        Capabilities.machine("tpu")


def test_plan_reads_as_a_table_for_a_learner():
    plan = Capabilities.machine("t4").plan()
    assert plan["autocast dtype"] == "float16" and plan["GradScaler"] == "yes"
    assert plan["speed claims"] == "fp16 autocast, cudnn.benchmark"
    assert Capabilities.machine("cpu").plan()["speed claims"].startswith("none")


@pytest.mark.parametrize("n", [0, -1, 1.5])
def test_demo_devices_of_a_plan_needs_one_device_or_more(n):
    with pytest.raises(ValueError, match="at least one device"):
        Capabilities.machine("2x_t4").demo_devices(n)


def test_resolve_order_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.delenv("TUTORIAL_DEVICE", raising=False)
    monkeypatch.setattr(devices, "has_gpu", lambda n=1: True)
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    assert devices.resolve() == torch.device("cuda", 0)
    assert devices.resolve(allowed=("mps", "cpu")) == torch.device("mps")
    monkeypatch.setattr(devices, "has_gpu", lambda n=1: False)
    assert devices.resolve() == torch.device("mps")
    assert devices.resolve(allowed=("cuda", "cpu")) == torch.device("cpu")


def test_resolve_honours_tutorial_device_and_refuses_what_is_not_allowed(monkeypatch):
    monkeypatch.setenv("TUTORIAL_DEVICE", "cpu")
    monkeypatch.setattr(devices, "has_gpu", lambda n=1: True)
    assert devices.resolve() == torch.device("cpu")
    with pytest.raises(ValueError, match="memory.measure works on cuda, not on cpu"):
        devices.resolve("cpu", allowed=("cuda",), purpose="memory.measure")
    with pytest.raises(ValueError, match="allowed must list"):
        devices.resolve("cpu", allowed=("tpu",))


# ---------------------------------------------------------------------------------------- 13


@pytest.mark.parametrize("key", ALL)
def test_13_fp8_matmul_from_compute_capability_8_9_on(fake_machine, key):
    """Notebook 13's guarded FP8 cell runs ``torch._scaled_mm`` on CUDA only where FP8 Tensor
    Cores exist: the H100 and H200 here, not a T4, V100, A100, MPS or the CPU."""
    fake_machine(key)
    assert devices.capabilities().fp8_matmul == (key in ("h100", "h200"))
