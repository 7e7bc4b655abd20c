"""tutorial_utils.recorded_cluster: recorded two-node Slurm runs, labelled; bad files skipped."""

from __future__ import annotations

import json

import pytest

from tutorial_utils import recorded_cluster

RUN = {
    "schema": 1,
    "kind": "slurm-two-node",
    "date": "2026-12-01",
    "slurm": "slurm-wlm 22.05.8",
    "torch": "2.13.0+cpu",
    "machine": "one machine, 2 CPUs, no GPU; nodes n1 and n2 on 127.0.0.1",
    "runs": {
        "ddp": {
            "command": "sbatch --wait slurm_ddp.sbatch",
            "state": "COMPLETED",
            "run_time": "00:00:17",
            "output": ["epoch 0: loss on all 64 samples = 2.6645"],
            "reports": {"0": {"node": "n2", "params": [1.0]}, "1": {"node": "n1"}},
        }
    },
}


def test_nothing_recorded_is_one_line(tmp_path):
    shown = recorded_cluster.show("ddp", results_dir=tmp_path)
    assert not shown.found
    assert str(shown).count("\n") == 0
    assert "No two-node Slurm run recorded yet for 'ddp'" in str(shown)


def test_a_record_is_shown_with_its_label_and_ranks(tmp_path):
    (tmp_path / "slurm-two-node-2026-12-01.json").write_text(json.dumps(RUN))
    shown = recorded_cluster.show("ddp", results_dir=tmp_path)
    lines = str(shown).splitlines()
    assert lines[0] == (
        "Recorded on the course's two-node Slurm cluster (slurm-wlm 22.05.8; one machine, 2 CPUs,"
        " no GPU; nodes n1 and n2 on 127.0.0.1), torch 2.13.0+cpu, 2026-12-01 (not run here)"
    )
    assert lines[1] == "$ sbatch --wait slurm_ddp.sbatch"
    assert lines[-1] == "job state COMPLETED, run time 00:00:17"
    assert shown.reports[0]["node"] == "n2" and sorted(shown.reports) == [0, 1]
    assert "<pre>" in shown._repr_html_()
    assert not recorded_cluster.show("rank_fails", results_dir=tmp_path).found


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"schema": 2, "runs": {}}),
        json.dumps([1, 2]),
        json.dumps({**RUN, "runs": {"ddp": {"output": "not a list"}}}),
        json.dumps({**RUN, "runs": {"ddp": {**RUN["runs"]["ddp"], "reports": {"x": {}}}}}),
        "[" * 100_000,  # too deeply nested for json: RecursionError, as in recorded
    ],
)
def test_malformed_files_are_passed_over_for_an_older_good_one(tmp_path, text):
    (tmp_path / "slurm-two-node-2026-11-01.json").write_text(
        json.dumps({**RUN, "date": "2026-11-01"})
    )
    (tmp_path / "slurm-two-node-2026-12-24.json").write_text(text)
    shown = recorded_cluster.show("ddp", results_dir=tmp_path)
    assert shown.found and shown.source["date"] == "2026-11-01"
    if (
        text.startswith("{not")
        or text.startswith("[[")
        or "reports" in text
        or "not a list" in text
    ):
        # a file that claims to be a record and cannot be read is named, with why
        assert "slurm-two-node-2026-12-24.json" in str(shown).splitlines()[-1], str(shown)
    else:  # another schema, or not an object: not one of ours, passed over quietly
        assert not shown.skipped


def test_the_gpu_results_pass_over_a_slurm_record_quietly(tmp_path):
    # every GPU placeholder in 00, 01, 04 and 05 printed "Skipped in docs/results (could not be
    # read): slurm-two-node-2026-12-01.json": the GPU reader took the Slurm record for a bad GPU run
    from tutorial_utils import recorded

    (tmp_path / "slurm-two-node-2026-12-01.json").write_text(json.dumps(RUN))
    shown = recorded.show("h2d_bandwidth", results_dir=tmp_path)
    assert not shown.found and not shown.skipped
    assert str(shown) == ""  # nothing recorded, nothing quoted: no word about the Slurm file
    bad_gpu_run = {"schema": 1, "device": "an H200", "results": {}}  # still named
    (tmp_path / "x-2026-12-01.json").write_text(json.dumps(bad_gpu_run))
    assert recorded.show("h2d_bandwidth", results_dir=tmp_path).skipped == (
        "x-2026-12-01.json: its 'device' and 'results' must be objects",
    )


def test_unknown_key_is_one_sentence():
    with pytest.raises(ValueError, match="unknown run 'dpp'; recorded runs are: ddp, rank_fails"):
        recorded_cluster.show("dpp")


def test_the_committed_record_is_read():
    shown = recorded_cluster.show("ddp")
    assert shown.found, shown.label
    assert shown.state == "COMPLETED"
