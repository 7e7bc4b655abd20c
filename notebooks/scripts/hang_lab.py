"""Notebook 14's hangs, each bounded by a timeout: run with torchrun on 2 ranks.

torchrun --nproc-per-node=2 hang_lab.py          # sections 1-4: three broken collectives
torchrun --nproc-per-node=2 hang_lab.py --die    # section 5: rank 1 dies mid-step
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")  # the flight recorder: before any group
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import report, teardown  # noqa: E402
from hang_tools import flight_record  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

TIMEOUT = timedelta(seconds=2)  # what each broken collective waits before it raises


def attempt(collective) -> str:
    """Run one collective; return "ok" or the first line of what it raised."""
    try:
        collective()
        return "ok"
    except RuntimeError as err:  # gloo's timeouts and mismatches are RuntimeErrors
        return str(err).splitlines()[0]


def lab(rank: int) -> dict:
    found = {}
    # 1. rank 1 skips an all_reduce: rank 0 waits in it until the group's timeout
    skip = dist.new_group(timeout=TIMEOUT)
    found["skipped"] = attempt(
        lambda: dist.all_reduce(torch.ones(4), group=skip) if rank == 0 else None
    )
    dist.barrier()  # every rank, on the default group (30 minutes), before the next case
    # 2. rank 1 is 4 s late: a monitored barrier on rank 0 names it
    late = dist.new_group(timeout=TIMEOUT)
    if rank == 1:
        time.sleep(2 * TIMEOUT.total_seconds())
    found["monitored"] = attempt(lambda: dist.monitored_barrier(late, TIMEOUT, wait_all_ranks=True))
    dist.barrier()
    # 3. with DETAIL, a group first compares each collective's fingerprint across ranks
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # as TORCH_DISTRIBUTED_DEBUG=DETAIL would
    checked = dist.new_group(timeout=TIMEOUT)
    found["shapes"] = attempt(lambda: dist.all_reduce(torch.ones(4 + rank), group=checked))
    if rank == 0:
        op = lambda: dist.all_reduce(torch.ones(4), group=checked)  # noqa: E731
    else:
        op = lambda: dist.broadcast(torch.ones(4), src=0, group=checked)  # noqa: E731
    found["ops"] = attempt(op)
    return found


@record  # torchrun's summary then shows this rank's exception, not "To enable traceback see..."
def die(rank: int) -> None:
    for step in range(3):
        grads = torch.full((4,), float(rank))
        if rank == 1 and step == 1:
            raise RuntimeError("rank 1: NaN in the loss at step 1, giving up")
        try:
            dist.all_reduce(grads)
        except RuntimeError as err:  # rank 0: what the others see when a rank dies
            report({"step": step, "error": str(err).splitlines()[0]})
            time.sleep(1.1)  # torchrun dates failures to the second: the dead rank's comes first
            raise


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if "--die" in sys.argv:
        die(rank)
    found = lab(rank)
    report({**found, "flight_record": flight_record(), "timeout_s": TIMEOUT.total_seconds()})
    teardown()


if __name__ == "__main__":
    main()
