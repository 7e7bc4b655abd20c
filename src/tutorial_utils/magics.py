"""``%load_ext tutorial_utils``: the ``%%peak`` cell magic.

``%%peak`` runs the cell inside :func:`tutorial_utils.memory.measure` and prints the cell's
exact peak and its delta (memory still held when it ends), in binary units::

    %%peak
    a = torch.randn(1024, 1024)      # 4 MiB, kept
    b = (a @ a).sum()                # a 4 MiB temporary, freed

prints ``peak +8.00 MiB, delta +4.00 MiB (cpu, exact)``. ``%%peak cuda:1`` measures another
device. The numbers come from the allocator's counters (CUDA) or exact tensor accounting (CPU),
never from polling, so a spike however short is counted. The cell's last expression is still
displayed, and an error inside the cell is raised as usual after the measurement is printed.
"""

from __future__ import annotations

import ast
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from .units import format_bytes

__all__ = ["MemoryMagics", "load_ipython_extension", "format_measurement"]


def _signed(nbytes: int) -> str:
    return ("+" if nbytes >= 0 else "") + format_bytes(nbytes)


def format_measurement(result: Any) -> str:
    """One line from a ``memory.measure()`` result: peak and delta relative to the start."""
    fields = ("peak_above_start_bytes", "delta_bytes", "device")
    if not all(hasattr(result, f) for f in fields) or not all(
        isinstance(getattr(result, f), int) and not isinstance(getattr(result, f), bool)
        for f in fields[:2]
    ):
        raise TypeError(
            "format_measurement needs what `with memory.measure() as m:` gives (m), "
            f"not {type(result).__name__}"
        )
    return (
        f"peak {_signed(result.peak_above_start_bytes)}, delta {_signed(result.delta_bytes)} "
        f"({result.device}, exact)"
    )


def _split_last_expression(code: str) -> tuple[ast.Module, ast.Expression | None]:
    """The cell as statements plus its last expression (evaluated separately, like IPython)."""
    tree = ast.parse(code)
    try:
        compile(tree, "<%%peak cell>", "exec")
    except SyntaxError as exc:
        if "outside function" in str(exc.msg) and "await" not in str(exc.msg):  # return, yield
            word = str(exc.msg).split("'")[1] if "'" in str(exc.msg) else "return"
            raise UsageError(
                f"%%peak runs the cell as top-level code, where '{word}' is not allowed (line "
                f"{exc.lineno}): end the cell with the value to show instead"
            ) from None
        try:  # valid only as a top-level await: say what to do, not a SyntaxError
            compile(tree, "<%%peak cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError:
            raise
        raise UsageError(
            "%%peak cannot run a cell with a top-level await: measure inside your coroutine "
            "instead (with tutorial_utils.memory.measure() as m: ...), or drop the magic"
        ) from None
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    return tree, last


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@magics_class
class MemoryMagics(Magics):
    @cell_magic
    def peak(self, line: str, cell: str) -> Any:
        """Run the cell and print its exact memory peak and delta: ``%%peak [device]``."""
        from . import memory  # deferred: torch takes seconds; %load_ext alone should not wait
        from .accounting import _resolve

        device = line.strip() or None
        try:  # a device this machine cannot measure: one line, before the cell runs
            _resolve(device)
        except (ValueError, RuntimeError, AssertionError, TypeError) as exc:
            raise UsageError(f"%%peak {line.strip()}: {_one_line(exc)}") from None
        code = self.shell.transform_cell(cell)  # %magics and !commands inside the cell
        body, last = _split_last_expression(code)
        ns = self.shell.user_ns
        value = None
        error: BaseException | None = None
        with memory.measure(device) as result:
            try:
                exec(compile(body, "<%%peak cell>", "exec"), ns)  # the user's own cell
                if last is not None:
                    value = eval(compile(last, "<%%peak cell>", "eval"), ns)
            except BaseException as exc:  # print the measurement first, then raise as usual
                error = exc
        print(("until the error: " if error is not None else "") + format_measurement(result))
        if error is not None:
            raise error
        return value


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext tutorial_utils``."""
    ipython.register_magics(MemoryMagics)
