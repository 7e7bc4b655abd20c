"""How long ``tutorial_utils.distributed.launch`` takes to run, to stop a hung job, and to refuse.

    .venv/bin/python benchmarks/launch_times.py            # 5 runs of each, about 2.5 min
    .venv/bin/python benchmarks/launch_times.py --runs 9

What ``tests/test_distributed.py`` no longer times (a test checks what the code does, not how
fast): the wall time of a two-rank gloo job that only joins and leaves; for a job whose rank 1
sleeps, how long after its ``timeout`` ``launch`` raises (every process stopped and reaped);
and how long ``launch`` takes to refuse a busy explicit port (nothing is started). Medians over
``--runs`` runs, with the load average: a busy machine is slower.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

from tutorial_utils.distributed import LaunchError, PortInUseError, launch

JOIN = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""

HANG = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(600)
dist.barrier()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each (default 5)")
    parser.add_argument("--timeout", type=float, default=10.0, help="the hung job's timeout")
    args = parser.parse_args()
    walls, stops, refusals = [], [], []
    with tempfile.TemporaryDirectory(prefix="launch-times-") as tmp:
        join, hang = Path(tmp) / "join.py", Path(tmp) / "hang.py"
        join.write_text(JOIN)
        hang.write_text(HANG)
        for _ in range(args.runs):  # interleaved, so a change of load hits all three alike
            walls.append(launch(join, nproc=2, timeout=120, echo=None).wall_seconds)
            began = time.perf_counter()
            try:
                launch(hang, nproc=2, timeout=args.timeout, echo=None)
            except LaunchError:
                stops.append(time.perf_counter() - began - args.timeout)
            else:
                raise SystemExit("the hung job did not time out")
            with socket.create_server(("127.0.0.1", 0)) as busy:
                began = time.perf_counter()
                try:
                    launch(join, nproc=2, port=busy.getsockname()[1], echo=None)
                except PortInUseError:
                    refusals.append(time.perf_counter() - began)
    med = statistics.median
    print(f"{args.runs} runs each, medians (min-max):")
    for name, values, unit in (
        ("two-rank job, join and leave", walls, "s"),
        (f"hung job: past its {args.timeout:g} s timeout", stops, "s"),
        ("busy explicit port refused", [1000 * v for v in refusals], "ms"),
    ):
        print(f"  {name:34} {med(values):7.2f} {unit}  ({min(values):.2f}-{max(values):.2f})")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
