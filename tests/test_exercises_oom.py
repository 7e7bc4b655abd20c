"""The notebook-05 checkers: right answers pass, each typical mistake fails with a useful reason."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch
from torch import nn

from tutorial_utils import models
from tutorial_utils.exercises import oom as ex


def _n(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_training_state_bytes_is_four_fp32_copies() -> None:
    model = models.MLP(d_in=30, d_hidden=70, d_out=5, depth=2)
    assert ex.training_state_bytes(model) == 16 * _n(model)
    # and it agrees with a real Adam step, measured (Adam adds a 4-byte step counter per tensor)
    step = __import__("tutorial_utils.memory", fromlist=["breakdown"]).breakdown(
        model, models.mlp_batch(4, 30), optimizer=torch.optim.Adam
    )
    n_tensors = len(list(model.parameters()))
    assert (
        step.parameters + step.gradients + step.optimizer_state
        == ex.training_state_bytes(model) + 4 * n_tensors
    )


def test_training_state_bytes_right_answer_passes() -> None:
    model = models.MLP(d_in=300, d_hidden=700, d_out=5, depth=3)
    ex.check_training_state_bytes(model, 16 * _n(model)).assert_passed()


def test_training_state_bytes_names_the_missing_part() -> None:
    model = models.MLP(d_in=300, d_hidden=700, d_out=5, depth=3)
    n = _n(model)
    assert "Adam" in ex.check_training_state_bytes(model, 8 * n).report()
    assert "two tensors" in ex.check_training_state_bytes(model, 12 * n).report()
    assert "only the parameters" in ex.check_training_state_bytes(model, 4 * n).report()
    assert "number of weights" in ex.check_training_state_bytes(model, n).report()
    assert not ex.check_training_state_bytes(model, 0).passed
    assert not ex.check_training_state_bytes(model, 12345).passed


def test_evaluate_leaky_loop_fails_with_the_reason() -> None:
    def leaky(model, batches):
        total = 0
        for x, y in batches:
            total += nn.functional.cross_entropy(model(x), y)
        return total / len(batches)

    # that is notebook 04's shipped exercise code: not an answer yet (issue 31)
    assert not ex.check_evaluate(leaky).answered

    def leaky(model, batches):  # the same mistake, typed by the learner
        running = 0
        for x, y in batches:
            running += nn.functional.cross_entropy(model(x), y)
        return running / len(batches)

    fb = ex.check_evaluate(leaky)
    assert not fb.passed
    assert any("graph" in p for p in fb.problems)


def test_evaluate_fixed_loops_pass() -> None:
    def with_item(model, batches):
        return sum(nn.functional.cross_entropy(model(x), y).item() for x, y in batches) / len(
            batches
        )

    def with_no_grad(model, batches):
        total = 0.0
        with torch.no_grad():
            for x, y in batches:
                total += nn.functional.cross_entropy(model(x), y).item()
        return total / len(batches)

    ex.check_evaluate(with_item).assert_passed()
    ex.check_evaluate(with_no_grad).assert_passed()


def test_evaluate_wrong_value_and_leftover_memory_fail() -> None:
    def wrong(model, batches):
        return sum(nn.functional.cross_entropy(model(x), y).item() for x, y in batches)  # no mean

    assert any("mean loss" in p for p in ex.check_evaluate(wrong).problems)

    stash = []

    def hoarder(model, batches):
        total = 0.0
        for x, y in batches:
            out = model(x)
            stash.append(out)  # keeps every output (and its graph) alive
            total += nn.functional.cross_entropy(out, y).item()
        return total / len(batches)

    fb = ex.check_evaluate(hoarder)
    assert not fb.passed and any("still alive" in p for p in fb.problems)


def test_evaluate_that_raises_is_reported() -> None:
    def broken(model, batches):
        raise ValueError("boom")

    fb = ex.check_evaluate(broken)
    assert not fb.passed and "boom" in fb.report()


def test_evaluate_that_holds_every_graph_until_one_item_fails() -> None:
    """Issue 25: adding up the loss tensors and calling .item() once returned a float and left
    nothing behind, so it passed; its peak was 1,187,344 B against 262,144 B for the solution."""

    def item_once(model, batches):
        total = 0
        for x, y in batches:
            total = total + nn.functional.cross_entropy(model(x), y)
        return total.item() / len(batches)

    fb = ex.check_evaluate(item_once)
    assert not fb.passed and "1,187,344 bytes above the start" in fb.report(), fb.report()


def test_training_state_bytes_placeholder_zero_is_not_an_attempt() -> None:
    from tutorial_utils.exercises import reset_attempts

    reset_attempts()
    model = models.MLP(d_in=8, d_hidden=16, d_out=2, depth=2)
    untouched = ex.check_training_state_bytes(model, 0)  # the cell ships `my_answer = 0  # TODO`
    assert not untouched.passed and not untouched.answered and untouched.attempt == 0
    assert ex.check_training_state_bytes(model, 12345).attempt == 1
    reset_attempts()


def test_training_state_bytes_accepts_adams_step_counters() -> None:
    """Issue 20: the notebook's check counts 4 bytes per tensor for Adam's step (c8), so the
    checker accepts that count too, and says both are right."""
    model = models.MLP(d_in=300, d_hidden=700, d_out=5, depth=3)
    n_tensors = len(list(model.parameters()))
    with_steps = ex.check_training_state_bytes(model, 16 * _n(model) + 4 * n_tensors)
    with_steps.assert_passed()
    assert not ex.check_training_state_bytes(model, 16 * _n(model) + 4 * n_tensors + 4).passed


# -----------------------------------------------------------------------------
# The notebooks do not give exercise answers away (issue 20 §5 and §6)

_NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _cells(name: str) -> list[dict]:
    return json.loads((_NOTEBOOKS / name).read_text(encoding="utf-8"))["cells"]


def _halving_retries(source: str) -> list[str]:
    """Functions in ``source`` that catch torch.OutOfMemoryError and halve a batch size."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef):
            continue
        catches = any(
            isinstance(h, ast.ExceptHandler) and "OutOfMemoryError" in ast.unparse(h.type or h)
            for h in ast.walk(node)
        )
        halves = any(
            isinstance(n, (ast.AugAssign, ast.BinOp))
            and isinstance(n.op, ast.FloorDiv)
            and ast.unparse(n.value if isinstance(n, ast.AugAssign) else n.right) == "2"
            for n in ast.walk(node)
        )
        if catches and halves:
            found.append(node.name)
    return found


