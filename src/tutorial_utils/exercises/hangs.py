"""Checkers for notebook 14 (when a job hangs).

* ``check_timeout``: the learner picks a process group's timeout for a job whose legitimate
  waits are given (``WAITS``): twice the longest of them, since the waits happen one at a time.
* ``check_hang``: the learner reads what a hung job's tools printed (each rank's Python stack
  and flight record) and names the rank that hangs and the collective it never reached. The
  reference is found in the ranks' flight records first, from a private copy: in a group where
  one rank's record stops before the others', that rank hangs, and the collective is the next
  one the others recorded.
* ``check_same_collectives``: the bug hunt. ``log_metrics(rank, world, loss, correct, dist)``
  must make every rank call the same collectives in the same order (what
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` compares), and still return the mean loss and the summed
  count on every rank. It runs for each rank of a 2-rank world against a stand-in for
  ``torch.distributed`` that records each call and sums across ranks.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from . import Feedback, checker
from .answers import describe, finite_number, number_problem, tensor_number, whole_number

__all__ = ["MARGIN", "WAITS", "check_hang", "check_same_collectives", "check_timeout", "hang_in"]


# ---------------------------------------------------------------------------------------------
# Exercise 1: a timeout that outlasts every legitimate wait

#: Notebook 14's job: how long its ranks wait for one another when nothing is wrong, in seconds
WAITS = {
    "the first step: rank 0 compiles the model, the others wait in the first all_reduce": 75.0,
    "every 500 steps: rank 0 writes a checkpoint, the others wait at a barrier": 40.0,
    "any other step: the ranks wait for the slowest one's gradients": 0.3,
}
MARGIN = 2  # the timeout: this many times the longest legitimate wait


@checker(answers=("seconds",), zero=True)
def check_timeout(seconds: object) -> Feedback:
    """``seconds``: the timeout to give ``init_process_group`` for the job of ``WAITS`` (a
    number of seconds or a ``timedelta``), ``MARGIN`` times its longest legitimate wait."""
    longest = max(WAITS.values())  # the reference, first
    want = MARGIN * longest
    fb = Feedback(f"a timeout {MARGIN} times the longest legitimate wait")
    fb.hint(
        "a timeout is how long one collective may wait: which single wait of a healthy run is "
        "the longest, and how much margin does the exercise ask for?"
    )
    fb.fix(f"timeout_s = {MARGIN} * max(WAITS.values())  # {want:g} s")
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    value = finite_number(seconds)
    fb.require(
        value is not None and value > 0,
        number_problem("the answer", seconds) + " (a number of seconds, or a timedelta)"
        if value is None
        else f"{value:g} s is no timeout: give a positive number of seconds",
        brief="the answer is not a positive number of seconds",
    )
    close = lambda x: abs(value - x) <= 1e-9 * x  # noqa: E731 (the answers are sums of the waits)
    if value < longest:
        fb.fail(
            f"{value:g} s is shorter than the {longest:g} s the first step legitimately waits: "
            "this timeout kills a healthy job",
            brief="this timeout kills a healthy job",
        )
    if close(longest):
        fb.fail(
            f"{value:g} s is exactly the longest wait: no margin (a slower compile, a busier disk "
            f"and the healthy job dies); the exercise asks for {MARGIN} times it",
            brief="the timeout leaves no margin over the longest wait",
        )
    if close(MARGIN * sum(WAITS.values())):
        fb.fail(
            f"{value:g} s adds the waits up: they happen at different times, and a timeout "
            "bounds one collective's wait, so only the longest one counts",
            brief="the waits were added up; a timeout bounds one wait at a time",
        )
    fb.expect(
        close(want),
        f"{value:g} s is not {MARGIN} times the longest legitimate wait",
        brief=f"the timeout is not {MARGIN} times the longest wait",
    )
    return fb


# ---------------------------------------------------------------------------------------------
# Exercise 2: which rank hangs, in which collective


def _records(reports: object) -> dict[int, list[dict]]:
    """Each rank's flight record from a launch's reports, checked (the notebook's data)."""
    if not isinstance(reports, Mapping) or not reports:
        raise ValueError(
            f"pass the job's reports ({{rank: report}}, as launch returns them), not "
            f"{describe(reports)}"
        )
    found = {}
    for rank, report in reports.items():
        record = report.get("flight_record") if isinstance(report, Mapping) else None
        if whole_number(rank) is None or not isinstance(record, list):
            raise ValueError(f"rank {rank!r}'s report has no flight record: launch the job again")
        found[int(rank)] = copy.deepcopy(record)
    return found


def hang_in(reports: Mapping[int, Mapping]) -> dict[str, Any]:
    """``{"rank", "group", "seq", "op", "sizes"}``: the rank whose flight record stops first in a
    group, and the collective the other ranks recorded next there. ``ValueError`` when every
    rank reached the same collective of every group (nothing hangs on a collective)."""
    records = _records(reports)
    groups = sorted({e["group"] for record in records.values() for e in record if e["group"]})
    for group in groups:
        last = {
            rank: max((e["seq"] for e in record if e["group"] == group), default=0)
            for rank, record in records.items()
        }
        behind = min(last.values())
        if behind == max(last.values()):
            continue
        (rank,) = [r for r, seq in last.items() if seq == behind][:1]
        ahead = next(r for r, seq in last.items() if seq > behind)
        entry = next(e for e in records[ahead] if e["group"] == group and e["seq"] == behind + 1)
        return {"rank": rank, "group": group, **{k: entry[k] for k in ("seq", "op", "sizes")}}
    raise ValueError("every rank's flight record reaches the same collective: no hang to find")


def _op_name(value: object) -> str | None:
    """``all_gather`` from "all_gather", "gloo:all_gather", "dist.all_gather()", "ALLGATHER"."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower().removesuffix("()").split(":")[-1].split(".")[-1]
    return text.replace("_", "").replace(" ", "") or None


@checker(answers=("answer",))
def check_hang(answer: Mapping[str, object], reports: Mapping[int, Mapping]) -> Feedback:
    """``answer``: ``{"rank": ..., "op": ..., "seq": ...}``, the rank that hangs and the
    collective it never reached (its name and its number in the flight record), read from the
    job's ``reports`` (each rank's stack and flight record)."""
    want = hang_in(reports)  # the reference, before the answer is read
    fb = Feedback("the rank that hangs, and the collective it never reached")
    fb.hint(
        "the rank whose error you read is the one that waited: compare the last collective in "
        "each rank's flight record. Whose stops first, and what did the others record next?"
    )
    fb.fix(
        f'{{"rank": {want["rank"]}, "op": "{want["op"]}", "seq": {want["seq"]}}}: rank '
        f"{want['rank']}'s flight record stops at #{want['seq'] - 1}; the others went on to "
        f"#{want['seq']}, {want['op']} of sizes {want['sizes']}, and waited there for it"
    )
    fb.require(
        isinstance(answer, Mapping) and {"rank", "op", "seq"} <= set(answer),
        f'answer with a dict {{"rank": ..., "op": ..., "seq": ...}}, not {describe(answer)}',
        brief="the answer is not a dict with rank, op and seq",
    )
    rank, seq, op = whole_number(answer["rank"]), whole_number(answer["seq"]), answer["op"]
    fb.require(
        rank is not None and seq is not None and _op_name(op) is not None,
        f"rank and seq are whole numbers and op a collective's name (like 'all_reduce'); got "
        f"rank {describe(answer['rank'])}, seq {describe(answer['seq'])}, op {describe(op)}",
        brief="rank and seq must be whole numbers, op a name",
    )
    ranks = sorted(_records(reports))
    if rank != want["rank"]:
        waited = rank in ranks
        fb.expect(
            False,
            f"rank {rank} "
            + (
                f"called collective #{want['seq']} and waited in it until its timeout: it "
                f"reported the error, but the rank that hangs is the one that never got there"
                if waited
                else f"is not a rank of this job (its ranks: {ranks})"
            ),
            brief="that rank waited for the other, it is not the one that hangs"
            if waited
            else "there is no such rank",
        )
    if seq != want["seq"]:
        done = seq < want["seq"]
        fb.expect(
            False,
            f"collective #{seq} "
            + (
                "completed on every rank: both flight records hold it"
                if done
                else "was never called by any rank"
            )
            + "; the one that hangs is the first a rank's record lacks",
            brief="every rank finished that collective" if done else "no rank reached that one",
        )
    fb.expect(
        _op_name(op) == _op_name(want["op"]),
        f"collective #{want['seq']} is not {describe(op)}: read its name in the flight record "
        "of a rank that reached it",
        brief="the collective is another operation",
    )
    return fb


# ---------------------------------------------------------------------------------------------
# Exercise 3: the same collectives on every rank

WORLD = 2
_INPUTS = {0: (0.75, 5), 1: (1.25, 2)}  # each rank's (loss, correct predictions)


class _Recorder:
    """A stand-in for ``torch.distributed`` on one rank of a simulated world: it records each
    collective (name, shapes, dtypes) and, for all_reduce and all_gather, answers with what the
    other ranks gave at the same call in the previous round (``given``)."""

    ReduceOp = dist.ReduceOp

    def __init__(self, rank: int, given: dict[int, list[list[torch.Tensor]]]) -> None:
        self.rank, self.given = rank, given
        self.calls: list[str] = []
        self.inputs: list[list[torch.Tensor]] = []

    def get_rank(self, group: object = None) -> int:
        return self.rank

    def get_world_size(self, group: object = None) -> int:
        return WORLD

    def _record(self, name: str, *tensors: torch.Tensor) -> list[torch.Tensor]:
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} takes tensors, not {describe(t)}")
        shapes = ", ".join(
            f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors
        )
        self.calls.append(f"{name}({shapes})")
        self.inputs.append([t.detach().clone() for t in tensors])
        i = len(self.inputs) - 1
        others = [self.given.get(r, []) for r in range(WORLD)]
        return [r[i] if i < len(r) else [t.detach().clone() for t in tensors] for r in others]

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        parts = self._record("all_reduce", tensor)
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise ValueError("this check's all_reduce sums (ReduceOp.SUM) or averages (AVG)")
        with torch.no_grad():
            total = sum(p[0].to(tensor.dtype) for p in parts if p and p[0].shape == tensor.shape)
            tensor.copy_(total / WORLD if op == dist.ReduceOp.AVG else total)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        parts = self._record("all_gather", tensor)
        with torch.no_grad():
            for out, p in zip(tensor_list, parts, strict=False):
                out.copy_(p[0])

    def broadcast(self, tensor, src=0, group=None, async_op=False):
        self._record(f"broadcast[src={src}]", tensor)

    def barrier(self, group=None, async_op=False, device_ids=None):
        self._record("barrier")

    def __getattr__(self, name: str):
        raise AttributeError(
            f"this check's stand-in for torch.distributed has no {name}: use all_reduce, "
            "all_gather, broadcast or barrier"
        )


def _run_ranks(fb: Feedback, log_metrics: Callable, given: dict) -> tuple[dict, dict]:
    """Each rank's (calls, result) for one round, the inputs of each call kept in ``given``."""
    calls, results, inputs = {}, {}, {}
    for rank in range(WORLD):
        loss, correct = _INPUTS[rank]
        recorder = _Recorder(rank, given)
        # fresh tensors for each call: all_reduce works in place, and the reference is the floats
        args = (torch.tensor(loss), torch.tensor(correct))
        with contextlib.redirect_stdout(io.StringIO()):  # rank 0's log line
            out = fb.run(
                f"log_metrics(rank={rank}, ...)",
                log_metrics,
                rank,
                WORLD,
                *args,
                recorder,
                returns=tuple,
            )
        calls[rank], inputs[rank], results[rank] = recorder.calls, recorder.inputs, out
    given.clear()
    given.update(inputs)
    return calls, results


