"""A job in which one rank fails: notebook 07 launches it to show what launch() does then."""

from __future__ import annotations

import sys
import time

from common import setup

rank, world, device = setup()
if rank == 1:
    print("rank 1: reading my shard of the data", flush=True)
    print("rank 1: my shard is missing, giving up", flush=True)
    sys.exit(1)
time.sleep(120)  # rank 0 is still busy when rank 1 fails: torchrun stops it
