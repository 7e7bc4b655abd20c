"""The answer: one GPU's memory at the step's peak, by category, and the verdict.

One job: hold what ``peak.will_it_fit`` found and show it: a text form (``repr``), a verdict
sentence, one stacked bar (``plot``), and the bands it does not model (``notes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..units import format_bytes
from .cards import GPUS, GiB, Gpu
from .states import STATES

__all__ = ["CATEGORIES", "COMPILE_BAND", "FitReport"]

#: The categories of the bar, in order: model states, then what the step adds at its peak.
CATEGORIES = (
    *STATES,
    "DDP buckets",
    "gathered unit",
    "activations",
    "transient",
    "step temporaries",
)

#: Published torch.compile (and Float8) peaks against the same recipe in eager mode, as
#: measured ratios: torchtitan's Llama 3.1 8B FSDP tables (benchmarks/
#: llama3_h100_202412_torchtitan.md: 8 GPUs 77.0 and 76.8 against 82.4 GiB; 128 GPUs 62.0 and
#: 61.8 against 67.0) and torchtune's Llama 3.2 3B (README "Optimization flags": 51.0 against
#: 60.0 GiB). A band, not a model: compile changes what is saved.
COMPILE_BAND = (51.0 / 60.0, 77.0 / 82.4)


@dataclass(frozen=True)
class FitReport:
    """One GPU's training memory at the step's peak, by category, for one choice of knobs.

    ``categories`` are the bytes held at the peak; ``peak_bytes`` their sum (PyTorch's
    ``max_memory_allocated``); ``headroom`` the named terms added on top (``{}`` with
    ``headroom=False``); ``total`` what the verdict compares with the GPU's memory.
    """

    preset: str
    batch: int
    seq: int
    precision: str
    optimizer: str
    checkpointing: str
    sharding: str
    n_gpus: int
    n_parameters: int
    categories: dict[str, int]
    model_states: dict[str, int]  # this GPU's share of the four states, gradients in full
    peaks: dict[str, int]  # the three moments' totals (before headroom)
    headroom: dict[str, int]
    gathered_unit: str
    formula_total: int | None
    gpu: Gpu | None = None
    seconds: float = field(default=0.0, compare=False)  # how long this answer took
    extras: tuple[str, ...] = ()  # the knobs beyond the classic ones, said in words
    notes: tuple[str, ...] = ()  # what the answer assumes, and the bands it does not model
    arguments: dict = field(default_factory=dict, compare=False, repr=False)  # to ask again
    unit_bytes: int = 0  # what ZeRO-3/FSDP's gathered units add while a unit computes

    @property
    def peak_bytes(self) -> int:
        return sum(self.categories.values())

    @property
    def states_bytes(self) -> int:
        """What no batch or checkpointing change can shrink: the model states (this GPU's
        share, every gradient), DDP's buckets and ZeRO-3's gathered unit."""
        extra = self.categories["DDP buckets"] + self.unit_bytes
        return sum(self.model_states.values()) + extra

    @property
    def headroom_bytes(self) -> int:
        return sum(self.headroom.values())

    @property
    def total(self) -> int:
        return self.peak_bytes + self.headroom_bytes

    @property
    def peak_moment(self) -> str:
        return max(self.peaks, key=self.peaks.__getitem__)

    @property
    def fits(self) -> bool | None:
        return None if self.gpu is None else self.total <= self.gpu.memory_bytes

    @property
    def fits_on(self) -> tuple[str, ...]:
        return tuple(name for name, capacity in GPUS.items() if self.total <= capacity)

    @property
    def verdict(self) -> str:
        """One sentence: fits or not, the number it used and the headroom it kept."""
        kept = (
            f"peak {format_bytes(self.peak_bytes)} + headroom {format_bytes(self.headroom_bytes)}"
            if self.headroom
            else f"peak {format_bytes(self.peak_bytes)}, no headroom kept"
        )
        if self.gpu is None:
            cards = ", ".join(self.fits_on) or "none of the cards in the table"
            return f"needs {format_bytes(self.total)} per GPU ({kept}): fits on {cards}"
        word = "fits" if self.fits else "does not fit"
        where = "one" if self.n_gpus == 1 else f"each of {self.n_gpus} x"
        return (
            f"{word} on {where} {self.gpu}: needs {format_bytes(self.total)} per GPU ({kept}) "
            f"of {format_bytes(self.gpu.memory_bytes)}"
        )

    @property
    def knobs(self) -> str:
        if self.sharding != "none":
            where = f"{self.sharding} over {self.n_gpus} GPUs"
        else:
            where = "one GPU" if self.n_gpus == 1 else f"DDP over {self.n_gpus} GPUs"
        more = "".join(f", {e}" for e in self.extras)
        return (
            f"{self.preset} ({self.n_parameters / 1e9:.2f} B params), batch {self.batch} x "
            f"{self.seq} tokens, {self.precision}, {self.optimizer}, checkpointing "
            f"{self.checkpointing}, {where}{more}"
        )

    @property
    def compile_band(self) -> tuple[int, int]:
        """The range published torch.compile / Float8 runs fall in against this eager answer
        (``COMPILE_BAND``), in bytes: a labelled band, not a prediction."""
        return int(COMPILE_BAND[0] * self.total), int(COMPILE_BAND[1] * self.total)

    def __repr__(self) -> str:
        lines = [f"FitReport({self.knobs})"]
        for name in CATEGORIES:
            if self.categories[name] or name in STATES:
                lines.append(f"  {name:<30}{format_bytes(self.categories[name]):>12}")
        at = f"peak, at the {self.peak_moment}"
        lines.append(f"  {at:<30}{format_bytes(self.peak_bytes):>12}")
        for name, nbytes in self.headroom.items():
            lines.append(f"  + {name:<28}{format_bytes(nbytes):>12}")
        lines.append(f"  {'total':<30}{format_bytes(self.total):>12}")
        if self.gathered_unit:
            lines.append(
                "  ZeRO-3 gathers one FSDP unit at a time (torchtitan's wrapping: each block, "
                f"then the root); the largest: {self.gathered_unit}"
            )
        formula = (
            format_bytes(self.formula_total)
            if self.formula_total is not None
            else f"no closed form for checkpointing {self.checkpointing}"
        )
        lines.append(f"  formula check (a sum, not a peak): {formula}")
        lines.append(f"  {self.verdict}")
        return "\n".join(lines)

    def plot(self, ax=None):
        """One stacked bar: the peak's categories, then each headroom term, and a line at the
        GPU's memory (or at each card of ``GPUS`` near the bar when no GPU was given)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(8, 2.8))
        left = 0.0
        parts = [(n, b) for n, b in self.categories.items()]
        parts += [(n, b) for n, b in self.headroom.items()]
        for name, nbytes in parts:
            gib = nbytes / GiB
            if gib > 0:
                hatch = "//" if name in self.headroom else None
                ax.barh(0, gib, left=left, label=name, hatch=hatch)
                left += gib
        biggest = self.total / GiB
        lines: dict[float, list[str]] = {}
        if self.gpu is not None:
            lines[self.gpu.memory_bytes / GiB] = [str(self.gpu)]
        else:
            for name, capacity in GPUS.items():
                lines.setdefault(capacity / GiB, []).append(name)
        holding = [c for c in lines if c >= biggest]
        xmax = max(1.15 * biggest, 1.08 * min(holding)) if holding else 1.15 * biggest
        shown = [c for c in sorted(lines) if c <= xmax]
        for i, capacity in enumerate(shown):
            ax.axvline(capacity, color="k", ls=(0, (2, 2)), lw=0.8)
            label = " / ".join(lines[capacity])
            ax.text(capacity, 0.55 + 0.15 * (i % 2), label, fontsize=7, ha="center")
        ax.set_xlim(0, xmax)
        ax.set_yticks([])
        ax.set_ylim(-0.5, 0.9)
        ax.set_xlabel("GiB on one GPU")
        word = {None: "needs", True: "fits:", False: "does not fit:"}[self.fits]
        ax.set_title(
            f"{self.preset}, batch {self.batch} x {self.seq}: {word} "
            f"{format_bytes(self.total)} per GPU",
            fontsize=9,
            wrap=True,
        )
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
        ax.figure.tight_layout()
        return ax
