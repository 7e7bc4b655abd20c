"""Timing a model split over two devices, for notebook 08 (imported, not launched).

A step's work is recorded as events ``(stage, "F" or "B", micro-batch, start, end)``, in
seconds. ``timed_step`` measures them on the notebook's two devices (GPUs, or CPU stand-ins);
``gpipe_schedule`` places measured stage times on two lanes as GPipe would, when a single
process cannot overlap them; ``replay`` runs a recorded order of work with unit times.
On GPUs every stage is followed by ``torch.cuda.synchronize``: CUDA kernels run asynchronously,
so the clock is read only once the device has finished.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "draw_timeline",
    "gpipe_schedule",
    "idle_fraction",
    "make_stages",
    "measured_steps",
    "median_times",
    "overlap_seconds",
    "replay",
    "span",
    "timed_step",
]


def make_stages(devs, width: int, seed: int = 0) -> list[nn.Module]:
    """One stage per device: 4 Linear + Tanh layers of ``width`` each, seeded."""
    torch.manual_seed(seed)
    return [
        nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.Tanh())]).to(d)
        for d in devs
    ]


def _sync(devs) -> None:
    if not devs.stand_ins:  # CUDA kernels run asynchronously: wait before reading the clock
        for d in devs:
            torch.cuda.synchronize(d)


def timed_step(stages, devs, xb, yb, m: int, scale) -> tuple[list, float]:
    """One forward+backward of the stages, cutting the batch into m micro-batches.

    Runs the micro-batches in GPipe order (every forward, then every backward); each
    micro-batch's loss is multiplied by ``scale(m)``. Returns (events, wall seconds).
    """
    for stage in stages:
        stage.zero_grad()  # each call leaves exactly this step's gradients
    events, saved = [], []
    t0 = time.perf_counter()
    for i, (xm, ym) in enumerate(zip(xb.chunk(m), yb.chunk(m), strict=True)):
        h, acts = xm, []
        for s, (stage, d) in enumerate(zip(stages, devs, strict=True)):
            h_in = h.detach().to(d).requires_grad_(s > 0)
            start = time.perf_counter()
            h = stage(h_in)
            _sync(devs)
            events.append((s, "F", i, start - t0, time.perf_counter() - t0))
            acts.append((h_in, h))
        saved.append((acts, F.mse_loss(h, ym.to(h.device)) * scale(m)))
    for i, (acts, loss) in enumerate(saved):
        grad = None
        for s in reversed(range(len(stages))):
            h_in, h = acts[s]
            start = time.perf_counter()
            if grad is None:
                loss.backward()
            else:
                h.backward(grad.to(h.device))
            _sync(devs)
            events.append((s, "B", i, start - t0, time.perf_counter() - t0))
            grad = h_in.grad
    return events, time.perf_counter() - t0


def draw_timeline(ax, events, devs, title: str) -> None:
    colors = {"F": "tab:blue", "B": "tab:orange"}
    for s, kind, i, start, end, *_ in events:
        ax.broken_barh([(start * 1e3, (end - start) * 1e3)], (s - 0.4, 0.8), color=colors[kind])
        mid = (start + end) / 2 * 1e3
        ax.text(mid, s, f"{kind}{i}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(devs)), [f"stage {s} ({d})" for s, d in enumerate(devs)])
    ax.set_xlabel("time (ms)")
    ax.set_title(title)


def idle_fraction(events, stage: int) -> float:
    """The fraction of the step's span during which ``stage`` did no work."""
    return 1 - sum(e[4] - e[3] for e in events if e[0] == stage) / span(events)


def median_times(events, kind: str) -> list[float]:
    per_stage = [
        sorted(e[4] - e[3] for e in events if e[0] == s and e[1] == kind) for s in range(2)
    ]
    return [t[len(t) // 2] for t in per_stage]


def gpipe_schedule(fwd, bwd, m: int) -> list:
    """Events of a GPipe step on len(fwd) devices, from per-micro-batch stage times (seconds):
    each operation starts as soon as its device is free and its input has arrived."""
    p, free, done, events = len(fwd), [0.0] * len(fwd), {}, []
    for i in range(m):
        for s in range(p):
            start = max(free[s], done.get(("F", s - 1, i), 0.0))
            free[s] = done[("F", s, i)] = start + fwd[s]
            events.append((s, "F", i, start, free[s]))
    for i in range(m):
        for s in reversed(range(p)):
            ready = done[("F", p - 1, m - 1)] if s == p - 1 else done[("B", s + 1, i)]
            start = max(free[s], ready)
            free[s] = done[("B", s, i)] = start + bwd[s]
            events.append((s, "B", i, start, free[s]))
    return events


def measured_steps(reports: dict, m: int) -> list[list]:
    """Each timed step of pipeline_by_hand.py with m micro-batches: both ranks' events
    (stage, kind, micro-batch, start, end, cpu), in seconds, start and end from that step's first
    start, cpu the CPU time the rank's thread spent computing it."""
    steps = []
    for k in range(len(reports[0]["runs"][str(m)]["steps"])):
        events = [
            (rank, *event)
            for rank, rep in sorted(reports.items())
            for event in rep["runs"][str(m)]["steps"][k]
        ]
        t0 = min(e[3] for e in events)
        steps.append([(s, kind, i, a - t0, b - t0, cpu) for s, kind, i, a, b, cpu in events])
    return steps


def span(events) -> float:
    """Seconds from the step's first start to its last end."""
    return max(e[4] for e in events) - min(e[3] for e in events)


def overlap_seconds(events) -> float:
    """How long both stages computed at the same time."""
    a = [(e[3], e[4]) for e in events if e[0] == 0]
    b = [(e[3], e[4]) for e in events if e[0] == 1]
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def replay(orders, f: float = 1.0, b: float = 2.0) -> list[float]:
    """Idle fraction per stage running its recorded order: F(s,i) after F(s-1,i), B(s,i) after
    B(s+1,i) (on the last stage, after its own F(s,i))."""
    p, done, free, pos = len(orders), {}, [0.0] * len(orders), [0] * len(orders)
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, i = orders[s][pos[s]][0], int(orders[s][pos[s]][1:])
                need = ("F", s - 1, i) if kind == "F" else ("B", s + 1, i)
                need = None if s == 0 and kind == "F" else need
                need = ("F", s, i) if s == p - 1 and kind == "B" else need
                if need is not None and need not in done:
                    break  # wait for the other stage
                start = max(free[s], done.get(need, 0.0))
                free[s] = done[(kind, s, i)] = start + (f if kind == "F" else b)
                pos[s] += 1
    return [1 - sum(f if o[0] == "F" else b for o in orders[s]) / max(free) for s in range(p)]
