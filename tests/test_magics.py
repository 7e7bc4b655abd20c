"""The %%peak cell magic: exact peak and delta of a cell through tutorial_utils.memory.measure."""

from __future__ import annotations

import gc

import pytest
from IPython.core.interactiveshell import InteractiveShell

from tutorial_utils import magics


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_cell("%load_ext tutorial_utils", store_history=False).raise_error()
    ip.run_cell("import torch", store_history=False).raise_error()
    yield ip
    # Free what the cells made: later tests (memory.budget) count every live CPU tensor.
    ip.reset(new_session=False)
    InteractiveShell.clear_instance()
    gc.collect()


def test_peak_and_delta_are_exact(shell, capsys):
    result = shell.run_cell(
        "%%peak\n"
        "x = torch.empty(1024, 1024)        # 4 MiB, kept\n"
        "tmp = torch.empty(2, 1024, 1024)   # 8 MiB, freed below\n"
        "del tmp\n"
    )
    result.raise_error()
    assert capsys.readouterr().out == "peak +12.00 MiB, delta +4.00 MiB (cpu, exact)\n"
    assert tuple(shell.user_ns["x"].shape) == (1024, 1024)  # the cell ran in the user's namespace


def test_docstring_example(shell, capsys):
    shell.run_cell(
        "%%peak\n"
        "a = torch.randn(1024, 1024)      # 4 MiB, kept\n"
        "b = (a @ a).sum()                # a 4 MiB temporary, freed\n"
    ).raise_error()
    assert capsys.readouterr().out == "peak +8.00 MiB, delta +4.00 MiB (cpu, exact)\n"


def test_last_expression_is_returned(shell, capsys):
    result = shell.run_cell("%%peak\nz = torch.zeros(256)\nz.numel()\n")
    result.raise_error()
    assert result.result == 256
    assert "delta +1.00 KiB" in capsys.readouterr().out


def test_freed_memory_shows_a_negative_delta(shell, capsys):
    shell.run_cell("big = torch.empty(1024, 1024)").raise_error()
    shell.run_cell("%%peak\ndel big\n").raise_error()
    assert capsys.readouterr().out == "peak +0 B, delta -4.00 MiB (cpu, exact)\n"


def test_error_in_the_cell_is_raised_after_the_measurement(shell, capsys):
    result = shell.run_cell("%%peak\nw = torch.empty(1024, 1024)\nraise KeyError('boom')\n")
    assert isinstance(result.error_in_exec, KeyError)
    assert (
        "until the error: peak +4.00 MiB, delta +4.00 MiB (cpu, exact)" in capsys.readouterr().out
    )


def test_magics_inside_the_cell_still_work(shell, capsys):
    shell.run_cell("%%peak\n%time q = torch.ones(128)\n").raise_error()
    assert "delta +512 B" in capsys.readouterr().out


def test_format_measurement_reads_a_measurement():
    from tutorial_utils import memory

    with memory.measure("cpu") as m:
        keep = __import__("torch").empty(256, 1024)
    assert magics.format_measurement(m) == "peak +1.00 MiB, delta +1.00 MiB (cpu, exact)"
    del keep


# --- issue 25 §8: one line, not a traceback ---------------------------------------------------


@pytest.mark.parametrize("device", ["cuda", "meta", "gpu0"])
def test_a_device_this_machine_cannot_measure_is_one_line(shell, capsys, device):
    from IPython.core.error import UsageError

    result = shell.run_cell(f"%%peak {device}\nran = True\n")
    out = capsys.readouterr()
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert "Traceback" not in out.out + out.err
    assert str(result.error_in_exec).startswith(f"%%peak {device}: ")
    assert "\n" not in str(result.error_in_exec)
    assert "ran" not in shell.user_ns  # refused before the cell ran


def test_a_top_level_await_says_what_to_do(shell, capsys):
    from IPython.core.error import UsageError

    result = shell.run_cell("%%peak\nimport asyncio\nawait asyncio.sleep(0)\n")
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert "top-level await" in str(result.error_in_exec)
    assert not isinstance(result.error_in_exec, SyntaxError)
