"""Read back and draw the Chrome traces that ``ddp_seen.py`` writes (notebook 07, section 4).

A Chrome trace is JSON: a list of ``traceEvents``, each with a name, a thread (``tid``), a start
``ts`` and a duration ``dur`` in microseconds. On the training thread (the one that ran
``DistributedDataParallel.forward``) backward's ops are ``autograd::engine::evaluate_function:
...`` and each bucket's launch is ``c10d::allreduce_``; gloo's own threads run
``gloo:all_reduce``, the bucket's transfer.
"""

from __future__ import annotations

import json

import matplotlib.pyplot as plt


def read_trace(path) -> dict:
    """The events of one rank's trace that the notebook checks and draws, by kind."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    forward = next(e for e in events if e["name"] == "DistributedDataParallel.forward")
    main = [e for e in events if e["tid"] == forward["tid"]]
    return {
        "start": forward["ts"],
        "backward": [e for e in main if e["name"].startswith("autograd::engine::evaluate")],
        "launches": [e for e in main if e["name"] == "c10d::allreduce_"],
        "transfers": [e for e in events if e["name"] == "gloo:all_reduce"],
        "layer_grads": [
            e for e in main if e["name"] == "autograd::engine::evaluate_function: AddmmBackward0"
        ],
    }


def draw_trace(trace: dict) -> None:
    """One row of backward ops and one of gloo transfers per rank, bucket launches as ticks.

    Returns nothing: the notebook's inline backend shows the figure once, at the end of the cell.
    """
    t0 = min(t["start"] for t in trace.values())

    def ms(events):
        return [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in events]

    fig, ax = plt.subplots(figsize=(9, 2.6))
    for y, t in enumerate(trace.values()):
        ax.broken_barh(ms(t["backward"]), (2 * y, 0.8), color="tab:blue", edgecolor="white")
        ax.broken_barh(ms(t["transfers"]), (2 * y + 1, 0.8), color="tab:orange", edgecolor="white")
        ax.vlines([s for s, _ in ms(t["launches"])], 2 * y, 2 * y + 0.8, color="black")
    ax.set_yticks(
        [i + 0.4 for i in range(2 * len(trace))],
        [f"rank {r} {k}" for r in trace for k in ("backward", "gloo")],
    )
    ax.set_xlabel("ms since the first rank's forward started")
    ax.set_title("One DDP step: backward ops (blue), bucket launches (black), all-reduces (orange)")
    fig.tight_layout()
