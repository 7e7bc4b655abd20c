"""Notebook 02: what CUDA_VISIBLE_DEVICES does, checked in fresh processes.

For each setting (empty; this process's cuda:0 alone; with two GPUs, its cuda:1 alone and both
swapped) it starts a fresh Python with CUDA_VISIBLE_DEVICES set before CUDA starts, which
reports the setting it found and the UUIDs of the GPUs it sees. Then it checks that the listed
GPUs, and only they, are seen, renumbered from 0 in the order listed. Exits 1 with one line per
failed check.

    python scripts/cuda_visible_devices.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

CHILD = (
    "import json, os, torch\n"
    "n = torch.cuda.device_count()\n"
    "uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]\n"
    "print(json.dumps({'saw': os.environ.get('CUDA_VISIBLE_DEVICES'), 'uuids': uuids}))"
)


def visible_gpus(setting: str) -> tuple[str | None, list[str]]:
    """(the setting the child found, the UUIDs of the GPUs it sees) for one setting."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": setting}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:  # one line, not the child's traceback
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"the child Python failed with CUDA_VISIBLE_DEVICES={setting!r}: {last}")
    answer = json.loads(out.stdout)
    return answer["saw"], answer["uuids"]


def main() -> int:
    n = torch.cuda.device_count()
    mine = [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]
    # the setting that names each of our GPUs: our own CUDA_VISIBLE_DEVICES' entries when set
    ours = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    names = ours.split(",") if ours else [str(i) for i in range(n)]
    expect = {"": []}  # an empty setting hides every GPU
    if n >= 1:
        expect[names[0]] = mine[:1]  # our cuda:0 alone
    if n >= 2:
        expect[names[1]] = [mine[1]]  # our cuda:1 is the child's cuda:0: renumbered from 0
        expect[f"{names[1]},{names[0]}"] = [mine[1], mine[0]]  # the order listed is the order
    failed = []
    for setting, want in expect.items():
        saw, uuids = visible_gpus(setting)
        print(
            f"CUDA_VISIBLE_DEVICES={setting!r:8} -> {len(uuids)} GPU(s)", *[u[:13] for u in uuids]
        )
        if saw != setting:
            failed.append(f"the child found CUDA_VISIBLE_DEVICES={saw!r}, not {setting!r}")
        if uuids != want:
            failed.append(f"with {setting!r} the child saw {uuids}, expected {want}")
    for line in failed:
        print("FAILED:", line, file=sys.stderr)
    if failed:
        pass
    elif n == 0:
        print("Checked: each child got its setting. (0 GPUs is no check without a GPU.)")
    elif n == 1:
        print("Checked: one GPU listed, that one seen. (The renumbering needs two GPUs.)")
    else:
        print("Checked: exactly the GPUs listed, renumbered from 0 in the order listed.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
