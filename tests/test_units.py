"""Sizes read and written in one place: what format_bytes prints, parse_bytes reads back."""

from __future__ import annotations

import math

import pytest

from tutorial_utils.units import format_bytes, parse_bytes


@pytest.mark.parametrize("nbytes", [0, 1, 1023, 1024, 3 * 2**20, 2**40 + 2**39, 2**50, 7 * 2**50])
def test_what_format_bytes_prints_parse_bytes_reads_back(nbytes):
    text = format_bytes(nbytes, precision=6)
    assert math.isclose(parse_bytes(text), nbytes, rel_tol=1e-6)


def test_units():
    assert format_bytes(None) == "n/a"
    assert format_bytes(-3 * 2**20) == "-3.00 MiB"
    assert format_bytes(5 * 2**60) == "5120.00 PiB"  # nothing above PiB
    assert parse_bytes("1.5 GiB") == 3 * 2**29
    assert parse_bytes("2 PB") == 2 * 10**15
    assert parse_bytes("512m") == 512 * 2**20
    assert parse_bytes("1_024") == 1024
    with pytest.raises(ValueError, match="cannot be negative"):  # issue 37: it was -5 MiB
        parse_bytes("-5 MiB")


@pytest.mark.parametrize("bad", [True, float("nan"), float("inf"), "abc", None, "1 XiB", "", [1]])
def test_bad_sizes_are_one_sentence(bad):
    with pytest.raises(ValueError) as info:
        parse_bytes(bad)
    message = str(info.value)
    assert "\n" not in message and repr(bad) in message  # one line that names what was given


@pytest.mark.parametrize("bad", [True, float("nan"), float("inf")])
def test_a_budget_of_true_nan_or_infinity_is_one_sentence(bad):
    from tutorial_utils import memory

    with pytest.raises(ValueError, match="a size must be"):
        with memory.budget(bad):
            pass


@pytest.mark.parametrize("bad", [(-1, 3), (1.5, 3), (True, 2), ("a",), None, 8])
def test_spec_refuses_a_shape_that_is_not_whole_numbers(bad):
    from tutorial_utils import memory

    with pytest.raises(ValueError, match="a shape is a tuple of whole numbers"):
        memory.spec(bad)
    assert memory.spec((8, 0)).shape == (8, 0)  # an empty batch is a shape too


# --- issue 25 §8 ---------------------------------------------------------------------------


def test_format_bytes_of_nan_text_or_infinity_is_an_answer_or_one_sentence():
    assert format_bytes(float("nan")) == "n/a"  # unknown, as None
    assert format_bytes(float("inf")) == "inf B" and format_bytes(-float("inf")) == "-inf B"
    for bad in ("5", [5], True):
        with pytest.raises(TypeError, match="format_bytes needs a number of bytes") as info:
            format_bytes(bad)
        assert "\n" not in str(info.value)
    assert "parse_bytes" in str(info.value)


@pytest.mark.parametrize("huge", ["1e308 PiB", "2e18", 1e300, "1025 PiB"])
def test_a_size_too_large_for_any_machine_is_one_sentence(huge):
    from tutorial_utils import memory

    with pytest.raises(ValueError, match="too large a size") as info:
        parse_bytes(huge)
    assert "\n" not in str(info.value) and repr(huge) in str(info.value)
    with pytest.raises(ValueError, match="too large a size"):
        with memory.budget(huge):
            pass
