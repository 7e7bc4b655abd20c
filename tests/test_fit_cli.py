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
        (["llama-2-7b", "--no-double-quant"], "give --lora RANK --qlora --qlora-library bitsa"),
        (
            ["llama-2-7b", "--lora", "8", "--qlora", "--no-double-quant"],
            "--no-double-quant is bitsandbytes' NF4 without double quantization (torchao's",
        ),
        (["llama-2-7b", "--qlora-library", "bitsandbytes"], "whose NF4 holds the base: give --q"),
        (["llama-2-7b", "--lora", "8", "--qlora", "--qlora-library", "bnb"], "invalid choice"),
        (["llama-2-7b", "--lora-dropout", "0.05"], "on LoRA's adapters: give --lora RANK too"),
        (["llama-2-7b", "--lora", "8", "--lora-dropout", "1"], "a probability from 0 to below 1"),
        (["llama-2-7b", "--lora", "8", "--lora-dropout", "x"], "a probability from 0 to below 1"),
        (["llama-2-7b", "--pp-microbatches", "8"], "feeds a pipeline: give --pp 2 or more too"),
        (
            ["llama-2-7b", "--logits-kept", "--tp", "2", "--gpus", "2"],
            "--logits-kept is modelled for one GPU, DDP and FSDP: leave out --tp, --pp and --cp",
        ),
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


#: litgpt 8641822's finetune/lora.py under --quantize bnb.nf4, as tests/test_fit_published.py
#: holds it to litgpt's README (micro-batch 1 of 128, 512 tokens), on the command line.
LITGPT_QLORA = ["llama-2-7b", "--precision", "pure-bf16", "--optimizer", "paged-adamw"]
LITGPT_QLORA += ["--lora", "8", "--lora-targets", "qv", "--lora-dropout", "0.05", "--qlora"]
LITGPT_QLORA += ["--qlora-library", "bitsandbytes", "--no-double-quant", "--logits-kept"]
LITGPT_QLORA += ["--block", "litgpt", "--grad-accumulation", "128", "--seq", "512"]
LITGPT_KNOBS = dict(
    lora_rank=8,
    lora_targets="qv",
    lora_dropout=0.05,
    lora_base="bnb-nf4",
    nf4_double_quant=False,
    logits_kept=True,
    block="litgpt",
    grad_accumulation=128,
    optimizer="paged-adamw",
    precision="pure-bf16",
)


def test_each_new_flag_reaches_the_calculator_as_its_knob(capsys, monkeypatch):
    """--logits-kept, --qlora-library, --no-double-quant, --lora-dropout and --pp-microbatches
    arrive at ``will_it_fit`` as the knobs tests/test_fit_published.py sets for litgpt's rows
    (what they do to the bytes: tests/test_fit_qlora.py); left out, each is its default."""
    from tutorial_utils.fit import peak

    asked = []

    def record(preset, **knobs):
        asked.append(knobs)
        raise ValueError("recorded")  # stop before any work: what arrived is the test

    monkeypatch.setattr(peak, "will_it_fit", record)
    assert fit_cli.main(LITGPT_QLORA) == 2 and capsys.readouterr().err == "fit: recorded\n"
    assert {k: asked[0][k] for k in LITGPT_KNOBS} == LITGPT_KNOBS
    assert fit_cli.main(["llama-2-7b", "--lora", "8", "--qlora"]) == 2
    assert (asked[1]["lora_base"], asked[1]["nf4_double_quant"]) == ("nf4", True)
    assert (asked[1]["lora_dropout"], asked[1]["logits_kept"]) == (0.0, False)
    assert asked[1]["pp_microbatches"] == 0  # as many as stages
    assert fit_cli.main(["llama-2-7b", "--pp", "4", "--gpus", "4", "--pp-microbatches", "8"]) == 2
    assert (asked[2]["pp"], asked[2]["pp_microbatches"]) == (4, 8)


def test_a_combination_the_calculator_refuses_is_one_sentence(capsys):
    """What ``will_it_fit`` itself refuses (here litgpt's block on GPT-2's LayerNorm and GELU)
    comes out as its one sentence, exit status 2, no traceback."""
    assert fit_cli.main(["gpt2", "--block", "litgpt"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("fit: block='litgpt' re-creates litgpt 8641822's Llama block")


@pytest.mark.heavy  # bitsandbytes' NF4 base has no formula: the fake-tensor pass runs
def test_litgpt_s_qlora_recipe_on_the_command_line_is_the_published_row_s_answer(capsys):
    """The flags print the report ``will_it_fit`` gives for the same knobs, and the two new
    switches each move it: the kept graph adds to the peak, NF4 without double quantization
    adds to the weights."""
    from tutorial_utils.fit import will_it_fit

    assert fit_cli.main(LITGPT_QLORA) == 0
    both = capsys.readouterr().out
    report = will_it_fit("llama-2-7b", 1, 512, **LITGPT_KNOBS)
    assert repr(report) in both, (both, repr(report))
    assert fit_cli.main([a for a in LITGPT_QLORA if a != "--logits-kept"]) == 0
    no_graph = will_it_fit("llama-2-7b", 1, 512, **(LITGPT_KNOBS | {"logits_kept": False}))
    assert repr(no_graph) in capsys.readouterr().out
    assert no_graph.peak_bytes < report.peak_bytes
    with_dq = will_it_fit("llama-2-7b", 1, 512, **(LITGPT_KNOBS | {"nf4_double_quant": True}))
    assert with_dq.model_states["weights"] < report.model_states["weights"]


def test_the_readme_s_calculator_section_names_every_option():
    """README's "Will it fit?" section lists the calculator's knobs: each option of the parser
    is named there, so a flag added to the CLI and left out of the README fails here."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = readme.index("## Will it fit?")
    section = readme[start : readme.index("\n## ", start)]
    unnamed = [
        action.option_strings[-1]
        for action in fit_cli.parser()._actions
        if action.option_strings
        and not any(re.search(re.escape(o) + r"(?![\w-])", section) for o in action.option_strings)
    ]
    assert not unnamed, f"README's calculator section does not name {unnamed}"
