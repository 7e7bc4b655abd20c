"""The optimizer step's temporaries: what ``optimizer.step()`` allocates beyond the states.

One job: the bytes a step holds at its highest above the weights, gradients and state it
updates, for each implementation ``torch.optim`` has (torch 2.13's ``adam.py`` and ``sgd.py``,
read; ``tests/test_fit_temporaries.py`` measures each on the CPU with the course's accountant
and gets these bytes exactly):

- **Adam / AdamW, foreach** (torch's default on CUDA): ``exp_avg_sq_sqrt =
  torch._foreach_sqrt(exp_avg_sqs)`` makes one new tensor per parameter, then divides and adds
  in place: one copy of the second moment of every parameter of the group at once, 4 bytes per
  (local) parameter in fp32.
- **Adam / AdamW, for-loop** (``foreach=False``): ``denom = (exp_avg_sq.sqrt() /
  bias_correction2_sqrt).add_(eps)`` per parameter: the square root and the quotient exist
  together for a moment, and the previous parameter's ``denom`` is still bound to the name
  until the new one replaces it: the largest, over the parameters in order, of two copies of
  one parameter's second moment and one of the one before it.
- **fused** (``fused=True``): one kernel updates in place: nothing.
- **SGD with or without momentum**, every implementation: the buffers are updated in place
  (``_foreach_mul_``, ``_foreach_add_``; ``buf.mul_(momentum).add_(grad)``): nothing, with the
  defaults (no weight decay, no Nesterov).
- **bitsandbytes' 8-bit AdamW**: one CUDA kernel per parameter updates the quantized state in
  place, each block dequantized, stepped and requantized in registers
  (``F.optimizer_update_8bit_blockwise`` passes pointers to ``optimizerStatic8bitBlockwise``:
  one launch, no allocation, in ``csrc/ops.cu`` at 0.41.1 = 18e827d6 and 0.50.1 = 37d2a938):
  nothing. On the CPU, ``tests/test_fit_8bit.py`` runs the library's own step (where it is
  installed) and finds that it keeps nothing: the state is made at the first step and then
  updated in place. What bitsandbytes' CPU backend holds meanwhile (the fp32 copies it
  dequantizes into) is that backend's, not the CUDA kernel's.
"""

from __future__ import annotations

__all__ = ["step_temporaries"]


def step_temporaries(
    numels: list[int] | tuple[int, ...], optimizer: str, impl: str, state_element_bytes: int = 4
) -> int:
    """Bytes the step allocates at its highest, for parameters of ``numels`` elements (this
    GPU's share of each), ``optimizer`` and ``impl`` (``inputs.OPTIMIZERS``,
    ``inputs.OPTIMIZER_IMPLS``) and the state's element size (4: fp32, 2: bf16 state)."""
    if optimizer not in ("adamw", "adam") or impl == "fused" or not numels:
        return 0
    if impl == "foreach":
        return state_element_bytes * sum(numels)
    if impl == "forloop":
        before = (0, *numels[:-1])
        return state_element_bytes * max(2 * n + b for n, b in zip(numels, before, strict=True))
    raise ValueError(f"optimizer implementation must be foreach, fused or forloop, not {impl!r}")
