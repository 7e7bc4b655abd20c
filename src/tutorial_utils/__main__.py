"""``python -m tutorial_utils doctor|lab|fit``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "doctor": "check this machine for the course",
        "lab": "start JupyterLab on the notebooks",
        "fit": "will a model's training step fit a GPU, and what to change if not",
    }
    if not argv or argv[0] not in commands:
        lines = [f"  {name:8} {what}" for name, what in commands.items()]
        print(
            "usage: python -m tutorial_utils COMMAND [options]\n\ncommands:\n" + "\n".join(lines),
            file=sys.stderr,
        )
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    # Imported here, for the command asked for only: doctor imports torch (seconds), which
    # `make lab` does not need before JupyterLab starts; fit imports it after its arguments.
    if argv[0] == "doctor":
        from .doctor import main as run
    elif argv[0] == "fit":
        from .fit.cli import main as run
    else:
        from .lab import main as run
    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
