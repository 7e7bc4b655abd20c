import subprocess
import sys

import pytest
from conftest import fake_program

from tutorial_utils import doctor as doctor_mod
from tutorial_utils.doctor import doctor, main, parse_requirement


def rows(report):
    return {c.name: c for c in report.checks}


def test_doctor_on_this_machine_never_raises():
    report = doctor()
    r = rows(report)
    for name in (
        "Python",
        "torch",
        "NVML",
        "nvidia-smi",
        "GPUtil",
        "ipywidgets",
        "widget extension",
    ):
        assert name in r, name
    text = str(report)
    assert "status" in text and "torch" in text
    html = report._repr_html_()
    assert html.startswith("<table>") and "NVML" in html


def test_no_nvml_library_is_a_row(monkeypatch):
    import pynvml

    def missing():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    r = rows(doctor())
    assert r["NVML"].status == "missing"
    assert "NVML library was not found" in r["NVML"].detail


def test_nvml_failing_after_init_is_a_row(monkeypatch):
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)

    def broken():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", broken)
    r = rows(doctor())
    assert r["NVML"].status == "missing" and "NVML query failed" in r["NVML"].detail


def test_broken_nvidia_smi_is_a_row(broken_nvidia_smi):
    r = rows(doctor())
    assert r["nvidia-smi"].status == "missing"
    assert "exit code 9" in r["nvidia-smi"].detail
    # GPUtil parses nvidia-smi's output and raises ValueError on this one.
    assert r["GPUtil"].status == "missing"
    assert "cannot parse" in r["GPUtil"].detail


def test_cuda_visible_devices_empty_is_a_row(fake_cuda, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    report = doctor()
    assert report.gpu_count == 0
    assert "empty string" in rows(report)["GPUs"].detail
    assert report.missing(["gpu"]) and "empty string" in report.missing(["gpu"])[0]


def test_no_driver_is_a_row(cuda_build_without_driver):
    r = rows(doctor())
    assert r["GPUs"].status == "missing" and "no usable GPU" in r["GPUs"].detail


def test_mocked_gpus_listed(fake_cuda):
    report = doctor()
    assert report.gpu_count == 2
    r = rows(report)
    assert "NVIDIA Fake 1" in r["GPU 1"].detail
    assert report.missing(["gpus=2"]) == []
    assert "Needs 3 GPU(s) but found 2" in report.missing(["gpus=3"])[0]


@pytest.mark.parametrize(
    ("text", "parsed"), [("gpu", ("gpus", 1)), ("GPUS=2", ("gpus", 2)), ("widgets", ("widgets", 0))]
)
def test_parse_requirement(text, parsed):
    assert parse_requirement(text) == parsed


@pytest.mark.parametrize("bad", ["gpus=0", "gpus=two", "tpu", "gpus="])
def test_parse_requirement_rejects(bad):
    with pytest.raises(ValueError):
        parse_requirement(bad)


def test_require_exit_codes(capsys, fake_cuda):
    assert main(["--require", "gpus=2,widgets"]) == 0
    assert main(["--require", "gpus=3"]) == 1
    err = capsys.readouterr().err
    assert "not ready" in err and "Needs 3 GPU(s)" in err
    assert main(["--require", "gpus=two"]) == 2
    assert "whole number" in capsys.readouterr().err


def test_require_widgets_missing(monkeypatch, capsys):
    monkeypatch.setattr(doctor_mod, "_version", lambda dist: None)
    assert main(["--require", "widgets"]) == 1
    assert "ipywidgets" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_end_to_end():
    proc = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "doctor", "--require", "widgets"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Ready: widgets." in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_where_running(monkeypatch):
    for k in list(__import__("os").environ):
        if k.startswith("BINDER_") or k == "COLAB_RELEASE_TAG":
            monkeypatch.delenv(k)
    assert doctor_mod.where_running() == "local"
    monkeypatch.setenv("BINDER_LAUNCH_HOST", "https://mybinder.org/")
    assert doctor_mod.where_running() == "Binder"
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261101")
    assert doctor_mod.where_running().startswith("Colab")


def test_nvidia_smi_and_gputil_rows_from_a_working_nvidia_smi(tmp_path, monkeypatch):
    fake_program(
        tmp_path / "bin",
        "nvidia-smi",
        'case "$1" in\n'
        "  --query-gpu=index,uuid,name) echo '0, GPU-5d6c0000-aaaa, NVIDIA H100' ;;\n"
        "  *) echo '0, GPU-5d6c0000-aaaa, 3, 81559, 4, 81000, 570.1, NVIDIA H100, 1, "
        "Disabled, Disabled, 30' ;;\n"
        "esac\n",
        monkeypatch,
    )
    r = rows(doctor(timeout_s=20))
    assert (r["nvidia-smi"].status, r["nvidia-smi"].detail) == ("ok", "sees 1 GPU(s)")
    assert r["GPUtil"].status == "ok" and "sees 1 GPU(s)" in r["GPUtil"].detail


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon", "1e308", "601"])
def test_bad_timeout_is_one_sentence(bad, capsys):
    assert main(["--timeout", bad]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"doctor: --timeout must be a positive number of seconds, at most 600; got {bad!r}\n"
    )


def test_doctor_function_checks_its_timeout():
    with pytest.raises(ValueError, match="positive number of seconds"):
        doctor(timeout_s=0)


def test_without_nvidia_smi_gputil_sees_no_gpu_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvidia-smi
    r = rows(doctor())
    assert r["nvidia-smi"].detail == "not on PATH (comes with the NVIDIA driver)"
    assert (r["GPUtil"].status, r["GPUtil"].detail) == (
        "info",
        "1.4.0: sees 0 GPU(s); starts nvidia-smi on every call",
    )


def test_a_check_that_never_returns_becomes_a_row_not_a_hang():
    # The last line of defence behind each check's own timeout (a lock inside a library).
    import threading

    from tutorial_utils import doctor as doctor_module

    release, returned = threading.Event(), []

    def never_returns():
        release.wait(60)  # a hang guard: a doctor that waited for it would return after 60 s
        returned.append(True)

    result = doctor_module._in_background(never_returns, "GPUtil", 0.2)
    row = result()
    assert returned == [], "the row came only once the check returned: the doctor waited"
    release.set()
    assert (row.name, row.status) == ("GPUtil", doctor_module.MISSING)
    assert "gave up after 0.2 s" in row.detail


# --- issue 25 §8: the doctor is what a learner runs when torch is broken ----------------------


@pytest.mark.parametrize(
    ("module", "error"),
    [
        ("raise ImportError('libtorch_cpu.so: cannot open shared object file')", "ImportError"),
        ("raise ModuleNotFoundError(\"No module named 'torch'\")", "ModuleNotFoundError"),
    ],
    ids=["broken", "missing"],
)
def test_a_broken_or_missing_torch_is_a_row_not_a_traceback(tmp_path, module, error):
    import os
    from pathlib import Path

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(module + "\n")
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{src}"}
    out = subprocess.run(
        [sys.executable, "-m", "tutorial_utils", "doctor", "--timeout", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("torch "))
    assert "missing" in row and f"cannot be imported ({error}" in row and "pip install" in row
    assert "Python" in out.stdout and "psutil" in out.stdout  # the other rows still come
