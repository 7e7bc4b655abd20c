import pytest

from tutorial_utils.exercises import ExerciseNotPassed, start


def test_tensor_bytes():
    assert start.check_tensor_bytes(1000 * 3 * 224 * 224 * 2).passed
    wrong = start.check_tensor_bytes(1000 * 3 * 224 * 224)
    assert not wrong and "2 bytes" in str(wrong)
    assert "float32" in str(start.check_tensor_bytes(1000 * 3 * 224 * 224 * 4))
    assert "whole number" in str(start.check_tensor_bytes(...))
    with pytest.raises(ExerciseNotPassed, match="Not yet"):
        start.check_tensor_bytes(12).assert_passed()


def test_matmul_peak():
    assert start.check_matmul_peak(917504).passed
    assert "only the output" in str(start.check_matmul_peak(512 * 128 * 4))
    assert "only the inputs" in str(start.check_matmul_peak(512 * 256 * 4 + 256 * 128 * 4))
    assert not start.check_matmul_peak(True)
    html = start.check_matmul_peak(1)._repr_html_()
    assert "Not yet" in html
