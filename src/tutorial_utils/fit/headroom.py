"""Headroom: what a training process needs on the GPU beside its tensors (a term; no torch).

- **CUDA context**: 0.47 GiB, what the CUDA context and PyTorch's kernels took on an A100 80GB
  with PyTorch 2.1.1 and lazy module loading (0.92 GiB with ``CUDA_MODULE_LOADING=EAGER``),
  stas00/ml-engineering (``published.json``, key ``cuda_context``). It is outside PyTorch's
  allocator: ``torch.cuda.memory_reserved()`` does not count it, ``nvidia-smi`` does.
- **allocator reserve**: a fraction of the tensors' peak, kept for what the caching allocator
  reserves beyond what is allocated (rounding and fragmentation). Its source is
  ``reserve_pairs``: every published pair of ``max_memory_reserved`` and
  ``max_memory_allocated`` we found, with the rules (written before the pairs were weighed
  against ``tests/test_fit_published``) that decide which count: CUDA, a training run past a
  full optimizer step, eager, both peaks from one call on one rank, a named dense decoder
  model, the default allocator. With ``MIN_PAIRS`` (5) or more, the term is their median and
  the source names their range. Today 3 pairs count (+42.9, +55.6 and +79.5 %: FSDP runs of
  Llama 2 7B, Llama 3 8B and Llama 3.1 8B), so the fraction stays an ASSUMED 5 %, and says
  so. Those 3 are far above it; the pairs after model init, before any step, are close to
  zero (torchtune's 13.98 against 13.96 GB, 6.27 against 6.21 GiB): a step's activations and
  frees are what fragment. The reserve depends on the order of allocations (Edward Yang,
  "When does fragmentation occur in the CUDA caching allocator?", PyTorch dev-log,
  2026-06-01). Measure yours: ``torch.cuda.max_memory_reserved()`` against
  ``torch.cuda.max_memory_allocated()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import reserve_pairs
from .cards import GiB

__all__ = ["ASSUMED_RESERVE", "HEADROOM", "HeadroomTerm", "reserve_term"]

#: the reserve kept while fewer than reserve_pairs.MIN_PAIRS published pairs count
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


def reserve_term(pairs: tuple = reserve_pairs.COUNTED) -> HeadroomTerm:
    """The allocator's reserve: the median of ``pairs`` (the published pairs that pass
    ``reserve_pairs``' rules) when there are ``MIN_PAIRS`` or more, else ``ASSUMED_RESERVE``,
    labelled as an assumption that says what was found."""
    measure = "measure max_memory_reserved() against max_memory_allocated()"
    if not pairs:
        return HeadroomTerm(
            "allocator reserve",
            0,
            ASSUMED_RESERVE,
            f"an ASSUMED {ASSUMED_RESERVE:.0%} of the tensors' peak for the caching "
            f"allocator's rounding and fragmentation (no published pair counts); {measure}",
        )
    median, low, high = reserve_pairs.summary(pairs)
    found = f"range {low:+.0%} to {high:+.0%}"
    if len(pairs) >= reserve_pairs.MIN_PAIRS:
        return HeadroomTerm(
            "allocator reserve",
            0,
            median,
            f"{median:.0%} of the tensors' peak: the median of {len(pairs)} published pairs of "
            f"max_memory_reserved over max_memory_allocated ({found}; fit.reserve_pairs); "
            f"{measure}",
            band=(low, high),
        )
    return HeadroomTerm(
        "allocator reserve",
        0,
        ASSUMED_RESERVE,
        f"an ASSUMED {ASSUMED_RESERVE:.0%} of the tensors' peak for the caching allocator's "
        f"rounding and fragmentation: only {len(pairs)} published training pairs count "
        f"({found}; fit.reserve_pairs), fewer than the {reserve_pairs.MIN_PAIRS} a sourced "
        f"term needs; {measure}",
    )


HEADROOM = (
    HeadroomTerm(
        "CUDA context",
        int(0.47 * GiB),
        0.0,
        "ml-engineering: 0.47 GiB on an A100 80GB, PyTorch 2.1.1, lazy module loading",
    ),
    reserve_term(),
)
