"""What every script in this folder does at the start and the end of a distributed run.

torchrun starts one copy of a script per process and gives each one its place through
environment variables: RANK (0..WORLD_SIZE-1 over all machines), LOCAL_RANK (0.. on this
machine), WORLD_SIZE, MASTER_ADDR / MASTER_PORT (where to meet). These helpers read them.
They need only torch, so the scripts run the same on a laptop, a GPU server or a cluster.
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def setup() -> tuple[int, int, torch.device]:
    """Join the process group; return (rank, world size, this process's device).

    The device comes from the accelerator and the backend from the device (NCCL for CUDA).
    With fewer accelerators than local processes, or one whose only backend is gloo (MPS),
    every rank runs on the CPU with gloo.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is not None and torch.accelerator.device_count() >= local_world:
        device = torch.device(accelerator.type, local_rank)
        backend = dist.get_default_backend_for_device(device)
        if backend != "gloo":
            # The one place to set the current device, which notebook 02 advises against:
            # NCCL runs its collectives on it, so each rank sets its own before joining.
            torch.accelerator.set_device_index(local_rank)
            dist.init_process_group(backend, device_id=device)
            return dist.get_rank(), dist.get_world_size(), device
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), torch.device("cpu")


def torchrun_env() -> dict[str, str | None]:
    """What torchrun told this process: who it is, and where the ranks met.

    With the static rendezvous (a one-node ``torchrun --master-port=PORT``, and ``launch``) the
    ranks meet at ``--master-addr``:``--master-port`` and the run's id is ``--rdzv-id``
    ("none" by default); ``--standalone`` (the c10d rendezvous) gives them a second store's
    port and a fresh id. Notebook 07 compares these with the command that ran.
    """
    names = (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
    )
    return {name: os.environ.get(name) for name in names}


def teardown() -> NoReturn:
    """Leave cleanly: wait for every rank, destroy the group, then end this process at once.

    Call it last: it does not return. The barrier lets every rank finish its collectives.
    ``os._exit(0)`` skips the interpreter's shutdown, during which a gloo worker thread still
    freeing an all-reduce started inside ``backward()`` can abort a rank whose work is done
    ("terminate called without an active exception"). Output is flushed first.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def mlp(width: int, layers: int, activation: type[nn.Module], seed: int = 0) -> nn.Sequential:
    """``layers`` Linear(width, width) with ``activation`` between them, seeded: the same initial
    weights on every rank and in the single-process reference."""
    torch.manual_seed(seed)
    parts: list[nn.Module] = []
    for i in range(layers):
        parts.append(nn.Linear(width, width))
        if i < layers - 1:
            parts.append(activation())
    return nn.Sequential(*parts)


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes this rank really stores for ``t``: only its shard when ``t`` is a DTensor."""
    if t is None:
        return 0
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def log(*args) -> None:
    """Print from rank 0 only, so the output is one copy, in order."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        # One write per line: torchrun copies our output line by line, and a line that reaches it
        # in two pieces (text, then its newline) comes out as two lines.
        sys.stdout.write(" ".join(map(str, args)) + "\n")
        sys.stdout.flush()


def report(data: dict) -> None:
    """Send plain data back to the notebook that launched us (tutorial_utils.distributed.launch).

    Each rank writes rank<R>.json into the folder named by TUTORIAL_REPORT_DIR; run by hand or on a
    cluster, where that variable is unset, this does nothing.
    """
    folder = os.environ.get("TUTORIAL_REPORT_DIR")
    if folder:
        rank = dist.get_rank() if dist.is_initialized() else 0
        path = os.path.join(folder, f"rank{rank}.json")
        # Written whole or not at all: a rank stopped halfway leaves no half-written file.
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)


# Tolerances. Two correct programs that add the same numbers in another order (another rank
# split, another BLAS kernel, another thread count) round differently: the results agree only to
# within what rounding can move them. Each bound below is that amount, worked out from the sum's
# length, so it holds on every CPU math path (MKL AVX-512 or AVX2, ATen's kernels, oneDNN, any
# thread count) and still catches a real mistake: a missing gradient average is off by 1/world,
# a wrong shard by the size of the values themselves.
FP32_ROUNDING = 2.0**-24  # one fp32 rounding moves a value by at most this, relatively
BF16_ROUNDING = 2.0**-8  # one bf16 rounding: 8 significant bits


def sum_bound(terms: int, rounding: float = FP32_ROUNDING) -> float:
    """How far two orders of one sum of ``terms`` products can drift apart, relatively.

    Each order is within ``terms * rounding`` of the exact sum (Higham, *Accuracy and Stability of
    Numerical Algorithms*, §3.1: the constant gamma_n), so two orders are within twice that.
    """
    return 2 * terms * rounding


def relative_gap(got, want) -> float:
    """The largest difference of two lists of tensors, in units of the largest value they hold.

    Relative to the largest value of all, not element by element nor tensor by tensor: an
    element (or a one-element bias gradient) that is nearly zero because its terms cancel may
    differ by all of itself after rounding, and that is no mistake.
    """
    got, want = list(got), list(want)
    if len(got) != len(want):
        raise ValueError(f"{len(got)} tensors compared with {len(want)}: pass matching lists")
    scale = max(w.detach().float().abs().max().item() for w in want)
    gap = max(
        (g.detach().float() - w.detach().float()).abs().max().item()
        for g, w in zip(got, want, strict=True)
    )
    return gap / scale if scale else gap


def within(name: str, gap: float, tol: float) -> bool:
    """``gap < tol``, and the pair booked in TUTORIAL_TOLERANCE_LOG when that variable names a
    file (``tools/cpu_paths.py`` sets it to find each tolerance's worst value over CPU paths)."""
    path = os.environ.get("TUTORIAL_TOLERANCE_LOG")
    if path:
        rank = dist.get_rank() if dist.is_initialized() else 0
        record = {"source": os.path.basename(sys.argv[0]), "name": name, "rank": rank}
        with open(path, "a") as f:  # one short line per append: whole even with ranks writing
            f.write(json.dumps({**record, "gap": float(gap), "tol": float(tol)}) + "\n")
    return gap < tol
