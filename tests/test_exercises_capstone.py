"""The capstone grader catches each way a training step can be wrong, and passes a right one."""

import threading

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import checkpoint

from tutorial_utils import accounting, memory
from tutorial_utils.exercises import capstone, reset_attempts
from tutorial_utils.exercises.capstone import CapstoneTask, grade
from tutorial_utils.models import MLP, mlp_batch


@pytest.fixture(scope="module")
def task():
    return budgeted_task()


def budgeted_task() -> CapstoneTask:
    """An MLP whose plain step does not fit the budget and whose 4 micro-batches do (also used
    by ``test_wrong_answers.py``)."""

    def make_model():
        return MLP(d_in=64, d_hidden=128, d_out=5, depth=3, seed=0)

    x = mlp_batch(512, 64, seed=1)
    y = torch.randint(0, 5, (512,), generator=torch.Generator().manual_seed(2))
    peaks = {}
    for name, step in [("plain", plain), ("micro", micro)]:
        model = make_model()
        optimizer = torch.optim.Adam(model.parameters())
        step(model, optimizer, x, y)  # Adam makes its state in the first step
        del model, optimizer
        model = make_model()  # measured from a fresh model, as the grader's steps run
        optimizer = torch.optim.Adam(model.parameters())
        with memory.measure("cpu") as m:
            for _ in range(2):
                step(model, optimizer, x, y)
        peaks[name] = m.peak_bytes - m.start_bytes
        base = (
            m.start_bytes
        )  # tensors other tests in this process left alive: the budget counts them
        del model, optimizer
    assert peaks["micro"] < 0.9 * peaks["plain"], peaks  # the budget below must separate them
    budget = base + (peaks["plain"] + peaks["micro"]) // 2  # plain cannot fit; 4 micro can
    return CapstoneTask(
        make_model, x, y, budget_bytes=budget, device=torch.device("cpu"), lr=1e-3, steps=3
    )


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
    assert result.feedback.passed, result.feedback.report()
    assert result.peak_bytes <= task.budget_bytes
    assert result.losses[-1] < result.losses[0]


