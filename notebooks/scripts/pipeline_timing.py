"""Timing a model split over two devices, for notebook 08 (imported, not launched).

A step's work is recorded as events ``(stage, "F" or "B", micro-batch, start, end[, cpu])``, in
seconds. ``gpipe_schedule`` places given stage times on lanes as GPipe would (the notebook's
illustration of the bubble); ``measured_steps`` and ``by_hand_summary`` read the two real
processes of ``pipeline_by_hand.py``; ``replay`` runs a recorded order of work with unit times
(pinned against the formula in tests/test_exercises_parallel.py).
"""

from __future__ import annotations

import os
import statistics

import torch
from torch import nn

__all__ = [
    "bubble",
    "best_pipeline",
    "by_hand_summary",
    "draw_timeline",
    "gpipe_schedule",
    "idle_fraction",
    "make_stages",
    "measured_steps",
    "median_step",
    "neither_computing",
    "overlap_seconds",
    "replay",
    "span",
]


def make_stages(devs, width: int, seed: int = 0) -> list[nn.Module]:
    """One stage per device: 4 Linear + Tanh layers of ``width`` each, seeded."""
    torch.manual_seed(seed)
    return [
        nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.Tanh())]).to(d)
        for d in devs
    ]


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


def bubble(p: int, m: int) -> float:
    """GPipe's idle fraction per stage: p equal stages, m micro-batches, free communication."""
    return (p - 1) / (m + p - 1)


def median_step(reports: dict, m: int) -> list:
    """The timed step of median length among pipeline_by_hand.py's steps with m micro-batches."""
    steps = sorted(measured_steps(reports, m), key=span)
    return steps[len(steps) // 2]


def neither_computing(events) -> float:
    """Seconds of the step in which no stage computed: sends, receives, and waiting for them."""
    busy, end = 0.0, None
    for start, stop in sorted((e[3], e[4]) for e in events):
        if end is None or start > end:
            busy, end = busy + stop - start, stop
        elif stop > end:
            busy, end = busy + stop - end, stop
    return span(events) - busy


def best_pipeline(reports: dict) -> int:
    """The m > 1 of pipeline_by_hand.py whose median step was the shortest."""
    ms = [int(m) for m in reports[0]["runs"]][1:]
    return min(ms, key=lambda m: statistics.median(map(span, measured_steps(reports, m))))


def by_hand_summary(reports: dict) -> str:
    """pipeline_by_hand.py's timing per m (medians over the timed steps) as a table, and
    sentences that say, from these numbers, how each pipeline compares with the formula and
    why: whether the ranks had a core each, what the smaller products cost in CPU time, and how
    long neither stage computed (the sends and receives, paid once per micro-batch)."""

    def per_step(m, f):
        return statistics.median(f(ev) for ev in measured_steps(reports, m))

    def compute_cpu(ev):  # CPU seconds the ranks' threads spent computing
        return sum(e[5] for e in ev)

    def core_share(ev):  # of the wall time the ranks spent computing, the part they had a core
        return compute_cpu(ev) / sum(e[4] - e[3] for e in ev)

    ms = [int(m) for m in reports[0]["runs"]]
    step = {m: per_step(m, span) for m in ms}
    cpu = {m: per_step(m, compute_cpu) for m in ms}
    work = {m: cpu[m] / cpu[ms[0]] for m in ms}
    share = {m: per_step(m, core_share) for m in ms}
    overlap = {m: per_step(m, lambda ev: overlap_seconds(ev) / span(ev)) for m in ms}
    idle = {m: per_step(m, neither_computing) for m in ms}
    lines = [
        "p=2   bubble    step time, x m=1's       stages        compute CPU  had a core  neither",
        "      formula   formula  measured (ms)   overlapping   x m=1's      computing   computing",
    ]
    for m in ms:
        lines.append(
            f"m={m:<2}  {bubble(2, m):7.2f}   {(m + 1) / (2 * m):7.2f}  {step[m] / step[1]:6.2f}"
            f" ({step[m] * 1e3:4.0f})  {overlap[m]:8.0%}   {work[m]:11.2f}  {share[m]:9.0%}"
            f"  {idle[m] * 1e3:6.1f} ms"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    def why(m: int) -> list[str]:
        ratio, reasons = step[m] / step[1], []
        if reports[0]["device"] != "cpu":
            return [
                f"the ranks ran on {reports[0]['device']} devices (CPU time says nothing there)"
            ]
        if share[m] < 0.8:
            reasons.append(
                f"the ranks had a core for only {share[m]:.0%} of the time they were computing, "
                "so the stages often took turns instead of overlapping"
            )
        if work[m] > 1.15:
            reasons.append(
                f"{m} micro-batches cost {work[m]:.2f}x the CPU time of one batch (smaller "
                f"products: {(cpu[m] - cpu[1]) / (m - 1) * 1e3:.1f} ms more per "
                "extra micro-batch)"
            )
        if idle[m] > 0.15 * step[m]:
            reasons.append(
                f"for {idle[m] / step[m]:.0%} of the step neither stage computed (the sends and "
                f"receives and the waits for them, {idle[m] / m * 1e3:.1f} ms per micro-batch)"
            )
        if not reasons:
            if ratio < 0.9:
                rest = (
                    "so the stages overlapped; the rest of the gap is what the formula leaves "
                    "out: the sends and receives, and stages of unequal cost"
                )
            else:
                rest = (
                    "yet the step shrank by less than a tenth"
                    if ratio < 1
                    else "yet the step did not shrink"
                ) + ": the sends and receives cost about what the overlap saved"
            reasons.append(
                f"each rank had its core ({share[m]:.0%} of its compute time) and {m} "
                f"micro-batches cost {work[m]:.2f}x the batch's CPU time, {rest}"
            )
        return reasons

    best = best_pipeline(reports)
    text = [
        f"Here the best pipeline, m={best}, took {step[best] / step[1]:.2f}x the time of m=1, "
        f"where the formula (equal stages, free communication) gives {(best + 1) / (2 * best):.2f}x"
        ": " + "; and ".join(why(best)) + "."
    ]
    if any(share[m] < 0.8 for m in ms):
        text.append(
            f"This machine has {cores} cores and a load average of {os.getloadavg()[0]:.1f} "
            "(processes wanting a core, these two included)."
        )
    for m in ms[1:]:
        if m == best:
            continue
        text.append(
            f"m={m} took {step[m] / step[1]:.2f}x (formula {(m + 1) / (2 * m):.2f}x): "
            + "; and ".join(why(m))
            + "."
        )
        grew = {
            "smaller products: the two ranks' CPU time": cpu[m] - cpu[best],
            "one more send and receive each: the time neither stage computed": idle[m] - idle[best],
        }
        grew = {what: seconds for what, seconds in grew.items() if seconds > 0}
        if m > best and step[m] > step[best] and grew:
            saves = step[1] * ((best + 1) / (2 * best) - (m + 1) / (2 * m))
            text.append(
                f"From m={best} to m={m} the formula saves {saves * 1e3:.0f} ms of the step, "
                "yet each micro-batch has a cost of its own that grew with m ("
                + ", ".join(f"{what} grew by {sec * 1e3:.0f} ms" for what, sec in grew.items())
                + f"), and the step took {(step[m] - step[best]) * 1e3:.0f} ms longer."
            )
    return "\n".join(lines) + "\n\n" + "\n".join(text)
