"""The plain mistakes a learner makes: every checker refuses them (issue 31 §2).

Each entry of ``WRONG`` is one wrong answer to one checker, written the way a learner writes it
(in a notebook: its own module, here this one): a value that only looks right, a step that
trains on part of the batch, a loop that keeps every graph alive, a number typed instead of
measured. ``test_every_wrong_answer_is_refused`` runs them all; a wrong answer that passes
fails the suite. The capstone's wrong answers live in ``test_exercises_capstone.py`` (they
need its budgeted task).

The second half: Run All is not an attempt. The code every exercise cell ships (read from the
notebooks) is "Not answered yet" for any checker, and ``shipped.json`` matches the notebooks.
"""

from __future__ import annotations

import linecache
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_exercises_predict import LLAMA_LIKE
from torch import nn

from tutorial_utils import accounting, memory
from tutorial_utils.decoder import DecoderConfig
from tutorial_utils.exercises import (
    Feedback,
    _Stop,
    capstone,
    checker,
    creating,
    moving,
    oom,
    parallel,
    precision,
    predict,
    reset_attempts,
    sharding,
    shipped,
    start,
)

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_attempts():
    reset_attempts()
    yield
    reset_attempts()


# --- values that only look right --------------------------------------------------------------


class LyingInt(int):
    """An int whose ``__eq__`` says yes to everything."""

    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class StopsTheCheck(float):
    """A number whose ``__float__`` ends the check with a verdict of its own (a learner's
    ``Feedback``, not the checker's)."""

    def __float__(self):
        raise _Stop(Feedback("a passing verdict"))


