"""The "will it fit" calculator as a widget: change a knob, and the bar and the verdict follow.

``fit.will_it_fit`` does the work (and caches what does not change); this module only draws it.
In a notebook:

    from tutorial_utils.calculator import Calculator
    Calculator(preset="llama-8b")          # the knobs, a stacked bar, the verdict

``Calculator.set(batch=4)`` turns a knob from code (what a test does); ``.report`` is the latest
``fit.FitReport``, ``.picture.value`` its bar as PNG bytes and ``.updates`` the seconds each
update took (the answer and the picture). Without ipywidgets, building
one says what to use instead (``fit.will_it_fit`` or ``python -m tutorial_utils.fit``).
"""

from __future__ import annotations

import html
import io
import time

from . import fit
from .decoder import PRESETS
from .units import format_bytes

__all__ = ["SEQ_CHOICES", "Calculator"]

SEQ_CHOICES = (256, 512, 1024, 2048, 4096, 8192)
_DEFAULTS = {
    "preset": "llama-8b",
    "batch": 1,
    "seq": 2048,
    "precision": "bf16-master",
    "optimizer": "adamw",
    "checkpointing": "selective",
    "sharding": "zero3",
    "n_gpus": 8,
}


def _widgets():
    try:
        import ipywidgets
    except ImportError:
        raise ModuleNotFoundError(
            "ipywidgets is not installed: use fit.will_it_fit(...) or "
            "`python -m tutorial_utils.fit PRESET` instead, or pip install ipywidgets."
        ) from None
    return ipywidgets


def _png(report: fit.FitReport) -> bytes:
    """The report's bar as PNG bytes (matplotlib's Agg canvas; no pyplot state is touched)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 2.8), dpi=100)
    report.plot(figure.subplots())
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


class Calculator:
    """Knobs for every input of ``fit.will_it_fit``, one stacked bar, one verdict line."""

    def __init__(self, **knobs) -> None:
        unknown = set(knobs) - set(_DEFAULTS)
        if unknown:
            raise TypeError(
                f"Calculator has no knob {', '.join(sorted(unknown))}; "
                f"it has: {', '.join(_DEFAULTS)}."
            )
        values = {**_DEFAULTS, **knobs}
        fit.will_it_fit(**self._fit_args(values))  # bad values: fit's one-sentence error, now
        w = _widgets()
        seq_options = sorted({*SEQ_CHOICES, values["seq"]})
        self.knobs = {
            "preset": w.Dropdown(options=list(PRESETS), value=values["preset"]),
            "batch": w.IntSlider(value=values["batch"], min=1, max=max(64, values["batch"])),
            "seq": w.SelectionSlider(options=seq_options, value=values["seq"]),
            "precision": w.Dropdown(options=fit.PRECISIONS, value=values["precision"]),
            "optimizer": w.Dropdown(options=fit.OPTIMIZERS, value=values["optimizer"]),
            "checkpointing": w.Dropdown(options=fit.CHECKPOINTING, value=values["checkpointing"]),
            "sharding": w.Dropdown(options=fit.SHARDING, value=values["sharding"]),
            "n_gpus": w.IntSlider(value=values["n_gpus"], min=1, max=max(64, values["n_gpus"])),
        }
        for name, knob in self.knobs.items():
            knob.description = name
            knob.style.description_width = "initial"  # "checkpointing" in full
            knob.observe(self._on_change, names="value")
        self.summary = w.HTML()
        self.summary.add_class("tu-fit-summary")
        # A PNG in an Image widget, not a figure shown in an Output widget: the picture is the
        # widget's value, so it redraws the same in JupyterLab, Colab and a test kernel
        self.picture = w.Image(format="png")
        self.picture.add_class("tu-fit-picture")
        knobs_list = list(self.knobs.values())
        self.widget = w.VBox(
            [w.HBox(knobs_list[:4]), w.HBox(knobs_list[4:]), self.summary, self.picture]
        )
        self.report: fit.FitReport | None = None
        self.error: str | None = None
        self.updates: list[float] = []
        self._update()

    @staticmethod
    def _fit_args(values: dict) -> dict:
        args = dict(values)
        if args["sharding"] == "none":
            args["n_gpus"] = 1  # one GPU: the slider waits until a stage is chosen
        return args

    def values(self) -> dict:
        """The knobs' current values."""
        return {name: knob.value for name, knob in self.knobs.items()}

    def set(self, **knobs) -> fit.FitReport | None:
        """Turn knobs from code, as a learner would by hand; returns the new report."""
        unknown = set(knobs) - set(self.knobs)
        if unknown:
            raise TypeError(f"Calculator has no knob {', '.join(sorted(unknown))}.")
        self._holding = True  # one update for all the knobs, not one per knob
        try:
            for name, value in knobs.items():
                self.knobs[name].value = value
        finally:
            self._holding = False
        self._update()
        return self.report

    _holding = False

    def _on_change(self, change) -> None:
        if not self._holding:
            self._update()

    def _update(self) -> None:
        start = time.perf_counter()
        values = self.values()
        self.knobs["n_gpus"].disabled = values["sharding"] == "none"
        try:
            report = fit.will_it_fit(**self._fit_args(values))
        except ValueError as err:  # e.g. a sequence longer than GPT-2's learned positions
            self.error = str(err)
            self.summary.value = f"<b>Cannot answer:</b> {html.escape(self.error)}"
            self.picture.value = b""
            self.updates.append(time.perf_counter() - start)
            return
        self.report, self.error = report, None
        self.summary.value = (
            f"<b>{format_bytes(report.total)}</b> per GPU exact, "
            f"{format_bytes(report.formula_total)} by formula: {html.escape(report.verdict)}"
        )
        self.picture.value = _png(report)
        self.updates.append(time.perf_counter() - start)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def __repr__(self) -> str:
        state = self.error or (self.report.verdict if self.report else "no answer yet")
        knobs = ", ".join(f"{k}={v!r}" for k, v in self.values().items())
        return f"Calculator({knobs}): {state}"
