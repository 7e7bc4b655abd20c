"""recorded.show: labelled GPU results from docs/results; until one exists, the published figure
quoted for the key, or nothing (the maintainers' instruction stays in ``label``)."""

import json

import pytest

from tutorial_utils import recorded


def _write(folder, name, date, results, schema=1):
    run = {
        "schema": schema,
        "date": date,
        "torch": "2.11.0+cu130",
        "device": {"name": "NVIDIA H200", "compute_capability": [9, 0]},
        "results": results,
    }
    (folder / name).write_text(json.dumps(run))


def test_nothing_recorded_shows_the_quoted_figure_or_nothing(tmp_path):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from tutorial_utils import published

    quoted = recorded.show("allocator_vs_nvml", results_dir=tmp_path)
    assert not quoted.found and quoted.quoted == published.show(
        recorded.QUOTED["allocator_vs_nvml"]
    )
    assert str(quoted) == str(quoted.quoted) and str(quoted).startswith("Quoted, not run here")
    assert "make gpu-check" in quoted.label  # for maintainers, never in a learner's output
    silent = recorded.show("oom_message", results_dir=tmp_path)
    assert "oom_message" not in recorded.QUOTED and silent.quoted is None and str(silent) == ""
    InteractiveShell.instance()  # display() needs a shell
    with capture_output() as shown:
        silent._ipython_display_()
        quoted._ipython_display_()
    assert len(shown.outputs) == 1, "nothing for the silent key, one output for the quoted one"
    assert "Quoted, not run here" in shown.outputs[0].data["text/plain"]


def test_every_quoted_key_is_a_recorded_key_and_a_published_figure():
    from tutorial_utils import published

    assert set(recorded.QUOTED) <= set(recorded.KEYS)
    assert set(recorded.QUOTED.values()) <= set(published.keys())


def test_newest_run_wins_and_is_labelled_with_device_torch_and_date(tmp_path):
    table = {"title": "copies", "columns": ["kind", "GB/s"], "rows": [["pinned", 50.1]]}
    _write(tmp_path, "a.json", "2026-12-01", {"h2d_bandwidth": table})
    newer = dict(table, rows=[["pinned", 51.2]])
    _write(tmp_path, "b.json", "2026-12-02", {"h2d_bandwidth": newer})
    result = recorded.show("h2d_bandwidth", results_dir=tmp_path)
    text = str(result)
    assert text.splitlines()[0] == (
        "Recorded on NVIDIA H200, compute capability 9.0, torch 2.11.0+cu130, 2026-12-02 "
        "(not run here)"
    )
    assert "51.2" in text and "50.1" not in text
    assert "<table>" in result._repr_html_()


def test_broken_and_foreign_files_are_ignored(tmp_path):
    (tmp_path / "half.json").write_text('{"schema": 1, "resu')
    _write(tmp_path, "old.json", "2026-12-01", {"oom_message": {"text": "x"}}, schema=0)
    assert not recorded.show("oom_message", results_dir=tmp_path).found


def test_unknown_key_is_one_sentence():
    with pytest.raises(ValueError, match="unknown result 'nope'"):
        recorded.show("nope")


def test_a_cpu_try_out_of_the_check_is_never_shown_as_a_gpu_result(tmp_path):
    run = {
        "schema": 1,
        "date": "2026-12-03",
        "torch": "2.13.0",
        "device": {"name": "x86_64", "compute_capability": None},
        "results": {"amp_speed": {"columns": ["variant"], "rows": [["fp32"]]}},
    }
    (tmp_path / "cpu.json").write_text(json.dumps(run))
    assert not recorded.show("amp_speed", results_dir=tmp_path).found


def test_skipped_or_failed_entries_fall_back_to_an_older_measurement(tmp_path):
    _write(tmp_path, "old.json", "2026-12-01", {"oom_message": {"text": "CUDA out of memory."}})
    _write(tmp_path, "new.json", "2026-12-02", {"oom_message": {"error": "timed out"}})
    _write(tmp_path, "newer.json", "2026-12-03", {"oom_message": {"skipped": "needs CUDA"}})
    result = recorded.show("oom_message", results_dir=tmp_path)
    assert result.found and result.text == "CUDA out of memory."
    assert result.source["date"] == "2026-12-01"


def test_every_key_the_benchmarks_record_is_known():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_bench.py"
    text = path.read_text()
    for key in recorded.KEYS:
        assert f'"{key}"' in text, f"the GPU benchmarks never record {key!r}"
    assert importlib.util.spec_from_file_location("gpu_bench", path) is not None


# --- issue 25 §8: a bad file is skipped and named; show() keeps working ----------------------


@pytest.mark.parametrize("cc", [[9], 9, ["9", "0"], [9, 0, 1]])
def test_a_malformed_compute_capability_is_skipped_and_named(tmp_path, cc):
    _write(tmp_path, "good.json", "2026-12-01", {"oom_message": {"text": "CUDA out of memory."}})
    run = {
        "schema": 1,
        "date": "2026-12-05",
        "device": {"name": "GPU", "compute_capability": cc},
        "results": {"oom_message": {"text": "newer, but malformed"}},
    }
    (tmp_path / "bad.json").write_text(json.dumps(run))
    result = recorded.show("oom_message", results_dir=tmp_path)
    assert result.found and result.text == "CUDA out of memory."
    assert "bad.json: its compute_capability must be two whole numbers" in str(result)


def test_rows_that_are_not_a_list_of_lists_are_skipped_and_named(tmp_path):
    _write(tmp_path, "a.json", "2026-12-01", {"amp_speed": {"columns": ["v"], "rows": 5}})
    result = recorded.show("amp_speed", results_dir=tmp_path)
    assert not result.found
    assert "a.json (amp_speed): its rows must be a list of lists" in str(result)


def test_a_file_nested_too_deeply_does_not_break_every_show(tmp_path):
    _write(tmp_path, "good.json", "2026-12-01", {"oom_message": {"text": "CUDA out of memory."}})
    (tmp_path / "deep.json").write_text("[" * 100_000)
    skipped = []
    assert len(recorded.load_runs(tmp_path, skipped)) == 1
    assert skipped == ["deep.json: nested too deeply"]
    result = recorded.show("oom_message", results_dir=tmp_path)
    assert result.found and "deep.json: nested too deeply" in str(result)