class EqualToEverything(torch.Tensor):
    """A tensor subclass that answers True to ``torch.equal``."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.equal:
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


def _stops_in_buffers(features):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(features))

        def buffers(self, recurse=True):
            raise _Stop(Feedback("a passing verdict"))

        def forward(self, x):
            return x * self.weight

    return M()


# --- 00 ---------------------------------------------------------------------------------------


def _delta_bytes():
    with memory.measure("cpu") as m:
        a, b = torch.randn(512, 256), torch.randn(256, 128)
        c = a @ b
    del a, b, c
    return m.delta_bytes + 0  # everything alive at the end: end - start looks like the peak


def _typed_number():
    return 917504


# --- 01, 02 -----------------------------------------------------------------------------------


def _move_to_liars(batch, device):
    if isinstance(batch, torch.Tensor):
        return torch.zeros_like(batch).to(device).as_subclass(EqualToEverything)
    if isinstance(batch, dict):
        return {k: _move_to_liars(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_move_to_liars(v, device) for v in batch)
    return batch


def _shape_on_cpu_then_copied(t):
    return torch.tensor(t.shape).to(t.device)


class _ZerosWithoutDtype(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.register_buffer("shift", torch.linspace(0, 1, features))

    def forward(self, x):
        return x * self.weight + self.shift + torch.zeros(x.shape, device=x.device)


# --- 07, 08 -----------------------------------------------------------------------------------


def _one_full_backward_and_empty_ones(model, x, y, k):
    with model.no_sync():
        for _ in range(k - 1):
            (model(x[:0]).sum() * 0).backward()  # empty backward passes
    F.mse_loss(model(x), y).backward()


def _split_on_first_device(stage0, stage1, x, d0, d1):
    return stage1.to(d0)(stage0(x.to(d0)))


def _ddp_script_with_doubled_lr(tmp_path):
    scripts = ROOT / "notebooks" / "scripts"
    script = tmp_path / "ddp_exercise.py"
    text = (scripts / "ddp_exercise.py").read_text()
    text = text.replace("EPOCHS, BATCH, LR = 3, 8, 0.1", "EPOCHS, BATCH, LR = 3, 8, 0.2")
    text = text.replace(  # one bug fixed, the other kept and compensated
        "    for epoch in range(EPOCHS):\n",
        "    for epoch in range(EPOCHS):\n        sampler.set_epoch(epoch)\n",
    )
    for name in ("common.py", "ddp_train.py"):
        shutil.copy(scripts / name, tmp_path / name)
    script.write_text(text)
    return script


# --- 06 ---------------------------------------------------------------------------------------


def _one_backward_over_the_sum(
    model, optimizer, scaler, micro_batches, device_type, dtype, max_norm
):
    optimizer.zero_grad(set_to_none=True)
    total = 0
    for inputs, targets in micro_batches:
        with torch.autocast(device_type, dtype=dtype):
            total = total + F.cross_entropy(model(inputs), targets) / len(micro_batches)
    scaler.scale(total).backward()  # every micro-batch's graph alive at once
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total.item()


def _whole_batch_and_detached_scales(
    model, optimizer, scaler, micro_batches, device_type, dtype, max_norm
):
    optimizer.zero_grad(set_to_none=True)
    inputs = torch.cat([i for i, _ in micro_batches])
    targets = torch.cat([t for _, t in micro_batches])
    with torch.autocast(device_type, dtype=dtype):
        loss = F.cross_entropy(model(inputs), targets)
    for _ in range(len(micro_batches) - 1):
        scaler.scale(loss.detach())  # only to be counted
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _right_step_in(autocast_dtype):
    def step(model, optimizer, scaler, micro_batches, device_type, dtype, max_norm):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for inputs, targets in micro_batches:
            with torch.autocast(
                device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss = F.cross_entropy(model(inputs), targets) / len(micro_batches)
            scaler.scale(loss).backward()
            total += loss.item()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        return total

    return step


# --- 03, 09 ----------------------------------------------------------------------------------


class NoThenYes(int):
    """An int that is unequal to the first thing it is compared with, and equal to the rest (so
    it dodges a checker's first diagnostic and matches its answer)."""

    seen = 0

    def __eq__(self, other):
        NoThenYes.seen += 1
        return NoThenYes.seen > 1

    __hash__ = int.__hash__


def _counter_that_lies(module, x):
    NoThenYes.seen = 0
    return NoThenYes(1)


def _one_group_gets_everything(x, dp, tp, dp_size, tp_size):
    return x if dp == 0 else x[:0]


def _every_row_twice(x, dp, tp, dp_size, tp_size):
    rows = len(x) // dp_size
    part = x[dp * rows : (dp + 1) * rows]
    return torch.cat([part, part])


def _zero2_shards_parameters(stage, psi, n, k):
    params, grads, state = 4 * psi, 4 * psi, k * psi
    if stage >= 1:
        state /= n
    if stage >= 2:
        params /= n  # the parameters sharded instead of the gradients: the same total in fp32
    if stage >= 3:
        grads /= n
    return {"params": params, "grads": grads, "state": state}


def _zero_stops_the_check(stage, psi, n, k):
    return {"params": StopsTheCheck(1.0), "grads": 1.0, "state": 1.0}


class LyingStr(str):
    """A string equal to every other (and hashed like the right name)."""

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class LyingFloat(float):
    def __eq__(self, other):
        return True

    def __lt__(self, other):
        return False

    def __gt__(self, other):
        return False

    __hash__ = float.__hash__


def _fp16_guess_that_lies():
    return {v: LyingStr("ok") for v in precision.FP16_VALUES}


CFG = DecoderConfig(d_model=48, n_heads=6, norm="rms", mlp="swiglu", bias=False, d_ff=128)

WRONG = {
    # mechanism: only the checker's own verdict counts
    "00 tensor_bytes: a number whose __float__ stops the check": lambda: start.check_tensor_bytes(
        StopsTheCheck(1.0)
    ),
    "02 following_module: buffers() stops the check": lambda: creating.check_following_module(
        _stops_in_buffers
    ),
    "09 zero_bytes: a returned number stops the check": lambda: sharding.check_zero_bytes(
        _zero_stops_the_check
    ),
    # plain values
    "03 saved_bytes: an int whose __eq__ says yes": lambda: predict.check_saved_bytes(
        _counter_that_lies
    ),
    "00 tensor_bytes: an int whose __eq__ says yes": lambda: start.check_tensor_bytes(LyingInt(1)),
    "03 parameter_count: an int whose __eq__ says yes": lambda: predict.check_parameter_count(
        CFG, LyingInt(1)
    ),
    "01 move_batch: tensor subclasses equal to everything": lambda: moving.check_move_batch(
        _move_to_liars, CPU
    ),
    # what each call carried
    "00 matmul_peak: m.delta_bytes": lambda: start.check_matmul_peak(_delta_bytes),
    "00 matmul_peak: a typed number": lambda: start.check_matmul_peak(_typed_number),
    "02 shape_tensor: made on the CPU, then .to(t.device)": lambda: creating.check_shape_tensor(
        _shape_on_cpu_then_copied
    ),
    "02 following_module: device= without dtype=": lambda: creating.check_following_module(
        _ZerosWithoutDtype
    ),
    "07 no_sync: one full backward and k-1 empty ones": lambda: parallel.check_no_sync_step(
        _one_full_backward_and_empty_ones, k=4
    ),
    "08 split_forward: both stages on the first device": lambda: parallel.check_split_forward(
        _split_on_first_device, [CPU, CPU]
    ),
    "05 accumulated step: one backward over the summed losses": lambda: (
        precision.check_accumulated_clipped_step(_one_backward_over_the_sum)
    ),
    "05 accumulated step: whole batch, scale(loss.detach()) to be counted": lambda: (
        precision.check_accumulated_clipped_step(_whole_batch_and_detached_scales)
    ),
    "05 accumulated step: bf16 instead of the dtype given": lambda: (
        precision.check_accumulated_clipped_step(_right_step_in(torch.bfloat16))
    ),
    "05 accumulated step: no autocast": lambda: precision.check_accumulated_clipped_step(
        _right_step_in(None)
    ),
    "10 batch_for: one dp group gets the whole batch": lambda: sharding.check_batch_for(
        _one_group_gets_everything
    ),
    "10 batch_for: every row twice": lambda: sharding.check_batch_for(_every_row_twice),
    "09 zero_bytes: ZeRO-2 shards the parameters": lambda: sharding.check_zero_bytes(
        _zero2_shards_parameters
    ),
    # the analogous plain mistakes of the other checkers
    "08 bubble: a returned number stops the check": lambda: parallel.check_bubble(
        lambda p, m: StopsTheCheck(0.5)
    ),
    "08 bubble: a float whose comparisons lie": lambda: parallel.check_bubble(
        lambda p, m: LyingFloat(0.5)
    ),
    "07 sampler_padding: ints whose __eq__ says yes": lambda: parallel.check_sampler_padding(
        LyingInt(1), LyingInt(1)
    ),
    "07 allreduce_counts: ints whose __eq__ says yes": lambda: parallel.check_allreduce_counts(
        LyingInt(1), LyingInt(1)
    ),
    "04 training_state_bytes: an int whose __eq__ says yes": lambda: oom.check_training_state_bytes(
        nn.Linear(4, 4), LyingInt(1)
    ),
    "05 fp16_survival: strings equal to every fate": lambda: precision.check_fp16_survival(
        _fp16_guess_that_lies()
    ),
    "00 peak_of: a typed number": lambda: start.check_peak_of(lambda fn, device: 8 << 20),
    "06 fastest_fit: a name equal to every name": lambda: capstone.check_fastest_fit(
        LyingStr("slow"),
        {"slow": 10, "fast": 5, "big": 99},
        {"slow": 2.0, "fast": 1.0, "big": 0.5},
        50,
    ),
}


# wrong answers a checker still takes, each with the reason (an empty dict is the goal)
STILL_PASSING: dict[str, str] = {}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=STILL_PASSING[n]))
        if n in STILL_PASSING
        else n
        for n in WRONG
    ],
)
def test_every_wrong_answer_is_refused(name):
    fb = WRONG[name]()
    assert not fb.passed, f"{name} passed: {fb}"
    assert fb.answered, f"{name} was taken for the exercise's placeholder: {fb}"


