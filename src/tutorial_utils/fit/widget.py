"""The "will it fit" calculator as a widget: change a knob, and the bar, verdict and advice follow.

``fit.will_it_fit`` does the work (and caches what does not change), ``fit_advice.advise``
finds what to change; this module only draws them. In a notebook:

    from tutorial_utils.calculator import Calculator
    Calculator(preset="llama-3-8b", gpu="H100")   # the knobs, a stacked bar, the verdict

Its knobs are every input of ``will_it_fit`` a learner sets (all but ``nf4_chunk``, a detail of
torchao's version): the model, GPU, batch, sequence and whose block (the course's or litgpt's);
precision, optimizer (8-bit and paged included) and its implementation, checkpointing; the
profile (DDP, ZeRO, FSDP1, FSDP2 with its resharding and reduce dtype) over GPUs with TP, PP
(and its micro-batches) and CP degrees; LoRA's rank, targets, dropout and base (QLoRA on
torchao's or bitsandbytes' NF4, with or without double quantization); cross-entropy chunks,
gradient accumulation and FSDP1's gradient sync, a loop that keeps its logits (litgpt's);
activation and CPU offload, the optimizer step in backward, headroom.

``Calculator.set(batch=4)`` turns knobs from code (what a test does), with the names people
type (``precision="bf16"``, ``optimizer="adam"``). A value a slider cannot show widens the
slider, never clamps silently; a value or combination the calculator refuses is said in the
summary (``.error``), and ``.report`` is then None: an old answer is never shown as the new
one. ``.picture.value`` is the bar as PNG bytes (``.drawn`` the report it was drawn from, always
``.report``; ``.chart_title`` its title, also the picture's tooltip), ``.updates`` the seconds
each update took. While an
update works the summary says "updating..." and the old bar is gone.
Without ipywidgets, building one says what to use instead.
"""

from __future__ import annotations

import html
import io
import time

from ..units import format_bytes
from . import advice as fit_advice
from . import cards, inputs, presets
from . import report as fit_report
from .peak import will_it_fit

PRESETS = presets.PRESETS

__all__ = ["SEQ_CHOICES", "Calculator"]

SEQ_CHOICES = (256, 512, 1024, 2048, 4096, 8192)
_NO_GPU = "(any: list the cards it fits)"
_DEFAULTS = {
    "preset": "llama-8b",
    "batch": 1,
    "seq": 2048,
    "precision": "bf16-master",
    "optimizer": "adamw",
    "checkpointing": "every-second-matmul",
    "sharding": "zero3",
    "n_gpus": 8,
    "gpu": "H100",
    "headroom": True,
    "optimizer_impl": "foreach",
    "lora_rank": 0,
    "lora_targets": "attention",
    "lora_base": "bf16",
    "ce_chunks": 1,
    "activation_offload": False,
    "cpu_offload": False,
    "optimizer_in_backward": False,
    "grad_accumulation": 1,
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "reshard_after_forward": True,
    "reduce_dtype": "param",
    "pp_microbatches": 0,
    "lora_dropout": 0.0,
    "nf4_double_quant": True,
    "logits_kept": False,
    "gradient_sync": "every",
    "block": "course",
}
LORA_RANKS = (0, 8, 16, 32, 64)  # 0: full training
TP_DEGREES = (1, 2, 4, 8)  # and PP's and CP's
CE_CHUNKS = (1, 2, 4, 8, 16)  # torchtune's CEWithChunkedOutputLoss uses 8
PP_MICROBATCHES = (0, 2, 4, 8, 16, 32)  # 0: as many as stages
LORA_DROPOUTS = (0.0, 0.05, 0.1)  # torchtune's and litgpt's LoRA recipes use 0.05
#: Whose NF4 holds QLoRA's base, as the dropdown names it.
LORA_BASES = (
    ("bf16 (LoRA)", "bf16"),
    ("nf4, torchao (QLoRA: torchtune)", "nf4"),
    ("nf4, bitsandbytes (QLoRA: litgpt, HF)", "bnb-nf4"),
)
#: The knobs whose values are a short list (a value not in it is added, never refused).
_CHOICES = (
    "seq",
    "gpu",
    "lora_rank",
    "tp",
    "pp",
    "cp",
    "ce_chunks",
    "pp_microbatches",
    "lora_dropout",
)
#: The True/False knobs.
_SWITCHES = (
    "headroom",
    "activation_offload",
    "cpu_offload",
    "optimizer_in_backward",
    "reshard_after_forward",
    "nf4_double_quant",
    "logits_kept",
)
#: How each knob's value is read from what a person types (one sentence when it cannot be).
_READ = {
    "preset": presets.model,
    "precision": inputs.recipe,
    "optimizer": inputs.optimizer,
    "checkpointing": inputs.checkpointing,
    "sharding": inputs.sharding,
    "batch": lambda v: inputs.positive_int("batch", v),
    "seq": lambda v: inputs.positive_int("seq", v),
    "n_gpus": lambda v: inputs.positive_int("n_gpus", v, largest=2**20),
    "gpu": lambda v: _NO_GPU if v in (None, _NO_GPU) else cards.gpu(v).name,
    "optimizer_impl": inputs.optimizer_impl,
    "lora_rank": lambda v: _zero_or_count("lora_rank", v, 2**16),  # 0: full training
    "lora_targets": inputs.lora_targets,
    "lora_base": lambda v: _one_of("lora_base", v, tuple(value for _, value in LORA_BASES)),
    "lora_dropout": lambda v: _probability("lora_dropout", v),
    "pp_microbatches": lambda v: _zero_or_count("pp_microbatches", v, 2**16),  # 0: as pp
    "reduce_dtype": lambda v: _one_of("reduce_dtype", v, ("param", "fp32")),
    "gradient_sync": lambda v: _one_of("gradient_sync", v, ("every", "last")),
    "block": inputs.block,
    "ce_chunks": lambda v: inputs.positive_int("ce_chunks", v, 2**12),
    "grad_accumulation": lambda v: inputs.positive_int("grad_accumulation", v, 2**20),
    **{n: lambda v, n=n: inputs.positive_int(n, v, 2**12) for n in ("tp", "pp", "cp")},
    **{n: lambda v, n=n: inputs.flag(n, v) for n in _SWITCHES},
}


