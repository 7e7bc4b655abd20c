"""The wheel list for the GPU machine is complete: a missing wheel fails here, not over there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import gpu_wheels  # noqa: E402


def test_every_package_the_check_needs_travels_or_is_on_the_target():
    # the closure of pyproject's dependencies and the notebook runner, for Python 3.12 on Linux
    assert gpu_wheels.uncovered() == {}


def test_a_wheel_dropped_from_the_list_is_caught():
    lock = gpu_wheels.read_lock()
    del lock["tornado"]
    assert gpu_wheels.uncovered(lock) == {"tornado": "jupyter-client"}


def test_listed_versions_are_the_tested_pins():
    pins = gpu_wheels.read_constraints()
    for name, version in gpu_wheels.read_lock().items():
        assert pins.get(name) == version, (
            f"{name}=={version} but constraints.txt has {pins.get(name)}"
        )


def test_nothing_travels_that_the_target_has():
    # two versions of one package stop the whole install over there
    assert not set(gpu_wheels.read_lock()) & gpu_wheels.ON_TARGET


def test_the_runners_and_the_package_dependencies_are_the_roots():
    roots = gpu_wheels.needed()
    assert {"nbclient", "nbformat", "ipykernel", "ipywidgets", "gputil", "torch"} <= set(roots)
    # the unit tests: without xdist they run serially, without pytest-timeout its option warns
    assert {"pytest", "pytest-xdist", "pytest-timeout", "hypothesis"} <= set(roots)


def test_the_target_is_counted_on_for_nothing_it_does_not_bring():
    # before: attrs, hypothesis, pytest-xdist and pytest-timeout were counted on, so a machine
    # with only what docs/results/README.md names was refused ("jsonschema needs attrs>=22.2.0")
    brought = gpu_wheels.closure(list(gpu_wheels.TARGET), stop=frozenset())
    assert set(gpu_wheels.TARGET) <= gpu_wheels.ON_TARGET
    assert gpu_wheels.ON_TARGET <= set(brought), sorted(gpu_wheels.ON_TARGET - set(brought))
    text = (ROOT / "docs" / "results" / "README.md").read_text()
    assert "numpy, matplotlib, psutil, nvidia-ml-py and pytest" in " ".join(text.split())


def test_check_names_what_is_missing_extra_or_doubled(tmp_path):
    lock = {"nbclient": "0.11.0", "tornado": "6.6.1"}
    (tmp_path / "nbclient-0.11.0-py3-none-any.whl").write_text("")
    (tmp_path / "six-1.17.0-py2.py3-none-any.whl").write_text("")
    (tmp_path / "tornado-6.5.0-cp39-abi3-manylinux1_x86_64.whl").write_text("")
    problems = gpu_wheels.check(tmp_path, lock)
    assert "missing tornado==6.6.1 (found: 6.5.0)" in problems
    assert any(p.startswith("unlisted wheel six") for p in problems)
    (tmp_path / "tornado-6.6.1-cp39-abi3-manylinux1_x86_64.whl").write_text("")
    assert any("tornado has 2 versions" in p for p in gpu_wheels.check(tmp_path, lock))
    assert gpu_wheels.check(tmp_path / "nope", lock)[0].endswith(
        "run `make gpu-wheels` first (here, with PyPI)"
    )


def test_a_bad_lock_line_is_one_sentence(tmp_path):
    bad = tmp_path / "lock.txt"
    bad.write_text("nbclient==0.11.0\ntornado>=6\n")
    with pytest.raises(ValueError, match=r"line 2: write NAME==VERSION, not 'tornado>=6'"):
        gpu_wheels.read_lock(bad)


def test_the_wheel_folder_is_ignored_by_git():
    assert ".whl/" in (ROOT / ".gitignore").read_text().split()


def test_wheels_and_the_working_tree_stay_well_under_40_mib():
    folder = gpu_wheels.WHEEL_DIR
    if not folder.is_dir():
        pytest.skip("no .whl/ here: run `make gpu-wheels` to measure the size")
    import shutil
    import subprocess

    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout (the GPU machine gets a copy of the files)")

    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=30
    ).stdout.split(b"\0")
    tree = sum(
        (ROOT / f.decode()).stat().st_size for f in tracked if f and (ROOT / f.decode()).is_file()
    )
    total = tree + gpu_wheels.size_bytes(folder)
    assert total < 30 * 2**20, f"{total / 2**20:.1f} MiB travel to the GPU machine"
