"""The notebook 01 checkers accept the reference answers and reject the common mistakes."""

from __future__ import annotations

import pytest
import torch
from conftest import move_ref

from tutorial_utils.exercises.moving import check_move_batch


def test_move_reference_passes():
    assert check_move_batch(move_ref, "cpu").passed


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (lambda b, d: b, "is on cpu, not meta"),
        (
            lambda b, d: {
                k: move_ref(v, d) if k != "pair" else list(move_ref(v, d)) for k, v in b.items()
            },
            "tuple",
        ),
        (
            lambda b, d: move_ref(b, torch.device(d)) | {"x": b["x"].to(d, torch.float32)},
            "changed dtype",
        ),
        (lambda b, d: [b], "dict must come back as a dict"),
        (lambda b, d: b.to(d), "raised AttributeError"),
    ],
)
def test_move_mistakes_are_named(wrong, message):
    fb = check_move_batch(wrong, "cpu")
    assert not fb.passed
    assert message in fb.report(), fb.report()


def test_move_dropping_non_tensors_fails():
    def drop(batch, device):
        out = move_ref(batch, device)
        out["items"][2] = None
        return out

    assert "unchanged" in check_move_batch(drop).report()


def test_move_that_rewrites_the_batch_in_place_fails():
    """Issue 25: a move that turned the batch's tensors into float16 zeros in place, and returned
    the batch, passed: the checker compared the result with the batch it had handed over."""

    def zeroes_in_place(batch, device):
        if isinstance(batch, dict):
            for key, value in batch.items():
                if isinstance(value, torch.Tensor):
                    batch[key] = torch.zeros(value.shape, dtype=torch.float16, device=device)
                else:
                    zeroes_in_place(value, device)
        elif isinstance(batch, list):
            for i, value in enumerate(batch):
                if isinstance(value, torch.Tensor):
                    batch[i] = torch.zeros(value.shape, dtype=torch.float16, device=device)
                else:
                    zeroes_in_place(value, device)
        return move_ref(batch, device)

    fb = check_move_batch(zeroes_in_place, "cpu")
    assert not fb.passed and "changed its input" in fb.report(), fb.report()


def test_move_that_zeroes_the_tensors_it_is_given_fails():
    def zero_then_move(batch, device):
        batch["x"].zero_()
        return move_ref(batch, device)

    fb = check_move_batch(zero_then_move, "cpu")
    assert not fb.passed and "batch['x'] changed its values" in fb.report(), fb.report()