def _one_of(name: str, value, allowed: tuple) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def _values(options) -> list:
    """A dropdown's values, whether its options are values or (label, value) pairs."""
    return [o[1] if isinstance(o, tuple) else o for o in options]


def _labelled(name: str, values: set) -> list:
    """A short list's options in order; PP's 0 micro-batches read as what it means."""
    if name != "pp_microbatches":
        return sorted(values)
    return [("as pp", 0) if v == 0 else (str(v), v) for v in sorted(values)]


def _zero_or_count(name: str, value, largest: int) -> int:
    """0, or a whole number from 1 (0.0 and False are refused as every count refuses them)."""
    if type(value) is int and value == 0:
        return 0
    return inputs.positive_int(name, value, largest)


def _probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a probability from 0 to below 1, not {value!r}")
    return float(value)


def _widgets():
    try:
        import ipywidgets
    except ImportError:
        raise ModuleNotFoundError(
            "ipywidgets is not installed: use fit.will_it_fit(...) or "
            "`python -m tutorial_utils fit MODEL` instead, or pip install ipywidgets."
        ) from None
    return ipywidgets


def _picture(w):
    """An Image widget whose tooltip (the chart's title on hover) the page can show.

    ipywidgets 8's front end sets a tooltip only where the model's ``description`` is empty
    text, and an Image has no description: its view fails to draw ("Cannot read properties of
    undefined (reading 'length')", jupyterlab_widgets 3.0). An empty description, synced, is
    what it reads."""
    import traitlets

    class Picture(w.Image):
        description = traitlets.Unicode("").tag(sync=True)

    return Picture(format="png")


