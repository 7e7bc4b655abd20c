"""Notebook 12's checkers: right answers pass, wrong shapes of answer get one sentence each.

The plain mistakes (keys without values, round-robin experts, a merge that overflows...) are in
``tests/test_wrong_answers.py``; here: the reference values, and answers that are not numbers.
"""

from __future__ import annotations

import math

import pytest
import torch

from tutorial_utils.exercises import reset_attempts
from tutorial_utils.exercises.at_scale import (
    check_merge,
    check_ring_bytes,
    check_send_splits,
    ring_reference,
)


@pytest.fixture(autouse=True)
def _fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


def ring_bytes(world, batch, heads, seq, head_dim, elem):
    block = batch * heads * (seq // world) * head_dim * elem
    return (world - 1) * 2 * block, ((world - 1) * 4 + 2) * block


def send_splits(expert_of_token, experts, world):
    return torch.bincount(expert_of_token // (experts // world), minlength=world).tolist()


def merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse


def test_the_ring_reference_is_what_notebook_12s_run_sent():
    """2 ranks, B, H, S, DH = 2, 4, 64, 16, fp32: 32,768 B forward and 98,304 B backward per
    rank, as ring_attention.py counted at batch_isend_irecv (and 49,152 / 114,688 on 4 ranks)."""
    assert ring_reference(2, 2, 4, 64, 16, 4) == (32_768, 98_304)
    assert ring_reference(4, 2, 4, 64, 16, 4) == (49_152, 114_688)


@pytest.mark.parametrize(
    "answer", [ring_bytes, lambda *a: tuple(float(v) for v in ring_reference(*a))]
)
def test_right_ring_bytes_pass(answer):
    check_ring_bytes(answer).assert_passed()


def test_right_splits_pass_as_a_list_or_a_tensor():
    check_send_splits(send_splits).assert_passed()
    reset_attempts()
    check_send_splits(lambda e, n, w: torch.tensor(send_splits(e, n, w))).assert_passed()


def test_the_right_merge_passes_and_keeps_the_inputs():
    check_merge(merge).assert_passed()


@pytest.mark.parametrize(
    "answer, says",
    [
        (lambda *a: 5, "returned 5"),
        (lambda *a: (1, math.nan), "return a finite number"),
        (lambda *a: (1, 2, 3), "returned 3 values"),
    ],
)
def test_ring_bytes_that_are_not_two_numbers_get_one_sentence(answer, says):
    fb = check_ring_bytes(answer)
    assert not fb.passed and says in fb.report(), fb.report()


def test_splits_of_the_wrong_length_get_one_sentence():
    fb = check_send_splits(lambda e, n, w: [len(e)])
    assert not fb.passed and "return one per rank" in fb.report(), fb.report()


def test_a_merge_that_changes_its_input_in_place_is_refused():
    def in_place(out_a, lse_a, out_b, lse_b):
        lse = torch.logaddexp(lse_a, lse_b)
        out_a.mul_(torch.exp(lse_a - lse))
        return out_a + torch.exp(lse_b - lse) * out_b, lse

    fb = check_merge(in_place)
    assert not fb.passed and "out_a" in fb.report(), fb.report()
