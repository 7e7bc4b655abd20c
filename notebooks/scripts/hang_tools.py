"""What a rank can say about itself when a job hangs: notebook 14's two tools.

* ``flight_record()``: this rank's flight recorder, every collective it called, oldest first.
  PyTorch keeps it when ``TORCH_FR_BUFFER_SIZE`` (or, on NCCL, ``TORCH_NCCL_TRACE_BUFFER_SIZE``)
  is above 0 when the process group is made; ``_dump_fr_trace()`` returns it as a pickle.
* ``Watchdog``: a thread that, when the training loop has not called ``pet()`` for ``seconds``,
  reports where this rank's main thread is (its Python stack, as ``py-spy dump`` would show it)
  and its flight record, once. NCCL's own watchdog does the same on a GPU
  (``TORCH_NCCL_DUMP_ON_TIMEOUT``); gloo has none, so this one stands in for it.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback

from torch._C._distributed_c10d import _dump_fr_trace

BUFFER = "TORCH_FR_BUFFER_SIZE"  # read when a process group is made: set it before


def flight_record() -> list[dict]:
    """Each collective this rank called (the last ``TORCH_FR_BUFFER_SIZE``), oldest first."""
    trace = pickle.loads(_dump_fr_trace(includeStackTraces=False))
    return [
        {
            "group": e["process_group"][0],  # "0": the default group, then "1", "2"... by creation
            "seq": e["collective_seq_id"],  # the n-th collective of that group, from 1
            "op": e["profiling_name"].split(":")[-1],  # "gloo:all_reduce" -> "all_reduce"
            "sizes": e["input_sizes"],  # the shape of each input tensor
        }
        for e in trace.get("entries", [])
    ]


def stack_of(thread_id: int) -> list[str]:
    """Where a thread is: one line per frame of this script's files, outermost first."""
    frame = sys._current_frames().get(thread_id)
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}: {f.line}"
        for f in traceback.extract_stack(frame)
        if os.path.dirname(os.path.abspath(f.filename)) == here
    ]


class Watchdog:
    """Call ``pet()`` once per step; after ``seconds`` without one, ``report`` gets what this rank
    knows: ``{"stack": [...], "flight_record": [...]}``. It fires at most once."""

    def __init__(self, seconds: float, report) -> None:
        self.seconds, self.report = seconds, report
        self.main = threading.main_thread().ident
        self.last = time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()

    def pet(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        while time.monotonic() - self.last < self.seconds:
            time.sleep(0.05)
        self.report({"stack": stack_of(self.main), "flight_record": flight_record()})