def _png(report: fit_report.FitReport) -> tuple[bytes, str]:
    """The report's bar as PNG bytes, and the chart's title (matplotlib's Agg canvas; no pyplot
    state is touched)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 2.8), dpi=100)
    ax = report.plot(figure.subplots())
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue(), ax.get_title()


class Calculator:
    """Knobs for every input of ``fit.will_it_fit``, one stacked bar, a verdict and advice."""

    def __init__(self, **knobs) -> None:
        unknown = set(knobs) - set(_DEFAULTS)
        if unknown:
            raise TypeError(
                f"Calculator has no knob {', '.join(sorted(unknown))}; "
                f"it has: {', '.join(_DEFAULTS)}."
            )
        values = self._read({**_DEFAULTS, **knobs})
        will_it_fit(**self._fit_args(values))  # a refused combination: its sentence, now
        w = _widgets()
        self.knobs = {
            "preset": w.Dropdown(options=list(PRESETS), value=values["preset"]),
            "batch": w.IntSlider(value=values["batch"], min=1, max=max(64, values["batch"])),
            "seq": w.SelectionSlider(
                options=sorted({*SEQ_CHOICES, values["seq"]}), value=values["seq"]
            ),
            "precision": w.Dropdown(options=tuple(inputs.RECIPES), value=values["precision"]),
            "optimizer": w.Dropdown(options=inputs.OPTIMIZERS, value=values["optimizer"]),
            "checkpointing": w.Dropdown(
                options=tuple(inputs.CHECKPOINTING), value=values["checkpointing"]
            ),
            "sharding": w.Dropdown(options=inputs.SHARDING, value=values["sharding"]),
            "n_gpus": w.IntSlider(value=values["n_gpus"], min=1, max=max(64, values["n_gpus"])),
            "gpu": w.Dropdown(
                options=list(dict.fromkeys([_NO_GPU, *cards.CARDS, values["gpu"]])),
                value=values["gpu"],
            ),
            "optimizer_impl": w.Dropdown(
                options=inputs.OPTIMIZER_IMPLS, value=values["optimizer_impl"]
            ),
            "lora_rank": w.Dropdown(
                options=sorted({*LORA_RANKS, values["lora_rank"]}), value=values["lora_rank"]
            ),
            "lora_targets": w.Dropdown(options=inputs.LORA_TARGETS, value=values["lora_targets"]),
            "lora_base": w.Dropdown(options=LORA_BASES, value=values["lora_base"]),
            "lora_dropout": w.Dropdown(
                options=sorted({*LORA_DROPOUTS, values["lora_dropout"]}),
                value=values["lora_dropout"],
            ),
            "pp_microbatches": w.Dropdown(
                options=_labelled("pp_microbatches", {*PP_MICROBATCHES, values["pp_microbatches"]}),
                value=values["pp_microbatches"],
            ),
            "gradient_sync": w.Dropdown(options=("every", "last"), value=values["gradient_sync"]),
            "block": w.Dropdown(options=inputs.BLOCKS, value=values["block"]),
            "ce_chunks": w.Dropdown(
                options=sorted({*CE_CHUNKS, values["ce_chunks"]}), value=values["ce_chunks"]
            ),
            "grad_accumulation": w.IntSlider(
                value=values["grad_accumulation"], min=1, max=max(64, values["grad_accumulation"])
            ),
            **{
                name: w.Dropdown(options=sorted({*TP_DEGREES, values[name]}), value=values[name])
                for name in ("tp", "pp", "cp")
            },
            "reduce_dtype": w.Dropdown(options=("param", "fp32"), value=values["reduce_dtype"]),
            **{name: w.Checkbox(value=values[name]) for name in _SWITCHES},
        }
        for name, knob in self.knobs.items():
            knob.description = name
            knob.style.description_width = "initial"  # "checkpointing" in full
            knob.observe(self._on_change, names="value")
        self.summary = w.HTML()
        self.summary.add_class("tu-fit-summary")
        # A PNG in an Image widget, not a figure shown in an Output widget: the picture is the
        # widget's value, so it redraws the same in JupyterLab, Colab and a test kernel
        self.picture = _picture(w)
        self.picture.add_class("tu-fit-picture")
        # One row per question: the model and shape, the recipe, the profile over GPUs, LoRA
        # and its base, the loop (loss, micro-batches), what is offloaded or stepped early
        rows = (
            ("preset", "gpu", "batch", "seq", "block"),
            ("precision", "optimizer", "optimizer_impl", "checkpointing"),
            ("sharding", "n_gpus", "tp", "pp", "pp_microbatches", "cp"),
            ("lora_rank", "lora_targets", "lora_dropout", "lora_base", "nf4_double_quant"),
            ("ce_chunks", "grad_accumulation", "gradient_sync", "logits_kept"),
            ("reshard_after_forward", "reduce_dtype", "activation_offload", "cpu_offload"),
            ("optimizer_in_backward", "headroom"),
        )
        assert sorted(n for row in rows for n in row) == sorted(self.knobs), "a knob unshown"
        self.widget = w.VBox(
            [w.HBox([self.knobs[n] for n in row]) for row in rows] + [self.summary, self.picture]
        )
        self.report: fit_report.FitReport | None = None
        self.advice: fit_advice.Advice | None = None
        self.error: str | None = None
        self.notes: list[str] = []  # what the last change did to a knob (a widened slider)
        self.updates: list[float] = []
        self.drawn: fit_report.FitReport | None = None  # the report the bar was drawn from
        self.chart_title = ""
        self._update()

    @staticmethod
    def _read(values: dict) -> dict:
        return {name: _READ[name](value) for name, value in values.items()}

    def _fit_args(self, values: dict) -> dict:
        args = dict(values)
        args["gpu"] = None if values["gpu"] == _NO_GPU else self._gpu(values["gpu"])
        return args

    @staticmethod
    def _gpu(name: str) -> cards.Gpu:
        return cards.gpu(name.removesuffix(" GPU") if name.endswith(" GPU") else name)

    def values(self) -> dict:
        """The knobs' current values."""
        return {name: knob.value for name, knob in self.knobs.items()}

    def set(self, **knobs) -> fit_report.FitReport | None:
        """Turn knobs from code, as a learner would by hand; returns the new report, or None
        when the calculator refuses the combination (``.error`` says why).

        Values are read as ``fit_inputs`` reads them ("bf16", "adam", "Llama-3.1-8B"); one it
        cannot read raises its one-sentence error and changes nothing. A batch, sequence or
        GPU count beyond a slider widens the slider (said in ``.notes``), never clamps.
        """
        unknown = set(knobs) - set(self.knobs)
        if unknown:
            raise TypeError(f"Calculator has no knob {', '.join(sorted(unknown))}.")
        values = self._read(knobs)  # raises before any knob moves
        self.notes = []
        self._holding = True  # one update for all the knobs, not one per knob
        try:
            for name, value in values.items():
                self._widen(name, value)
                self.knobs[name].value = value
        finally:
            self._holding = False
        self._update()
        return self.report

    def _widen(self, name: str, value) -> None:
        knob = self.knobs[name]
        if name in ("batch", "n_gpus", "grad_accumulation") and value > knob.max:
            knob.max = value
            self.notes.append(f"the {name} slider now goes to {value:,}")
        elif name in _CHOICES and value not in _values(knob.options):
            if name == "gpu":
                knob.options = [*knob.options, value]
            else:
                knob.options = _labelled(name, {*_values(knob.options), value})
            self.notes.append(f"{value} added to the {name} choices")

    _holding = False

    def _on_change(self, change) -> None:
        if not self._holding:
            self.notes = []
            self._update()

    def _update(self) -> None:
        start = time.perf_counter()
        # Cleared first: whatever happens below, the old answer is not shown as the new one;
        # the page says it is updating, and the old bar goes, so a verdict and a bar shown
        # together always belong to the same answer (the bar is drawn before the verdict)
        self.report, self.advice, self.error = None, None, None
        self.drawn, self.chart_title = None, ""
        self.summary.value = "<i>updating...</i>"
        with self.picture.hold_sync():  # one message: the bar and its title go together
            self.picture.value, self.picture.tooltip = b"", ""
        try:
            report = will_it_fit(**self._fit_args(self.values()))
        except (TypeError, ValueError) as err:  # e.g. GPT-2 at 2048 tokens, ZeRO on one GPU
            self.error = str(err)
            self.summary.value = f"<b>Cannot answer:</b> {html.escape(self.error)}"
            self.picture.value = b""
            self.updates.append(time.perf_counter() - start)
            return
        self.report = report
        asked = f"{report.preset}, batch {report.batch} x {report.seq}"  # as the bar's title
        lines = [f"{html.escape(asked)}: <b>{html.escape(report.verdict)}</b>"]
        if report.extras:  # the knobs away from their defaults, in words
            lines.append(f"With {html.escape(', '.join(report.extras))}.")
        if report.fits is False:
            self.advice = fit_advice.advise(report)
            lines.append("What would make it fit:")
            lines.append(html.escape(repr(self.advice)).replace("\n", "<br>"))
        if report.headroom:
            kept = ", ".join(f"{k} {format_bytes(v)}" for k, v in report.headroom.items())
            lines.append(f"Headroom kept: {html.escape(kept)} (sources: fit.headroom).")
        if self.notes:
            lines.append(f"<i>{html.escape('; '.join(self.notes))}.</i>")
        # One report draws both: the bar (and its title) and then the verdict
        png, self.chart_title = _png(report)
        with self.picture.hold_sync():  # the title on hover: what a browser test reads
            self.picture.value, self.picture.tooltip = png, self.chart_title
        self.drawn = report
        self.summary.value = "<br>".join(lines)
        self.updates.append(time.perf_counter() - start)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        # The widget, with a sentence as its text form: a saved notebook shows that text until
        # the cell runs (ipywidgets' own would be "VBox(children=(HBox(...": an object's repr).
        bundle = dict(self.widget._repr_mimebundle_() or {})
        state = self.error or (self.report.verdict if self.report else "no answer yet")
        bundle["text/plain"] = f"Will-it-fit calculator: {state}. Run the cell to turn its knobs."
        display(bundle, raw=True)

    def __repr__(self) -> str:
        state = self.error or (self.report.verdict if self.report else "no answer yet")
        knobs = ", ".join(f"{k}={v!r}" for k, v in self.values().items())
        return f"Calculator({knobs}): {state}"
