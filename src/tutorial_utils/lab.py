"""``make lab``: start JupyterLab on the notebooks, safely.

* It binds to 127.0.0.1 (never 0.0.0.0) and always requires a token, made here.
* The token never appears on a command line: any user of the machine can read every process's
  arguments (``/proc/PID/cmdline``). Jupyter reads it from a file only its owner can read (mode
  0600 in a private folder, named by ``JUPYTER_TOKEN_FILE``), deleted once the server is up. The
  folder's name carries the launcher's pid: one left by a launcher that was killed before the
  server was up (SIGKILL runs no cleanup) is removed by the next launch.
* A busy port is an error, never a silent move: the port is checked first, and Jupyter is told
  not to try the next one (``port_retries=0``) in case another program takes it meanwhile.
* The address with the token is printed only when the server listening on that port is the one
  started here, and it refuses requests without the token (a Jupyter configuration that turns
  the token off, ``c.ServerApp.token = ''``, is refused with the line to remove; one that sets a
  token of its own, which would replace ours, is refused at once in the same way). The checks
  make no request the server logs as a warning.
* It serves the repository (the folder above the notebooks) and opens on notebook 00, so the
  notebooks' links to ``../docs/...`` open in the lab.
* JupyterLab dies with this launcher (Linux: a parent-death signal); Ctrl-C reaches JupyterLab,
  which asks whether to shut down. As root (containers, some cloud machines) JupyterLab refuses to
  start unless it is given ``--allow-root``, so that flag is added only then.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil

from .processes import tied_to_parent

__all__ = ["lab_command", "main", "parse_port", "served_root", "start_page"]

HOST = "127.0.0.1"
DEFAULT_PORT = 8888
_READY_TIMEOUT_S = 180.0  # JupyterLab starts in a few seconds; a loaded machine may take more
_HTTP_TIMEOUT_S = 3.0


def parse_port(text: str | int) -> int:
    """A TCP port from ``PORT=...`` or ``--port``; ``ValueError`` with one sentence otherwise."""
    try:
        port = int(str(text).strip())
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ValueError(
            f"the port must be a whole number from 1 to 65535, got {str(text)!r} "
            "(for example PORT=8890 make lab)"
        )
    return port


FIRST_NOTEBOOK = "00_start_here.ipynb"


def served_root(notebook_dir: str | Path = "notebooks") -> Path:
    """The folder the lab serves: the one above the notebooks (the repository), so that their
    links to ``../docs/...`` open in the lab instead of doing nothing."""
    return Path(notebook_dir).resolve().parent


def start_page(notebook_dir: str | Path = "notebooks") -> str:
    """The page the lab opens on: the first notebook, or the notebooks' folder without it."""
    folder = Path(notebook_dir).resolve()
    page = f"/lab/tree/{folder.name}"
    return f"{page}/{FIRST_NOTEBOOK}" if (folder / FIRST_NOTEBOOK).is_file() else page


def lab_command(
    notebook_dir: str | Path = "notebooks",
    *,
    port: int = DEFAULT_PORT,
    open_browser: bool = True,
    is_root: bool | None = None,
) -> list[str]:
    """The exact ``jupyter lab`` command line ``make lab`` runs (the token is not in it)."""
    if isinstance(port, bool) or not isinstance(port, int):  # 8890.0 or "8890" is a slip too
        raise ValueError(f"port must be a whole number from 1 to 65535, not {port!r}")
    port = parse_port(port)
    if is_root is None:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={served_root(notebook_dir)}",
        f"--ServerApp.default_url={start_page(notebook_dir)}",
    ]
    if not open_browser:
        cmd.append("--no-browser")
    if is_root:
        cmd.append("--allow-root")
    return cmd


