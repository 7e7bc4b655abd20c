"""Two-node Slurm runs recorded on the course's cluster, shown in notebook 03 with their label.

``tools/record_cluster_run.py`` (as root) starts the course's two-node cluster
(``make cluster``), submits ``notebooks/scripts/slurm_ddp.sbatch`` and writes
``docs/results/slurm-two-node-<date>.json``. ``show(key)`` returns the newest run for ``key``
(``"ddp"``: the course's job; ``"rank_fails"``: the same script running ``crash_demo.py``) as a
value whose first line says where and when it ran; never as if it had just run. A missing or
malformed file is one line saying so.

>>> print(show("ddp", results_dir="/nonexistent"))  # doctest: +ELLIPSIS
No two-node Slurm run recorded yet...
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .recorded import find_results_dir

__all__ = ["KEYS", "ClusterRun", "load_runs", "show"]

SCHEMA = 1
KEYS = {
    "ddp": "03: slurm_ddp.sbatch as written (ddp_train.py, 3 epochs) on nodes n1 and n2",
    "rank_fails": "03: the same script running crash_demo.py, whose rank 1 gives up",
}


def load_runs(results_dir: str | os.PathLike | None = None) -> list[dict]:
    """Every readable ``slurm-two-node-*.json`` in ``results_dir``, newest first."""
    folder = Path(results_dir) if results_dir is not None else find_results_dir()
    if folder is None or not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("slurm-two-node-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            continue  # half-written, foreign or nested too deeply: not a record
        if (
            isinstance(record, dict)
            and record.get("schema") == SCHEMA
            and isinstance(record.get("runs"), dict)
        ):
            record["_file"] = path.name
            found.append(record)
    found.sort(key=lambda r: (str(r.get("date", "")), r["_file"]), reverse=True)
    return found


@dataclass(frozen=True)
class ClusterRun:
    """One recorded job, or the statement that none was recorded. Shown by evaluating it."""

    key: str
    command: str = ""
    state: str = ""
    run_time: str = ""
    output: tuple[str, ...] = ()
    reports: dict = field(default_factory=dict)  # rank (int) -> what that rank reported
    source: dict = field(default_factory=dict)  # date, slurm, torch, machine, file

    @property
    def found(self) -> bool:
        return bool(self.source)

    @property
    def label(self) -> str:
        if not self.found:
            return (
                f"No two-node Slurm run recorded yet for {self.key!r}: as root, "
                "`python tools/record_cluster_run.py` records one into docs/results/."
            )
        s = self.source
        return (
            f"Recorded on the course's two-node Slurm cluster ({s.get('slurm', '?')}; "
            f"{s.get('machine', '?')}), torch {s.get('torch', '?')}, {s.get('date', '?')} "
            "(not run here)"
        )

    def lines(self) -> list[str]:
        if not self.found:
            return [self.label]
        return [
            self.label,
            f"$ {self.command}",
            *self.output,
            f"job state {self.state}, run time {self.run_time}",
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        body = html.escape("\n".join(self.lines()[1:]))
        return f"<p><em>{html.escape(self.label)}</em></p>" + (f"<pre>{body}</pre>" if body else "")


def show(key: str, results_dir: str | os.PathLike | None = None) -> ClusterRun:
    """The newest recorded run for ``key`` (one of ``KEYS``), labelled with where it ran."""
    if key not in KEYS:
        raise ValueError(f"unknown run {key!r}; recorded runs are: {', '.join(KEYS)}")
    for record in load_runs(results_dir):
        run = record["runs"].get(key)
        if not isinstance(run, dict) or not isinstance(run.get("output"), list):
            continue
        try:
            reports = {int(k): v for k, v in dict(run.get("reports", {})).items()}
        except (TypeError, ValueError):
            continue  # a rank that is not a number: not a record we can read
        return ClusterRun(
            key=key,
            command=str(run.get("command", "")),
            state=str(run.get("state", "?")),
            run_time=str(run.get("run_time", "?")),
            output=tuple(str(x) for x in run["output"]),
            reports=reports,
            source={k: record.get(k, "?") for k in ("date", "slurm", "torch", "machine", "_file")},
        )
    return ClusterRun(key=key)
