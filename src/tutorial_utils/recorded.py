"""GPU results recorded on a real machine, shown beside the cells they belong to.

A learner without a GPU still deserves to see what a GPU shows. ``make gpu-check`` on a GPU
machine writes one JSON file per run into ``docs/results/`` (named by device and date); the
notebooks call ``recorded.show(key)`` next to a GPU-only cell, which returns the newest recorded
result for that key as a value whose repr says, first, where and when it was measured. It never
pretends to have just run. Until a run is recorded, a notebook shows the published figure
quoted for that key (``QUOTED``: one of ``published.keys()``, with its hardware and source), or
nothing at all: how a maintainer records a run is the maintainers' business (``label`` says it,
for docs and tests), not a learner's.

>>> print(repr(str(show("no_such_key", results_dir="/nonexistent"))))
''

The file format (``schema`` 1)::

    {"schema": 1, "date": "2026-12-01", "torch": "2.11.0+cu130", "python": "3.12.3",
     "device": {"name": "NVIDIA H200", "compute_capability": [9, 0], "total_bytes": ...,
                "gpu_count": 1, "driver": "..."},
     "results": {"h2d_bandwidth": {"title": "...", "columns": [...], "rows": [[...], ...],
                                   "note": "..."},
                 "oom_message": {"title": "...", "text": "..."}},
     "notebooks": [{"name": "00_start_here.ipynb", "passed": true, "seconds": 12.3}]}

``make gpu-check`` (``tools/gpu_check.py``) writes this file and adds ``goals``,
``unit_tests``, ``torch_api``, ``phases`` and, per result, ``figures``; a result that could not
be measured carries ``skipped`` or ``error`` instead of data, and ``show`` passes over it to an
older run. Only runs made on a GPU (with a ``compute_capability``) are read: a CPU try-out of
the check is never shown as a GPU result.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["KEYS", "Recorded", "find_results_dir", "load_runs", "read_records", "show"]

SCHEMA = 1
GPU_CHECK_KIND = "gpu-check"  # files without a "kind" are GPU-check runs too (the first ones)

# What the GPU check records, and the notebook that shows each one.
KEYS: dict[str, str] = {
    "allocator_vs_nvml": "00: allocated / reserved / NVML used after allocating a tensor",
    "h2d_bandwidth": "01: host-to-device copies, pageable vs pinned",
    "oom_message": "04: a real CUDA out-of-memory message, verbatim",
    "expandable_segments": "04: reserved minus allocated, with and without expandable segments",
    "empty_cache": "04: reserved memory before and after torch.cuda.empty_cache()",
    "checkpointing": "03: activation checkpointing, memory saved and time paid",
    "amp_speed": "05: one training step in fp32 / TF32 / bf16 / fp16 autocast",
    "cudnn_benchmark": "05: cudnn.benchmark on and off, fixed and varying shapes",
    "matmul_peak": "05: a large matrix product as a share of the measured peak",
    "spike_test": "00: a short memory spike seen by the allocator, NVML, GPUtil and the gauge",
    "source_cost": "00: the cost of one reading from each gauge source",
    "inference_mode": "04: forward passes with grad, no_grad and inference_mode",
}


#: The published figure a notebook shows for a key until a GPU run of it is recorded (keys of
#: ``published.json``). A key without one shows nothing until then.
QUOTED: dict[str, str] = {
    "allocator_vs_nvml": "cuda_context",
    "amp_speed": "amp_speedup",
}  # h2d_bandwidth: 01's pinning cell quotes pin_then_copy and shows this run beside it


def find_results_dir(start: str | os.PathLike | None = None) -> Path | None:
    """``docs/results`` of the course: ``TUTORIAL_RESULTS_DIR``, else searched upward from
    ``start``."""
    env = os.environ.get("TUTORIAL_RESULTS_DIR")
    if env:
        return Path(env)
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "docs" / "results"
        if candidate.is_dir():
            return candidate
    return None


def _run_problem(run: object) -> str | None:
    """Why ``run`` (a parsed file) is not a GPU run this module can show; None when it is.

    A foreign, older-schema or CPU try-out file is passed over quietly (``""``); a file that
    claims to be a GPU run but is malformed gets a reason, so ``show`` can name it.
    """
    if not isinstance(run, dict) or run.get("schema") != SCHEMA:
        return ""  # not one of ours (or an older schema)
    if run.get("kind", GPU_CHECK_KIND) != GPU_CHECK_KIND:
        return ""  # another record kept beside the GPU runs (a Slurm run: recorded_cluster)
    device = run.get("device")
    if not isinstance(device, dict) or not isinstance(run.get("results"), dict):
        return "its 'device' and 'results' must be objects"
    cc = device.get("compute_capability")
    if not cc:
        return ""  # a CPU try-out of the check: never shown as a GPU result
    if (
        not isinstance(cc, (list, tuple))
        or len(cc) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in cc)
    ):
        return f"its compute_capability must be two whole numbers such as [9, 0], not {cc!r}"
    return None


def _entry_problem(entry: dict) -> str | None:
    """Why a result entry cannot be shown as a table or text; None when it can."""
    columns, rows = entry.get("columns", []), entry.get("rows", [])
    if not isinstance(columns, (list, tuple)):
        return f"its columns must be a list, not {type(columns).__name__}"
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in rows):
        return "its rows must be a list of lists"
    return None


def load_runs(
    results_dir: str | os.PathLike | None = None, skipped: list[str] | None = None
) -> list[dict]:
    """Every readable run in ``results_dir``, newest first (by date, then file name).

    A file that cannot be read (not JSON, nested too deeply for the parser, a malformed GPU
    run) is left out; with ``skipped`` given, one line per such file is appended to it.
    """
    return read_records("*.json", _run_problem, results_dir, skipped)


def read_records(
    pattern: str,
    problem: Callable[[object], str | None],
    results_dir: str | os.PathLike | None = None,
    skipped: list[str] | None = None,
) -> list[dict]:
    """The files of ``results_dir`` matching ``pattern`` that ``problem`` accepts, newest first.

    ``problem(parsed)`` is None for a record to read, ``""`` for a file to pass over quietly
    (not this kind of record), else why it cannot be read: that line, and each file that is not
    JSON, is appended to ``skipped`` when given. Each record gets ``_file``, its file's name.
    """
    folder = Path(results_dir) if results_dir is not None else find_results_dir()
    if folder is None or not folder.is_dir():
        return []
    runs = []
    for path in sorted(folder.glob(pattern)):
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as exc:  # half-written, foreign, hostile
            if skipped is not None:
                why = "nested too deeply" if isinstance(exc, RecursionError) else "not valid JSON"
                skipped.append(f"{path.name}: {why}")
            continue
        why = problem(run)
        if why is None:
            run["_file"] = path.name
            runs.append(run)
        elif why and skipped is not None:
            skipped.append(f"{path.name}: {why}")
    runs.sort(key=lambda r: (str(r.get("date", "")), r["_file"]), reverse=True)
    return runs


@dataclass(frozen=True)
class Recorded:
    """One recorded result, or the statement that none exists. Shown by evaluating it."""

    key: str
    title: str = ""
    columns: tuple[str, ...] = ()
    rows: tuple[tuple, ...] = ()
    text: str = ""
    note: str = ""
    source: dict = field(default_factory=dict)  # device, torch, date, file of the run
    skipped: tuple[str, ...] = ()  # files (and entries) passed over, each with why

    @property
    def found(self) -> bool:
        return bool(self.source)

    @property
    def quoted(self):
        """The published figure shown while no run is recorded (``QUOTED``), else None."""
        if self.found or self.key not in QUOTED:
            return None
        from tutorial_utils import published

        return published.show(QUOTED[self.key])

    @property
    def label(self) -> str:
        if not self.found:
            return (
                f"No GPU run recorded yet for {self.key!r}: on a GPU machine, `make gpu-check` "
                "records one into docs/results/ (see docs/results/README.md)."
            )
        dev = self.source.get("device", {})
        cc = dev.get("compute_capability")
        cc_text = f", compute capability {cc[0]}.{cc[1]}" if cc else ""
        return (
            f"Recorded on {dev.get('name', 'unknown GPU')}{cc_text}, "
            f"torch {self.source.get('torch', '?')}, "
            f"{self.source.get('date', '?')} (not run here)"
        )

    def _table_lines(self) -> list[str]:
        cells = [tuple(str(c) for c in self.columns)] + [
            tuple(str(c) for c in r) for r in self.rows
        ]
        widths = [
            max(len(row[i]) for row in cells if i < len(row)) for i in range(len(self.columns))
        ]
        return [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
            for row in cells
        ]

    @property
    def skipped_note(self) -> str:
        if not self.skipped:
            return ""
        return "Skipped in docs/results (could not be read): " + "; ".join(self.skipped)

    def __str__(self) -> str:
        if not self.found and not self.skipped:  # what a learner sees: the quote, or nothing
            return str(self.quoted or "")
        lines = [self.label]
        if self.found:
            if self.title:
                lines.append(self.title)
            if self.columns:
                lines += self._table_lines()
            if self.text:
                lines.append(self.text)
            if self.note:
                lines.append(self.note)
        if self.skipped:
            lines.append(self.skipped_note)
        return "\n".join(lines)

    __repr__ = __str__

    def _ipython_display_(self) -> None:
        """In a notebook: the run, the quoted figure until there is one, or nothing at all."""
        from IPython.display import display

        if self.found or self.skipped:
            display({"text/plain": str(self), "text/html": self._repr_html_()}, raw=True)
        elif self.quoted is not None:
            display(self.quoted)

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = [f"<p><em>{esc(self.label)}</em></p>"]
        if self.found:
            if self.title:
                parts.append(f"<p><b>{esc(self.title)}</b></p>")
            if self.columns:
                head = "".join(f"<th>{esc(str(c))}</th>" for c in self.columns)
                body = "".join(
                    "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>"
                    for row in self.rows
                )
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            if self.text:
                parts.append(f"<pre>{esc(self.text)}</pre>")
            if self.note:
                parts.append(f"<p>{esc(self.note)}</p>")
        if self.skipped:
            parts.append(f"<p><em>{esc(self.skipped_note)}</em></p>")
        return "".join(parts)


def show(key: str, results_dir: str | os.PathLike | None = None) -> Recorded:
    """The newest recorded result for ``key`` (one of ``KEYS``), labelled with where it ran."""
    if key not in KEYS and results_dir is None:
        raise ValueError(f"unknown result {key!r}; the GPU check records: {', '.join(KEYS)}")
    skipped: list[str] = []
    for run in load_runs(results_dir, skipped):
        entry = run["results"].get(key)
        if not isinstance(entry, dict) or entry.get("skipped") or entry.get("error"):
            continue  # nothing was measured for this key in that run
        problem = _entry_problem(entry)
        if problem:
            skipped.append(f"{run['_file']} ({key}): {problem}")
            continue
        return Recorded(
            key=key,
            title=str(entry.get("title", "")),
            columns=tuple(entry.get("columns", ())),
            rows=tuple(tuple(r) for r in entry.get("rows", ())),
            text=str(entry.get("text", "")),
            note=str(entry.get("note", "")),
            source={
                "device": run.get("device", {}),
                "torch": run.get("torch", "?"),
                "date": run.get("date", "?"),
                "file": run["_file"],
            },
            skipped=tuple(skipped),
        )
    return Recorded(key=key, skipped=tuple(skipped))
