"""The code every exercise cell ships with, so that running it unchanged is not an attempt.

An exercise cell is a code cell of a notebook that calls a checker (``check_...(`` or
``grade(``) without ``.assert_passed()``, outside a solution. Whatever it defines (the
TODO's ``def``, the bug hunt's starting code, a class to fix) is its shipped code. ``derive``
reads it from the notebooks, ``tools/shipped_exercises.py`` writes it to ``shipped.json``
beside this file (a test keeps the two equal, so a new exercise cannot forget it), and
``@checker`` asks ``is_shipped`` about each of its arguments.

A definition is compared by its syntax tree, so comments, blank lines and the function's name
do not count: a renamed copy of the starting code is still the starting code. A function's tree
comes from the source IPython keeps of each cell (``inspect.getsource``); a class's from its
methods' (a class typed in a notebook has no source file of its own). Code whose source cannot
be read counts as changed, so it is graded.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import re
import textwrap
import tokenize
import types
from pathlib import Path

__all__ = ["derive", "exercise_cells", "is_shipped", "key_of", "SHIPPED_FILE"]

SHIPPED_FILE = Path(__file__).with_name("shipped.json")

_CHECKS = re.compile(r"\b(check_\w+|grade)\(")


def _hash(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _function_tree(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    node = ast.parse(ast.unparse(node)).body[0]  # a copy
    node.name = "_"  # a renamed copy of the starting code is still the starting code
    return ast.dump(node)


def _class_key(node: ast.ClassDef) -> str:
    methods = [
        f"{n.name}:{_function_tree(n)}"
        for n in node.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    return "class:" + _hash(sorted(methods))


def _keys_of_source(source: str) -> list[str]:
    """The keys of every top-level ``def`` and ``class`` in ``source`` (a cell's code)."""
    lines = [
        line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip()[:1] in ("%", "!") else line
        for line in source.splitlines()
    ]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    keys = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            keys.append("def:" + _hash([_function_tree(node)]))
        elif isinstance(node, ast.ClassDef):
            keys.append(_class_key(node))
    return keys


def exercise_cells(notebook: Path) -> list[str]:
    """The source of every exercise cell of ``notebook`` (see the module docstring)."""
    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    found = []
    for cell in cells:
        source = "".join(cell["source"])
        first = source.lstrip().split("\n", 1)[0]
        if cell["cell_type"] != "code" or first.startswith("# Solution"):
            continue
        if _CHECKS.search(source) and ".assert_passed()" not in source:
            found.append(source)
    return found


def derive(notebooks: Path) -> dict[str, list[str]]:
    """``{notebook file name: keys of the code its exercise cells ship}``, from the notebooks."""
    shipped = {}
    for path in sorted(Path(notebooks).glob("*.ipynb")):
        keys = [k for source in exercise_cells(path) for k in _keys_of_source(source)]
        if keys:
            shipped[path.name] = sorted(set(keys))
    return shipped


@functools.cache
def _known() -> frozenset[str]:
    try:
        data = json.loads(SHIPPED_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return frozenset()
    return frozenset(k for keys in data.values() for k in keys)


def key_of(value: object) -> str | None:
    """The key of a function or class typed by the learner, or ``None`` when unreadable."""
    try:
        if isinstance(value, types.FunctionType):
            tree = ast.parse(textwrap.dedent(inspect.getsource(value))).body[0]
            if isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return "def:" + _hash([_function_tree(tree)])
            return None
        if isinstance(value, type):
            methods = []
            for name, member in vars(value).items():
                if isinstance(member, types.FunctionType):
                    tree = ast.parse(textwrap.dedent(inspect.getsource(member))).body[0]
                    if not isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        return None
                    tree.name = name
                    methods.append(f"{name}:{_function_tree(tree)}")
            return "class:" + _hash(sorted(methods)) if methods else None
    except (OSError, TypeError, SyntaxError, IndexError, tokenize.TokenError):
        return None  # tokenize: the source file was edited since, a bracket left open
    return None


def is_shipped(value: object) -> bool:
    """Is ``value`` a function or class that some exercise cell ships, unchanged?"""
    if not isinstance(value, (types.FunctionType, type)):
        return False
    known = _known()
    return bool(known) and key_of(value) in known