def test_05_teaches_no_retry_loop_that_exercise_2_asks_for():
    """Exercise 2 (a retry that halves the batch) must take thought: no cell above it shows the
    finished pattern (until issue 20, section 3's ``largest_batch_that_fits`` did)."""
    cells = _cells("04_out_of_memory.ipynb")
    end = next(
        i
        for i, c in enumerate(cells)
        if c["cell_type"] == "markdown" and "## Exercises" in "".join(c["source"])
    )
    shown = [
        name
        for c in cells[:end]
        if c["cell_type"] == "code" and not "".join(c["source"]).startswith("# Colab only")
        for name in _halving_retries("".join(c["source"]))
    ]
    assert not shown, f"cells above the exercises show exercise 2's answer: {shown}"


def test_the_rule_finds_a_halving_retry():
    old_cell = (
        "def largest_batch_that_fits(batch_size):\n"
        "    while batch_size >= 1:\n"
        "        try:\n"
        "            train(batch_size)\n"
        "            return batch_size\n"
        "        except torch.OutOfMemoryError:\n"
        "            pass\n"
        "        batch_size //= 2\n"
    )
    assert _halving_retries(old_cell) == ["largest_batch_that_fits"]
    assert (
        _halving_retries("def f():\n    try:\n        g()\n    except KeyError:\n        n //= 2\n")
        == []
    )


# ----------------------------------------------------------------------------- issue 32
# Notebook 04 after the v2 renumbering: it follows 03, measures neither checkpointing nor
# autocast memory (03 and 05 do), teaches chunked cross-entropy with a check that can fail,
# and shows the allocator calls it runs on a GPU.
_OOM_NB = "04_out_of_memory.ipynb"


def _sources(kind: str) -> list[str]:
    return ["".join(c["source"]) for c in _cells(_OOM_NB) if c["cell_type"] == kind]


def _python_cells() -> list[str]:
    """The code cells but the Colab setup cell (shell escapes, not Python)."""
    return [src for src in _sources("code") if not src.startswith("# Colab only")]


def _code_cell(marker: str) -> str:
    (found,) = [src for src in _sources("code") if marker in src]
    return found


def test_04_comes_after_03_and_points_back_to_it() -> None:
    intro = _sources("markdown")[0]
    assert "notebook 03" in intro.split("**Prerequisites:**", 1)[1].split("**Where")[0]
    text = "\n".join(_sources("markdown") + _sources("code"))
    assert "05a" not in text and "notebook 06" not in text, "old numbers: 03 and 05 now"


