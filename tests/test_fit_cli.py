"""fit_cli and fit_inputs: the calculator asked the way a person asks, and every bad input in
one sentence, before torch is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutorial_utils import fit_cli, fit_inputs

PERSON = ["llama-3-8b", "--precision", "bf16", "--optimizer", "adam", "--seq", "4096"]
PERSON += ["--batch", "4", "--gpu", "80GB"]


def _run(capsys, *args: str) -> subprocess.CompletedProcess:
    """``fit ARGS`` answered in this process (the ``-m`` entry point has its own tests below,
    each a fresh Python): the exit code and what it printed."""
    capsys.readouterr()
    code = fit_cli.main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["fit", *args], code, out, err)


def _imports_torch(*args: str) -> tuple[bool, subprocess.CompletedProcess]:
    """Run ``python -m tutorial_utils fit ARGS`` in a fresh Python: whether it imported torch
    (what makes an answer slow: about 2 s on a small machine), and the finished process."""
    code = (
        "import sys\n"
        "from tutorial_utils.__main__ import main\n"
        "try:\n    code = main(['fit', *sys.argv[1:]])\nexcept SystemExit as exit:\n"
        "    code = exit.code\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
        "sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )
    *lines, imported = done.stderr.splitlines()
    done.stderr = "\n".join(lines) + ("\n" if lines else "")
    return imported == "True", done


def test_help_describes_every_option_and_comes_before_torch():
    # issue 37: this asserted --help < 0.5 s (a wall clock; benchmarks/response_times.py times
    # it); what keeps it quick is that it imports no torch
    parser = fit_cli.parser()
    for action in parser._actions:
        assert action.help, f"{action.option_strings or action.dest} has no line in --help"
    imported, done = _imports_torch("--help")
    assert not imported, "--help imported torch"
    for option in ("--batch", "--seq", "--precision", "--optimizer", "--checkpointing"):
        assert option in done.stdout
    for option in ("--sharding", "--gpus", "--gpu ", "--gpu-memory", "--no-headroom"):
        assert option in done.stdout
    assert "RTX 4090" in done.stdout and "L40S" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["llama-9b"], "model 'llama-9b' is unknown: did you mean 'llama-8b'? choose one of"),
        (["gpt2", "--precision", "fp8"], "precision 'fp8' is unknown"),
        (["gpt2", "--batch", "-3"], "batch must be a whole number from 1"),
        (["gpt2", "--batch", "2.5"], "batch must be a whole number such as 4"),
        (["gpt2", "--gpus", "0"], "--gpus must be a whole number from 1"),
        (["gpt2", "--gpu", "GTX 9090"], "GPU 'GTX 9090' is unknown: did you mean 'RTX 4090'?"),
        (["gpt2", "--gpu-memory", "lots"], "cannot read 'lots' as a memory size"),
        (["gpt2", "--sharding", "zero3"], "zero3 shards over several GPUs and does nothing on one"),
        (["gpt2", "--gpu", "H100", "--gpu-memory", "24GB"], "not allowed with argument"),
        (["gpt2", "--colour", "red"], "unrecognized arguments: --colour red"),
        (["gpt2", "--seq", "4096"], "gpt2-124m has 1024 learned positions; give --seq 1024"),
    ],
)
def test_argument_errors_are_one_sentence_without_torch(args, message, capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    before = set(sys.modules)
    assert fit_cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("fit: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err
    assert "torch" not in set(sys.modules) - before


def test_an_argument_error_answers_before_importing_torch():
    # issue 37: this asserted < 2.0 s in a fresh Python (benchmarks/response_times.py times it)
    imported, done = _imports_torch("llama-9b")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "model 'llama-9b' is unknown" in done.stderr
    assert not imported, "an argument error imported torch first"


@pytest.mark.parametrize(
    "args",
    [
        ("llama-3.1-8b",),
        ("mistral-7b",),
        ("qwen2.5-7b", "--batch", "2", "--seq", "4096"),
        ("llama-3.1-70b", "--tp", "8", "--gpus", "64"),
        ("llama-3.1-8b", "--sharding", "fsdp2", "--gpus", "8", "--gpu", "H100"),
        ("llama-3.1-8b", "--precision", "mixed", "--lora", "16"),
        ("llama-3.1-8b", "--gpu", "H100"),  # README: its advice tries LoRA and checkpointing
        ("llama-3.1-8b", "--lora", "16"),  # LoRA under autocast
        ("llama-3.2-1b", "--batch", "8", "--seq", "4096", "--gpu", "RTX 4090"),  # the advice
        ("gpt2", "--batch", "16", "--checkpointing", "full"),  # a tied head, recomputed
        ("gpt2", "--ce-chunks", "8"),  # cross-entropy in 8 equal pieces
        ("llama-3.1-8b", "--lora", "16", "--qlora"),  # QLoRA: an NF4 base
        ("llama-3.2-1b", "--precision", "fp32"),
    ],
)
def test_a_typical_question_answers_without_importing_torch(args):
    """Questions with an activation formula (fit.activation_formulas, checked against the
    fake-tensor pass in tests/test_fit_activation_terms.py) answer with no torch in a fresh
    Python, which is what keeps a call well under a second of CPU (benchmarks/fit_times.py
    times it), and so does the advice, which tries every checkpointing policy, LoRA and bf16
    weights. A case with no formula imports torch for it:
    test_a_question_with_no_formula_still_answers."""
    imported, done = _imports_torch(*args)
    assert done.returncode in (0, 1), done.stderr  # 1: it does not fit
    assert "GiB" in done.stdout and ("fits" in done.stdout or "peak" in done.stdout), done.stdout
    assert not imported, f"fit {' '.join(args)} imported torch"


@pytest.mark.heavy  # a child Python that imports torch
def test_a_question_with_no_formula_still_answers_on_fake_tensors():
    """Cross-entropy in pieces of unequal length (252 tokens in 8 pieces of 32, the last of
    28) has no formula: the pass runs, torch is imported, and the answer comes all the same."""
    imported, done = _imports_torch("gpt2", "--seq", "252", "--ce-chunks", "8")
    assert done.returncode in (0, 1), done.stderr
    assert imported and "GiB" in done.stdout


@pytest.mark.heavy
def test_the_persons_question_gets_a_verdict_and_the_change_that_helps(capsys):
    done = _run(capsys, *PERSON)
    assert done.returncode == 1, done.stderr  # 1: it does not fit
    out = done.stdout
    assert out.startswith("Read as: llama-8b, fp32 states, bf16 autocast")
    assert "does not fit on one 80GB GPU: needs " in out and "+ headroom" in out
    assert "Model states alone are 119.66 GiB per GPU: no batch or checkpointing change" in out
    assert "zero3 on 4 GPUs or more and full checkpointing" in out
    assert "CUDA context: ml-engineering" in out


def test_the_learned_positions_the_command_line_knows_are_the_presets():
    from tutorial_utils.decoder import PRESETS

    learned = {name: cfg.max_positions for name, cfg in PRESETS.items() if cfg.max_positions}
    assert fit_inputs.LEARNED_POSITIONS == learned


def test_gpu_memory_takes_a_size(capsys):
    done = _run(capsys, "gpt2", "--seq", "512", "--gpu-memory", "80GiB")
    assert done.returncode == 0, done.stderr
    assert "fits on one 80GiB GPU: needs" in done.stdout


def test_no_headroom_gives_the_raw_peak(capsys):
    done = _run(capsys, "gpt2", "--seq", "512", "--gpu", "RTX 4090", "--no-headroom")
    assert done.returncode == 0, done.stderr
    assert "no headroom kept" in done.stdout and "CUDA context" not in done.stdout


@pytest.mark.parametrize(
    "typed, preset",
    [
        ("llama-3-8b", "llama-8b"),
        ("Llama-3.1-8B", "llama-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-8b"),
        ("gpt2", "gpt2-124m"),
        ("gpt2-xl", "gpt2-1.5b"),
        ("GPT2-XL", "gpt2-1.5b"),
    ],
)
def test_model_names_people_type(typed, preset):
    assert fit_inputs.model(typed) == preset


@pytest.mark.parametrize(
    "typed, read",
    [
        ("bf16", "autocast-bf16"),
        ("fp16", "autocast-fp16"),
        ("fp32", "fp32"),
        ("mixed", "bf16-master"),
        ("pure-bf16", "pure-bf16"),
        ("adam", "adamw"),
        ("AdamW", "adamw"),
        ("sgd", "sgd"),
        ("selective", "every-second-matmul"),
        ("fsdp", "zero3"),
    ],
)
def test_recipe_optimizer_and_policy_names(typed, read):
    readers = (fit_inputs.recipe, fit_inputs.optimizer, fit_inputs.checkpointing)
    found = set()
    for reader in (*readers, fit_inputs.sharding):
        try:
            found.add(reader(typed))
        except ValueError:
            pass
    assert found == {read}


@pytest.mark.parametrize(
    "typed, nbytes",
    [
        ("24GB", 24 * 10**9),
        ("24 GB", 24 * 10**9),
        ("80GiB", 80 * 2**30),
        ("RTX 3090", 24576 * 2**20),  # nvidia-smi reports it
        ("nvidia rtx 4090", 24564 * 2**20),
        ("L4", 23034 * 2**20),  # nvidia-smi's total for an L4
        ("A10G", 24 * 10**9),
        ("RTX A6000", 48 * 10**9),
        ("L40S", 48 * 10**9),
        ("a100-40gb", 40 * 10**9),
        ("H100", 81559 * 2**20),  # nvidia-smi's total for an H100 80GB HBM3
    ],
)
def test_a_gpu_is_a_card_or_a_size(typed, nbytes):
    assert fit_inputs.gpu(typed).memory_bytes == nbytes


# Free text with a character no name and no size has, and near-misses people type
BAD_TEXT = st.one_of(
    st.text(max_size=12).map(lambda t: t + "#"),
    st.sampled_from(["fp8", "llama-9b", "lion", "zero4", "-1GB", "nan GB", "1e999GB", "GB", ""]),
)
NOT_TEXT = st.one_of(st.none(), st.integers(), st.floats(), st.booleans(), st.lists(st.text()))


@given(BAD_TEXT)
def test_any_unknown_name_gets_one_sentence_that_lists_the_choices(text):
    for reader in (
        fit_inputs.model,
        fit_inputs.recipe,
        fit_inputs.optimizer,
        fit_inputs.checkpointing,
        fit_inputs.sharding,
        fit_inputs.gpu,
    ):
        try:
            reader(text)
        except ValueError as err:
            assert "\n" not in str(err) and (
                "choose one of" in str(err) or "give" in str(err) or "write it like" in str(err)
            )
        else:
            raise AssertionError(f"{reader.__name__} accepted {text!r}")


@given(NOT_TEXT)
def test_a_name_that_is_not_text_is_a_type_error_in_one_sentence(value):
    for reader in (fit_inputs.model, fit_inputs.recipe, fit_inputs.optimizer):
        with pytest.raises(TypeError, match="must be text such as"):
            reader(value)


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=2**31 + 1)))
def test_counts_out_of_range_say_the_range(value):
    with pytest.raises(ValueError, match="must be a whole number from 1 to"):
        fit_inputs.positive_int("batch", value)


@given(st.one_of(st.floats(), st.text(), st.booleans(), st.none()))
def test_counts_that_are_not_whole_numbers_say_so(value):
    with pytest.raises(TypeError, match="batch must be a whole number such as 4"):
        fit_inputs.positive_int("batch", value)


@given(
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not 2**20 <= x * 1e9 <= 2**50)
)
def test_sizes_that_are_no_gpu_are_refused(gb):
    with pytest.raises((ValueError, TypeError)):
        fit_inputs.parse_size(f"{gb}GB")


@pytest.mark.parametrize(
    "args",
    [
        ["mistral-7b"],
        ["qwen2.5-7b"],
        ["llama-3.1-8b", "--lora", "16"],
        ["llama-3.1-8b", "--optimizer", "adamw8bit"],
        ["llama-3.1-70b", "--tp", "8", "--gpus", "64"],
        [
            "llama-3.1-8b",
            "--optimizer-impl",
            "fused",
            "--grad-accumulation",
            "4",
            "--ce-chunks",
            "8",
        ],
        ["llama-3.1-70b", "--sharding", "fsdp1", "--gpus", "8", "--cpu-offload"],
        ["gemma-2b", "--lora", "8", "--qlora", "--gpu", "T4"],
    ],
    ids=" ".join,
)
def test_the_issue_s_questions_each_answer_with_a_number_and_a_verdict(args, capsys):
    """Issue 39's done-when: each of these answers, with a number and a verdict."""
    assert fit_cli.main([*args, "--seq", "1024"]) in (0, 1)
    out = capsys.readouterr().out
    assert "GiB" in out and ("fits on" in out or "does not fit" in out), out
    assert "eager mode" in out  # the answer says what it models


def test_gradient_sync_last_asks_for_fsdp1_s_no_sync(capsys):
    """``--gradient-sync last`` reaches the calculator: over FSDP1 with accumulation the answer
    says so (its bytes: ``tests/test_fit_profiles.py``); a profile that does not model it is
    refused in one sentence."""
    base = ["gemma-2b", "--sharding", "fsdp1", "--gpus", "4", "--grad-accumulation", "4"]
    assert fit_cli.main([*base, "--gpu", "80GB"]) == 0
    every = capsys.readouterr().out
    assert fit_cli.main([*base, "--gpu", "80GB", "--gradient-sync", "last"]) == 0
    last = capsys.readouterr().out
    assert "no_sync" in last and "no_sync" not in every
    assert fit_cli.main([*base[:2], "zero3", *base[3:], "--gradient-sync", "last"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fit: gradient_sync='last'") and err.count("\n") == 1, err
