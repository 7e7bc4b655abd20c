"""Old import path of the calculator's widget: now ``fit.widget`` (re-exported here), as
notebook 03's further reading names it: ``Calculator(preset="Llama-3-8B")``."""

from __future__ import annotations

from .fit.widget import SEQ_CHOICES, Calculator

__all__ = ["SEQ_CHOICES", "Calculator"]