def test_garbage_of_earlier_cells_is_collected_before_the_budgeted_steps(task):
    """A notebook's earlier cells leave cyclic garbage; the collector may free it at any moment.
    Kept alive through the budgeted window it counts against the budget (the budget counts every
    tensor in the process); freed inside it, it lowers the count below what the step made. The
    grader collects it first, so the right answer passes either way."""
    import gc

    class Cycle:
        def __init__(self, nbytes):
            self.me, self.data = self, torch.zeros(nbytes // 4)  # freed only by the collector

    gc.disable()
    try:
        Cycle(task.budget_bytes // 2)  # half the budget, unreachable but alive
        result = grade(micro, task)
    finally:
        gc.enable()
    assert result.feedback.passed, result.feedback.report()


def test_plain_step_runs_out_of_memory(task):
    result = grade(plain, task)
    assert not result.feedback.passed
    assert "ran out of memory" in result.feedback.report()


def test_unscaled_accumulation_is_caught(task):
    fb = grade(lambda *a: micro(*a, scale=False), task).feedback
    assert "4.00x the full-batch gradients" in fb.report()


def test_dropped_samples_are_caught(task):
    def half_batch(model, optimizer, x, y):
        return micro(model, optimizer, x[: len(x) // 2], y[: len(y) // 2], k=2)

    fb = grade(half_batch, task).feedback
    assert "another direction" in fb.report()


def test_two_optimizer_steps_are_caught(task):
    def twice(model, optimizer, x, y):
        micro(model, optimizer, x, y)
        optimizer.step()
        return 0.0

    fb = grade(twice, task).feedback
    assert "exactly once" in fb.report()


def test_loss_must_fall(task):
    fb = grade(lambda *a: (micro(*a), 1.0)[1], task).feedback
    assert "did not fall" in fb.report()


def test_a_crashing_step_is_reported(task):
    def broken(model, optimizer, x, y):
        raise ValueError("shapes do not match")

    fb = grade(broken, task).feedback
    assert "raised ValueError: shapes do not match" in fb.report()
    assert "must be a function" in str(grade(42, task).feedback)


def _plain_in_a_thread(model, optimizer, x, y):
    box = {}
    worker = threading.Thread(target=lambda: box.update(loss=plain(model, optimizer, x, y)))
    worker.start()
    worker.join()
    return box["loss"]


def _plain_with_modes_popped(model, optimizer, x, y):
    with _disable_current_modes():
        return plain(model, optimizer, x, y)


def _plain_with_dispatch_off(model, optimizer, x, y):
    with torch._C._DisableTorchDispatch():
        return plain(model, optimizer, x, y)


@pytest.mark.parametrize(
    ("step", "seen"),
    [
        (_plain_in_a_thread, "ran in another thread"),
        (_plain_with_modes_popped, "ran with the dispatch modes popped"),
        (_plain_with_dispatch_off, "ran with torch dispatch turned off"),
    ],
)
def test_a_step_hidden_from_the_accountant_is_refused(task, step, seen):
    fb = grade(step, task).feedback
    assert not fb.passed
    assert seen in fb.report() and "could not count part of your step's memory" in fb.report()


def test_the_books_are_checked_against_what_the_step_made(task, monkeypatch):
    """Even with the hooks blind, a step the accountant did not see is caught by the books."""

    def blind(self, what):
        self.forwards += 1

    monkeypatch.setattr(capstone._Watch, "_check", blind)
    monkeypatch.setattr(capstone._Threads, "__enter__", lambda self: self)  # blind too
    fb = grade(_plain_in_a_thread, task).feedback
    assert not fb.passed
    assert "less than the gradients and optimizer state your step made" in fb.report()


def test_a_checkpointed_step_in_the_calling_thread_passes(task):
    def checkpointed(model, optimizer, x, y, k=4):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for xc, yc in zip(x.chunk(k), y.chunk(k), strict=True):
            out = checkpoint(model, xc, use_reentrant=False)
            loss = nn.functional.cross_entropy(out, yc) / k
            loss.backward()
            total += loss.item()
        optimizer.step()
        return total

    result = grade(checkpointed, task)
    assert result.feedback.passed, result.feedback.report()


def test_a_step_that_returns_no_loss_is_told_so(task):
    fb = grade(lambda *a: (micro(*a), None)[1], task).feedback
    assert "must return the batch's loss as a finite number, not None" in fb.report()


def test_first_failure_hints_second_explains(task):
    reset_attempts()
    first = grade(plain, task).feedback
    assert not first.detailed and "ran out of memory" in repr(first)
    assert "Fix:" not in repr(first)
    second = grade(plain, task).feedback
    assert second.detailed and "Fix:" in repr(second)
    reset_attempts()


def test_each_named_exercise_starts_with_a_hint(task):
    """07 grades three exercises with one grader: each counts its own attempts."""
    reset_attempts()
    assert not grade(plain, task).feedback.passed  # the "your turn" cell, failed
    tight = grade(plain, task, exercise="tight budget").feedback
    assert not tight.passed and tight.attempt == 1 and not tight.detailed
    assert grade(plain, task, exercise="tight budget").feedback.detailed
    with pytest.raises(ValueError, match="string"):
        grade(plain, task, exercise=2)
    reset_attempts()


# --- issue 25: wrong steps that passed before ------------------------------------------------


def test_a_step_that_zeroes_its_labels_is_refused_and_the_notebooks_labels_stay(task):
    """``labels.zero_()`` passed and wiped the task's (the notebook's) labels."""
    kept = task.labels.clone()

    def zeroes_labels(model, optimizer, x, y):
        y.zero_()
        return micro(model, optimizer, x, y)

    fb = grade(zeroes_labels, task).feedback
    assert not fb.passed and "changed its input: labels changed its values" in fb.report(), (
        fb.report()
    )
    assert torch.equal(task.labels, kept)


def test_a_step_that_trains_once_then_fakes_is_caught(task):
    """Real work on the first call only, then a made-up falling loss and model(tokens[:1])."""
    calls = []

    def once_then_fake(model, optimizer, x, y):
        calls.append(1)
        if len(calls) == 1:
            return micro(model, optimizer, x, y)
        model(x[:1])
        return 1.0 / len(calls)

    fb = grade(once_then_fake, task).feedback
    assert not fb.passed, fb.report()
    assert "exactly once per train_step (in step 1 it was called 0 times)" in fb.report(), (
        fb.report()
    )


def test_a_step_that_catches_the_oom_and_trains_on_a_quarter_is_caught(task):
    def quarter_on_oom(model, optimizer, x, y):
        try:
            return plain(model, optimizer, x, y)
        except torch.OutOfMemoryError:
            pass
        n = len(x) // 4
        return plain(model, optimizer, x[:n], y[:n])

    fb = grade(quarter_on_oom, task).feedback
    assert not fb.passed and "in step 1 point in another direction" in fb.report(), fb.report()


def test_micro_batches_divided_by_k_plus_1_are_caught(task):
    """16 micro-batches, each loss / 17: gradients 0.94x, inside the old +-10% tolerance."""

    def by_k_plus_1(model, optimizer, x, y, k=16):
        optimizer.zero_grad()
        total = 0.0
        for xc, yc in zip(x.chunk(k), y.chunk(k), strict=True):
            loss = nn.functional.cross_entropy(model(xc), yc)
            (loss / (k + 1)).backward()
            total += loss.item() / k
        optimizer.step()
        return total

    fb = grade(by_k_plus_1, task).feedback
    assert not fb.passed and "0.94x the full-batch gradients" in fb.report(), fb.report()


def test_bf16_autocast_stays_inside_the_gradient_tolerance(task):
    def micro_bf16(model, optimizer, x, y, k=4):
        optimizer.zero_grad()
        total = 0.0
        for xc, yc in zip(x.chunk(k), y.chunk(k), strict=True):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(xc)
            loss = nn.functional.cross_entropy(out.float(), yc)
            (loss / k).backward()
            total += loss.item() / k
        optimizer.step()
        return total

    result = grade(micro_bf16, task)
    assert result.feedback.passed, result.feedback.report()
    # ...unless the exercise asks for the full-batch gradients themselves (06's exercise 2)
    strict = grade(micro_bf16, task, exercise="fp32 only", fp32_gradients=True).feedback
    assert not strict.passed and "without autocast" in str(strict), str(strict)
    assert grade(micro, task, exercise="fp32 only", fp32_gradients=True).feedback.passed


def test_messages_name_the_step_as_the_learner_called_it(task):
    def colleague_step(model, optimizer, x, y):  # exercise 3's name for its step
        raise ValueError("shapes do not match")

    fb = str(grade(colleague_step, task, exercise="named").feedback.explain())
    assert "your colleague_step raised ValueError" in fb and "your train_step" not in fb, fb
    anonymous = str(grade(lambda *a: 1 / 0, task, exercise="lambda").feedback.explain())
    assert "your train_step raised ZeroDivisionError" in anonymous, anonymous


def test_a_step_that_changes_the_weights_besides_the_optimizer_is_caught(task):
    def nudges(model, optimizer, x, y):
        loss = micro(model, optimizer, x, y)
        with torch.no_grad():
            next(model.parameters()).mul_(0.9)
        return loss

    fb = grade(nudges, task).feedback
    assert not fb.passed and "not what the optimizer's own step gives" in fb.report(), fb.report()


def test_a_step_that_adds_a_parameter_gets_a_sentence(task):
    def adds(model, optimizer, x, y):
        model.extra = nn.Parameter(torch.zeros(3))
        return micro(model, optimizer, x, y)

    fb = grade(adds, task).feedback
    assert not fb.passed and "changed the model's parameters" in fb.report(), fb.report()


def _lifts_the_limit(model, optimizer, x, y):
    acc = getattr(accounting._local, "shared", None)
    if acc is None:  # the grader's first, unbudgeted call
        return micro(model, optimizer, x, y)
    limits = [(w, w.limit) for w in acc.windows]
    for w, _ in limits:
        w.limit = None
    acc.limited = False
    try:
        return plain(model, optimizer, x, y)
    finally:
        for w, limit in limits:
            w.limit = limit
        acc.limited = True


def _resets_the_peak(model, optimizer, x, y):
    acc = getattr(accounting._local, "shared", None)
    if acc is None:  # the grader's first, unbudgeted call
        return micro(model, optimizer, x, y)
    loss = _lifts_the_limit(model, optimizer, x, y)  # over the budget, then hide the peak
    for w in acc.windows:
        w.peak = acc.current
    acc.peak = acc.current
    return loss


@pytest.mark.parametrize(
    ("step", "seen"),
    [(_lifts_the_limit, "the budget's limit was lifted"), (_resets_the_peak, "peak was reset")],
)
def test_a_step_that_edits_the_accountant_is_refused(task, step, seen):
    fb = grade(step, task).feedback
    assert not fb.passed and "changed the grader's memory count" in fb.report(), fb.report()
    assert seen in fb.report()


def test_an_untouched_step_is_not_an_attempt(task):
    reset_attempts()

    def train_step(model, optimizer, tokens, labels): ...  # TODO

    untouched = grade(train_step, task).feedback
    assert not untouched.passed and not untouched.answered and untouched.attempt == 0
    assert "Not answered yet" in repr(untouched)
    assert grade(plain, task).feedback.attempt == 1
    reset_attempts()


def test_notebook_07_grades_each_exercise_under_its_own_name(task):
    """Issue 25: a demo and the learner's "your turn" step shared one attempt key, so the
    learner's first edit was attempt 3 and got the full fix. Every grade() in 07 but the task's
    own names its exercise, so each one's first wrong answer gets a hint."""
    import json
    import re
    from pathlib import Path

    nb = Path(__file__).resolve().parent.parent / "notebooks" / "06_capstone_make_it_fit.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
    calls = [m for c in cells for m in re.findall(r"grade\((\w+), (\w+)(, exercise=[^,)]+)?", c)]
    untagged = {(step, on) for step, on, named in calls if not named}
    assert untagged == {("train_step", "task")}, calls
    reset_attempts()
    assert grade(plain, task).feedback.attempt == 1  # "your turn", run as shipped
    other = grade(lambda *a: micro(*a, scale=False), task, exercise="another").feedback
    assert not other.passed and other.attempt == 1
    assert grade(plain, task).feedback.attempt == 2  # the learner's first edit: not 3
    reset_attempts()


def test_the_graders_peak_is_what_memory_measure_sees_of_the_same_steps(task):
    """07 used to check this in a cell after the solution: the grader measures the steps as a
    learner measuring them with memory.measure would, within 5% of the budget."""
    result = grade(micro, task)
    model, optimizer = task.new_run()
    with memory.measure("cpu") as mine:
        losses = [micro(model, optimizer, task.tokens, task.labels) for _ in range(task.steps)]
    del model, optimizer
    assert mine.peak_bytes <= task.budget_bytes, "measured apart from the grader, it fits"
    copies = task.tokens.nbytes + task.labels.nbytes  # the step gets its own copy of the batch
    assert abs(mine.peak_bytes + copies - result.peak_bytes) <= 0.05 * task.budget_bytes
    assert losses[-1] < losses[0], "and the loss falls"


# --- issue 31: references from private copies, what each call carried, the grader's own claims


def test_a_step_that_overwrites_the_notebooks_batch_fails_and_the_batch_is_put_back(task):
    """Issue 31 §1: a step that trains on 64 of 512 rows and copies them over the notebook's
    batch (a global) made the references, computed after it from ``task.tokens``, agree."""
    original = (task.tokens.clone(), task.labels.clone())

    def overwrite(model, optimizer, x, y):
        for i in range(1, 8):  # row by row: no big temporary under the budget
            task.tokens[64 * i : 64 * (i + 1)].copy_(task.tokens[:64])
            task.labels[64 * i : 64 * (i + 1)].copy_(task.labels[:64])
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the reference made after the call
            return micro(model, optimizer, x[:64], y[:64], k=1)

    fb = grade(overwrite, task).feedback
    assert not fb.passed
    assert "changed the notebook's tokens and labels" in fb.report()
    assert torch.equal(task.tokens, original[0]) and torch.equal(task.labels, original[1])


def _functional_plain(model, optimizer, x, y):
    """The plain step through functional ops and autograd.grad: no module hook sees it."""
    optimizer.zero_grad()
    model(x[:1])  # one forward in view, for the hooks
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    params = [p for m in linears for p in (m.weight, m.bias)]
    with torch._C._DisableTorchDispatch():
        h = x
        for i, m in enumerate(linears):
            h = nn.functional.linear(h, m.weight, m.bias)
            h = h if i == len(linears) - 1 else torch.relu(h)
        loss = nn.functional.cross_entropy(h, y)
        grads = torch.autograd.grad(loss, params)
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    optimizer.step()
    return loss.item()


def test_a_functional_step_with_dispatch_disabled_is_refused(task):
    """Issue 31 §2: functional ops plus autograd.grad under _DisableTorchDispatch hid from the
    hooks and the accountant; the CPU allocator's events see it."""
    fb = grade(_functional_plain, task).feedback
    assert not fb.passed
    assert "the CPU allocator saw" in fb.report()


def test_a_functional_step_in_a_thread_is_refused(task):
    def threaded(model, optimizer, x, y):
        box = {}
        worker = threading.Thread(
            target=lambda: box.update(loss=_functional_plain(model, optimizer, x, y))
        )
        worker.start()
        worker.join()
        return box["loss"]

    fb = grade(threaded, task).feedback
    assert not fb.passed
    assert "thread(s) started during the step" in fb.report()


def test_a_step_that_fits_but_computes_the_wrong_thing_gets_a_hint_about_that(task):
    """Issue 31 §2: a step dividing by k + 1 fit, and was told to use more micro-batches."""
    fb = grade(lambda m, o, x, y: micro(m, o, x, y, k=4, scale=True) * 4 / 5, task).feedback
    fb2 = grade(lambda *a: _k_plus_one(*a), task).feedback
    for f in (fb, fb2):
        assert not f.passed
        assert all("micro-batches (twice" not in h for h in f.hints + f.fixes), f.hints
    assert "does not compute what the plain step computes" in fb2.hints[0]


def _k_plus_one(model, optimizer, x, y, k=4):
    optimizer.zero_grad()
    total = 0.0
    for xc, yc in zip(x.chunk(k), y.chunk(k), strict=True):
        loss = nn.functional.cross_entropy(model(xc), yc) / (k + 1)
        loss.backward()
        total += loss.item()
    optimizer.step()
    return total


def test_the_gradients_problem_is_said_once(task):
    fb = grade(_k_plus_one, task).feedback
    assert sum("your gradients" in p for p in fb.problems) == 1, fb.problems


def test_one_backward_over_micro_batches_is_refused_even_when_it_fits(task):
    """Issue 31 §2, 06 exercise 3: one graph over 8 micro-batches, one backward, checkpointed."""

    def one_backward(model, optimizer, x, y, k=8):
        optimizer.zero_grad()
        total = 0.0
        for xc, yc in zip(x.chunk(k), y.chunk(k), strict=True):
            total = (
                total
                + nn.functional.cross_entropy(checkpoint(model, xc, use_reentrant=False), yc) / k
            )
        total.backward()
        optimizer.step()
        return total.item()

    fb = grade(one_backward, task).feedback
    assert not fb.passed
    assert "keeps all their graphs alive at once" in fb.briefs[0]


def test_fp32_gradients_are_asked_of_every_call(task):
    """Issue 31 §2, 06 exercise 2: fp32 in the first, unbudgeted call, bf16 under the budget."""
    calls = []

    def sneaky(model, optimizer, x, y):
        calls.append(1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=len(calls) > 1):
            return micro(model, optimizer, x, y)

    fb = grade(sneaky, task, fp32_gradients=True).feedback
    assert not fb.passed
    assert "in step 1 your sneaky ran its forward under autocast" in fb.report()


def test_calling_the_worked_solution_is_not_an_answer(task):
    """Issue 31 §2: `return solution_step(...)` passed 06's task."""

    def lazy(model, optimizer, x, y):
        capstone.solution_step(model, optimizer, x, y)
        return micro(model, optimizer, x, y)

    # the MLP has no embed/encoder/head, so solution_step raises: count the call all the same
    fb = grade(lazy, task).feedback
    assert not fb.passed
    before = capstone._solution_calls
    with pytest.raises(ValueError):
        capstone.solution_step(task.make_model(), None, task.tokens, task.labels)
    assert capstone._solution_calls == before + 1


def test_a_loss_that_stops_the_check_is_the_answers_doing(task):
    """Issue 31 §2: a `_Stop(Feedback(...))` raised from a returned number's __float__ passed."""
    from tutorial_utils.exercises import Feedback, _Stop

    class Stops(float):
        def __float__(self):
            raise _Stop(Feedback("a passing verdict"))

    fb = grade(lambda *a: Stops(micro(*a)), task).feedback
    assert not fb.passed and "_Stop" in fb.report(), fb.report()
