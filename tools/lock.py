"""Print constraints.txt from the packages installed in the running environment (``make lock``)."""

from __future__ import annotations

import importlib.metadata
import sys

HEADER = """\
# Tested pins (a lock file): every package `make test`, `make lab` and `make site` install,
# as tested on Python {py} (x86_64 Linux, CPU). pip reads it with `-c constraints.txt`.
# torch is pinned without a build tag: 2.13.0+cpu and 2.13.0+cu12x both satisfy it.
# Other lines only apply on Python 3.11+, where they were tested; on 3.10 pip picks
# versions inside pyproject.toml's ranges. Refresh with `make lock`.
"""
SKIP = {"pip", "tutorial-utils", "tutorial_utils"}


def main() -> None:
    pins = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in SKIP:
            pins[name] = dist.version
    print(HEADER.format(py=".".join(map(str, sys.version_info[:2]))))
    for name in sorted(pins, key=str.lower):
        if name.lower() == "torch":
            print("torch==" + pins[name].split("+")[0])
        else:
            print(f'{name}=={pins[name]} ; python_version >= "3.11"')


if __name__ == "__main__":
    main()
