"""The capstone grader catches each way a training step can be wrong, and passes a right one."""

import pytest
import torch
from torch import nn

from tutorial_utils import memory
from tutorial_utils.exercises.capstone import CapstoneTask, grade
from tutorial_utils.models import MLP, mlp_batch


@pytest.fixture(scope="module")
def task():
    def make_model():
        return MLP(d_in=64, d_hidden=256, d_out=5, depth=3, seed=0)

    x = mlp_batch(1024, 64, seed=1)
    y = torch.randint(0, 5, (1024,), generator=torch.Generator().manual_seed(2))
    model = make_model()
    plain = memory.breakdown(model, x, loss_fn=lambda out: nn.functional.cross_entropy(out, y), optimizer=torch.optim.Adam)
    fixed = plain.parameters + plain.gradients + plain.optimizer_state + plain.inputs
    budget = fixed + int(0.5 * (plain.peak - fixed))  # the plain step cannot fit; 4 micro-batches can
    return CapstoneTask(make_model, x, y, budget_bytes=budget, device=torch.device("cpu"), lr=1e-3, steps=3)


def plain(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def micro(model, optimizer, x, y, k=4, scale=True):
    optimizer.zero_grad()
    total = 0.0
    for xc, yc in zip(x.chunk(k), y.chunk(k), strict=True):
        loss = nn.functional.cross_entropy(model(xc), yc)
        (loss / k if scale else loss).backward()
        total += loss.item() / k
    optimizer.step()
    return total


def test_right_answer_passes(task):
    result = grade(micro, task)
    assert result.feedback.passed, str(result.feedback)
    assert result.peak_bytes <= task.budget_bytes
    assert result.losses[-1] < result.losses[0]


def test_plain_step_runs_out_of_memory(task):
    result = grade(plain, task)
    assert not result.feedback.passed
    assert "ran out of memory" in str(result.feedback)


def test_unscaled_accumulation_is_caught(task):
    fb = grade(lambda *a: micro(*a, scale=False), task).feedback
    assert "4.00x the full-batch gradients" in str(fb)


def test_dropped_samples_are_caught(task):
    def half_batch(model, optimizer, x, y):
        return micro(model, optimizer, x[: len(x) // 2], y[: len(y) // 2], k=2)

    fb = grade(half_batch, task).feedback
    assert "another direction" in str(fb)


def test_two_optimizer_steps_are_caught(task):
    def twice(model, optimizer, x, y):
        micro(model, optimizer, x, y)
        optimizer.step()
        return 0.0

    fb = grade(twice, task).feedback
    assert "exactly once" in str(fb)


def test_loss_must_fall(task):
    fb = grade(lambda *a: (micro(*a), 1.0)[1], task).feedback
    assert "did not fall" in str(fb)


def test_a_crashing_step_is_reported(task):
    def broken(model, optimizer, x, y):
        raise ValueError("shapes do not match")

    fb = grade(broken, task).feedback
    assert "raised ValueError: shapes do not match" in str(fb)
    assert "must be a function" in str(grade(42, task).feedback)
