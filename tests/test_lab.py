"""`make lab` binds to 127.0.0.1 with a token, also as root; a real server is started once."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tutorial_utils.lab import lab_command

ROOT = Path(__file__).resolve().parent.parent


def test_command_binds_localhost_with_a_token():
    cmd = lab_command("notebooks", port=9999, is_root=False)
    assert "--ServerApp.ip=127.0.0.1" in cmd
    assert not any("0.0.0.0" in part for part in cmd)
    token = next(p.split("=", 1)[1] for p in cmd if p.startswith("--IdentityProvider.token="))
    assert len(token) >= 32
    assert "--allow-root" not in cmd
    assert lab_command("notebooks", token="", is_root=True)[-1] == "--allow-root"
    # an empty token is replaced, never passed through
    assert all(p != "--IdentityProvider.token=" for p in lab_command("notebooks", token=""))


def test_tokens_differ_between_launches():
    a, b = (next(p for p in lab_command() if "token=" in p) for _ in range(2))
    assert a != b


def test_makefile_lab_uses_the_launcher():
    makefile = (ROOT / "Makefile").read_text()
    lab_recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "-m tutorial_utils lab" in lab_recipe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_real_server_needs_the_token(tmp_path):
    port = _free_port()
    log = tmp_path / "lab.log"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tutorial_utils", "lab", "--no-browser", "--port", str(port)],
            cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    try:
        token = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and token is None:
            text = log.read_text()
            m = re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=([0-9a-f]+)", text)
            if m and "is running at" in text:
                token = m.group(1)
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited early:\n{text}")
            time.sleep(0.3)
        assert token, log.read_text()
        base = f"http://127.0.0.1:{port}/api/contents"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(base, timeout=10)
        assert denied.value.code == 403
        with urllib.request.urlopen(f"{base}?token={token}", timeout=10) as ok:
            names = ok.read().decode()
        assert "00_start_here.ipynb" in names or '"content"' in names
        assert "0.0.0.0" not in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
