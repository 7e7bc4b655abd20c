"""The checkers of notebook 03: right answers pass, typical mistakes fail with the reason."""

from __future__ import annotations

import torch

from tutorial_utils import formulas
from tutorial_utils.decoder import DecoderConfig
from tutorial_utils.exercises import predict as ex
from tutorial_utils.exercises import reset_attempts

LLAMA_LIKE = DecoderConfig(
    vocab=500,
    d_model=64,
    n_layers=2,
    n_heads=8,
    n_kv_heads=2,
    d_ff=160,
    norm="rms",
    mlp="swiglu",
    bias=False,
    tied=False,
    max_positions=0,
)


def test_parameter_count_right_and_wrong():
    truth = formulas.decoder_parameters(LLAMA_LIKE)
    ex.check_parameter_count(LLAMA_LIKE, truth).assert_passed()
    assert "output head" in ex.check_parameter_count(LLAMA_LIKE, truth - 500 * 64).report()
    assert "third matrix" in ex.check_parameter_count(LLAMA_LIKE, truth - 2 * 64 * 160).report()
    assert not ex.check_parameter_count(LLAMA_LIKE, truth + 1).passed
    assert not ex.check_parameter_count(LLAMA_LIKE, 0).answered


def test_activation_bytes_right_and_wrong():
    cfg = DecoderConfig(d_model=48, n_heads=6)
    truth = formulas.block_activation_bytes(cfg, 3, 20)
    ex.check_activation_bytes(cfg, 3, 20, truth).assert_passed()
    assert "4 bytes per element" in ex.check_activation_bytes(cfg, 3, 20, truth // 2).report()
    assert "elements, not bytes" in ex.check_activation_bytes(cfg, 3, 20, truth // 4).report()


def test_saved_bytes_counter_catches_double_counted_views():
    def per_tensor(module, x):  # the colleague's bug: every saved view counted again
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(x)
        return total

    assert not ex.check_saved_bytes(per_tensor).passed
    ex.check_saved_bytes(ex.saved_bytes).assert_passed()
    ex._check_formula_is_exact()


def test_saved_bytes_first_response_to_the_shipped_counter_gives_no_answer():
    """03 exercise 3 is saved with its first response showing (issue 20 §6): a hint that makes
    the learner look, not the fix (until then it said "count each storage once")."""

    def shipped(module, x):  # the exercise cell as it ships
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(x)
        return total

    reset_attempts()  # as in a fresh notebook: this is the first attempt
    first = repr(ex.check_saved_bytes(shipped))
    assert "Hint:" in first and "Fix:" not in first, first
    for answer in ("storage once", "_cdata", "weights", "view"):
        assert answer not in first, f"the first response gives {answer!r} away: {first}"