@checker(shipped_hint="follow it for rank 0, then for rank 1: which collectives does each call?")
def check_same_collectives(log_metrics: Callable) -> Feedback:
    """``log_metrics(rank, world, loss, correct, dist)`` returns ``(mean loss, summed correct)``
    on every rank, every rank calling the same collectives; ``dist`` is the module to call."""
    mean = sum(v[0] for v in _INPUTS.values()) / WORLD  # the reference, first
    total = sum(v[1] for v in _INPUTS.values())
    fb = Feedback("log_metrics calls the same collectives on every rank")
    fb.hint(
        "a collective returns only when every rank of the group has called it: may a collective "
        "sit under `if rank == 0`?"
    )
    fb.fix(
        "call dist.all_reduce(correct) on every rank, before `if rank == 0:`; keep only the "
        "print under the if"
    )
    given: dict = {}
    for _ in range(3):  # a round's answers feed the next one's inputs until they settle
        calls, results = _run_ranks(fb, log_metrics, given)
    lines = {r: ", ".join(c) or "no collective" for r, c in calls.items()}
    fb.require(
        calls[0] == calls[1],
        f"rank 0 calls {lines[0]}; rank 1 calls {lines[1]}. A rank waits in a collective until "
        "every rank calls it: the job hangs at the first difference (DETAIL would name it)",
        brief="the ranks call different collectives: the job would hang",
    )
    for rank, out in results.items():
        fb.require(
            len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out),
            f"log_metrics(rank={rank}, ...) returned {describe(out)}: return (loss, correct)",
            brief="log_metrics does not return (loss, correct)",
        )
        values = [tensor_number(t) for t in out]
        fb.require(
            None not in values,
            f"log_metrics(rank={rank}, ...) returned {describe(out)}: return (loss, correct), "
            "each a tensor holding one finite number",
            brief="log_metrics does not return two one-number tensors",
        )
        loss, correct = values
        fb.expect(
            # the inputs are exact binary fractions: an fp32 sum and a halving round at most twice
            # (2 * 2**-24 relative); 2e-6 is over 10x that, and a sum instead of a mean is 100% off
            abs(loss - mean) <= 2e-6 * mean,
            f"rank {rank} returns loss {loss:g}; the mean over ranks is {mean:g}",
            brief="the loss is not the mean over ranks",
        )
        fb.expect(
            correct == total,
            f"rank {rank} returns correct {correct:g}; the ranks' sum is {total}",
            brief="the correct predictions are not summed over ranks",
        )
        if not fb.passed:
            break
    return fb
