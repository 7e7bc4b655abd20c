"""The ``cpu_offload`` knob against FSDP2's own ``CPUOffloadPolicy``, counted on fake tensors.

``fit_cpu_offload_fake.py`` (its docstring says how, and which lines of FSDP2 it runs) takes a
step of the course's decoder as rank 0 of 4 under ``fully_shard``, once with
``CPUOffloadPolicy`` and once without, and counts with PyTorch's ``FSDPMemTracker`` the bytes
on the accelerator, and on the CPU, at each moment of the step: for one batch, two
micro-batches accumulated, the optimizer step in backward, ``reshard_after_forward=False``
and bf16 parameters (``MixedPrecisionPolicy(bfloat16, float32)``). The calculator is asked the
same questions (``will_it_fit(..., sharding="fsdp2", cpu_offload=True/False)`` with
``grad_accumulation=2``, ``optimizer_in_backward=True``, ``reshard_after_forward=False``, or
``precision="bf16-master", reduce_dtype="fp32"``).

What the knob changes is held to the byte: at each moment, what offloading takes off the
device (the control's bytes less the offloaded run's) is what the calculator's term takes off
(its peak without the knob less its peak with it), and the CPU then holds exactly the states
the calculator moved there. What
stays on the device, the gathered unit and the activations, is the same with and without
offloading, measured and calculated. The step's other terms (how much a gathered unit and the
activations hold at each moment) are the FSDP2 profile's, held elsewhere
(``test_fit_profiles.py``), not here. The same term serves FSDP1's ``CPUOffload`` and the
``zero3`` profile, unmeasured: FSDP1 moves its flat parameter between devices with
``.data =``, which torch refuses between the CPU and a device registered in Python, and
DeepSpeed is not installed. One child process that imports torch (about 16 s of CPU): heavy.
"""

from __future__ import annotations

import fake_fsdp2_counts
import pytest
from fake_fsdp2_counts import RECIPES, measured

from tutorial_utils import fit
from tutorial_utils.decoder_config import DecoderConfig
from tutorial_utils.units import format_bytes

SHARDED = ("Sharded Param", "Sharded Grad", "OptState")  # FSDPMemTracker's names for the states


@pytest.fixture(scope="module")
def counted() -> dict:
    out = fake_fsdp2_counts.counts()["offload"]  # one child for this file and the moments'
    assert set(out["runs"]) == set(RECIPES)
    return out


def _calculated(counted: dict, recipe: str) -> dict:
    ask = fake_fsdp2_counts.question(counted, recipe)
    cfg = DecoderConfig(**counted["config"])
    return {
        "control": fit.will_it_fit(cfg, **ask),
        "offload": fit.will_it_fit(cfg, **ask, cpu_offload=True),
    }


def _taken_off(control: dict, offload: dict, moment: str) -> int:
    """What offloading took off the device at ``moment``: the control's bytes less the
    offloaded run's. (With the optimizer step in backward no moment is a hook's: each shard
    steps after its unit's unsharded gradients are freed, below the moments' peaks.)"""
    return measured(control, moment) - measured(offload, moment)


@pytest.mark.heavy
@pytest.mark.parametrize("recipe", RECIPES)
def test_offloading_takes_off_the_device_what_the_term_takes_off(counted, recipe):
    control, offload = counted["runs"][recipe]["control"], counted["runs"][recipe]["offload"]
    calculated = _calculated(counted, recipe)
    assert control["shards on"] == ["accel"] and offload["shards on"] == ["cpu"]
    before = control["at the end of forward"].get("Sharded Grad", 0)  # an earlier micro-batch's
    start = control["at the peaks in backward"]["start of backward"]
    assert start.get("Sharded Grad", 0) == before, "none added yet"
    assert bool(control["in the hooks"]) == (recipe == "optimizer in backward")
    assert len(control["in the hooks"]) == len(offload["in the hooks"])
    for moment, with_states in calculated["control"].peaks.items():
        term = with_states - calculated["offload"].peaks[moment]
        assert _taken_off(control, offload, moment) == term, moment


@pytest.mark.heavy
def test_the_cpu_holds_the_states_the_term_moved_there(counted):
    """After backward: the shards of the weights and gradients and Adam's two moments are on
    the CPU. Adam's step counters are on the CPU in both runs (a 0-d tensor per parameter):
    the control's CPU bytes take them off."""
    run, calculated = counted["runs"]["one batch"], _calculated(counted, "one batch")
    on_cpu = run["offload"]["on the cpu"]
    counters = run["control"]["on the cpu"].get("OptState", 0)
    states = calculated["control"].model_states
    assert on_cpu["Sharded Param"] == states["weights"]
    assert on_cpu["Sharded Grad"] == states["gradients"]
    assert on_cpu["OptState"] - counters == states["optimizer state"]
    assert set(calculated["offload"].model_states.values()) == {0}, "none left on the GPU"
    said = f"on the CPU (offloaded): {format_bytes(sum(states.values()))} of states"
    assert said in calculated["offload"].notes


@pytest.mark.heavy
@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "optimizer in backward"])
def test_the_gathered_unit_and_the_activations_stay_on_the_device(counted, recipe):
    """Offloaded, the device holds no shard at any moment counted, while the gathered root (its
    weights: FSDP2 does not reshard the root after forward), the activations and, in backward,
    the all-gather buffers and unsharded gradients are what they are without offloading. The
    calculator keeps its gathered unit and activations too, and nothing at the step (the
    optimizer steps on the CPU): the device holds only the batch's token ids then. (The
    optimizer in backward is left out: the tracker files its states under "Temp".)"""
    control, offload = counted["runs"][recipe]["control"], counted["runs"][recipe]["offload"]
    calculated = _calculated(counted, recipe)
    for when in ("at the end of forward", "start of backward"):
        on, off = (
            r.get("at the peaks in backward", {}).get(when, r.get(when)) for r in (control, offload)
        )
        on = {k: v for k, v in on.items() if k not in SHARDED and k != "Total"}
        assert not set(SHARDED) & set(off), when
        assert {k: v for k, v in off.items() if k != "Total"} == on, when
    assert offload["after backward"] == offload["tokens"] + 4  # and the loss (0-d fp32), held
    assert offload["optimizer step"] == offload["tokens"]
    c, o = calculated["control"].categories, calculated["offload"].categories
    assert o["gathered unit"] == c["gathered unit"] > 0
    assert o["activations"] == c["activations"] > 0
    assert calculated["offload"].peaks["optimizer step"] == 0
