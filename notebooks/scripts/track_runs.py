"""Notebook 10 §4: notebook 09's ZeRO setups and notebook 08's pipelines, in one launch.

    torchrun --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 track_runs.py

Runs ``zero_stages.main()`` and then ``pipeline_gpipe.main()`` (one micro-batch checked, GPipe
and 1F1B compared at 8) in the same processes: one start of torch and one process group instead
of two launches. Each script's report is kept under its name ("zero", "pipe") and sent back once.
"""

from __future__ import annotations

import os
import sys

import common
import pipeline_gpipe
import torch.distributed as dist
import zero_stages


def main() -> None:
    rank, world, device = common.setup()
    reports: dict[str, dict] = {}
    for name, script, args in (
        ("zero", zero_stages, []),
        ("pipe", pipeline_gpipe, ["--microbatches", "1"]),
    ):
        # The script's own setup, report and teardown, replaced: the group is already made, the
        # report is kept for later, and the process stays alive for the next script.
        script.setup = lambda: (rank, world, device)
        script.report = lambda data, name=name: reports.__setitem__(name, data)
        script.teardown = dist.barrier
        sys.argv = [os.path.basename(script.__file__), *args]  # its options; within() names it
        script.main()
    common.report(reports)
    common.teardown()


if __name__ == "__main__":
    main()