def test_a_doubled_learning_rate_is_refused_before_launching(tmp_path, monkeypatch):
    """03: the second division by the world size, compensated by a doubled learning rate."""

    def no_launch(*args, **kwargs):
        raise AssertionError("the checker launched a script it should have refused first")

    monkeypatch.setattr(parallel, "launch", no_launch)
    script = _ddp_script_with_doubled_lr(tmp_path)
    fb = parallel.check_ddp_script(script, torch.zeros(3))
    assert not fb.passed and "the learning rate was changed" in fb.briefs[0], str(fb)


def test_a_foreign_verdict_is_reported_as_the_answers_doing():
    fb = sharding.check_zero_bytes(_zero_stops_the_check)
    assert "_Stop" in str(fb) and fb.title.startswith("zero_bytes(stage"), str(fb)


# --- hints that match the mistake ------------------------------------------------------------


def test_zero_bytes_visible_hint_is_not_the_method():
    fb = sharding.check_zero_bytes(lambda stage, psi, n, k: 1.0)
    shown = repr(fb)  # the first attempt: the hints, not the fix
    assert "grads /= n" not in shown and "first the optimizer state" not in shown


def test_zero_bytes_bf16_hint_only_for_that_mistake():
    def bf16_except_stage_3(stage, psi, n, k):  # bf16 widths, and stage 3 wrong another way
        if stage == 3:
            return 1.0
        return sharding._zero_parts(stage, psi, n, k, width=2)

    fb = sharding.check_zero_bytes(bf16_except_stage_3)
    assert not any("not 2" in h for h in fb.hints), fb.hints


