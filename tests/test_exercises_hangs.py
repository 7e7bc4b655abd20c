"""Notebook 14's checkers: the hang's reference found in the flight records, and the stand-in
``torch.distributed`` that compares what each rank calls.

``broken_job_reports`` is what ``scripts/broken_job.py`` reports (measured, torch 2.13): each of
its 4 steps all-reduces the 6 gradients of a 3-layer MLP of width 16 ([16, 16], [16] each), then
all-gathers the loss ([1]); rank 1 stops on a lock in its third step after #20, rank 0 goes on
to #21. The slow test launches the job and checks the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tutorial_utils.exercises import reset_attempts
from tutorial_utils.exercises.hangs import check_hang, check_same_collectives, hang_in

SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"


@pytest.fixture(autouse=True)
def _fresh_attempts():
    reset_attempts()


def broken_job_record(collectives: int) -> list[dict]:
    """The first ``collectives`` entries of a rank's flight record in ``broken_job.py``."""
    record, seq = [], 0
    for _step in range(4):
        for _layer in range(3):
            for sizes in ([[16, 16]], [[16]]):
                seq += 1
                record.append({"group": "0", "seq": seq, "op": "all_reduce", "sizes": sizes})
        seq += 1
        record.append({"group": "0", "seq": seq, "op": "all_gather", "sizes": [[1]]})
    return record[:collectives]


def broken_job_reports() -> dict[int, dict]:
    """What the two ranks of ``broken_job.py`` report when it hangs (their stacks, shortened)."""
    return {
        0: {
            "stack": ["broken_job.py:50 in main: dist.all_gather(...)"],
            "flight_record": broken_job_record(21),
        },
        1: {
            "stack": ["broken_job.py:28 in save_checkpoint: checkpoint_lock.acquire()"],
            "flight_record": broken_job_record(20),
        },
    }


ANSWER = {"rank": 1, "op": "all_gather", "seq": 21}


def test_the_reference_is_the_first_collective_a_rank_lacks():
    assert hang_in(broken_job_reports()) == {**ANSWER, "group": "0", "sizes": [[1]]}


def test_the_reference_skips_detail_s_own_group_and_finds_another_group():
    """Notebook 14's lab: rank 0 has group 1's all_reduce, rank 1 nothing on group 1; DETAIL's
    fingerprint exchanges run on a group without a name."""
    detail = {"group": "", "seq": 3, "op": "all_gather", "sizes": [[1]]}
    barrier = {"group": "0", "seq": 1, "op": "barrier", "sizes": []}
    reports = {
        0: {
            "flight_record": [
                {"group": "1", "seq": 1, "op": "all_reduce", "sizes": [[4]]},
                barrier,
                detail,
            ]
        },
        1: {"flight_record": [barrier, detail]},
    }
    assert hang_in(reports) == {
        "rank": 1,
        "group": "1",
        "seq": 1,
        "op": "all_reduce",
        "sizes": [[4]],
    }


@pytest.mark.parametrize("op", ["all_gather", "gloo:all_gather", "dist.all_gather()", "ALLGATHER"])
def test_the_right_answer_passes_however_the_op_is_spelt(op):
    assert check_hang({**ANSWER, "op": op}, broken_job_reports()).passed


def test_reports_without_a_hang_or_a_record_are_one_sentence():
    same = {r: {"flight_record": broken_job_record(21)} for r in (0, 1)}
    with pytest.raises(ValueError, match="no hang to find"):
        check_hang(ANSWER, same)
    with pytest.raises(ValueError, match="has no flight record"):
        check_hang(ANSWER, {0: {"stack": []}, 1: {}})
    with pytest.raises(ValueError, match="pass the job's reports"):
        check_hang(ANSWER, None)


def test_the_reference_is_computed_before_the_answer_is_read():
    """An answer that changes the reports when read (rank 1 catches up: no hang left) cannot move
    the reference: it was found before, so the right answer still passes."""
    reports = broken_job_reports()

    class Sneaky(dict):
        def __getitem__(self, key):
            reports[1]["flight_record"].append(
                {"group": "0", "seq": 21, "op": "all_gather", "sizes": [[1]]}
            )
            return super().__getitem__(key)

    assert check_hang(Sneaky(ANSWER), reports).passed


def _solution(rank, world, loss, correct, dist):
    dist.all_reduce(loss)
    dist.all_reduce(correct)
    loss = loss / world
    if rank == 0:
        print(f"mean loss {loss.item():.4f}, correct predictions {int(correct.item())}")
    return loss, correct


def test_the_solution_passes_and_averaging_in_the_collective_does_too():
    assert check_same_collectives(_solution).passed

    def averaged(rank, world, loss, correct, dist):
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        dist.all_reduce(correct)
        return loss, correct

    assert check_same_collectives(averaged).passed


def test_a_collective_the_stand_in_lacks_is_named():
    def scatters(rank, world, loss, correct, dist):
        dist.reduce_scatter_tensor(loss, loss)
        return loss, correct

    fb = check_same_collectives(scatters)
    assert not fb.passed and "has no reduce_scatter_tensor" in fb.report()


@pytest.mark.slow
def test_the_broken_job_hangs_where_the_reference_says():
    """Its group's 3-s timeout ends the hang, nothing is left running, and the reference found
    in the real flight records is the one the tests above assume."""
    import psutil

    from tutorial_utils.distributed import launch

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    job = launch(SCRIPTS / "broken_job.py", nproc=2, timeout=120, echo=None)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, f"the hung job left processes behind: {left}"
    assert job.exit_problem and "rank 0" in job.exit_problem
    assert {k: v for k, v in hang_in(job.reports).items()} == {
        **ANSWER,
        "group": "0",
        "sizes": [[1]],
    }
    assert "save_checkpoint" in job.reports[1]["stack"][-1]
    assert "all_gather" in job.reports[0]["stack"][-1]