def test_04_measures_neither_checkpointing_nor_autocast_memory() -> None:
    """One place per lesson: 03 measures checkpointing, 05 autocast memory. The only
    checkpoint left here is chunked cross-entropy's, and no breakdown runs under autocast."""
    for src in _python_cells():
        tree = ast.parse(src)
        for node in ast.walk(tree):
            if isinstance(node, ast.With) and "autocast" in ast.unparse(node.items[0]):
                assert "breakdown" not in ast.unparse(node), "autocast memory is 05's"
        calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "checkpoint"
        ]
        if calls:
            assert "def chunked_cross_entropy" in src, "checkpointing is measured in 03"


def test_04_states_the_logits_bytes_as_computed() -> None:
    """Old cell 50 said 16 GiB for 4·s·b·v at s = 4096, b = 8, v = 128 000: it is 15.6 GiB."""
    assert 4 * 4096 * 8 * 128_000 / 2**30 == 15.625
    assert not any("16 GiB" in src for src in _sources("markdown") + _sources("code"))
    assert "format_bytes(4 * 4096 * 8 * 128_000)" in _code_cell("def loss_step(")


def test_04_shows_each_allocator_demo_it_runs() -> None:
    """The helper shows, PyTorch does: a cell that runs scripts/allocator_gpu.py shows the
    function first (listing.show), on every machine."""
    ran = 0
    for src in _python_cells():
        for name in set(
            n.attr
            for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "allocator_gpu"
        ):
            ran += 1
            assert "listing.show(" in src and f'"{name}"' in src, f"{name} runs without being shown"
    assert ran == 2, "oom_under_fraction and snapshot_live_blocks"


def _clinic(shape: tuple[int, int, int, int] | None = None, k: int | None = None, **world):
    """Run notebook 04's logits cells on the CPU (optionally at another shape and chunk count)
    in a fresh namespace; ``world`` replaces names the cells use."""
    from torch.utils.checkpoint import checkpoint

    from tutorial_utils import devices, memory
    from tutorial_utils.units import format_bytes

    caps = devices.Capabilities.machine("cpu")
    torch.manual_seed(0)  # the head's weights come from the global generator: not test order
    ns = {"torch": torch, "nn": nn, "models": models, "memory": memory, "caps": caps}
    ns.update(device=torch.device("cpu"), dev="cpu", checkpoint=checkpoint)
    ns.update(format_bytes=format_bytes, **world)
    bf16 = _code_cell("def loss_step(")
    if shape is not None:
        line = "\nb, s, v, h = 4, 64, 8000, 64\n"
        assert line in bf16
        bf16 = bf16.replace(line, "\nb, s, v, h = {}, {}, {}, {}\n".format(*shape))
    exec(bf16, ns)
    chunked = _code_cell("def chunked_cross_entropy(")  # after the autocast peak, in one cell
    if k is not None:
        assert "\nk = 4\n" in chunked
        chunked = chunked.replace("\nk = 4\n", f"\nk = {k}\n")
    exec(chunked, ns)
    return ns


def test_chunked_cross_entropy_meets_its_prediction_at_other_shapes() -> None:
    """The notebook's prediction, (12·s·b·v − 2·s·b·h)·(1 − 1/k) − 2·v·h, holds to the byte on
    a CPU at shapes and chunk counts the notebook does not run."""
    for shape, k in (((2, 128, 5000, 32), 2), ((4, 64, 6000, 96), 8)):
        ns = _clinic(shape, k)
        assert ns["tol_drop_bytes"] == 0 and ns["drop"] == ns["predicted"], (shape, k)
        assert ns["peak_amp"] == ns["peak_cast"]


def test_chunked_check_fails_without_checkpoint() -> None:
    """Chunks without checkpoint keep every chunk's fp32 log-probabilities for backward: the
    peak barely drops, and the notebook's check says so."""
    import pytest

    def no_checkpoint(fn, *args, use_reentrant=None):
        return fn(*args)

    with pytest.raises(AssertionError) as failed:
        _clinic(checkpoint=no_checkpoint)
    assert isinstance(failed.value.args[0], float), "the drop's check (it shows drop - predicted)"


def test_autocast_check_fails_when_the_loss_stays_in_bf16() -> None:
    """A world where cross_entropy is not on autocast's fp32 list (its input stays bf16): the
    peak without .float() is lower, and the notebook's check fails."""
    import pytest

    real = nn.functional.cross_entropy

    def bf16_cross_entropy(logits, labels, **kw):
        with torch.autocast("cpu", enabled=False):
            return real(logits, labels, **kw)

    functional = type("F", (), {"cross_entropy": staticmethod(bf16_cross_entropy)})
    fake_nn = type("nn", (), {"functional": functional, "Linear": nn.Linear})
    with pytest.raises(AssertionError, match="the same peak"):
        _clinic(nn=fake_nn)
