"""benchmarks/gpu_bench.py: goals, isolation of failures, CPU skips, and the subprocess parsing."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_bench  # noqa: E402

from tutorial_utils import recorded  # noqa: E402

CUDA_ONLY = ["allocator_vs_nvml", "empty_cache", "h2d_bandwidth", "cudnn_benchmark", "spike_test"]


def _figures(**by_key):
    return {key: {"figures": figs} for key, figs in by_key.items()}


def test_goals_met_and_missed_by_how_much():
    results = _figures(
        amp_speed={"bf16_vs_fp32": 3.1},
        matmul_peak={"bf16_large_share_of_peak": 0.63},
        h2d_bandwidth={"pinned_share_of_large_min_16MiB": 0.91},
        checkpointing={"activation_saving": 6.0, "time_ratio": 1.54},
    )
    goals = {g["figure"]: g for g in gpu_bench.check_goals(results, cuda=True)}
    assert goals["bf16_vs_fp32"]["status"] == "met"
    assert goals["bf16_large_share_of_peak"]["status"] == "missed"
    assert goals["bf16_large_share_of_peak"]["by"] == "10% short"
    assert goals["time_ratio"]["by"] == "10% over"
    assert goals["activation_saving"]["status"] == "met"


def test_goals_are_not_checked_without_cuda_or_without_a_figure():
    cpu = gpu_bench.check_goals(_figures(amp_speed={"bf16_vs_fp32": 9.0}), cuda=False)
    assert {g["status"] for g in cpu} == {"not checked"}
    gpu = gpu_bench.check_goals({"amp_speed": {"error": "RuntimeError: boom"}}, cuda=True)
    assert gpu[0]["why"] == "RuntimeError: boom"


def test_every_goal_names_a_figure_its_benchmark_records():
    source = (ROOT / "benchmarks" / "gpu_bench.py").read_text()
    for key, figure, op, _goal, _ in gpu_bench.GOALS:
        assert key in gpu_bench.BENCHMARKS and f'"{figure}"' in source and op in (">=", "<=")


def test_cuda_only_benchmarks_skip_on_the_cpu_with_the_reason():
    report = gpu_bench.run(CUDA_ONLY + ["subprocesses"], budget_s=60, prefer="cpu")
    for key in CUDA_ONLY + ["oom_message", "expandable_segments"]:
        assert report["results"][key]["skipped"].startswith("skipped: needs CUDA"), key
    assert not report["cuda"]


def test_a_failing_benchmark_does_not_hide_the_others(monkeypatch):
    def boom(ctx):
        raise RuntimeError("CUDA error: an illegal memory access\nmore lines")

    def fine(ctx):
        return gpu_bench.Result("empty_cache", "fine", ["a"], [[1]])

    monkeypatch.setattr(gpu_bench, "BENCHMARKS", {"amp_speed": boom, "empty_cache": fine})
    report = gpu_bench.run(budget_s=30, prefer="cpu")
    assert report["results"]["amp_speed"]["error"] == (
        "RuntimeError: CUDA error: an illegal memory access"
    )
    assert report["results"]["empty_cache"]["rows"] == [[1]]
    assert "Traceback" in report["log"]
    assert "**failed**: RuntimeError" in gpu_bench.markdown(report)


def test_unknown_benchmark_is_one_sentence():
    with pytest.raises(ValueError, match="unknown benchmark"):
        gpu_bench.run(["nope"], prefer="cpu")


class _FakeProc:
    def __init__(self, out: str, rc: int = 0, err: str = ""):
        self.out, self.returncode, self.err = out, rc, err

    def communicate(self, timeout=None):
        return self.out, self.err

    def kill(self):
        pass


def test_oom_and_expandable_runs_are_parsed_into_the_recorded_schema(monkeypatch, tmp_path):
    oom_text = "CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of ..."
    runs = {
        "oom": json.dumps({"text": oom_text, "budget": 2 * 2**30, "total": 140 * 2**30}),
        "default": json.dumps(
            {
                "allocated": 120 * 2**20,
                "reserved": 6 * 2**30,
                "peak_reserved": 6 * 2**30,
                "segments": 41,
                "cuda_mallocs": 41,
            }
        ),
        "expandable": json.dumps(
            {
                "allocated": 120 * 2**20,
                "reserved": 450 * 2**20,
                "peak_reserved": 450 * 2**20,
                "segments": 1,
                "cuda_mallocs": 1,
            }
        ),
    }

    def fake_run(script, env, timeout):
        if "OutOfMemoryError" in script:
            return _FakeProc("warning line\n" + runs["oom"])
        expandable = env.get("PYTORCH_ALLOC_CONF") == "expandable_segments:True"
        assert env.get("PYTORCH_CUDA_ALLOC_CONF") == env.get("PYTORCH_ALLOC_CONF")
        return _FakeProc(runs["expandable" if expandable else "default"])

    monkeypatch.setattr(gpu_bench, "_run_script", fake_run)
    ctx = gpu_bench.Context(torch.device("cuda", 0), None, deadline=float("inf"))
    oom, frag = gpu_bench.bench_subprocesses(ctx)
    assert oom.text == oom_text and "2.00 GiB budget" in oom.note
    assert frag.rows[0][0] == "default" and frag.rows[0][3] == "5.88 GiB"
    assert frag.rows[1][-1] == 1
    # the notebooks read it back labelled, from a GPU run's file
    run = {
        "schema": 1,
        "date": "2026-12-01",
        "torch": "2.11.0+cu130",
        "device": {"name": "NVIDIA H200", "compute_capability": [9, 0]},
        "results": {oom.key: oom.as_json(), frag.key: frag.as_json()},
    }
    (tmp_path / "h200.json").write_text(json.dumps(run))
    shown = str(recorded.show("oom_message", results_dir=tmp_path))
    assert shown.startswith("Recorded on NVIDIA H200, compute capability 9.0") and oom_text in shown
    assert "5.88 GiB" in str(recorded.show("expandable_segments", results_dir=tmp_path))


def test_a_subprocess_that_fails_is_an_error_row_not_a_crash():
    got = gpu_bench._collect(_FakeProc("", rc=1, err="Traceback...\nRuntimeError: no CUDA"), 5)
    assert got == {"error": "exit 1: RuntimeError: no CUDA"}


def test_the_cuda_scripts_are_valid_python():
    compile(gpu_bench._OOM_SCRIPT, "oom", "exec")
    compile(gpu_bench._FRAGMENT_SCRIPT, "fragment", "exec")


@pytest.mark.slow  # real training steps on the CPU: several seconds on a loaded machine
def test_checkpointing_keeps_fewer_activations_on_the_cpu_too():
    report = gpu_bench.run(["checkpointing"], budget_s=120, prefer="cpu")
    res = report["results"]["checkpointing"]
    assert "error" not in res, res
    assert res["figures"]["activation_saving"] > 2, res["rows"]
    _ = io  # the markdown of a real result renders
    assert "| checkpoint every layer |" in gpu_bench.markdown(report)
