"""One run of ``fit_cpu_offload_fake.py --both`` per test run, shared by the two test files.

``test_fit_fsdp2_moments.py`` (the FSDP2 profile over a grid of shapes) and
``test_fit_cpu_offload.py`` (what CPU offload takes off the device) read the counts of the same
child: its grid's first shape is the offload test's control, so the child runs that shape once.
The two files may land on different pytest-xdist workers, so the first to ask runs the child
and writes its output beside a lock; the other waits on the lock and reads it. The file is
named after the run (``PYTEST_XDIST_TESTRUNUID``, the same in every worker of one run): a later
run, on other code, never reads it. Outside xdist each call runs the child.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path

from tutorial_utils import processes

SCRIPT = Path(__file__).with_name("fit_cpu_offload_fake.py")

# The calculator's moments are the script's: the end of forward (the most held as the loss is
# made), three windows of backward (the head's, the later blocks', the first block's and the
# embedding's: the most held in each) and the optimizer step.
BACKWARD = ("start of backward", "middle of backward", "end of backward")
# The script's recipes (fit_cpu_offload_fake.RECIPES), as the calculator's knobs
RECIPES = {
    "one batch": {},
    "2 micro-batches": {"grad_accumulation": 2},
    "optimizer in backward": {"optimizer_in_backward": True},
    "reshard_after_forward=False": {"reshard_after_forward": False},
    "bf16 parameters": {"precision": "bf16-master", "reduce_dtype": "fp32"},
}


def question(shape: dict, recipe: str) -> dict:
    """``will_it_fit``'s knobs for the script's ``recipe`` at ``shape`` (batch, seq, world)."""
    ask = dict(
        batch=shape["batch"],
        seq=shape["seq"],
        precision="fp32",
        optimizer="adamw",  # foreach, as the script's
        sharding="fsdp2",
        n_gpus=shape["world"],
        headroom=False,
    )
    return {**ask, **RECIPES[recipe]}


def measured(run: dict, moment: str) -> int:
    """The script's count for the calculator's ``moment``."""
    if moment in BACKWARD:
        return run["in backward"][moment]
    return run[moment]


def _run() -> dict:
    done = processes.run([sys.executable, str(SCRIPT), "--both"], timeout_s=900)  # a hang only
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def counts() -> dict:
    """``{"grid": [...], "offload": {...}}``: see ``fit_cpu_offload_fake.main``."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return _run()
    path = Path(tempfile.gettempdir()) / f"tutorial-fake-fsdp2-{run}.json"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while the child runs
        if path.exists():
            return json.loads(path.read_text())
        out = _run()
        path.write_text(json.dumps(out))
        return out
