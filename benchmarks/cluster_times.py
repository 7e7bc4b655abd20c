"""How long the course's two-node Slurm cluster takes to start, stop, and end a failed job.

    sudo .venv/bin/python benchmarks/cluster_times.py            # 5 runs of each, about 4 min
    sudo .venv/bin/python benchmarks/cluster_times.py --runs 9

What ``tests/test_cluster.py`` no longer times (a test checks what the code does, not how
fast): ``tools/cluster.py start`` until both nodes are idle (``start()`` itself gives up after
60 s), ``stop``, and a job in which one rank fails while the other sleeps 120 s
(``crash_demo.py`` through ``slurm_ddp.sbatch``): its Slurm run time and ``sbatch --wait``'s
wall time, which stay far below 120 s because ``srun --kill-on-bad-exit`` ends the other node's
torchrun. Medians over ``--runs`` runs, with the load average: a busy machine is slower. Needs
root and Slurm (``python tools/cluster.py install``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import cluster as slurm  # noqa: E402


def _seconds(run_time: str) -> int:
    """Slurm's RunTime ([D-]HH:MM:SS) in seconds."""
    days, _, clock = run_time.rpartition("-")
    h, m, s = map(int, clock.split(":"))
    return int(days or 0) * 86_400 + h * 3600 + m * 60 + s


def failed_job(up: slurm.Cluster, folder: Path) -> tuple[float, int]:
    """(sbatch --wait wall seconds, Slurm run time in seconds) of one crash_demo.py job."""
    env = up.env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    env["TUTORIAL_REPORT_DIR"] = str(folder / "reports")
    env["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    done = subprocess.run(
        ["sbatch", "--parsable", "--wait", "--gpus-per-node=0", "--cpus-per-task=1",
         "slurm_ddp.sbatch", "crash_demo.py"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    wall = time.perf_counter() - start
    job = done.stdout.strip()
    text = up.run("scontrol", "show", "job", job).stdout
    run_time = next(w.split("=", 1)[1] for w in text.split() if w.startswith("RunTime="))
    return wall, _seconds(run_time)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each (default 5)")
    runs = parser.parse_args().runs
    if os.geteuid() != 0:
        sys.exit("the cluster's daemons run as root: run this as root")
    slurm.ensure_installed()
    starts, stops, walls, run_times = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="cluster-times-") as tmp:
        for k in range(runs):
            up = slurm.start(Path(tmp) / f"c{k}", tied_to_parent=True)
            starts.append(up.start_seconds)
            try:
                folder = Path(tmp) / f"job{k}"
                shutil.copytree(ROOT / "notebooks" / "scripts", folder)
                (folder / "reports").mkdir()
                wall, run_time = failed_job(up, folder)
                walls.append(wall)
                run_times.append(run_time)
            finally:
                began = time.perf_counter()
                stopped = slurm.stop(up)
                stops.append(time.perf_counter() - began)
            if stopped.left:
                sys.exit(f"processes of the cluster still running: {stopped}")
    med = statistics.median
    print(f"{runs} runs each, medians (min-max):")
    for name, values, unit in (
        ("start until both nodes idle", starts, "s"),
        ("stop (jobs, then daemons)", stops, "s"),
        ("failed job: sbatch --wait", walls, "s"),
        ("failed job: Slurm RunTime", run_times, "s (whole seconds)"),
    ):
        print(f"  {name:30} {med(values):6.1f} {unit}  ({min(values):.1f}-{max(values):.1f})")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
