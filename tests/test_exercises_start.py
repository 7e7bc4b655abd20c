import pytest

from tutorial_utils.exercises import ExerciseNotPassed, reset_attempts, start


def test_tensor_bytes():
    assert start.check_tensor_bytes(1000 * 3 * 224 * 224 * 2).passed
    wrong = start.check_tensor_bytes(1000 * 3 * 224 * 224)
    assert not wrong and "2 bytes" in str(wrong)
    assert "float32" in str(start.check_tensor_bytes(1000 * 3 * 224 * 224 * 4))
    assert "whole number" in str(start.check_tensor_bytes(2.5))
    untouched = start.check_tensor_bytes(...)  # the exercise cell as shipped: not an answer yet
    assert not untouched and not untouched.answered and "Not answered yet" in str(untouched)
    with pytest.raises(ExerciseNotPassed, match="Not yet"):
        start.check_tensor_bytes(12).assert_passed()


def test_matmul_peak():
    assert start.check_matmul_peak(917504).passed
    assert "only the output" in str(start.check_matmul_peak(512 * 128 * 4))
    assert "only the inputs" in str(start.check_matmul_peak(512 * 256 * 4 + 256 * 128 * 4))
    assert not start.check_matmul_peak(True)
    html = start.check_matmul_peak(1)._repr_html_()
    assert "Not yet" in html


@pytest.mark.parametrize(
    ("check", "wrong"),
    [
        (start.check_tensor_bytes, 1000 * 3 * 224 * 224),  # elements, not bytes
        (start.check_tensor_bytes, 12),
        (start.check_matmul_peak, 512 * 128 * 4),  # only the output
        (start.check_matmul_peak, 5),
    ],
)
def test_a_second_wrong_attempt_shows_the_fix(check, wrong):
    """Issue 25: the fix was declared after the first failed requirement, so never shown."""
    reset_attempts()
    check(wrong)
    second = check(wrong)
    assert second.detailed and "Fix:" in repr(second), repr(second)
    reset_attempts()
