"""Two-node Slurm runs recorded on the course's cluster, shown in notebook 07 with their label.

``tools/record_cluster_run.py`` (as root) starts the course's two-node cluster
(``make cluster``), submits ``notebooks/scripts/slurm_ddp.sbatch`` and writes
``docs/results/slurm-two-node-<date>.json``. ``show(key)`` returns the newest run for ``key``
(``"ddp"``: the course's job; ``"rank_fails"``: the same script running ``crash_demo.py``) as a
value whose first line says where and when it ran; never as if it had just run. Nothing
recorded is one line saying so; a file that could not be read is named, with why, below it.

>>> print(show("ddp", results_dir="/nonexistent"))  # doctest: +ELLIPSIS
No two-node Slurm run recorded yet...
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

from .recorded import read_records

__all__ = ["KEYS", "ClusterRun", "load_runs", "show"]

SCHEMA = 1
KEYS = {
    "ddp": "07: slurm_ddp.sbatch as written (ddp_train.py, 3 epochs) on nodes n1 and n2",
    "rank_fails": "07: the same script running crash_demo.py, whose rank 1 gives up",
}


KIND = "slurm-two-node"


def _record_problem(record: object) -> str | None:
    """None for a Slurm record to read; ``""`` for another kind of file; else why not."""
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        return ""  # not one of ours (or an older schema)
    if record.get("kind", KIND) != KIND:
        return ""
    if not isinstance(record.get("runs"), dict):
        return "its 'runs' must be an object"
    return None


def load_runs(
    results_dir: str | os.PathLike | None = None, skipped: list[str] | None = None
) -> list[dict]:
    """Every readable ``slurm-two-node-*.json`` in ``results_dir``, newest first; with
    ``skipped`` given, one line per file that could not be read is appended to it."""
    return read_records("slurm-two-node-*.json", _record_problem, results_dir, skipped)


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
    skipped: tuple[str, ...] = ()  # files (and runs) passed over, each with why

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
        lines = [self.label]
        if self.found:
            lines += [
                f"$ {self.command}",
                *self.output,
                f"job state {self.state}, run time {self.run_time}",
            ]
        if self.skipped:
            lines.append("Skipped in docs/results (could not be read): " + "; ".join(self.skipped))
        return lines

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
    skipped: list[str] = []
    for record in load_runs(results_dir, skipped):
        run = record["runs"].get(key)
        if run is None:
            continue  # not recorded in that file
        if not isinstance(run, dict) or not isinstance(run.get("output"), list):
            skipped.append(f"{record['_file']} ({key}): its 'output' must be a list of lines")
            continue
        try:
            reports = {int(k): v for k, v in dict(run.get("reports", {})).items()}
        except (TypeError, ValueError):
            skipped.append(f"{record['_file']} ({key}): its 'reports' must be keyed by rank")
            continue
        return ClusterRun(
            key=key,
            command=str(run.get("command", "")),
            state=str(run.get("state", "?")),
            run_time=str(run.get("run_time", "?")),
            output=tuple(str(x) for x in run["output"]),
            reports=reports,
            source={k: record.get(k, "?") for k in ("date", "slurm", "torch", "machine", "_file")},
            skipped=tuple(skipped),
        )
    return ClusterRun(key=key, skipped=tuple(skipped))
