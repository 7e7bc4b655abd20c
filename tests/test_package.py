"""The package's front page: its docstring names every module, so a newcomer finds each one."""

import re
from pathlib import Path

import tutorial_utils

PACKAGE = Path(tutorial_utils.__file__).parent


def test_the_package_docstring_names_every_module():
    modules = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    modules |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    named = set(re.findall(r"^\* ``(\w+)``:", tutorial_utils.__doc__, flags=re.MULTILINE))
    assert modules - named == set(), f"missing from tutorial_utils/__init__.py: {modules - named}"
    assert named - modules == set(), f"named but not in the package: {named - modules}"
