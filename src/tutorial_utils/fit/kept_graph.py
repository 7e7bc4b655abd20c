"""What one micro-batch's autograd graph still holds while the next one runs forward.

One job: the bytes a training loop carries from one micro-batch into the next when it keeps
the micro-batch's logits (``logits_kept``), by formula from the shape; ``tests/test_fit_qlora.py``
replays the loop on the CPU and measures the same bytes, to the byte.

- **The loop keeps the logits.** litgpt's fine-tuning loops (``finetune/lora.py`` at 8641822;
  ``litgpt/finetune/lora.py`` at 4a9b7e62, 0d207708, 58c5b188, 43c44323 and 00af8b0d) bind
  ``logits = model(input_ids, lm_head_chunk_size=128)`` and never delete it: the previous
  micro-batch's logits live until the next ``model(...)`` has returned (``finetune/full.py``
  does the same with ``logits = model(input_ids)``). Lightning Fabric hands them back in
  torch's default dtype, fp32 (``_FabricModule.forward`` calls the precision plugin's
  ``convert_output``, ``_convert_fp_tensor(tensor, torch.get_default_dtype())``, in
  ``HalfPrecision``, ``FSDPPrecision`` and ``BitsandbytesPrecision`` at Lightning 71aed751,
  b19c3a96, 75553845, 438f29f0 and 12881e83): 4 bytes a logit. Other loops let go: torchtune's
  recipes ``del logits`` ("free logits otherwise it peaks backward memory"), Answer.AI's
  fsdp_qlora ``train.py`` (50efa1e) sets ``output = None`` "so more memory frees up before the
  next forward pass".
- **Through them, the graph.** Each logit's ``grad_fn`` reaches every node of the step's graph.
  Backward has freed what the nodes saved with ``save_for_backward``, but not tensors a custom
  ``autograd.Function`` hung on its ``ctx``: bitsandbytes' ``MatMul4Bit`` (0.41.0 and 0.42.0,
  ``autograd/_functions.py``) keeps ``ctx.tensors = (A, B)``, so the input of every NF4 linear
  stays as long as the graph does (torchao's ``LinearNF4`` saves nothing of the kind).
  bitsandbytes 0.43.2 keeps ``(None, B)`` (bitsandbytes#1270, 2024-07-16, "the bug that caused a
  lot of memory issues with QLoRA"); the course's ``bnb-nf4`` is the library before it
  (``activations._Nf4Linear`` saves the input too). Per block those inputs are the first norm's
  output (the q/k/v linear's, h wide), attention's output (the projection's, q wide), the second
  norm's output (the MLP's first linears share it, h) and the MLP's product (the down
  projection's, f), in the stream's dtype; and the final norm's output when the head is NF4 too
  (litgpt, untied). One fewer: the first block's q/k/v input needs no gradient (the embedding
  and the norm are frozen), and ``MatMul4Bit`` keeps ``(None, None)`` when no input needs one.

The term is taken at the step's ``seq``: the previous micro-batch as long as this one. With
samples of varying length (a peak is set by the longest batch) that bounds it from above.
Under activation checkpointing the blocks' NF4 inputs are not counted: a reentrant checkpoint
builds the block's graph inside backward and frees it there.
"""

from __future__ import annotations

from ..decoder_config import DecoderConfig
from .states import Lora

__all__ = ["LOGIT_BYTES", "kept_graph_bytes"]

#: The kept logits' element size: fp32, as Lightning Fabric returns a module's output.
LOGIT_BYTES = 4


def kept_graph_bytes(
    cfg: DecoderConfig,
    batch: int,
    seq: int,
    lora: Lora | None,
    checkpointing: str = "none",
    element: int = 2,
    blocks: int | None = None,
) -> int:
    """Bytes the previous micro-batch's logits and the graph behind them hold (see the module's
    docstring); ``element``: the stream's element size (2 in bf16, 4 in fp32); ``blocks``: how
    many blocks' NF4 inputs to count (all, unless told: at the end of backward the first
    block's are in its activations already)."""
    tokens = batch * seq
    kept = LOGIT_BYTES * tokens * cfg.vocab
    if lora is not None and lora.base == "bnb-nf4":
        if checkpointing == "none":
            per_block = 2 * cfg.d_model + cfg.q_dim + cfg.ff
            if blocks is None:  # every block, the first without its q/k/v input
                inputs = cfg.n_layers * per_block - cfg.d_model
            else:
                inputs = blocks * per_block
            kept += tokens * inputs * element
        if not cfg.tied:  # Lightning makes the head NF4 too: the final norm's output
            kept += tokens * cfg.d_model * element
    return kept
