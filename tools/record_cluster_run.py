"""Record a real two-node Slurm run of the course's script, for notebook 07 to show.

    .venv/bin/python tools/record_cluster_run.py          # as root; about a minute

Starts the course's cluster (tools/cluster.py: nodes n1 and n2 on this machine), submits
``notebooks/scripts/slurm_ddp.sbatch`` exactly as a learner does on it (a copy of the scripts
folder, ``sbatch --wait --gpus-per-node=0 --cpus-per-task=1 slurm_ddp.sbatch``), then the same
script with ``crash_demo.py`` (rank 1 fails), stops the cluster, and writes
``docs/results/slurm-two-node-<date>.json`` (read by ``tutorial_utils.recorded_cluster``) and a
markdown twin. Labelled with the date, the Slurm and torch versions; paths are cut out.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster as slurm  # noqa: E402

SCHEMA = 1
CPU_CLUSTER = ["--gpus-per-node=0", "--cpus-per-task=1"]


def _clean(lines: list[str]) -> list[str]:
    """The job's output without Python tracebacks (torchrun prints its own) or local paths."""
    out, in_traceback = [], False
    venv = str(Path(sys.executable).parent)
    for line in lines:
        if line.startswith("Traceback (most recent call last):"):
            in_traceback = True
            continue
        if in_traceback:
            if line.startswith((" ", "\t")) or not line.strip():
                continue
            in_traceback = False
            if not line.startswith("torch.distributed.elastic.multiprocessing.errors"):
                out.append(line.replace(venv + "/", ""))
            continue
        if re.match(r"frame #\d+:|<omitting python frames>|Exception raised from ", line):
            continue  # a C++ stack: where in torch, not what happened
        line = line.replace(venv + "/python", "python").replace(venv + "/", "")
        line = line.replace(str(ROOT) + "/", "")
        line = re.sub(r"^\[([EWI])\d{4} [\d:.]+ ", r"[\1 ", line)  # time (C++ log lines)
        line = re.sub(r"^([EWI])\d{4} \d\d:\d\d:\d\d\.\d+ \d+ ", r"\1 ", line)  # time, pid
        line = re.sub(r"\(pid: \d+\)", "(pid: PID)", line)
        line = re.sub(r"Process \d+ got", "Process PID got", line)
        line = re.sub(r"process \d+ closing", "process PID closing", line)
        line = re.sub(r"time      : \S+", "time      : TIME", line)
        if line.strip():
            out.append(line.rstrip())
    return out


def _job(up: slurm.Cluster, folder: Path, args: list[str]) -> dict:
    env = up.env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    env["TUTORIAL_REPORT_DIR"] = str(folder / "reports")
    env["OMP_NUM_THREADS"] = "1"
    shutil.rmtree(folder / "reports", ignore_errors=True)
    (folder / "reports").mkdir()
    command = ["sbatch", "--wait", *CPU_CLUSTER, "slurm_ddp.sbatch", *args]
    began = time.monotonic()
    done = subprocess.run(
        ["sbatch", "--parsable", *command[1:]],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.monotonic() - began
    job = int(re.match(r"\d+", done.stdout.strip()).group(0))
    fields = up.run("scontrol", "show", "job", str(job)).stdout
    field = {k: re.search(rf"\b{k}=(\S+)", fields).group(1) for k in ("JobState", "RunTime")}
    output = (folder / f"ddp-train-{job}.out").read_text().splitlines()
    reports = {
        int(p.stem[4:]): json.loads(p.read_text())
        for p in sorted((folder / "reports").glob("rank*.json"))
    }
    return {
        "command": " ".join(command),
        "job_id": job,
        "exit_status": done.returncode,
        "state": field["JobState"],
        "run_time": field["RunTime"],
        "sbatch_wait_seconds": round(wall, 1),
        "output": _clean(output),
        "reports": {
            str(rank): {k: r[k] for k in ("rank", "world", "backend", "node", "saved_checkpoint")}
            | {"params": r["params"]}
            for rank, r in reports.items()
        },
    }


def main() -> int:
    slurm.ensure_installed()
    with tempfile.TemporaryDirectory(prefix="record-cluster-") as tmp:
        up = slurm.start(Path(tmp) / "cluster", port=None, tied_to_parent=True)
        try:
            version = up.run("sinfo", "--version")
            sinfo = up.run("sinfo").stdout.rstrip().splitlines()
            folder = Path(tmp) / "scripts"
            shutil.copytree(ROOT / "notebooks" / "scripts", folder)
            runs = {"ddp": _job(up, folder, []), "rank_fails": _job(up, folder, ["crash_demo.py"])}
        finally:
            stopped = slurm.stop(up)
    if stopped.left:
        print(f"warning: {stopped}", file=sys.stderr)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    record = {
        "schema": SCHEMA,
        "kind": "slurm-two-node",
        "date": today,
        "slurm": version.stdout.strip(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": f"one machine, {os.cpu_count()} CPUs, no GPU; nodes n1 and n2 on 127.0.0.1",
        "cluster_start_seconds": round(up.start_seconds, 1),
        "sinfo": sinfo,
        "runs": runs,
    }
    out = ROOT / "docs" / "results" / f"slurm-two-node-{today}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    md = [
        f"# Two-node Slurm run, {today}",
        "",
        f"{record['slurm']}, torch {record['torch']}, Python {record['python']}; "
        f"{record['machine']}. Cluster up in {record['cluster_start_seconds']} s "
        "(`tools/cluster.py`). Written by `tools/record_cluster_run.py`; notebook 07 shows it.",
        "",
        "```",
        *sinfo,
        "```",
    ]
    for key, run in runs.items():
        md += [
            "",
            f"## {key}: `{run['command']}`",
            "",
            f"Job {run['job_id']}: {run['state']}, run time {run['run_time']}, "
            f"`sbatch --wait` returned after {run['sbatch_wait_seconds']} s "
            f"(exit status {run['exit_status']}).",
            "",
            "```",
            *run["output"],
            "```",
        ]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {out.relative_to(ROOT)} and its .md")
    for key, run in runs.items():
        print(f"{key}: {run['state']} in {run['run_time']} ({run['sbatch_wait_seconds']} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
