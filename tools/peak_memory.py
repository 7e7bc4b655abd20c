"""Run a command and report the peak memory of its whole process tree (the Binder budget check).

    python tools/peak_memory.py -- \
        .venv/bin/python tools/run_notebooks.py --cpu notebooks/04_out_of_memory.ipynb
    python tools/peak_memory.py --json out.json --interval 0.05 -- CMD ARGS...

Binder gives a session about 2 GB, counted over every process of the session: the Jupyter
server, the kernel, and whatever the kernel starts (torchrun and its ranks in notebooks 03/04).
So this samples the command's process and all its descendants every ``--interval`` seconds and
keeps the largest sum of

* **PSS** (proportional set size, Linux): each process's resident pages, with pages shared by
  several processes divided among them; the sum over a tree counts shared libraries once. This is
  the figure to compare with a memory limit.
* **RSS** (resident set size): the same without dividing shared pages, so shared libraries are
  counted once per process; an upper bound.

Sampling can miss a spike shorter than the interval: the result is a lower bound of the true
peak, and says how many samples it took. The command's exit status is passed through.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

MiB = 2**20


@dataclass
class Peak:
    command: list[str]
    returncode: int
    wall_s: float
    samples: int
    interval_s: float
    peak_pss_bytes: int | None  # None where PSS cannot be read (not Linux)
    peak_rss_bytes: int
    peak_processes: int

    def __str__(self) -> str:
        pss = "n/a" if self.peak_pss_bytes is None else f"{self.peak_pss_bytes / MiB:,.0f} MiB"
        return (
            f"peak PSS {pss}, peak RSS {self.peak_rss_bytes / MiB:,.0f} MiB "
            f"(process tree of up to {self.peak_processes} processes, {self.samples} samples "
            f"every {self.interval_s:g} s over {self.wall_s:.1f} s; exit status {self.returncode})"
        )


def tree_memory(root: psutil.Process) -> tuple[int | None, int, int]:
    """(PSS, RSS, process count) summed over ``root`` and its descendants, now."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0, 0
    pss: int | None = 0
    rss = count = 0
    for proc in procs:
        try:
            if pss is not None:
                try:
                    pss += proc.memory_full_info().pss
                except AttributeError:  # no PSS on this platform
                    pss = None
            rss += proc.memory_info().rss
            count += 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # it ended between listing and reading
        except psutil.AccessDenied:
            pss = None  # another user's process: PSS unreadable; RSS of the rest still counts
    return pss, rss, count


def measure(command: list[str], interval_s: float = 0.1) -> Peak:
    """Run ``command`` to its end and return the peak memory of its process tree."""
    if not command:
        raise ValueError("give the command to run after --, e.g. -- python script.py")
    if not interval_s > 0:
        raise ValueError(f"interval must be a positive number of seconds, not {interval_s!r}")
    start = time.monotonic()
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    peak_pss: int | None = 0
    peak_rss = peak_n = samples = 0
    next_sample = time.monotonic()
    try:
        while child.poll() is None:
            pss, rss, n = tree_memory(root)
            samples += 1
            peak_pss = None if pss is None or peak_pss is None else max(peak_pss, pss)
            peak_rss, peak_n = max(peak_rss, rss), max(peak_n, n)
            next_sample += interval_s  # drift-free: the next tick, not now + interval
            time.sleep(max(0.0, next_sample - time.monotonic()))
    except BaseException:
        child.kill()
        child.wait()
        raise
    return Peak(
        command=list(command),
        returncode=child.returncode,
        wall_s=time.monotonic() - start,
        samples=samples,
        interval_s=interval_s,
        peak_pss_bytes=peak_pss,
        peak_rss_bytes=peak_rss,
        peak_processes=peak_n,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="also write the result there as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        peak = measure(command, args.interval)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    print(peak, file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(asdict(peak), indent=1) + "\n")
    return peak.returncode


if __name__ == "__main__":
    sys.exit(main())
