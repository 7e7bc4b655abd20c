"""docs/architecture.md describes every module of the package, and the layers it states hold."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "tutorial_utils"
PAGE = ROOT / "docs" / "architecture.md"


def modules() -> list[str]:
    """Every module of the package: its .py files and its subpackages."""
    found = [p.stem for p in PACKAGE.glob("*.py")]
    found += [p.parent.name for p in PACKAGE.glob("*/__init__.py")]
    return sorted(found)


def layer_table() -> dict[str, tuple[int, int]]:
    """module -> (layer, position in the table), read from the page's layer table."""
    rows, layer = {}, None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| (?:(\d+) · [^|]*)?\| `(\w+)` \|", line)
        if not match:
            continue
        if match.group(1) is not None:
            layer = int(match.group(1))
        assert layer is not None, f"a module row comes before the first layer: {line}"
        rows[match.group(2)] = (layer, len(rows))
    return rows


def imports_of(module: str) -> set[str]:
    """The package modules ``module`` imports (relative or absolute), at any depth of its file."""
    path = PACKAGE / f"{module}.py"
    files = [path] if path.exists() else sorted((PACKAGE / module).glob("*.py"))
    found = set()
    for file in files:
        inside_subpackage = file.parent != PACKAGE
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0 and (node.module or "").startswith("tutorial_utils"):
                    parts = (node.module or "").split(".")[1:]
                elif node.level == 1 and not inside_subpackage or node.level == 2:
                    parts = (node.module or "").split(".") if node.module else []
                else:
                    continue  # within the subpackage itself
                names = parts[:1] or [alias.name for alias in node.names]
                found.update(n for n in names if n in modules())
    found.discard(module)
    return found


def test_every_module_is_described():
    table = layer_table()
    text = PAGE.read_text(encoding="utf-8")
    for module in modules():
        assert module in table, f"docs/architecture.md's layer table has no row for `{module}`"
        assert f"`{module}`" in text


def test_the_table_names_no_module_that_is_gone():
    assert set(layer_table()) <= set(modules())


def test_modules_import_only_from_layers_below_or_earlier_in_their_own():
    table = layer_table()
    for module in modules():
        layer, position = table[module]
        for other in imports_of(module):
            other_layer, other_position = table[other]
            assert (other_layer, other_position) < (layer, position), (
                f"`{module}` (layer {layer}) imports `{other}` (layer {other_layer}), which the "
                "page puts above or after it: fix the import or move the row"
            )


def test_import_reader_sees_imports():
    assert "devices" in imports_of("accounting")
    assert {"accounting", "anatomy"} <= imports_of("memory")
    assert {"memory", "devices"} <= imports_of("exercises")


def test_contributing_points_at_files_that_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    for target in re.findall(r"`((?:\.\./|docs/|tools/|src/)[\w./-]+\.(?:md|py))`", text):
        path = (ROOT / target).resolve()
        assert path.is_file(), f"CONTRIBUTING.md points to {target}, which is not in the repository"
    assert "docs/architecture.md" in text
