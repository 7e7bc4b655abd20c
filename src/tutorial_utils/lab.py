"""``make lab``: start JupyterLab on the notebooks, safely.

It always binds to 127.0.0.1 (never 0.0.0.0) and always requires a token: it makes one
itself, so a stray ``c.ServerApp.token = ''`` in a learner's Jupyter config cannot turn
it off. As root (containers, some cloud machines) JupyterLab refuses to start unless it is
given ``--allow-root``, so that flag is added only then.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["lab_command", "main"]

HOST = "127.0.0.1"


def lab_command(
    notebook_dir: str | Path = "notebooks",
    *,
    port: int = 8888,
    token: str | None = None,
    open_browser: bool = True,
    is_root: bool | None = None,
) -> list[str]:
    """The exact ``jupyter lab`` command line ``make lab`` runs."""
    if not token:
        token = secrets.token_hex(24)
    if is_root is None:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    cmd = [
        sys.executable, "-m", "jupyterlab",
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={Path(notebook_dir).resolve()}",
    ]
    if not open_browser:
        cmd.append("--no-browser")
    if is_root:
        cmd.append("--allow-root")
    return cmd


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tutorial_utils lab", description=__doc__.splitlines()[0])
    parser.add_argument("--notebook-dir", default="notebooks")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8888")))
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    args = parser.parse_args(argv)
    if not 1 <= args.port <= 65535:
        print(f"lab: port must be between 1 and 65535, got {args.port}", file=sys.stderr)
        return 2
    if not Path(args.notebook_dir).is_dir():
        print(f"lab: no folder {args.notebook_dir!r}; run this from the repository root", file=sys.stderr)
        return 2
    token = secrets.token_hex(24)
    cmd = lab_command(args.notebook_dir, port=args.port, token=token, open_browser=not args.no_browser)
    # JupyterLab masks a token it did not generate ("?token=..."), so print the address here.
    print(f"JupyterLab will be at: http://{HOST}:{args.port}/lab?token={token}", flush=True)
    os.execv(cmd[0], cmd)
    return 0  # not reached
