"""Does this torch have every torch name the course uses? An inventory, checked against it.

    python tools/torch_api_check.py          # a table of what is missing (exit 1 if anything)
    python tools/torch_api_check.py --list   # every name used, and where
    python tools/torch_api_check.py --json   # one line of JSON (what gpu_check records)

The inventory is read from the source, not guessed: every ``torch.…`` attribute chain and
``from torch… import …`` in ``src/``, ``benchmarks/``, ``tools/``, ``notebooks/scripts/`` and the
code cells of ``notebooks/*.ipynb``, with aliases followed (``import torch.nn as nn``, ``from
torch.nn import functional as F``). Each name is then looked up in the torch that runs this
script (modules imported, attributes read), and each keyword argument passed to a torch
callable is checked against its signature where Python can read one.

This proves the names exist on *this* torch; it cannot prove behaviour. It runs here on our
pin (``tests/test_torch_api.py``) and on the GPU machine's torch inside ``make gpu-check``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# pyproject's floor (``torch>=TESTED_FLOOR``) is the oldest torch this check and the notebooks
# have run on: 2.11 is the GPU machine's torch (``make gpu-check`` runs both there; the unit
# tests and this check also ran on 2.11's CUDA build without a driver, Python 3.12), 2.13.0
# is our pin (CI). Older releases are not tested, so pip is not told they work.
TESTED_FLOOR = "2.11"
SOURCES = ("src", "benchmarks", "tools", "notebooks/scripts")


def _cells(path: Path) -> list[str]:
    """The code of each code cell; IPython-only lines (magics, shell escapes) become ``pass``.

    Cells that are meant to raise (tag ``raises-exception``) are left out: they show a wrong
    call on purpose, such as the guide's ``nn.DataParallel(model, gpu_ids=[0, 1])``.
    """
    out = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", []))
        tags = cell.get("metadata", {}).get("tags", [])
        if "raises-exception" in tags or "NBVAL_RAISES_EXCEPTION" in source:
            continue
        lines = []
        for line in source.split("\n"):
            stripped = line.lstrip()
            is_ipython = stripped.startswith(("%", "!"))
            lines.append(line[: len(line) - len(stripped)] + "pass" if is_ipython else line)
        out.append("\n".join(lines))
    return out


def _files(root: Path) -> list[Path]:
    files = [p for d in SOURCES for p in sorted((root / d).rglob("*.py"))]
    return files + sorted((root / "notebooks").glob("*.ipynb"))


class _Collector(ast.NodeVisitor):
    """Full names (``torch.cuda.Event``) used in one file, and keywords passed to them."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.names: set[str] = set()
        self.keywords: set[tuple[str, str]] = set()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "torch" or alias.name.startswith("torch."):
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    self.aliases["torch"] = "torch"
                self.names.add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level == 0 and (mod == "torch" or mod.startswith("torch.")):
            for alias in node.names:
                full = f"{mod}.{alias.name}"
                self.aliases[alias.asname or alias.name] = full
                self.names.add(full)

    def _full(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        full = self._full(node)
        if full is not None:
            self.names.add(full)
            return  # the inner part of the chain is a prefix of this one
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        full = self._full(node.func)
        if full is not None:
            for kw in node.keywords:
                if kw.arg is not None:
                    self.keywords.add((full, kw.arg))
        self.generic_visit(node)


def inventory(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[tuple[str, str], set[str]]]:
    """``({name: files}, {(callable, keyword): files})`` over the course's code."""
    names: dict[str, set[str]] = defaultdict(set)
    keywords: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in _files(root):
        rel = str(path.relative_to(root))
        texts = _cells(path) if path.suffix == ".ipynb" else [path.read_text()]
        trees = []
        for text in texts:
            try:
                trees.append(ast.parse(text))
            except SyntaxError as exc:
                raise SyntaxError(f"{rel} does not parse: {exc}") from None
        # two passes: aliases first (imports may come after a function that uses them)
        collector = _Collector()
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    collector.visit(node)
        for tree in trees:
            collector.visit(tree)
        for name in collector.names:
            names[name].add(rel)
        for pair in collector.keywords:
            keywords[pair].add(rel)
    return names, keywords


def resolve(name: str) -> object:
    """The object ``name`` denotes in the running torch; raises LookupError if there is none."""
    parts = name.split(".")
    obj = None
    for i in range(len(parts), 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        rest = parts[i:]
        break
    else:
        raise LookupError(name)
    for attr in rest:
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise LookupError(name) from None
    return obj


def _accepts(obj: object, keyword: str) -> bool | None:
    """Does ``obj`` take ``keyword``? None when Python cannot tell (builtins, C functions)."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return keyword in sig.parameters


def check(root: Path = ROOT) -> dict:
    import torch

    names, keywords = inventory(root)
    missing, objects = [], {}
    for name in sorted(names):
        try:
            objects[name] = resolve(name)
        except LookupError:
            missing.append(name)
    bad_keywords = []
    for (name, keyword), _files in sorted(keywords.items()):
        if name in objects and _accepts(objects[name], keyword) is False:
            bad_keywords.append(f"{name}({keyword}=...)")
    return {
        "torch": torch.__version__,
        "checked": len(names),
        "keywords_checked": len(keywords),
        "missing": missing,
        "bad_keywords": bad_keywords,
        "where": {n: sorted(names[n]) for n in missing},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    parser.add_argument("--list", action="store_true", help="every name used, and where")
    args = parser.parse_args(argv)
    if args.list:
        names, _ = inventory()
        for name, files in sorted(names.items()):
            print(f"{name:60} {', '.join(sorted(files))}")
        return 0
    result = check()
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"torch {result['torch']}: {result['checked']} names and "
            f"{result['keywords_checked']} keyword arguments checked"
        )
        for name in result["missing"]:
            print(f"missing: {name}  (used in {', '.join(result['where'][name])})")
        for call in result["bad_keywords"]:
            print(f"keyword not accepted: {call}")
    return 1 if result["missing"] or result["bad_keywords"] else 0


if __name__ == "__main__":
    sys.exit(main())
