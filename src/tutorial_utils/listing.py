"""Show a learner the part of a script that matters, not the whole file.

A notebook that launches ``scripts/ddp_train.py`` should show the lines that teach (the training
step, the setup), not 100 lines of argument parsing. ``show`` picks top-level functions and
classes of a Python file by name and displays them, headed by where they come from:

>>> text = excerpt("scripts/ddp_train.py", "build_model", root=_ROOT_FOR_DOCTEST)
>>> print(text.splitlines()[0])  # doctest: +ELLIPSIS
# scripts/ddp_train.py: build_model (lines ...); the file has ... lines

``tools/course_times.py`` counts what ``show`` displays (through ``excerpt``), so the time a
notebook states includes the script lines its reader reads.
"""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

__all__ = ["excerpt", "show"]

_ROOT_FOR_DOCTEST = Path(__file__).resolve().parents[2] / "notebooks"


#: The largest file shown: a script a learner reads is a few KiB; more is not a listing.
MAX_BYTES = 1 << 20


def _read(path: Path) -> str:
    """The text of a regular file of at most ``MAX_BYTES``. Opened without blocking and checked
    on the open descriptor: a FIFO, a device (``/dev/zero``) or a folder is refused at once."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"there is no file {path}: run the notebook from the notebooks folder, "
            "or give the script's path relative to where you run it."
        ) from None
    except OSError as exc:
        raise OSError(f"{path} could not be opened ({exc.strerror}).") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file: show a script or a text file.")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > MAX_BYTES:
            raise OSError(
                f"{path} is {info.st_size:,} bytes, more than the {MAX_BYTES:,} a listing shows: "
                "pick parts of it by name, or open it in an editor."
            )
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise OSError(
            f"{path} grew past {MAX_BYTES:,} bytes while it was read: open it in an editor."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OSError(f"{path} could not be read as text ({exc}).") from None


def _check(path: object, names: tuple, root: object) -> Path:
    """The arguments of ``excerpt``/``show``, checked in one place; the path to read."""
    for value, what in ((path, "path"), (root, "root")):
        if value is None and what == "root":
            continue
        if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
            raise TypeError(
                f"{what} must be a file path like 'scripts/ddp_train.py', got {value!r}."
            )
        if "\0" in os.fspath(value):
            raise ValueError(f"{what} contains a NUL character: give a file path, got {value!r}.")
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"names must be identifiers of functions or classes, got {name!r}.")
    return Path(root) / Path(path) if root is not None else Path(path)


def excerpt(path: str | os.PathLike, *names: str, root: str | os.PathLike | None = None) -> str:
    """The named top-level functions and classes of a Python file, in file order.

    With no names, the whole file. Each definition comes with its decorators and the comment
    lines right above it. The first line says which file and lines these are.
    """
    full = _check(path, names, root)
    shown = Path(path)
    text = _read(full)
    lines = text.splitlines()
    if not names:
        return text
    if full.suffix != ".py":
        raise ValueError(
            f"{shown} is not a Python file: pick parts by name only from a .py file, "
            "or show the whole file with show(path)."
        )
    try:
        tree = ast.parse(text, filename=str(shown))
    except SyntaxError as exc:
        raise ValueError(
            f"{shown} is not valid Python (line {exc.lineno}): fix it first."
        ) from None
    defs = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    missing = [n for n in names if n not in defs]
    if missing:
        raise ValueError(
            f"{shown} has no top-level function or class named {', '.join(map(repr, missing))}; "
            f"it has: {', '.join(defs) or 'none'}."
        )
    spans = []
    for name in dict.fromkeys(names):  # each once
        node = defs[name]
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        while start > 1 and lines[start - 2].lstrip().startswith("#"):
            start -= 1  # the comment block right above belongs to the definition
        spans.append((start, node.end_lineno or node.lineno, name))
    spans.sort()
    where = ", ".join(f"{name} (lines {a}-{b})" for a, b, name in spans)
    head = f"# {shown.as_posix()}: {where}; the file has {len(lines)} lines"
    body = "\n\n".join("\n".join(lines[a - 1 : b]) for a, b, _ in spans)
    return f"{head}\n{body}\n"


def show(path: str | os.PathLike, *names: str, language: str | None = None):
    """Display ``excerpt(path, *names)`` highlighted in a notebook (an ``IPython.display.Code``)."""
    from IPython.display import Code

    if language is not None and (not isinstance(language, str) or not language.isidentifier()):
        raise TypeError(f"language must be a name like 'python' or 'bash', got {language!r}.")
    text = excerpt(path, *names)
    if language is None:
        language = {".py": "python", ".sh": "bash", ".sbatch": "bash"}.get(
            Path(path).suffix, "text"
        )
    return Code(data=text, language=language)
