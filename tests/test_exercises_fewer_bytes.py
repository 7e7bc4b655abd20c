"""Notebook 13's checkers: PowerSGD's bytes, a scaled cast to float8, two stages per rank.

The references are held to PyTorch itself where it has the answer (``powerSGD_hook``'s own
``_should_compress``, the bytes notebook 13 measured at the collectives), right answers pass, and
wrong or malformed answers (None, NaN, values equal to everything, the wrong dtype or shape) are
refused with a sentence. The plain mistakes a learner makes are in ``test_wrong_answers.py``.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from conftest import EqInt, EqualToAll
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from tutorial_utils.exercises import reset_attempts
from tutorial_utils.exercises.fewer_bytes import (
    MIN_COMPRESSION_RATE,
    _compressed,
    check_powersgd_bytes,
    check_stage_ids,
    check_to_float8,
    powersgd_reference,
)

F8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


def powersgd_bytes(shapes, rank):
    return powersgd_reference(shapes, rank)


def to_float8(x):
    scale = torch.finfo(F8).max / x.abs().max()
    return (x * scale).to(F8), (1 / scale).float()


def stage_ids(rank, world, style):
    return [rank, rank + world] if style == "loop" else [rank, 2 * world - 1 - rank]


# --- the references -----------------------------------------------------------------------------


@pytest.mark.parametrize("n, m", [(256, 256), (8, 256), (16, 16), (1000, 8), (3, 4), (64, 288)])
@pytest.mark.parametrize("rank", [1, 2, 4])
def test_compression_rule_is_pytorchs(n, m, rank):
    ours = _compressed(n, m, rank)
    theirs = powerSGD_hook._should_compress(n, m, rank, MIN_COMPRESSION_RATE)[0]
    assert ours == theirs


def test_reference_is_what_notebook_13_measured():
    """Section 1's model at rank 1: 6,144 B a step, measured by wrapping dist.all_reduce."""
    assert powersgd_reference([[256, 256], [256], [256, 256], [256]], 1) == 6_144


def test_right_answers_pass():
    assert check_powersgd_bytes(powersgd_bytes).passed
    assert check_to_float8(to_float8).passed
    assert check_stage_ids(stage_ids).passed


def test_float8_with_a_python_float_scale_passes():
    def as_float(x):
        x8, s = to_float8(x)
        return x8, s.item()

    assert check_to_float8(as_float).passed


# --- wrong answers --------------------------------------------------------------------------------

GARBAGE = [None, float("nan"), "6144", EqInt(6144), EqualToAll(), mock.ANY, [6144], -1]


@pytest.mark.parametrize("value", GARBAGE, ids=repr)
def test_powersgd_bytes_refuses_garbage(value):
    fb = check_powersgd_bytes(lambda shapes, rank: value)
    assert not fb.passed and fb.problems, fb.report()


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(offset=st.integers(-10_000, 10_000).filter(lambda d: d != 0))
def test_powersgd_bytes_refuses_any_other_number(offset):
    reset_attempts()
    fb = check_powersgd_bytes(lambda shapes, rank: powersgd_reference(shapes, rank) + offset)
    assert not fb.passed


def _float8_garbage():
    x8 = lambda x: to_float8(x)[0]  # noqa: E731
    s = lambda x: to_float8(x)[1]  # noqa: E731
    return {
        "None": lambda x: None,
        "one tensor, no scale": lambda x: x8(x),
        "fp32, not float8": lambda x: (x.clone(), torch.tensor(1.0)),
        "e5m2, not e4m3": lambda x: ((x * 57344 / x.abs().max()).to(torch.float8_e5m2), s(x)),
        "wrong shape": lambda x: (x8(x).flatten(), s(x)),
        "NaN scale": lambda x: (x8(x), torch.tensor(float("nan"))),
        "zero scale": lambda x: (x8(x), torch.tensor(0.0)),
        "scale of many elements": lambda x: (x8(x), torch.ones(3)),
        "equal to everything": lambda x: (x8(x), EqualToAll()),
    }


@pytest.mark.parametrize("name", list(_float8_garbage()))
def test_to_float8_refuses_garbage(name):
    fb = check_to_float8(_float8_garbage()[name])
    assert not fb.passed and fb.problems, (name, fb.report())


@pytest.mark.parametrize(
    "answer",
    [
        lambda rank, world, style: None,
        lambda rank, world, style: [rank],
        lambda rank, world, style: [rank, EqualToAll()],
        lambda rank, world, style: "0, 3",
        lambda rank, world, style: [rank, rank + world],  # the loop for both (the shipped bug)
    ],
)
def test_stage_ids_refuses_garbage(answer):
    fb = check_stage_ids(answer)
    assert not fb.passed and fb.problems, fb.report()


def test_the_learners_tensor_is_a_copy():
    """to_float8 that scales x in place changes its own copy: the check still judges the cast."""

    def in_place(x):
        scale = torch.finfo(F8).max / x.abs().max()
        x.mul_(scale)
        return x.to(F8), (1 / scale).float()

    fb = check_to_float8(in_place)
    assert not fb.passed and "changed" in fb.report(), fb.report()


def test_the_scripts_placement_is_the_checkers_answer():
    """notebooks/scripts/pipeline_schedules.py places the stages the run of section 4 checked;
    exercise 3's reference must be that placement, for every world the checker tries."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "notebooks" / "scripts"))
    import pipeline_schedules

    from tutorial_utils.exercises.fewer_bytes import _WORLDS, _stage_reference

    for world in _WORLDS:
        for rank in range(world):
            for style in ("loop", "v"):
                assert pipeline_schedules.stage_ids(rank, world, style) == _stage_reference(
                    rank, world, style
                )
    assert check_stage_ids(pipeline_schedules.stage_ids).passed
