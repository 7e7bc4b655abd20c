"""`make lab` binds to 127.0.0.1 with a token, also as root; a real server is started once."""

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from tutorial_utils import lab
from tutorial_utils.lab import lab_command, parse_port

ROOT = Path(__file__).resolve().parent.parent


def test_command_binds_localhost_never_moves_port_and_holds_no_token():
    cmd = lab_command("notebooks", port=9999, is_root=False)
    assert "--ServerApp.ip=127.0.0.1" in cmd and "--ServerApp.port=9999" in cmd
    assert "--ServerApp.port_retries=0" in cmd  # a busy port is an error, never a silent move
    assert not any("0.0.0.0" in part for part in cmd)
    assert not any("token" in part.lower() for part in cmd)  # any user can read a command line
    assert "--allow-root" not in cmd
    assert lab_command("notebooks", is_root=True)[-1] == "--allow-root"


@pytest.mark.parametrize("text", ["abc", "", "0", "65536", "-1", "8888.5", "80 80"])
def test_bad_port_is_one_sentence(text):
    with pytest.raises(ValueError, match="whole number from 1 to 65535") as info:
        parse_port(text)
    assert "\n" not in str(info.value)
    assert parse_port(" 9000 ") == 9000


def test_port_from_the_environment_is_checked(monkeypatch, capsys):
    monkeypatch.setenv("PORT", "abc")
    assert lab.main(["--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lab: the port must be a whole number") and err.count("\n") == 1


def test_busy_port_is_refused_before_anything_starts(capsys):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        before = psutil.Process().children(recursive=True)
        assert lab.main(["--no-browser", "--port", str(port)]) == 2
        assert psutil.Process().children(recursive=True) == before
    out, err = capsys.readouterr()
    assert "token" not in out + err
    assert err.startswith(f"lab: port {port} is already in use on 127.0.0.1")
    assert err.count("\n") == 1


def test_makefile_lab_uses_the_launcher():
    makefile = (ROOT / "Makefile").read_text()
    lab_recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "-m tutorial_utils lab" in lab_recipe


@pytest.mark.slow
@pytest.mark.guard
def test_real_server_needs_its_own_token(start_lab, tmp_path):
    # A JUPYTER_TOKEN in the learner's environment would win over ours: it must not be used.
    run = start_lab(env={"JUPYTER_TOKEN": "not-secret"})
    token = run.wait_ready()
    assert len(token) >= 32 and token != "not-secret"
    # issue 20: the readiness checks made the server log "403 GET /api/status" just before ready
    assert "403 GET" not in run.text() and "[W" not in run.text()
    assert list(tmp_path.glob("tutorial-lab-*")) == []  # the token file is gone once it is up
    base = f"http://127.0.0.1:{run.port}/api/contents"
    for bad in ("", "?token=not-secret"):
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(base + bad, timeout=10)
        assert denied.value.code == 403
    with urllib.request.urlopen(f"{base}?token={token}", timeout=10) as ok:
        names = ok.read().decode()
    assert "00_start_here.ipynb" in names or '"content"' in names
    assert "0.0.0.0" not in run.text()
    # it opens on notebook 00, and 00's link to ../docs/troubleshooting.md is served
    assert f"{run.port}/lab/tree/notebooks/00_start_here.ipynb?token=" in run.text()
    docs = f"http://127.0.0.1:{run.port}/files/docs/troubleshooting.md?token={token}"
    with urllib.request.urlopen(docs, timeout=10) as ok:
        assert b"Troubleshooting" in ok.read()


@pytest.mark.slow
def test_a_configuration_that_turns_the_token_off_is_refused(start_lab):
    run = start_lab(config="c.IdentityProvider.token = ''\n")
    assert run.proc.wait(timeout=180) == 1
    text = run.text()
    assert "lab: your Jupyter configuration turns the token off" in text
    assert "token=" not in text.replace("token=...", "")


@pytest.mark.slow
def test_a_configuration_with_a_token_of_its_own_is_refused_at_once(start_lab):
    """It replaced ours: every check was refused (4 "Forbidden" warnings a second) until, after
    180 s, the launcher said the server was not ready although it was up."""
    run = start_lab(config="c.IdentityProvider.token = 'mytoken'\n")
    assert run.proc.wait(timeout=180) == 1
    # at once: refused by the configuration check, not after waiting for the server to be
    # ready (issue 37: not by the clock, "< half the ready timeout")
    text = run.text()
    assert "lab: your Jupyter configuration sets a token of its own" in text
    assert "was not ready" not in text
    assert text.count("403 GET") <= 1  # one refused check, not a stream of them


def test_token_folders_of_dead_launchers_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"tutorial-lab-{dead.pid}-abc"
    old_style = tmp_path / "tutorial-lab-xyz"  # made before the pid was in the name
    live = tmp_path / f"tutorial-lab-{os.getpid()}-def"
    for folder in (stale, old_style, live):
        folder.mkdir()
        (folder / "token").write_text("secret")
    other = tmp_path / "something-else"
    other.mkdir()
    assert sorted(lab._remove_stale_token_folders(tmp_path)) == sorted([stale, old_style])
    assert live.is_dir() and other.is_dir() and not stale.exists() and not old_style.exists()


def test_stale_token_folders_go_where_there_are_no_uids(tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"tutorial-lab-{dead.pid}-abc"
    stale.mkdir()
    monkeypatch.delattr(os, "getuid")  # Windows: no uids (its temp folder is the user's own)
    assert lab._remove_stale_token_folders(tmp_path) == [stale]


def test_the_token_folder_names_its_launcher(tmp_path, monkeypatch):
    monkeypatch.setattr(lab.tempfile, "tempdir", str(tmp_path))
    path = lab._write_token_file("secret")
    assert path.parent.name.startswith(f"tutorial-lab-{os.getpid()}-")
    assert lab._remove_stale_token_folders(tmp_path) == []  # we are alive: kept


@pytest.mark.slow
def test_a_launcher_killed_before_ready_leaves_no_token_for_the_next_one(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    code = (
        "import sys, time\n"
        "from tutorial_utils import lab\n"
        "lab._wait_until_ready = lambda *a: time.sleep(600)  # killed before the server is up\n"
        "sys.exit(lab.main(['--no-browser', '--port', sys.argv[1]]))\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = subprocess.Popen([sys.executable, "-c", code, str(port)], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("tutorial-lab-*/token")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(tmp_path.glob("tutorial-lab-*/token")), "the launcher never wrote its token"
    finally:
        launcher.kill()  # SIGKILL: no finally, no cleanup
        launcher.wait()
    assert list(tmp_path.glob("tutorial-lab-*/token"))  # what a killed launcher leaves
    assert lab._remove_stale_token_folders(tmp_path) and not list(tmp_path.glob("tutorial-lab-*"))


def test_a_home_that_is_a_file_is_one_sentence(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("HOME", str(home))
    before = psutil.Process().children(recursive=True)
    assert lab.main(["--no-browser", "--notebook-dir", str(ROOT / "notebooks")]) == 2
    assert psutil.Process().children(recursive=True) == before
    err = capsys.readouterr().err
    assert err.startswith(f"lab: HOME is {str(home)!r}, which is a file") and err.count("\n") == 1


@pytest.mark.slow
def test_a_port_taken_after_the_check_is_an_error_not_a_move(tmp_path):
    """Another program takes the port between the check and Jupyter's start: Jupyter must not
    move to the next port (port_retries=0), and no address with the token is printed."""
    code = (
        "import sys\n"
        "from tutorial_utils import lab\n"
        "lab._port_busy = lambda port: False  # the check saw it free\n"
        "sys.exit(lab.main(['--no-browser', '--port', sys.argv[1]]))\n"
    )
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "TMPDIR": str(tmp_path),
    }
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-c", code, str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert run.returncode == 1
    assert "lab: JupyterLab stopped before it was ready" in run.stderr
    assert "is ready at" not in run.stdout and f":{port + 1}/" not in run.stdout + run.stderr
    assert list(tmp_path.glob("tutorial-lab-*")) == []


def test_the_lab_opens_on_notebook_00_and_serves_what_the_notebooks_link_to():
    cmd = lab_command(ROOT / "notebooks", is_root=False)
    root = Path(next(p for p in cmd if p.startswith("--ServerApp.root_dir=")).split("=", 1)[1])
    assert root == ROOT
    assert "--ServerApp.default_url=/lab/tree/notebooks/00_start_here.ipynb" in cmd
    # every relative link in a notebook's prose must name a file inside what the lab serves
    # (issue 20: 00's "Troubleshooting · Glossary" went to ../docs/..., outside notebooks/)
    import json
    import re

    checked = 0
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            for target in re.findall(r"\]\(([^)\s]+)\)", "".join(cell["source"])):
                if re.match(r"[a-z]+:|#", target):
                    continue
                path = (nb.parent / target.partition("#")[0]).resolve()
                assert path.is_relative_to(root), f"{nb.name} links outside the lab: {target}"
                assert path.exists(), f"{nb.name} links to {target}: no such file"
                checked += 1
    assert checked >= 3  # 00's three doc links at least


def test_without_notebook_00_the_lab_opens_on_the_folder(tmp_path):
    (tmp_path / "notebooks").mkdir()
    assert lab.start_page(tmp_path / "notebooks") == "/lab/tree/notebooks"