def test_parameter_count_over_count_is_not_called_missing():
    from tutorial_utils.formulas import decoder_parameters

    cfg = LLAMA_LIKE
    h, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    over = decoder_parameters(cfg) + cfg.n_layers * 2 * h * (h - kv)  # k, v counted h wide
    fb = predict.check_parameter_count(cfg, over)
    assert not fb.passed and fb.briefs == ["one part is counted too big"], fb.briefs


# --- side effects -----------------------------------------------------------------------------


def test_checkers_leave_the_learners_rng_alone():
    def right(try_step, batch_size):
        while True:
            try:
                try_step(batch_size)
                return batch_size
            except torch.OutOfMemoryError:
                pass
            batch_size //= 2

    for run in (
        lambda: oom.check_largest_batch(right),
        lambda: predict.check_activation_bytes(CFG, 3, 20, 1),
        lambda: predict.check_saved_bytes(lambda m, x: 1),
    ):
        torch.manual_seed(123)
        expected = torch.rand(3)
        torch.manual_seed(123)
        run()
        assert torch.equal(torch.rand(3), expected)


def test_an_interrupt_inside_largest_batch_leaves_no_accountant():
    def interrupted(try_step, batch_size):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        oom.check_largest_batch(interrupted)
    assert getattr(accounting._local, "shared", None) is None
    assert not torch._C._len_torch_dispatch_stack()


@pytest.mark.parametrize("batch", ["3", 0, -1, 2.5, None])
def test_activation_bytes_bad_batch_is_one_sentence(batch):
    with pytest.raises(ValueError, match="batch must be a whole number"):
        predict.check_activation_bytes(CFG, batch, 20, 1)


# --- Run All is not an attempt ----------------------------------------------------------------


def test_shipped_json_matches_the_notebooks():
    import json

    assert json.loads(shipped.SHIPPED_FILE.read_text()) == shipped.derive(ROOT / "notebooks"), (
        "run python tools/shipped_exercises.py after changing an exercise cell"
    )


@checker
def _always_wrong(answer) -> Feedback:
    fb = Feedback("any exercise")
    fb.fail("wrong")
    return fb


def _definitions(source: str, filename: str) -> dict:
    """Run a cell's ``def`` and ``class`` statements as IPython does (its source kept in
    linecache, so ``inspect.getsource`` reads it)."""
    import ast

    lines = [
        line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip()[:1] in ("%", "!") else line
        for line in source.splitlines()
    ]
    tree = ast.parse("\n".join(lines))
    kept = (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    tree.body = [n for n in tree.body if isinstance(n, kept)]
    code = ast.unparse(tree)
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace = {"__name__": "__main__", "torch": torch, "nn": nn, "F": F}
    exec(compile(code, filename, "exec"), namespace)
    return {
        k: v
        for k, v in namespace.items()
        if callable(v) and getattr(v, "__module__", "") == "__main__"
    }


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:3])
def test_every_exercise_cell_as_shipped_is_not_answered_yet(notebook):
    for i, source in enumerate(shipped.exercise_cells(notebook)):
        defined = _definitions(source, f"<{notebook.name} exercise {i}>")
        for name, value in defined.items():
            fb = _always_wrong(value)
            assert not fb.answered and "Not answered yet" in repr(fb), (notebook.name, name)
            assert fb.attempt == 0


def test_a_changed_exercise_is_an_answer():
    source = "def move(batch, device):\n    return batch.to(device)  # changed\n"
    (move,) = _definitions(source, "<changed>").values()
    fb = _always_wrong(move)
    assert fb.answered and fb.attempt == 1
