"""Binder's configuration builds (checked by repo2docker without Docker) and matches the tested
pins."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split(";")[0].split("#")[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_binder_pins_agree_with_constraints():
    binder = _pins(ROOT / "binder" / "requirements.txt")
    tested = _pins(ROOT / "constraints.txt")
    assert binder.pop("torch") == "2.13.0+cpu", "Binder must use the small CPU build of torch"
    for name, version in binder.items():
        assert tested.get(name) == version, (
            f"binder/requirements.txt pins {name}=={version}, constraints.txt {tested.get(name)}"
        )


def test_binder_installs_the_package():
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "pip install" in post and "--no-deps" in post
    assert (ROOT / "binder" / "postBuild").stat().st_mode & 0o111, "postBuild must be executable"


def test_constraints_pin_torch_2_13():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().splitlines()


@pytest.mark.slow
def test_repo2docker_accepts_the_repository():
    exe = shutil.which("repo2docker") or str(Path(sys.executable).parent / "repo2docker")
    proc = subprocess.run(
        [exe, "--no-build", "--debug", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"pip install .*-r \"?binder/requirements.txt", out), (
        "requirements.txt not used"
    )
    assert "./binder/postBuild" in out, "postBuild not run"
    assert "python=3.11" in out


def test_environment_yml_lists_the_same_packages():
    import yaml

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    names = set()
    for dep in env["dependencies"]:
        items = dep["pip"] if isinstance(dep, dict) else [dep]
        for item in items:
            names.add(re.split(r"[=<> ]", item)[0].lower().replace("_", "-"))
    runtime = {
        "pytorch",
        "numpy",
        "matplotlib",
        "ipywidgets",
        "jupyterlab-widgets",
        "jupyterlab",
        "psutil",
        "nvidia-ml-py",
        "gputil",
        "setuptools",
        "ipython",
    }
    assert runtime <= names, f"missing from environment.yml: {runtime - names}"
    assert any(str(d).startswith("pytorch=2.13") for d in env["dependencies"])
