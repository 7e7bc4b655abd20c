"""Notebook 00's helpers that a learner need not read: the course table, the rule behind each
decision of ``devices.capabilities().plan()``, and a stand-in ``nvidia-smi`` for the GPUtil check.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

#: The rule behind each decision ``Capabilities.plan()`` prints (one per key of the plan).
RULES = {
    "device": "CUDA, then MPS, then the CPU",
    "autocast dtype": "bf16 on a CPU or a GPU of compute capability 8.0+, else fp16",
    "GradScaler": "only with fp16, whose small gradients underflow",
    "TF32": "GPUs of compute capability 8.0+",
    "speed claims": "only on a GPU with the units each claim needs",
    "memory measured on": "the CUDA allocator, else counted CPU tensors",
    "DDP backend (2 processes)": "NCCL if each process has a GPU, else gloo",
    "DataParallel": "replicas on 2+ GPUs; a pass-through without CUDA",
}


def course_tables(course) -> str:
    """One Markdown table per track of ``tutorial_utils.course``: number, title, time, hardware."""
    tables = []
    for track in course.TRACKS:
        nbs = [nb for nb in course.NOTEBOOKS if nb.track == track]
        rows = [
            f"| [{nb.filename[:2]}]({nb.filename}) | {nb.title} | {nb.minutes} min | {nb.runs_on} |"
            for nb in nbs
        ]
        tables.append(
            f"**{track.capitalize()}** ({len(nbs)} notebooks, about "
            f"{sum(nb.minutes for nb in nbs)} minutes)\n\n"
            "| # | notebook | time | runs for real on |\n| --- | --- | --- | --- |\n"
            + "\n".join(rows)
        )
    return "\n\n".join(tables)


@contextmanager
def stand_in_nvidia_smi(used_mib: int = 1234) -> Iterator[list[int]]:
    """Put a fake ``nvidia-smi`` first on PATH: it prints one made-up GPU with ``used_mib`` MiB
    used and logs each start. Yields a one-element list that holds the number of starts once the
    block ends (POSIX only: the stand-in is a shell script)."""
    folder = tempfile.mkdtemp()
    script, log = os.path.join(folder, "nvidia-smi"), os.path.join(folder, "starts.log")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\necho started >> {log}\n")
        f.write(f"echo '0, GPU-0, 0, 16384, {used_mib}, 15150, 0, Stand-in GPU, 0, Disabled, ")
        f.write("Disabled, 30'\n")
    os.chmod(script, 0o755)
    path, starts = os.environ["PATH"], [0]
    os.environ["PATH"] = folder + os.pathsep + path
    try:
        yield starts
    finally:
        os.environ["PATH"] = path
        if os.path.exists(log):
            with open(log) as f:
                starts[0] = len(f.readlines())
        shutil.rmtree(folder)
