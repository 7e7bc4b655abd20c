"""Old import path of the calculator's widget: now ``fit.widget`` (re-exported here). Notebook
03 §9 displays it: ``Calculator(preset="Llama-3.1-8B", batch=2, seq=8192)``."""

from __future__ import annotations

from .fit.widget import SEQ_CHOICES, Calculator

__all__ = ["SEQ_CHOICES", "Calculator"]
