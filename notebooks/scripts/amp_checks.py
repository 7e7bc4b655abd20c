"""Notebook 05's measuring machinery, kept out of the chapter so that it shows the PyTorch calls:

* ``linear_then_bn``: the BatchNorm model of section 2 (activations with std 300);
* ``practice_model``: the small model and SGD optimizer of section 3's AMP recipes;
* ``saved_for_backward``: section 4's ledger, what forward saves for backward, by kind;
* ``make_step`` and ``ran_as``: section 5's timed training steps, and what each one ran;
* ``hardware_notes``: what PyTorch reports about this machine, printed beside the timings.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from tutorial_utils import models


def linear_then_bn(device: torch.device) -> nn.Sequential:
    """A Linear that scales its input by 300, then a BatchNorm: activations with std 300."""
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with torch.no_grad():
        net[0].weight.copy_(torch.eye(4) * 300)
        net[0].bias.zero_()
    return net.to(device)


def practice_model(device: torch.device, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same small MLP (32 -> 64 -> 4) and an SGD optimizer, from the same seed each time."""
    torch.manual_seed(seed)
    net = models.MLP(d_in=32, d_hidden=64, d_out=4, depth=2).to(device)
    return net, torch.optim.SGD(net.parameters(), lr=0.1)


def saved_for_backward(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype, autocast: bool
) -> dict[str, int]:
    """Bytes that forward and a cross-entropy loss save for backward, by kind ("activations
    bfloat16", "weight copies bfloat16", ...): each storage once, new ones only.

    ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd saves. A saved tensor
    equal to a Linear's weight (transposed, in its dtype) is a low-precision weight copy.
    """
    weights = [m.weight.detach().T for m in model.modules() if isinstance(m, nn.Linear)]
    existed = {t.untyped_storage().data_ptr() for t in (x, y, *model.parameters())}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in existed:
            copy = any(t.shape == w.shape and torch.equal(t, w.to(t.dtype)) for w in weights)
            kind = "weight copies" if copy else "activations"
            saved[storage.data_ptr()] = (f"{kind} {str(t.dtype)[6:]}", storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(x.device.type, dtype=dtype, enabled=autocast):
            nn.functional.cross_entropy(model(x), y)
    return {kind: sum(n for k, n in saved.values() if k == kind) for kind, _ in saved.values()}


def make_step(
    model: nn.Module, batch: torch.Tensor, *, dtype=None, precision="highest", memory_format=None
):
    """A zero-argument function doing one full training step (SGD) with the given switches:
    autocast to ``dtype`` (None: off), ``torch.set_float32_matmul_precision(precision)`` during
    the step, and ``memory_format`` for the model and the batch. ``step.model`` is the model."""
    if memory_format is not None:
        model = model.to(memory_format=memory_format)
        batch = batch.contiguous(memory_format=memory_format)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(
                batch.device.type, dtype=dtype or torch.float32, enabled=dtype is not None
            ):
                loss = model(batch).float().square().mean()
            loss.backward()
            opt.step()
        finally:
            torch.set_float32_matmul_precision(old)

    step.model = model
    return step


def ran_as(step) -> set[tuple[torch.dtype, str]]:
    """One more call of ``step`` (outside any timing) with forward hooks on its Linear and Conv2d
    layers: the set of (output dtype, float32 matmul precision) they ran with."""
    seen = set()
    layers = [m for m in step.model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    hooks = [
        m.register_forward_hook(
            lambda m, i, out: seen.add((out.dtype, torch.get_float32_matmul_precision()))
        )
        for m in layers
    ]
    try:
        step()
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def hardware_notes(caps) -> dict[str, str]:
    """For bf16, fp16 and TF32: whether this machine has the hardware that makes it fast.

    On a CPU, the probes that pick oneDNN's path (``torch.ops.mkldnn._is_mkldnn_*_supported``,
    ``torch.cpu._is_*``: private, but they decide), ATen's capability and ONEDNN_MAX_CPU_ISA."""
    claims = ("bf16 autocast", "fp16 autocast", "TF32")
    if caps.cuda:
        return {
            c: f"{caps.name} has the hardware for it: {caps.expects_speedup(c)}" for c in claims
        }
    cpu = (
        f"AVX512-BF16 {torch.cpu._is_avx512_bf16_supported()}, "
        f"AMX {torch.cpu._is_amx_tile_supported()}"
    )
    isa = (
        f"ATen {torch.backends.cpu.get_cpu_capability()}, "
        f"ONEDNN_MAX_CPU_ISA {os.environ.get('ONEDNN_MAX_CPU_ISA')}"
    )
    return {
        "bf16 autocast": f"oneDNN's bf16 path {torch.ops.mkldnn._is_mkldnn_bf16_supported()} "
        f"({cpu}; {isa})",
        "fp16 autocast": f"oneDNN's fp16 path {torch.ops.mkldnn._is_mkldnn_fp16_supported()}",
        "TF32": "TF32 is a GPU format: 'high' runs fp32 on a CPU",
    }


def deterministic_cuda_ops() -> tuple[str | None, list[torch.Tensor]]:
    """On CUDA, to call with ``torch.use_deterministic_algorithms(True)`` on: the first line of
    the error ``torch.histc`` raises (None if it ran), and five ``index_add_`` of 10**6 values
    into 10 slots (atomic adds in any order by default)."""
    ones = torch.ones(2, device="cuda")
    try:
        torch.histc(ones)
        histc_error = None
    except RuntimeError as exc:
        histc_error = str(exc).splitlines()[0]
    slots = torch.randint(0, 10, (10**6,), generator=models.seeded(8)).to("cuda")
    values = torch.randn(10**6, generator=models.seeded(7)).to("cuda")
    sums = [torch.zeros(10, device="cuda").index_add_(0, slots, values) for _ in range(5)]
    return histc_error, sums
