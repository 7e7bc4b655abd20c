"""Old import path of the calculator's command line: now ``fit.cli`` (re-exported here)."""

from __future__ import annotations

from .fit.cli import main, parser

__all__ = ["main", "parser"]
