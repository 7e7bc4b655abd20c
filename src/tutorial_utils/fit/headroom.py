"""Headroom: what a training process needs on the GPU beside its tensors (a term; no torch).

- **CUDA context**: 0.47 GiB, what the CUDA context and PyTorch's kernels took on an A100 80GB
  with PyTorch 2.1.1 and lazy module loading (0.92 GiB with ``CUDA_MODULE_LOADING=EAGER``),
  stas00/ml-engineering (``published.json``, key ``cuda_context``). It is outside PyTorch's
  allocator: ``torch.cuda.memory_reserved()`` does not count it, ``nvidia-smi`` does.
- **allocator reserve**: a fraction of the tensors' peak, kept for what the caching allocator
  reserves beyond what is allocated (rounding and fragmentation), one term per profile
  (``reserve_for``). Its source is ``reserve_pairs``: every published pair of
  ``max_memory_reserved`` and ``max_memory_allocated`` we found, with the rules that decide
  which count: CUDA, a training run past a full optimizer step, eager, both peaks from one call
  on one rank, a named dense decoder model, the default allocator, and (rule 7) the profile
  the run used, read from its code or text. With ``MIN_PAIRS`` (5) or more for a profile, its
  term is their median and the CLI shows their range as a band. Today 5 pairs count, all FSDP1
  (+11.6 to +79.5 %, median +42.9 %); for one GPU, DDP, ZeRO and FSDP2 none does, so their
  fraction stays an ASSUMED 5 %, and says so. The pairs after model init, before any step, are
  close to zero (torchtune's 13.98 against 13.96 GB, 6.27 against 6.21 GiB): a step's
  allocations and frees are what fragment. The reserve depends on the order of allocations
  (Edward Yang, "When does fragmentation occur in the CUDA caching allocator?", PyTorch
  dev-log, 2026-06-01). Measure yours: ``torch.cuda.max_memory_reserved()`` against
  ``torch.cuda.max_memory_allocated()``.

Why FSDP1 has a term of its own (read in torch 2.13.0's sources, and held to the installed torch
by ``tests/test_fit_reserve.py``; on the CPU ``record_stream`` is a no-op,
``fsdp/_common_utils.py`` ``_no_dispatch_record_stream``, so no CPU test can show it): FSDP1
all-gathers each unit into a flat parameter allocated while its unshard stream is current
(``fsdp/_runtime_utils.py`` lines 263 and 304-305; ``fsdp/_flat_param.py`` 1381 and 1408), so
the block belongs to that stream's pool: "the CUDA caching allocator guarantees that the memory
will only be reused with the same creation stream" (``Tensor.record_stream``'s docstring). It
frees the unit with ``record_stream`` on the compute stream (``_flat_param.py`` 1818-1821), and
records each unsharded gradient on the post-backward stream before the reduce-scatter
(``_runtime_utils.py`` 772-773): the allocator then cannot reuse those blocks until a later
allocation polls that the recorded work is done, and "can potentially race with side stream
computation and non-deterministically reuse or fail to reuse memory" (the same docstring). The
rate limiter bounds this to two units in flight (``_limiter_utils.py`` line 15). FSDP2 also
all-gathers on a side stream, but copies the output into parameters allocated on the compute
stream and frees by events, with no ``record_stream`` (``_fully_shard/_fsdp_collectives.py``
``foreach_all_gather_copy_out``; RFC pytorch/pytorch#114299: FSDP1, fairscale and DeepSpeed ZeRO
"use recordStream"; per-parameter sharding "uses manual synchronization instead since doing so
can deterministically achieve the desired memory usage"). One GPU runs its step on one stream;
DDP's Python side calls no ``record_stream`` (``nn/parallel/distributed.py``; its C++ reducer
and NCCL's own stream were not read). The mechanism says why FSDP1 reserves more and less
predictably, not by how much: the size is the published pairs' median, and the band their range.
Against it: torchtune saw reserved memory rise a little when its LoRA recipe moved from FSDP1 to
FSDP2 (torchtune PR 1517, with the LoRA weights no longer wrapped apart), and no published FSDP2
pair counts yet to say where FSDP2's reserve lies.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import reserve_pairs
from .cards import GiB

__all__ = [
    "ASSUMED_RESERVE",
    "CONTEXT",
    "HEADROOM",
    "RESERVES",
    "HeadroomTerm",
    "headroom_for",
    "profile_of",
    "reserve_for",
    "reserve_term",
]

#: the reserve kept for a profile while fewer than reserve_pairs.MIN_PAIRS published pairs count
ASSUMED_RESERVE = 0.05


@dataclass(frozen=True)
class HeadroomTerm:
    """Memory a training process needs beside its tensors: a fixed size or a fraction of them."""

    name: str
    fixed_bytes: int
    fraction: float
    source: str
    band: tuple[float, float] | None = None  # the published range of ``fraction``, if sourced

    def bytes_for(self, tensors_bytes: int) -> int:
        return self.fixed_bytes + int(self.fraction * tensors_bytes)


def profile_of(sharding: str, n_gpus: int = 1) -> str:
    """The ``reserve_pairs`` profile that a calculator sharding (``inputs.SHARDING``) runs:
    ``fsdp1`` and ``fsdp1-grad-op`` are FSDP1, ``fsdp2`` FSDP2, the ZeRO stages ZeRO, and
    ``none`` one GPU or, over several, DDP."""
    if sharding.startswith("fsdp1"):
        return "fsdp1"
    if sharding.startswith("zero"):
        return "zero"
    if sharding == "fsdp2":
        return "fsdp2"
    if sharding == "none":
        return "single" if n_gpus == 1 else "ddp"
    raise ValueError(f"no reserve profile for sharding {sharding!r}")


def reserve_term(pairs: tuple, profile: str = "fsdp1") -> HeadroomTerm:
    """The allocator's reserve under ``profile``: the median of ``pairs`` (the published pairs
    that pass ``reserve_pairs``' rules for it) when there are ``MIN_PAIRS`` or more, else
    ``ASSUMED_RESERVE``, labelled as an assumption that says what was found."""
    measure = "measure max_memory_reserved() against max_memory_allocated()"
    under = reserve_pairs.PROFILES[profile]
    if not pairs:
        ran = sorted({reserve_pairs.PROFILES[p.profile] for p in reserve_pairs.COUNTED})
        n = len(reserve_pairs.COUNTED)
        found = f"; the {n} that count ran {' or '.join(ran)}: fit.reserve_pairs" if ran else ""
        return HeadroomTerm(
            "allocator reserve",
            0,
            ASSUMED_RESERVE,
            f"an ASSUMED {ASSUMED_RESERVE:.0%} of the tensors' peak for the caching "
            f"allocator's rounding and fragmentation (no published pair counts for "
            f"{under}{found}); {measure}",
        )
    median, low, high = reserve_pairs.summary(pairs)
    found = f"range {low:+.0%} to {high:+.0%}"
    if len(pairs) >= reserve_pairs.MIN_PAIRS:
        return HeadroomTerm(
            "allocator reserve",
            0,
            median,
            f"{median:.0%} of the tensors' peak under {under}: the median of {len(pairs)} "
            f"published pairs of max_memory_reserved over max_memory_allocated ({found}; "
            f"fit.reserve_pairs); {measure}",
            band=(low, high),
        )
    return HeadroomTerm(
        "allocator reserve",
        0,
        ASSUMED_RESERVE,
        f"an ASSUMED {ASSUMED_RESERVE:.0%} of the tensors' peak for the caching allocator's "
        f"rounding and fragmentation: only {len(pairs)} published training pairs count for "
        f"{under} ({found}; fit.reserve_pairs), fewer than the {reserve_pairs.MIN_PAIRS} a "
        f"sourced term needs; {measure}",
    )


#: the CUDA context, the same under every profile
CONTEXT = HeadroomTerm(
    "CUDA context",
    int(0.47 * GiB),
    0.0,
    "ml-engineering: 0.47 GiB on an A100 80GB, PyTorch 2.1.1, lazy module loading",
)

#: each profile's reserve, from the pairs that count for it
RESERVES = {
    profile: reserve_term(reserve_pairs.counted(profile), profile)
    for profile in reserve_pairs.PROFILES
    if profile not in ("other", "unknown")
}


def reserve_for(sharding: str, n_gpus: int = 1) -> HeadroomTerm:
    """The allocator's reserve for a calculator sharding over ``n_gpus``."""
    return RESERVES[profile_of(sharding, n_gpus)]


def headroom_for(sharding: str, n_gpus: int = 1) -> tuple[HeadroomTerm, HeadroomTerm]:
    """The headroom terms a run keeps: the CUDA context and its profile's reserve."""
    return CONTEXT, reserve_for(sharding, n_gpus)


#: one GPU's headroom (the profile of a plain run; ``headroom_for`` gives the others)
HEADROOM = headroom_for("none", 1)