def _port_busy(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Jupyter's server does
        try:
            sock.bind((HOST, port))
        except OSError:
            return True
    return False


_FOLDER_PREFIX = "tutorial-lab-"


def _write_token_file(token: str) -> Path:
    # mode 0700; the pid in the name tells a later launch whether its owner is still alive
    folder = Path(tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-"))
    path = folder / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return path


def _remove_stale_token_folders(tmp: str | Path | None = None) -> list[Path]:
    """Remove the token folders of launchers that died without cleaning up; the ones removed.

    A folder is stale when the launcher named by its pid is gone, or is a newer process that
    only got the same pid (it started after the folder was made), or when its name has no pid.
    """
    removed = []
    with contextlib.suppress(OSError):
        for folder in Path(tmp or tempfile.gettempdir()).glob(f"{_FOLDER_PREFIX}*"):
            with contextlib.suppress(OSError):
                mine = not hasattr(os, "getuid") or folder.stat().st_uid == os.getuid()
                if not folder.is_dir() or not mine:  # Windows has no uids: its temp is per user
                    continue
                pid_text = folder.name[len(_FOLDER_PREFIX) :].split("-", 1)[0]
                owner_alive = False
                if pid_text.isdigit():
                    with contextlib.suppress(psutil.Error):
                        owner = psutil.Process(int(pid_text))
                        owner_alive = owner.create_time() <= folder.stat().st_mtime + 1
                if not owner_alive:
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder)
    return removed


def _home_problem() -> str | None:
    """Why Jupyter could not keep its files under HOME, in one sentence, or None."""
    home = os.environ.get("HOME")
    if home and os.path.exists(home) and not os.path.isdir(home):
        return (
            f"HOME is {home!r}, which is a file, not a folder: Jupyter keeps its settings "
            "there; point HOME at your home folder (e.g. export HOME=~) and retry"
        )
    return None


def _listens(pid: int, port: int) -> bool:
    """True when process ``pid`` (or a child of it) listens on ``HOST:port``."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            conns = (
                proc.net_connections("tcp")
                if hasattr(proc, "net_connections")
                else proc.connections("tcp")
            )
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
                return True
    return False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a redirect is an answer, not a way on
        return None


def _status_code(port: int, token: str | None, path: str = "/api/status") -> int | None:
    """HTTP status of ``path`` on our port, with or without the token (no proxy, no redirect)."""
    request = urllib.request.Request(f"http://{HOST}:{port}{path}")
    if token:
        request.add_header("Authorization", f"token {token}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        with opener.open(request, timeout=_HTTP_TIMEOUT_S) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


def _wait_until_ready(child: subprocess.Popen, port: int, token: str) -> str | None:
    """None when our server is up on ``port`` and needs the token; else why not (one sentence)."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            return (
                f"JupyterLab stopped before it was ready (exit status {child.returncode}); "
                "its messages are above"
            )
        if _listens(child.pid, port):
            # With our token first: a server that accepts it answers 200, which it logs only at
            # debug level; a refused request would be a warning in the learner's terminal.
            with_ours = _status_code(port, token)
            if with_ours in (401, 403):
                return (
                    "your Jupyter configuration sets a token of its own (c.IdentityProvider.token "
                    "= '...' or c.ServerApp.token = '...'), which replaces the one made here, so "
                    "this lab cannot tell you its address: remove that line (see `jupyter --paths` "
                    "for where the files are)"
                )
            if with_ours == 200:
                # Does it refuse a stranger? Its login page answers 200 when it asks who you are,
                # and redirects (302) straight in when the token is off.
                login = _status_code(port, None, "/login")
                if login == 200:
                    return None
                if login is not None:
                    return (
                        "your Jupyter configuration turns the token off (c.ServerApp.token = '' "
                        "or c.IdentityProvider.token = ''), so anyone on this machine could use "
                        "this lab: remove that line (see `jupyter --paths` for where the files are)"
                    )
        time.sleep(0.25)
    return f"JupyterLab was not ready after {_READY_TIMEOUT_S:.0f} s; its messages are above"


def _stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tutorial_utils lab", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--notebook-dir", default="notebooks")
    parser.add_argument("--port", default=None, help=f"default: $PORT, else {DEFAULT_PORT}")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    args = parser.parse_args(argv)
    try:
        port = parse_port(args.port if args.port is not None else os.environ.get("PORT", "8888"))
    except ValueError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 2
    problem = _home_problem()
    if problem:
        print(f"lab: {problem}", file=sys.stderr)
        return 2
    if not Path(args.notebook_dir).is_dir():
        print(
            f"lab: no folder {args.notebook_dir!r}; run this from the repository root",
            file=sys.stderr,
        )
        return 2
    if _port_busy(port):
        print(
            f"lab: port {port} is already in use on {HOST} (another JupyterLab?): stop that "
            f"program, or choose another port, e.g. PORT={port + 1 if port < 65535 else 8890} "
            "make lab",
            file=sys.stderr,
        )
        return 2
    _remove_stale_token_folders()
    token = secrets.token_hex(24)
    token_file = _write_token_file(token)
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}  # it would win over ours
    env["JUPYTER_TOKEN_FILE"] = str(token_file)
    cmd = lab_command(args.notebook_dir, port=port, open_browser=not args.no_browser)
    # Ctrl-C in the terminal reaches JupyterLab too (same process group); it asks whether to stop,
    # so this launcher only waits. SIGTERM / SIGHUP of the launcher are passed on.
    passed_on = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, *passed_on)}
    signal.signal(signal.SIGINT, lambda *_: None)
    child = subprocess.Popen(tied_to_parent(cmd), env=env)

    def pass_on(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)

    for s in passed_on:
        signal.signal(s, pass_on)
    try:
        problem = _wait_until_ready(child, port, token)
        shutil.rmtree(token_file.parent, ignore_errors=True)  # the server has read it
        if problem:
            _stop(child)
            print(f"lab: {problem}", file=sys.stderr)
            return 1
        page = start_page(args.notebook_dir)
        print(f"\nJupyterLab is ready at: http://{HOST}:{port}{page}?token={token}\n", flush=True)
        return child.wait()
    finally:
        shutil.rmtree(token_file.parent, ignore_errors=True)
        _stop(child)
        for s, handler in previous.items():
            signal.signal(s, handler)
