"""The optimizer step's temporaries: the calculator's term against the course's accountant.

Each implementation of ``torch.optim`` runs a real step on the CPU on the course's small decoder
(fp32, torch's own optimizers) inside ``memory.measure("cpu")``, which counts every tensor
storage exactly; what the step holds above its start must equal ``temporaries.step_temporaries``
to the byte. The second step is measured: the first also creates the state, which is a state,
not a temporary. ``foreach=True`` is asked for by name: on the CPU torch's default is the
for-loop (foreach only defaults on CUDA), and the foreach kernels' outputs are the same tensors
on either device.
"""

from __future__ import annotations

import pytest
import torch

from tutorial_utils import fit, memory
from tutorial_utils.decoder import Decoder, DecoderConfig
from tutorial_utils.fit.temporaries import step_temporaries

SMALL = DecoderConfig(vocab=256, d_model=32, n_layers=2, n_heads=4)
IMPLS = ("foreach", "fused", "forloop")


def _optimizer(name: str, params, impl: str):
    kinds = {"foreach": {"foreach": True}, "fused": {"fused": True}, "forloop": {"foreach": False}}
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, **kinds[impl])
    return torch.optim.AdamW(params, lr=1e-3, **kinds[impl])


def _measured_step(name: str, impl: str) -> tuple[int, list[int]]:
    torch.manual_seed(0)
    model = Decoder(SMALL)
    params = list(model.parameters())
    opt = _optimizer(name, params, impl)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # makes the state
    with memory.measure("cpu") as m:
        opt.step()
    return m.peak_above_start_bytes, [p.numel() for p in params]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", ["adamw", "sgd-momentum"])
def test_the_step_temporaries_are_what_a_real_step_holds_to_the_byte(name, impl):
    measured, numels = _measured_step(name, impl)
    assert measured == step_temporaries(numels, name, impl)


def test_the_three_implementations_differ_as_the_term_says():
    """foreach holds a copy of every second moment, the for-loop two of one parameter's and one
    of the parameter before it, fused none: so the test above can fail for each of them."""
    numels = [p.numel() for p in Decoder(SMALL).parameters()]
    foreach, fused, forloop = (step_temporaries(numels, "adamw", i) for i in IMPLS)
    pairs = zip(numels, [0, *numels[:-1]], strict=True)
    assert foreach == 4 * sum(numels) and fused == 0
    assert forloop == 4 * max(2 * n + before for n, before in pairs) > 8 * max(numels)
    assert len({foreach, fused, forloop}) == 3
    with pytest.raises(ValueError, match="foreach, fused or forloop"):
        step_temporaries(numels, "adamw", "chunked")


def test_the_calculator_s_optimizer_step_moment_is_the_states_and_the_temporaries():
    """The fourth moment: every state, every gradient, and the term above, for the shapes the
    calculator counts (fp32, one GPU)."""
    numels = [p.numel() for p in Decoder(SMALL).parameters()]
    for impl in IMPLS:
        r = fit.will_it_fit(SMALL, batch=1, seq=8, precision="fp32", optimizer_impl=impl)
        states = sum(r.model_states.values())
        assert r.peaks["optimizer step"] == states + step_temporaries(numels, "adamw", impl)


def test_the_optimizer_step_can_be_the_peak_and_says_so():
    """Mistral 7B at batch 1: the foreach step (a fp32 copy of every second moment) is the
    largest moment, and the for-loop and fused steps are smaller by that copy."""
    foreach = fit.will_it_fit("mistral-7b", seq=512)
    assert foreach.peak_moment == "optimizer step"
    assert foreach.categories["step temporaries"] == 4 * foreach.n_parameters
    fused = fit.will_it_fit("mistral-7b", seq=512, optimizer_impl="fused")
    assert fused.peak_bytes < foreach.peak_bytes
    assert fused.peaks["optimizer step"] == foreach.peaks["optimizer step"] - 4 * fused.n_parameters
