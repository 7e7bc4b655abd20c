"""Headroom: what a training process needs on the GPU beside its tensors (a term; no torch).

- **CUDA context**: 0.47 GiB, what the CUDA context and PyTorch's kernels took on an A100 80GB
  with PyTorch 2.1.1 and lazy module loading (0.92 GiB with ``CUDA_MODULE_LOADING=EAGER``),
  stas00/ml-engineering (``published.json``, key ``cuda_context``). It is outside PyTorch's
  allocator: ``torch.cuda.memory_reserved()`` does not count it, ``nvidia-smi`` does.
- **allocator reserve**: 5 % of the tensors' peak, kept for what the caching allocator reserves
  beyond what is allocated (rounding and fragmentation). This fraction is an ASSUMPTION, not a
  published figure: no published pair of ``max_memory_reserved`` and ``max_memory_allocated``
  over a training step of a recipe the calculator models was found (torchtitan logs only the
  reserved peak; litgpt only the allocated one), and the course has no GPU recording of one
  yet. The pairs torchtune publishes are after model init, before any step: 13.98 against
  13.96 GB for Llama 2 7B LoRA (``qlora_finetune.rst``, 0914d5cfb) and 6.27 against 6.21 GiB
  for Llama 3.2 3B LoRA (``e2e_flow.rst``, 0cd8bc4ca), +0.1 % and +1.0 %: a lower bound, since
  a step's activations and frees are what fragment. Its QLoRA row shows the other end: init
  reserved 9.13 GB where the quantizing load allocates about 7.0 (``tests/test_fit_published``).
  The reserve depends on the order of allocations
  (Edward Yang, "When does fragmentation occur in the CUDA caching allocator?", PyTorch
  dev-log, 2026-06-01). Measure yours: ``torch.cuda.max_memory_reserved()`` against
  ``torch.cuda.max_memory_allocated()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cards import GiB

__all__ = ["HEADROOM", "HeadroomTerm"]


@dataclass(frozen=True)
class HeadroomTerm:
    """Memory a training process needs beside its tensors: a fixed size or a fraction of them."""

    name: str
    fixed_bytes: int
    fraction: float
    source: str

    def bytes_for(self, tensors_bytes: int) -> int:
        return self.fixed_bytes + int(self.fraction * tensors_bytes)


HEADROOM = (
    HeadroomTerm(
        "CUDA context",
        int(0.47 * GiB),
        0.0,
        "ml-engineering: 0.47 GiB on an A100 80GB, PyTorch 2.1.1, lazy module loading",
    ),
    HeadroomTerm(
        "allocator reserve",
        0,
        0.05,
        "an ASSUMED 5 % of the tensors' peak for the caching allocator's rounding and "
        "fragmentation (no published reserved/allocated pair found); measure "
        "max_memory_reserved() against max_memory_allocated()",
    ),
)
