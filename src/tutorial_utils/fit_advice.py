"""Old import path of the calculator's advice: now ``fit.advice`` (re-exported here)."""

from __future__ import annotations

from .fit.advice import Advice, Change, advise

__all__ = ["Advice", "Change", "advise"]
