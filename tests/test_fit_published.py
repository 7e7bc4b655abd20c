"""fit against the world: measured peaks others published, and DeepSpeed's own estimators.

Each row of ``MEASURED`` is a peak someone else measured, with its source, the commit or page
we read it at, and the recipe it ran. Rows the calculator can express (eager mode, a model
and recipe it models) are predicted and compared; rows it cannot (torch.compile, Float8, a
model outside the decoder family or with parallel blocks, an unpublished sequence length or
precision) are listed with the reason, so the table shows what is not checked as well as
what is. No constant was fitted to these
rows: the calculator's terms come from code and the CPU tests; the rows judge them.

Before the second held-out set (below): 55 rows expressible, 43 within +-10 % (78 %) and 48
within +-20 % (87 %); 57 more are listed with the reason they cannot be expressed. Three of the
55 publish a figure that is not their recipe's (two litgpt full fine-tunes below their own
yaml's model states, and torchtune's README single-GPU LoRA, whose figure its history dates to
an older config): over the other 52, 43 within 10 % (83 %).

Held out. 33 of the 55 (``HELD_OUT``, 45 rows in all) were collected on 2026-12-07 after the
calculator's last change, from sources the first 22 did not use (Answer.AI's fsdp_qlora
benchmarks, torchtune's Llama 3 tutorial and its README's compiled Llama 3.1 table, PEFT's
docs) or used little (litgpt's config hub), each row's knobs chosen from its recipe before the
calculator was asked. Untouched, they gave 15 of 33 within 10 % (45 %) and 27 within 20 %
(82 %): that is the calculator's fair score as it stood. Three changes were then made, each a
mechanism read in code, none a constant fitted, and the held-out rows are no longer untouched:

- litgpt's loop keeps its logits, so the previous micro-batch's graph lives through the next
  forward, and in it bitsandbytes 0.41-0.42's ``MatMul4Bit`` keeps every NF4 linear's input on
  its ctx (``fit.kept_graph``, ``logits_kept``; ``tests/test_fit_qlora.py``, to the byte); its
  ``--quantize bnb.nf4`` has no double quantization (``nf4_double_quant``). litgpt's QLoRA rows
  went from -8 to -21 % to -8.5 to 0.0 %. The kept term takes the previous micro-batch as long
  as this one: an upper bound over Alpaca's varying lengths.
- the allocator's reserve, one per profile (below): FSDP1's moved torchtune's two README FSDP1
  rows from -32 and -23 % to -7.5 and +5.1 %, and Answer.AI's reserved FSDP1 rows from -3 to
  -29 % under to -4 to +32 %, seven of them more than 10 % over: these runs reserved less than
  the median of FSDP1's published pairs (its band, +11.6 to +79.5 %, holds all but two).
- litgpt 8641822's own block (``block="litgpt"``, ``fit.litgpt_block``, held to litgpt's block
  run on fake tensors in ``tests/test_fit_litgpt_block.py``), which saves q and k after RoPE
  and the LoRA output it scatters into zeros: its single-GPU LoRA rows moved from -3.8 to
  -5.6 % to -2.2 to -3.2 %. The FSDP1 rows checkpoint each block and did not move; the config
  hub's rows ran later litgpt, whose block differs, and keep the course's.

Now: held out, 23 of 33 within 10 % (70 %), 27 within 20 % (82 %); the 22 earlier rows, 20 and
21 (91 %, 95 %). torchtune's low-memory full fine-tune (bitsandbytes' 32-bit ``PagedAdamW``,
whose large moments live outside PyTorch's allocator) became expressible with
``optimizer="paged-adamw"`` (``fit.states.bnb_adamw_bytes``, held to the library's allocations
in ``tests/test_fit_8bit.py``), at +1.8 %.

The twelve misses of those 55, each naming its term in ``missing``: seven Answer.AI reserved
FSDP1 peaks (+16 to +32 %: the reserve, above) and its FSDP1 NO_SHARD QLoRA run (-20 %: read as
DDP, whose reserve is the assumed 5 %); torchtune's QLoRA (-20.9 %: fragmentation at load); the
three rows whose figure is not their recipe's (+126 %, +149 %, -12.8 %).

Held out, second set. The rows above were used to change the calculator, so 24 more
(``HELD_OUT_2``) were collected on 2026-12-07 from sources no row above uses: IBM's
fms-acceleration benchmark CSV (Mistral 7B full fine-tune and LoRA on 1 and 2 A100s, rank 0's
peak allocated bytes), the training-speed notes of Sebastian Raschka's LLMs-from-scratch
(GPT-124M, reserved GiB), and, listed only (compiled, or an optimizer the calculator does not
model), torchao's low-bit optimizer README and the GaLore and Q-GaLore scripts. Each row's knobs
were committed before the calculator was asked (6e3e851), and nothing in the calculator changed
for them. 10 are expressible: 9 within 10 % (90 %) and 9 within 20 %. The four full fine-tunes
agree to -0.02 % (their peak is the foreach AdamW step), the four LoRA rows fall within -6.5 to
+5.4 %, the book's step 6 is -1.8 % (two unmodelled terms pulling apart, noted on the row), and
its step 7 is +52 % over: the book's loss runs on bf16 logits and the calculator's always
upcasts (``missing``). With them: 65 rows expressible, 52 within 10 % and 57 within 20 %; 71
listed.

Of the 22 earlier rows, before this round: the QLoRA rows were 22-39 % under until
their libraries' mechanisms were modelled (``fit.activations._Nf4Linear``,
``fit.states.nf4_load_bytes``, ``tests/test_fit_qlora.py``). Five FSDP1 rows (litgpt's LoRA on
2 and 4 A100s, and its Gemma 2B full fine-tune) were 33-73 % under until FSDP1's ``no_sync``
was modelled (``gradient_sync="last"``, held to 2 gloo ranks in
``tests/test_fit_profiles.py``): Lightning's ``no_backward_sync`` enters FSDP1's ``no_sync``
for every micro-batch but the last (lightning/fabric/strategies/fsdp.py,
_FSDPBackwardSyncControl), which keeps the full, unsharded gradient of every unit until the
micro-batch that syncs (the FullyShardedDataParallel.no_sync docstring, torch 2.1 to 2.13:
"FSDP will accumulate the full model gradients (instead of gradient shards)"), and under
``use_orig_params`` a unit that mixes frozen and trainable weights keeps gradient memory for
all of them (litgpt#1417; litgpt#1538 quotes torch's warning "1451376640 numel instead of
106496"): a bf16 gradient of every block weight on each rank, which is why 2 GPUs hold more
than one (22.18 against 21.30 GB). For torchtune's README FSDP1 rows these were ruled out
first, read at torchtune fef3ed10d: a root unit holding the frozen base (the root holds only
the embedding, final norm and head), frozen blocks kept gathered through backward (FSDP1
reshards them: ``test_fit_profiles.test_fsdp1_reshards_frozen_blocks_in_backward``) and model
init (outside the logged peak).

``test_the_misses_are_the_rows_that_say_so`` fails if another row misses or a named miss starts
to agree, so this paragraph stays true.

The reserve term is one per profile (``fit.headroom``). ``fit.reserve_pairs`` holds every
published pair of peak reserved and peak allocated memory found (24, with URLs) and the rules,
six written before any pair was weighed against these rows, for which count; rule 7, added
after, records each pair's profile from its code or text. 5 count, all FSDP1 (+11.6 % to
+79.5 %: llama-recipes' FSDP runs, Liger's Medusa example and two of Answer.AI's runs, whose
page also gives held-out rows here: those rows compare the same runs' allocated peaks, which
the reserve does not touch), so FSDP1's reserve is their median, +42.9 %, and FSDP1 frees its
all-gathered units with ``record_stream`` from a stream of its own, as one GPU, DDP and FSDP2
do not (``fit.headroom`` cites the code). Every other profile keeps the assumed 5 %: no pair
counts there. ``test_fsdp1s_median_would_overshoot_the_other_profiles_reserved_rows`` shows the
split matters: with FSDP1's median for every profile, the seven "reserved" rows of other
profiles that agree today would land 29-39 % over, and 14 of 22 earlier rows (not 20) would be
within 10 %; with the assumed 5 % for FSDP1 too, 39 and 47 of 55 (not 43 and 48), 21 and 28 of
33, 18 and 19 of 22.

What each source reports decides what is compared:

- torchtitan logs ``max_reserved_gib``: the allocator's ``reserved_bytes.all.peak``
  (``torchtitan/metrics.py`` and ``train.py`` at 9dec370). That is the tensors' peak plus the
  allocator's reserve; the CUDA context is outside it. So: ``peak_bytes`` + the reserve term
  (an assumption: ``fit.headroom``, sources weighed in ``fit.reserve_pairs``).
- torchtune's README table of 2024-11-18 is "Peak Memory Active": the tensors alone:
  ``peak_bytes``. Its LoRA and QLoRA tutorials' tables are peak memory *reserved*, in GB:
  their numbers were written on 2024-04-15, when ``torchtune/utils/memory.py`` divided by
  1e9 (GiB only from d0b89e206, 2024-08-15): ``peak_bytes`` + the reserve, over 10**9.
- litgpt's resource tables print ``torch.cuda.max_memory_allocated() / 1e9`` as "GB", and so
  does the "Peak memory" of its config hub (``finetune/full.py`` prints it): ``peak_bytes`` in
  10**9 bytes.
- Answer.AI's fsdp_qlora prints max_memory_allocated and max_memory_reserved / 2**30 as GiB
  (``train.py`` from 50efa1e); its tables show the reserved one.
- PEFT's docs give the GPU's memory read during training (the driver's view: the CUDA
  context and NCCL's buffers included, ``compares="nvidia-smi"``), not a peak: listed only.
- torchtune's README table of 2024-04-16 says "Peak Memory per GPU"; its QLoRA figure is the
  QLoRA tutorial's reserved one (9.29 GB), so the table is read as reserved, in GB.
- fms-acceleration's benchmark CSV gives ``mem_peak_torch_mem_alloc_in_bytes``: rank 0's
  ``max_memory_allocated()`` over the Trainer's init and train stages, in bytes (its
  ``benchmark.py``, ``extract_gpu_memory_metrics``): ``peak_bytes``. Its ``nvidia_mem_reserved``
  column is nvidia-smi's: not compared.
- LLMs-from-scratch prints ``torch.cuda.memory_reserved() / 1024**3`` as "GB" after an epoch
  with no ``empty_cache``: the reserved peak in GiB, ``peak_bytes`` + the reserve.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from tutorial_utils import fit, fit_inputs
from tutorial_utils.decoder import PRESETS, Decoder, DecoderConfig

GiB, GB = 2**30, 10**9
TOLERANCE = 0.10

TORCHTITAN = (
    "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (file commit 820504e, "
    "read at b5bcd76); runs: torchtitan 9dec370, torch 1963fc8 (2024-12), 8x H100 96GB per host"
)
TORCHTITAN_RUN = (
    "Llama 3.1 8B, FSDP2 (fully_shard per block, then the root), bf16 params with fp32 "
    "reduce (MixedPrecisionPolicy), AdamW, local batch 2, seq 8192 (train_configs/llama3_8b.toml"
    " at 9dec370), selective op AC (every second mm saved), eager"
)
TORCHTUNE = (
    "pytorch/torchtune README.md, 'Optimization flags' (table added in 1814feb, 2024-11-18; "
    "read at bd2a0fc)"
)
TORCHTUNE_RUN = (
    "Llama 3.2 3B, full_finetune_single_device, batch 2, max seq 4096, bf16 (weights, "
    "gradients and AdamW state), A100; each technique added on top of the previous one"
)
TORCHTUNE_LORA = (
    "pytorch/torchtune docs/source/tutorials/lora_finetune.rst, the table of LoRA layers and "
    "ranks (numbers added in ff594c231, 2024-04-15; read at bd2a0fc); peak memory reserved, "
    "GB: torchtune/utils/memory.py at ff594c231 divides max_memory_reserved by 1e9 (GiB only "
    "from d0b89e206, 2024-08-15)"
)
TORCHTUNE_QLORA = (
    "pytorch/torchtune docs/source/tutorials/qlora_finetune.rst, 'Peak memory reserved, "
    "training' (numbers added in 0914d5cfb, 2024-04-15; read at bd2a0fc); GB (1e9), as above"
)
TORCHTUNE_LORA_RUN = (
    "Llama 2 7B, lora_finetune_single_device with llama2/7B_lora_single_device at ff594c231: "
    "batch 2, gradient accumulation 64, bf16 weights and adapters (AdamW state bf16), LoRA "
    "dropout 0.05 (lora_llama2_7b's default), activation checkpointing on, alpaca_cleaned "
    "unpacked, truncated to max_seq_len=512 (the dataset's default at ff594c231 and 0914d5cfb;"
    " samples longer than 512 tokens exist, litgpt counts 1304 under Llama 2's tokenizer), so "
    "the longest batch is 512 (until 2026-12-07 these rows assumed 1304, at +2.7 to +4.0 %)"
)
TORCHTUNE_QLORA_RUN = (
    "Llama 2 7B, lora_finetune_single_device with llama2/7B_qlora_single_device at 0914d5cfb: "
    "qlora_llama2_7b, LoRA rank 8 on q, k, v, output and the MLP, dropout 0.05, batch 2, "
    "gradient accumulation 16, activation checkpointing on, bf16; torchao 0.1 (torchtune's "
    "pin), whose to_nf4 quantizes a whole tensor at once; the model is built and its checkpoint"
    " loaded (quantized) on the GPU, and memory_stats_log resets the peak after init, but "
    "reserved memory stays reserved: the training's reserved peak starts from init's (9.13 GB)"
)
LITGPT = (
    "Lightning-AI/litgpt tutorials/resource-tables.md (last changed e567dbe, read at 2685705): "
    "LitGPT 8641822, PyTorch 2.1.0, bitsandbytes 0.41.1, A100-SXM4-40GB, 2023-10-20; "
    "'Max GPU RAM' is max_memory_allocated / 1e9"
)
LITGPT_RUN = (
    "litgpt finetune_lora, Alpaca (longest sample 1304 tokens under Llama 2's tokenizer, as "
    "the page says), --precision bf16-true (weights, adapters and AdamW state bf16), LoRA r=8 "
    "on query and value (trainable 4,194,304 for 7B, as the page lists), minibatch 128 by "
    "gradient accumulation, no activation checkpointing; LoRA dropout 0.05 not modelled; "
    "logits = model(...) stays bound through the next micro-batch's forward (logits_kept, "
    "fit.kept_graph; the sample before taken as long as the longest, an upper bound)"
)
LIGHTNING = (
    "Lightning Fabric docs, 'Training models with billions of parameters' (FSDP guide), "
    "https://lightning.ai/docs/fabric/stable/advanced/model_parallel/fsdp.html (checked "
    "2026-12-01, src/tutorial_utils/published.json key fsdp_strategies); Lightning 2.1, "
    "2x A100 40GB"
)
TRAINY = (
    "pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (read at "
    "b5bcd76); torchtitan e7c0cae, 2025-06, H200"
)

LITGPT_MULTI = (
    "Lightning-AI/litgpt tutorials/resource-tables.md, 'Finetuning with LoRA on Multiple GPUs' "
    "(last changed e567dbe, read at 2685705): LitGPT 8641822, PyTorch 2.1.0, A100-SXM4-40GB, "
    "2023-10-20; 'Max GPU RAM' is max_memory_allocated / 1e9"
)
LITGPT_MULTI_RUN = (
    "finetune/lora.py at 8641822 with devices > 1: Lightning's FSDPStrategy(auto_wrap_policy="
    "{Block}, activation_checkpointing_policy={Block}, limit_all_gathers=True), i.e. FSDP1 "
    "FULL_SHARD with one unit per Block holding the frozen weights and the LoRA A and B "
    "together (Fabric's FSDPStrategy sets use_orig_params=True from torch 2.0, which is what "
    "lets a unit mix them); every micro-batch but the last of 128 runs under "
    "fabric.no_backward_sync; otherwise as the single-GPU rows (bf16-true, AdamW over the "
    "LoRA weights, r=8 on q and v, Alpaca, longest sample 1304 tokens)"
)
TORCHTUNE_README = (
    "pytorch/torchtune README.md, the table of recipes and 'Peak Memory per GPU' (added in "
    "fef3ed10d, 2024-04-16; the same table's QLoRA figure, 9.29 GB, is the QLoRA tutorial's "
    "peak memory reserved, so: reserved, in GB as torchtune/utils/memory.py wrote it then)"
)
TORCHTUNE_README_RUN = (
    "Llama 2 7B, dtype bf16 (weights, gradients and AdamW state bf16), torch.optim.AdamW, "
    "batch 2, configs at fef3ed10d; the Alpaca datasets truncate to max_seq_len=512 "
    "(torchtune/datasets/_alpaca.py at fef3ed10d, ff594c231 and 0914d5cfb), and samples "
    "longer than that exist (litgpt counts 1304 tokens), so the longest batch is 512"
)
LITGPT_HUB = (
    "Lightning-AI/litgpt config_hub/finetune/README.md (row written in 84a73fd0, 2024-03-27); "
    "'Peak memory' is max_memory_allocated() / 1e9 (litgpt/finetune/full.py at 84a73fd0)"
)
DEEPSPEED_GIST = (
    "chenyaofo's gist 'Benchmark of LLaMA-7B models using deepspeed-based training code', "
    "https://gist.github.com/chenyaofo/d4cd6a20ab4b95cb3a49491747e2139a (read 2026-12-07 from "
    "a stored copy): 8x A800 80GB, CUDA 12.1, PyTorch 2.2.0, DeepSpeed 0.14.2, seq 4096; GPU "
    "Mem is memory_allocated() / max_memory_allocated(), the second compared"
)

#: Llama 3.2 3B from Meta's config.json (hidden 3072, 28 layers, 24 heads, 8 kv heads, MLP
#: 8192, vocab 128256, tied embeddings): 3,212,749,824 parameters; now a preset too.
LLAMA_3B = DecoderConfig(
    vocab=128256,
    d_model=3072,
    n_layers=28,
    n_heads=24,
    n_kv_heads=8,
    d_ff=8192,
    norm="rms",
    mlp="swiglu",
    bias=False,
    tied=True,
    max_positions=0,
)


#: Gemma 2B as litgpt 84a73fd0 builds it: the preset's shape, lm_head a separate weight.
GEMMA_2B_UNTIED = dataclasses.replace(fit.shapes.config("gemma-2b")[1], tied=False)


@dataclass(frozen=True)
class Measured:
    """A published measured peak and how to ask the calculator the same question."""

    what: str
    measured: float
    source: str
    configuration: str
    compares: str  # "reserved" (peak + allocator reserve), "active"/"allocated" (peak), or
    # "nvidia-smi" (the driver's view, CUDA context included: listed, never modelled)
    knobs: dict | None  # will_it_fit's arguments; None when it cannot be modelled
    not_modelled: str = ""  # why not, when knobs is None
    unit: int = GiB
    missing: str = ""  # for a row that misses: the term the calculator lacks


def _titan(n_gpus: int) -> dict:
    return dict(
        preset="llama-8b",
        batch=2,
        seq=8192,
        precision="bf16-master",  # FSDP2's sharded fp32 params + bf16 compute: 16 B/param too
        optimizer="adamw",
        checkpointing="every-second-matmul",
        sharding="zero3",
        n_gpus=n_gpus,
    )


def _litgpt(preset: str, micro: int, base: str = "bf16") -> dict:
    return dict(
        preset=preset,
        batch=micro,
        seq=1304,
        precision="pure-bf16",
        # finetune/lora.py at 8641822: bnb.optim.PagedAdamW (32-bit) under --quantize bnb.*,
        # torch.optim.AdamW otherwise
        optimizer="paged-adamw" if base == "bnb-nf4" else "adamw",
        lora_rank=8,
        lora_targets="qv",
        lora_base=base,
        lora_dropout=0.05,  # finetune/lora.py at 8641822: lora_dropout = 0.05
        grad_accumulation=128 // micro,
        logits_kept=True,  # logits = model(input_ids, ...) stays bound: fit.kept_graph
        block="litgpt",  # lit_gpt.lora.Block at 8641822 (fit.litgpt_block)
    )


def _tune_lora(targets: str, rank: int, base: str = "bf16", accumulation: int = 64) -> dict:
    return dict(
        preset="llama-2-7b",
        batch=2,
        seq=512,  # alpaca_cleaned_dataset's max_seq_len default truncates every sample
        precision="pure-bf16",
        checkpointing="full",
        lora_rank=rank,
        lora_targets=targets,
        lora_base=base,
        lora_dropout=0.05,  # lora_llama2_7b's default at ff594c231 and 0914d5cfb
        grad_accumulation=accumulation,  # gradient_accumulation_steps in the config
    )


_FRAGMENTATION = (
    "the caching allocator's fragmentation while the base is quantized: this row is a reserved "
    "peak that starts from init's (9.13 GB in the same tutorial), and the loading moment "
    "allocates 7.0 GB (states + torchao 0.1's whole-tensor scratch for one MLP weight, 68 B a "
    "weight); 224 scratch spikes of 1.1-3.0 GB between small persistent NF4 allocations leave "
    "segments the next spike cannot reuse. The course has no model of fragmentation (the "
    "reserve term is a flat 5 %). Also left out: Llama-2-7b-hf's .bin files hold fp16, so the "
    "load keeps an fp16 GPU copy beside to_nf4's bf16 cast (0.09 GB)"
)
_COMPILE = "torch.compile changes what is saved: eager mode only (a labelled band)"

# Held-out rows (added 2026-12-07, issue 39): published peaks from sources the rows above do not
# use or use little, collected after the calculator was last changed; their knobs were chosen
# from each recipe before the calculator was asked. They are not to be fitted: a row that misses
# names the term it thinks is lacking, as the rows above do.

LITGPT_HUB_HELD = (
    "Lightning-AI/litgpt config_hub/finetune/README.md, the row of {yaml} (written in "
    "{commit}, {date}; read at 2685705); 'Peak memory' is what litgpt/finetune/{script}.py "
    "at {commit} prints, max_memory_allocated() / 1e9 (never reset: the load counts); "
    "1x A10G (24 GB) on Lightning Studios"
)
LITGPT_HUB_RUN = (
    "config_hub/finetune/{yaml} at {commit}: bf16-true (weights, trainable weights' "
    "gradients and AdamW state bf16), {what}, 1 device (strategy 'auto': no FSDP, no "
    "activation checkpointing), micro-batch {micro}, global batch {total}, Alpaca2k truncated "
    "to max_seq_length 512 (the longest batch assumed to reach it, as the gemma-2b row above);"
    " logits made in chunks of 128 tokens (lm_head_chunk_size=128), which Lightning Fabric "
    "hands back in fp32 (_FabricModule.forward: precision.convert_output, to torch's default "
    "dtype), so the cross-entropy per chunk (chunked_cross_entropy) is fp32, as the "
    "calculator's loss (until 2026-12-07 this said bf16: misread, the knobs unchanged); the "
    "loop never deletes them, so the previous micro-batch's logits and graph live through the "
    "next forward (logits_kept, fit.kept_graph; that micro-batch taken as long as this one)"
)
_HUB_LORA = (
    "torch.optim.AdamW over LoRA rank {rank} (alpha 16, dropout {dropout}) on {targets}{quant}"
)
_BNB_NO_DQ = (
    "; --quantize bnb.nf4: every nn.Linear bitsandbytes' NF4 Linear4bit WITHOUT double "
    "quantization (Lightning's _NF4Linear: compress_statistics=False; an fp32 absmax per 64 "
    "weights, 0.375 bit a weight more than with it: nf4_double_quant=False, 0.3 GB at 7B), "
    "bitsandbytes' MatMul4Bit keeping each linear's input on its ctx (0.41.0, 0.42.0), AdamW "
    "swapped for bitsandbytes' PagedAdamW (32-bit state of tensors of 100,000 elements or "
    'more in CUDA unified memory, outside the allocator: optimizer="paged-adamw")'
)

#: TinyLlama 1.1B as litgpt 4a9b7e62 builds it (litgpt/config.py, tiny-llama-1.1b): 22 layers,
#: hidden 2048, 32 heads, 4 query groups, LLaMAMLP 5632, vocab 32000, RMSNorm, lm_head apart.
TINYLLAMA = DecoderConfig(
    vocab=32000,
    d_model=2048,
    n_layers=22,
    n_heads=32,
    n_kv_heads=4,
    d_ff=5632,
    norm="rms",
    mlp="swiglu",
    bias=False,
    tied=False,
    max_positions=0,
)
#: Llama 3.2 1B and 3B as litgpt 00af8b0d builds them: no weight tying in litgpt's Config;
#: convert_hf_checkpoint copies the embedding into lm_head when the checkpoint has none.
LLAMA_1B_UNTIED = dataclasses.replace(fit.shapes.config("llama-1b")[1], tied=False)
LLAMA_3B_UNTIED = dataclasses.replace(LLAMA_3B, tied=False)
#: Yi 34B from 01-ai/Yi-34B's config.json (LlamaForCausalLM): hidden 7168, 60 layers, 56
#: heads, 8 kv heads, MLP 20480, vocab 64000, untied.
YI_34B = DecoderConfig(
    vocab=64000,
    d_model=7168,
    n_layers=60,
    n_heads=56,
    n_kv_heads=8,
    d_ff=20480,
    norm="rms",
    mlp="swiglu",
    bias=False,
    tied=False,
    max_positions=0,
)


def _hub(yaml, commit, date, measured, preset, micro, total, script="lora", missing="", **lora):
    """A litgpt config-hub row on one A10G."""
    knobs = dict(
        preset=preset,
        batch=micro,
        seq=512,
        precision="pure-bf16",
        optimizer="adamw",
        grad_accumulation=total // micro,
        logits_kept=True,  # logits = model(input_ids, ...) stays bound: fit.kept_graph
    )
    what = "torch.optim.AdamW over every weight (foreach, torch's default)"
    if lora:
        head = lora.pop("head", False)
        quant = _BNB_NO_DQ if lora.get("lora_base") == "bnb-nf4" else ""
        targets = "q and v" if lora["lora_targets"] == "qv" else "q, k, v, proj and the MLP"
        if head:
            targets += " and lm_head (LoRA on the head not modelled: rank x (hidden + vocab) "
            targets += "more weights and a (batch, seq, vocab) bf16 output)"
        what = _HUB_LORA.format(
            rank=lora["lora_rank"], dropout=lora["lora_dropout"], targets=targets, quant=quant
        )
        knobs |= lora
        if lora["lora_base"] == "bnb-nf4":
            knobs["nf4_double_quant"] = False  # --quantize bnb.nf4
            knobs["optimizer"] = "paged-adamw"  # litgpt swaps AdamW for bnb's PagedAdamW
    return Measured(
        f"litgpt config hub {yaml}, 1x A10G",
        measured,
        LITGPT_HUB_HELD.format(yaml=yaml, commit=commit, date=date, script=script),
        LITGPT_HUB_RUN.format(yaml=yaml, commit=commit, what=what, micro=micro, total=total),
        "allocated",
        knobs,
        unit=GB,
        missing=missing,
    )


def _qv(rank=32, base="bf16"):
    return dict(lora_rank=rank, lora_targets="qv", lora_base=base, lora_dropout=0.05)


def _all(rank, dropout, base="bf16"):
    return dict(lora_rank=rank, lora_targets="all", lora_base=base, lora_dropout=dropout, head=True)


_NOT_ITS_RECIPE = (
    "not identified: the published peak is below the yaml's own model states (bf16 weights, "
    "gradients and two AdamW moments, 8 B a weight: "
    "test_the_rows_that_cannot_be_their_recipe_hold_less_than_its_states), so the run that "
    "printed it cannot have been this yaml's full fine-tune on one device"
)
_FSDP1_BELOW_MEDIAN = (
    "a reserve below FSDP1's median: the calculator adds the median of the published FSDP1 "
    "pairs (+43 %, fit.headroom), and this run reserved less beyond its peak; the same page's "
    "two LoRA runs of this script reserved +24 % and +12 % beyond what they allocated "
    "(fit.reserve_pairs), the low end of the pairs' +12 to +80 % band, which the CLI shows"
)
_ANSWERAI_RESERVE = (
    "a reserve beyond the assumed 5 %: the calculator reads NO_SHARD as DDP, for which no "
    "published pair counts (fit.headroom), though FSDP1's NO_SHARD still records each gradient "
    "on its post-backward stream; the same page measured this script's FULL_SHARD LoRA runs "
    "reserving 24 % and 12 % above what they allocated (10.24 against 8.28 GiB at context "
    "512, 10.22 against 9.16 at 2048), which would lift this row by 6 to 18 points"
)

ANSWERAI = (
    "AnswerDotAI/fsdp_qlora benchmarks_03_2024.md (added 4cd6923, 2024-05-03; read at "
    "05ed9f2): runs of February and March 2024 on {hw}; train.py from 50efa1e (2024-03-26) "
    "prints max_memory_allocated() and max_memory_reserved() / 2**30 as GiB, over the first "
    "epoch after reset_peak_memory_stats (so after the model is loaded and wrapped); the "
    "tables' 'Peak Memory (GiB)' is the reserved one (the page: 'the reported peak reserved "
    "memory for both 512 and 2048 ... the peak allocated memory is 8.28 GiB vs 9.16 GiB')"
)
ANSWERAI_RUN = (
    "train.py at 50efa1e with {args}: transformers' LlamaForCausalLM (sdpa attention, logits "
    "upcast to fp32 for the loss), --precision bf16 (weights, LoRA and AdamW state bf16, no "
    "MixedPrecision), torch.optim.AdamW over the trainable weights, LoRA rank 64 alpha 16 "
    "dropout 0.1 on q, k, v, gate, up and down ('all' in train.py: not o_proj, rank x 8192 "
    "weights a layer fewer than the knob's), {sharding}, each LoRA linear and each "
    "LlamaDecoderLayer its own unit (no unit mixes frozen and trainable weights), "
    "use_orig_params=False, limit_all_gathers, reentrant activation checkpointing per decoder "
    "layer, the dummy dataset (every sample truncated to the context length), no gradient "
    "accumulation, 2 GPUs{quant}"
)
_ANSWERAI_QLORA = (
    "; --train_type qlora: every linear of the decoder layers bitsandbytes' Linear4bit (NF4, "
    "double quantization by default, quant_storage bf16 so that FSDP shards the packed "
    "weights), built on the meta device and quantized layer by layer as it loads "
    "(--low_memory); the head and embedding bf16"
)


def _answerai(what, gib, compares, train, seq, batch, hw="2x RTX 3090 (24 GB)", **extra):
    missing = extra.pop("missing", "")
    ddp = extra.pop("ddp", False)
    knobs = dict(
        preset=extra.pop("preset", "llama-2-7b"),
        batch=batch,
        seq=seq,
        precision="pure-bf16",
        optimizer="adamw",
        checkpointing="full",
        sharding="none" if ddp else "fsdp1",
        n_gpus=2,
        lora_rank=64,
        lora_targets="all",
        lora_base="bnb-nf4" if train == "qlora" else "bf16",
        lora_dropout=0.1,
        **extra,
    )
    offload = extra.get("cpu_offload", False)
    args = f"--train_type {train} --batch_size {batch} --context_length {seq}"
    args += f" --use_cpu_offload {offload}" + (" --sharding_strategy ddp" if ddp else "")
    sharding = (
        "FSDP1 NO_SHARD (the page's 'DDP': FSDP keeping whole copies, read as DDP)"
        if ddp
        else "FSDP1 FULL_SHARD" + (" with CPUOffload(offload_params=True)" if offload else "")
    )
    return Measured(
        what,
        gib,
        ANSWERAI.format(hw=hw),
        ANSWERAI_RUN.format(
            args=args, sharding=sharding, quant=_ANSWERAI_QLORA if train == "qlora" else ""
        ),
        compares,
        knobs,
        unit=GiB,
        missing=missing,
    )


TORCHTUNE_LLAMA3 = (
    "pytorch/torchtune docs/source/tutorials/llama3.rst, 'In our experiments, we observed a "
    "peak memory usage of 18.5 GB' (written in 20747cd87, 2024-04-18; read at bd2a0fc); which "
    "of the peaks torchtune/utils/memory.py logged then (active, allocated, reserved, each "
    "/ 1e9) is not said: read as reserved, as the README table of the same week"
)
TORCHTUNE_SPEED = (
    "pytorch/torchtune README.md, 'Memory and training speed' (table of 30b8519e8, "
    "2024-09-24; read at bd2a0fc): 'Peak Memory per GPU', batch 2, no gradient accumulation, "
    "dataset packed to 2048, torch compile enabled; which peak is not said (read as reserved)"
)

PEFT_DOCS = (
    "huggingface/peft docs/source/accelerate/{page}.md, 'Memory usage' (written in {commit}; "
    "read at 5d602fdbf): 'the memory consumed per GPU', read off the GPU's own memory "
    "readout during training (the DeepSpeed page shows it as a screenshot): not a peak"
)
_PEFT_RUN = (
    "examples/sft/train.py with TRL's SFTTrainer: Llama-2-70b-hf, ultrachat-10k packed to "
    "2048, --bf16 True, flash attention 2, gradient checkpointing, LoRA r=8 alpha 16 dropout "
    "0.1 on all linears, per-device batch {batch}, gradient accumulation {accumulation}, "
    "{how}"
)
_PEFT_NOT = (
    "a reading of the GPU's memory at some moment of training (the driver's view, with the "
    "CUDA context and NCCL's buffers), not a peak the calculator can be held to; and the "
    "Trainer's bf16 autocast over bf16-stored weights with PEFT's adapters is not a recipe "
    "the calculator models"
)

HELD_OUT = (
    _hub("llama-2-7b/lora.yaml", "41dece20", "2024-03-15", 19.77, "llama-2-7b", 2, 8, **_qv()),
    _hub(
        "llama-2-7b/qlora.yaml",
        "4a9b7e62",
        "2024-03-14",
        13.68,
        "llama-2-7b",
        2,
        8,
        **_qv(base="bnb-nf4"),
    ),
    _hub("llama-3-8b/lora.yaml", "58c5b188", "2024-04-19", 19.73, "llama-8b", 1, 8, **_qv()),
    _hub(
        "llama-3-8b/qlora.yaml",
        "58c5b188",
        "2024-04-19",
        17.41,
        "llama-8b",
        2,
        8,
        **_qv(base="bnb-nf4"),
    ),
    _hub("mistral-7b/lora.yaml", "43c44323", "2024-04-24", 20.66, "mistral-7b", 2, 8, **_qv()),
    _hub(
        "mistral-7b/qlora.yaml",
        "0d207708",
        "2024-03-17",
        14.29,
        "mistral-7b",
        2,
        8,
        **_qv(base="bnb-nf4"),
    ),
    _hub("tiny-llama/full.yaml", "4a9b7e62", "2024-03-14", 14.10, TINYLLAMA, 4, 32, "full"),
    _hub(
        "tiny-llama/lora.yaml", "41397ed6", "2024-03-14", 13.50, TINYLLAMA, 8, 8, **_all(32, 0.05)
    ),
    _hub(
        "tiny-llama/qlora.yaml",
        "41397ed6",
        "2024-03-14",
        16.24,
        TINYLLAMA,
        8,
        8,
        **_all(32, 0.05, "bnb-nf4"),
    ),
    _hub(
        "llama-3.2-1B/full.yaml",
        "00af8b0d",
        "2024-09-27",
        8.70,
        LLAMA_1B_UNTIED,
        4,
        64,
        "full",
        _NOT_ITS_RECIPE,
    ),
    _hub("llama-3.2-1B/lora.yaml", "00af8b0d", "2024-09-27", 4.49, LLAMA_1B_UNTIED, 1, 8, **_qv()),
    _hub(
        "llama-3.2-1B/qlora.yaml",
        "00af8b0d",
        "2024-09-27",
        5.53,
        LLAMA_1B_UNTIED,
        2,
        8,
        **_qv(base="bnb-nf4"),
    ),
    _hub(
        "llama-3.2-3B/full.yaml",
        "00af8b0d",
        "2024-09-27",
        16.51,
        LLAMA_3B_UNTIED,
        4,
        64,
        "full",
        _NOT_ITS_RECIPE,
    ),
    _hub("llama-3.2-3B/lora.yaml", "00af8b0d", "2024-09-27", 9.67, LLAMA_3B_UNTIED, 1, 8, **_qv()),
    _hub(
        "llama-3.2-3B/qlora.yaml",
        "00af8b0d",
        "2024-09-27",
        10.30,
        LLAMA_3B_UNTIED,
        2,
        8,
        **_qv(base="bnb-nf4"),
    ),
    _hub(
        "gemma-2b/lora.yaml",
        "bc3c337f",
        "2024-03-15",
        12.62,
        GEMMA_2B_UNTIED,
        2,
        6,
        **_all(16, 0.1),
    ),
    _hub(
        "gemma-2b/qlora.yaml",
        "43c44323",
        "2024-04-24",
        11.58,
        GEMMA_2B_UNTIED,
        2,
        6,
        **_all(16, 0.1, "bnb-nf4"),
    ),
    _answerai("Answer.AI FSDP LoRA, Llama 2 7B, context 512", 8.28, "allocated", "lora", 512, 1),
    _answerai("Answer.AI FSDP LoRA, Llama 2 7B, context 2048", 9.16, "allocated", "lora", 2048, 1),
    _answerai(
        "Answer.AI FSDP QLoRA, Llama 2 7B, context 512",
        4.98,
        "reserved",
        "qlora",
        512,
        1,
        missing=_FSDP1_BELOW_MEDIAN,
    ),
    _answerai(
        "Answer.AI FSDP QLoRA, Llama 2 7B, context 2048",
        5.21,
        "reserved",
        "qlora",
        2048,
        1,
        missing=_FSDP1_BELOW_MEDIAN,
    ),
    *(
        _answerai(
            f"Answer.AI FSDP {train}, Llama 2 7B, context 2048, batch {batch}",
            gib,
            "reserved",
            train.lower(),
            2048,
            batch,
            missing=_FSDP1_BELOW_MEDIAN,
        )
        for train, batch, gib in (("QLoRA", 4, 11.22), ("QLoRA", 10, 20.97), ("LoRA", 4, 16.14))
    ),
    _answerai(
        "Answer.AI FSDP LoRA, Llama 2 7B, context 2048, batch 6",
        21.35,
        "reserved",
        "lora",
        2048,
        6,
    ),
    _answerai(
        "Answer.AI FSDP1 NO_SHARD QLoRA, Llama 2 7B, context 2048, batch 8",
        20.94,
        "reserved",
        "qlora",
        2048,
        8,
        ddp=True,
        missing=_ANSWERAI_RESERVE,
    ),
    _answerai(
        "Answer.AI FSDP1 NO_SHARD LoRA, Llama 2 7B, context 2048, batch 4",
        22.04,
        "reserved",
        "lora",
        2048,
        4,
        ddp=True,
    ),
    _answerai(
        "Answer.AI FSDP QLoRA, Yi 34B, context 2048, batch 2",
        23.05,
        "reserved",
        "qlora",
        2048,
        2,
        preset=YI_34B,
        missing=_FSDP1_BELOW_MEDIAN,
    ),
    _answerai(
        "Answer.AI FSDP QLoRA + CPU offload, Yi 34B, context 2048, batch 4",
        22.98,
        "reserved",
        "qlora",
        2048,
        4,
        preset=YI_34B,
        cpu_offload=True,
    ),
    _answerai(
        "Answer.AI FSDP QLoRA + CPU offload, Llama 2 70B, context 2048, batch 2",
        14.92,
        "reserved",
        "qlora",
        2048,
        2,
        preset="llama-2-70b",
        cpu_offload=True,
    ),
    _answerai(
        "Answer.AI FSDP LoRA + CPU offload, Llama 2 7B, context 2048, batch 10, 2x RTX 4090",
        22.69,
        "reserved",
        "lora",
        2048,
        10,
        hw="2x RTX 4090 (24 GB)",
        cpu_offload=True,
    ),
    _answerai(
        "Answer.AI FSDP QLoRA + CPU offload, Llama 2 7B, context 2048, batch 12, 2x RTX 4090",
        22.38,
        "reserved",
        "qlora",
        2048,
        12,
        hw="2x RTX 4090 (24 GB)",
        cpu_offload=True,
        missing=_FSDP1_BELOW_MEDIAN,
    ),
    Measured(
        "torchtune Llama 3 8B LoRA, single device",
        18.5,
        TORCHTUNE_LLAMA3,
        "Llama 3 8B (the llama-8b shape; Llama 3.1 changes only RoPE's scaling), "
        "lora_finetune_single_device with llama3/8B_lora_single_device at 20747cd87: "
        "lora_llama3_8b (rank 8, alpha 16, dropout 0.05) on q and v, batch 2, gradient "
        "accumulation 64, bf16 (weights, adapters and AdamW state), activation checkpointing "
        "on, alpaca_cleaned_dataset truncated to max_seq_len=512 (its default at 20747cd87), "
        "torch.nn.CrossEntropyLoss on the fp32-upcast logits",
        "reserved",
        dict(_tune_lora("qv", 8), preset="llama-8b"),
        unit=GB,
    ),
    *(
        Measured(
            f"PEFT docs, Llama 2 70B {label}",
            gb,
            PEFT_DOCS.format(page=page, commit=commit),
            _PEFT_RUN.format(batch=batch, accumulation=accumulation, how=how),
            "nvidia-smi",
            None,
            _PEFT_NOT,
            unit=GB,
        )
        for label, gb, page, commit, batch, accumulation, how in (
            (
                "QLoRA, FSDP1 + CPU offload, 2 GPUs",
                19.6,
                "fsdp",
                "6008f272a, 2024-03-13",
                2,
                2,
                "4-bit NF4 with double quantization stored as bf16, FSDP1 FULL_SHARD with "
                "CPU offload of parameters, use_orig_params False, 2 GPUs (24 GB)",
            ),
            (
                "QLoRA, FSDP1, 2 GPUs",
                35.6,
                "fsdp",
                "6008f272a, 2024-03-13",
                2,
                2,
                "as the row before without CPU offload",
            ),
            (
                "LoRA, DeepSpeed ZeRO-3, 8x H100",
                64.0,
                "deepspeed",
                "aa2ca83ca, 2024-02-26",
                8,
                4,
                "bf16 weights, DeepSpeed ZeRO-3 with bf16 mixed precision, 8x H100 80GB",
            ),
            (
                "QLoRA, DeepSpeed ZeRO-3, 2x A100 40GB",
                36.6,
                "deepspeed",
                "6008f272a, 2024-03-13",
                2,
                2,
                "4-bit NF4 with double quantization stored as bf16, DeepSpeed ZeRO-3 "
                "(zero3_init_flag), 2x 40 GB GPUs",
            ),
        )
    ),
    *(
        Measured(
            f"torchtune README {model} {method}, {hw}",
            peak,
            TORCHTUNE_SPEED,
            f"{model}, {method}, {hw}, packed to 2048, batch 2, torch.compile" + extra,
            "reserved",
            None,
            _COMPILE,
            unit=unit,
        )
        for model, method, hw, peak, unit, extra in (
            ("Llama 3.1 8B", "full fine-tune", "1x RTX 4090", 18.9, GiB, ""),
            ("Llama 3.1 8B", "full fine-tune", "1x A6000", 37.4, GiB, ""),
            ("Llama 3.1 8B", "LoRA", "1x RTX 4090", 16.2, GiB, ""),
            ("Llama 3.1 8B", "LoRA", "1x A6000", 30.3, GiB, ""),
            ("Llama 3.1 8B", "QLoRA", "1x RTX 4090", 7.4, GiB, ""),
            ("Llama 3.1 70B", "full fine-tune", "8x A100", 13.9, GiB, "; CPU offload, fused"),
            ("Llama 3.1 70B", "LoRA", "8x A100", 27.6, GiB, ""),
            ("Llama 3.1 405B", "QLoRA", "8x A100", 44.8, GB, "; the table says GB here"),
        )
    ),
)


# Held-out rows, second set (added 2026-12-07 evening, issue 39): the rows of HELD_OUT were used
# to change the calculator, so they no longer judge it fairly. These come from sources no row
# above uses (IBM's fms-acceleration benchmarks, Sebastian Raschka's LLMs-from-scratch training
# speed notes, torchao's low-bit optimizer README, the GaLore and Q-GaLore scripts); each row's
# knobs were written from its recipe and committed before the calculator was asked.

FMS = (
    "foundation-model-stack/fms-acceleration scripts/benchmarks/refs/a100_80gb.csv at 9239802 "
    "(2024-11-14, 'Update Benchmarks'; row {index}): 1x or 2x A100 80GB, torch 2.4.1, "
    "transformers 4.45.2, trl 0.11.4, peft 0.13.2, accelerate 1.0.1, flash-attn 2.6.3 "
    "(refs/requirements.txt at 9239802); mem_peak_torch_mem_alloc_in_bytes is rank 0's "
    "max_memory_allocated() in bytes over the Trainer's init and train stages "
    "(benchmark.py extract_gpu_memory_metrics at 9239802: the allocated running sum at each "
    "stage's end plus that stage's peaked delta, from transformers' TrainerMemoryTracker, which "
    "resets the peak at each stage's start)"
)
FMS_RUN = (
    "fms-hf-tuning's sft_trainer (TRL SFTTrainer over the HF Trainer) on yahma/alpaca-cleaned, "
    "packing True at max_seq_len 4096 (benchmark.py's matrices at 9239802; the logged "
    "tokens/sec x runtime / 100 steps is 4096 tokens a sample), Mistral-7B-v0.1 with "
    "torch_dtype bfloat16 and no --bf16 (no autocast: weights, gradients and AdamW state "
    "bf16), flash attention 2 (use_flash_attn), gradient_checkpointing True (per decoder "
    "layer), the Trainer's default optimizer (torch.optim.AdamW, foreach), no gradient "
    "accumulation, 100 steps, per-device batch {batch}; transformers 4.45's MistralForCausalLM "
    "upcasts all logits to fp32 before the loss (and makes a contiguous shifted copy, not "
    "modelled); {how}"
)
_FMS_ONE = "1 GPU: plain python, no FSDP"
_FMS_TWO = (
    "2 GPUs: accelerate launch with scripts/benchmarks/accelerate.yaml at 9239802, FSDP1 "
    "FULL_SHARD (fsdp_sharding_strategy 1), TRANSFORMER_BASED_WRAP per MistralDecoderLayer, "
    "BACKWARD_PRE, no forward prefetch, mixed_precision 'no'"
)
_FMS_LORA = (
    "; standard-peft: LoRA r=16, alpha 16, dropout 0.1 on q_proj, k_proj, v_proj and o_proj "
    "(scenarios.yaml at 9239802), AdamW over the adapters only"
)
_FMS_LORA_FSDP = (
    " (with FSDP the Trainer's _fsdp_qlora_plugin_updates swaps in PEFT's "
    "fsdp_auto_wrap_policy, so each LoRA linear is its own unit and no unit mixes frozen and "
    "trainable weights)"
)


def _fms(index: int, batch: int, n_gpus: int, gb_bytes: int, lora: bool) -> Measured:
    knobs = dict(
        preset="mistral-7b",
        batch=batch,
        seq=4096,
        precision="pure-bf16",
        optimizer="adamw",
        checkpointing="full",
    )
    if n_gpus > 1:
        knobs |= dict(sharding="fsdp1", n_gpus=n_gpus)
    if lora:
        knobs |= dict(lora_rank=16, lora_targets="attention", lora_base="bf16", lora_dropout=0.1)
    how = _FMS_ONE if n_gpus == 1 else _FMS_TWO
    if lora:
        how += _FMS_LORA + (_FMS_LORA_FSDP if n_gpus > 1 else "")
    what = "LoRA" if lora else "full fine-tune"
    return Measured(
        f"fms-acceleration Mistral 7B {what}, {n_gpus}x A100 80GB, batch {batch}",
        gb_bytes / GB,
        FMS.format(index=index),
        FMS_RUN.format(batch=batch, how=how),
        "allocated",
        knobs,
        unit=GB,
    )


RASBT = (
    "rasbt/LLMs-from-scratch ch05/10_llm-training-speed/README.md (numbers written in 908dd2f, "
    "2025-02-12; unchanged to 322000d): A100, PyTorch 2.6.0+cu124; 'Reserved memory' is "
    "torch.cuda.memory_reserved() / 1024**3 printed as 'GB' (so GiB) after the first epoch's "
    "training, evaluation and sampling (01_opt_single_gpu.py and 00_orig.py, "
    "train_model_simple_with_timing); nothing calls empty_cache, so it is the reserved peak"
)
RASBT_RUN = (
    "the chapter 5 GPT (124M shape: vocab 50257, 768 wide, 12 layers, 12 heads, context 1024, "
    "learned positions, LayerNorm, GELU(tanh) MLP 4x, biases but no qkv bias, lm_head apart "
    "from the embedding), trained on Middlemarch in 1024-token windows, batch 8 (00_orig.py's "
    "settings; step 10 alone raises it), drop_rate 0.1 (nn.Dropout after the embedding and on "
    "both residual branches of each block: not modelled), torch.set_float32_matmul_precision"
    "('high'), torch.optim.AdamW(fused=True), the model cast to bfloat16 (weights, gradients "
    "and AdamW state bf16), F.cross_entropy on the bf16 logits (no fp32 upcast), no "
    "checkpointing, eager; {step}"
)
#: The chapter's GPT as LLMs-from-scratch builds it: the course's GPT-2 block (LayerNorm,
#: GELU(tanh), biases) with its own lm_head; the course's biases include q, k and v's
#: (3 x 768 weights a layer more than the book's qkv_bias=False: 0.02 % of 163M).
RASBT_GPT = dataclasses.replace(fit.shapes.config("gpt2-124m")[1], tied=False)


def _rasbt(
    step: str, gib: float, attention: str | None, why: str = "", missing: str = ""
) -> Measured:
    knobs = None
    if attention is not None:
        knobs = dict(
            preset=dataclasses.replace(RASBT_GPT, attention=attention),
            batch=8,
            seq=1024,
            precision="pure-bf16",
            optimizer="adamw",
            optimizer_impl="fused",
            checkpointing="none",
        )
    return Measured(
        f"LLMs-from-scratch GPT-124M, {step}",
        gib,
        RASBT,
        RASBT_RUN.format(step=step),
        "reserved",
        knobs,
        why,
        unit=GiB,
        missing=missing,
    )


_BF16_LOSS = (
    "not identified to the byte; the likely term: the loss in the logits' own dtype. The book "
    "calls F.cross_entropy on bf16 logits, with no fp32 upcast, and the calculator's loss "
    "always upcasts (its peak is at the start of backward, 4.58 GiB of activations and 2.92 "
    "GiB of transients, where logits-sized tensors are 8 x 1024 x 50257 = 412M elements: 1.53 "
    "GiB each in fp32, 0.77 GiB in bf16); the excess is 3.1 GiB"
)
_FROM_SCRATCH = (
    "the book's own LayerNorm (mean, variance and the normalised copy each saved) and GELU "
    "(the tanh formula written out, several 4x-wide intermediates saved) are not the ops the "
    "calculator's block runs"
)

TORCHAO = (
    "pytorch/ao torchao/optim/README.md (read at 072500a; the Llama2-7B table from PR 812, "
    "2024-09-05, after PR 746): 'Fine-tune Llama2-7B on Alpaca. PyTorch 2.4, full BF16, 1 "
    "epoch, A100 ... with torchtune 52d1b838'; 'Peak memory allocated (GB)' as the README "
    "labels it (which divisor torchtune's memory stats used at 52d1b838 was not read here)"
)
GALORE = (
    "{repo} {path} at {commit}: the script's own comment, '{comment}'; which statistic (and GB "
    "or GiB) is not said"
)


HELD_OUT_2 = (
    *(
        _fms(index, batch, n_gpus, peak, lora)
        for index, batch, n_gpus, peak, lora in (
            (10, 4, 1, 72_434_853_376, False),
            (11, 2, 2, 36_225_955_840, False),
            (12, 8, 1, 72_435_246_592, False),
            (13, 4, 2, 36_226_152_448, False),
            (34, 4, 1, 25_653_881_344, True),
            (35, 2, 2, 15_245_549_568, True),
            (36, 8, 1, 36_643_613_184, True),
            (37, 4, 2, 22_161_170_432, True),
        )
    ),
    _rasbt(
        "step 6: PyTorch's LayerNorm and GELU, the book's explicit attention (softmax of the "
        "masked q k^T, dropout 0.1 on the weights: the dropout not modelled)",
        11.5645,
        "explicit",
        # within 10 % (-1.8 %) by two unmodelled terms of about the same size pulling apart, as
        # read after the comparison: the bf16 loss (step 7's miss, about -3 GiB) and the
        # dropout on the attention weights (a bool mask and the dropped bf16 copy, 3 B a weight:
        # 8 x 12 x 1024 x 1024 x 3 B = 0.28 GiB a layer, 3.4 GiB over 12 layers, not counted)
    ),
    _rasbt(
        "step 7: F.scaled_dot_product_attention(is_causal=True, dropout_p=0.1) with one fused "
        "qkv linear",
        5.9004,
        "sdpa",
        missing=_BF16_LOSS,
    ),
    *(
        _rasbt(step, gib, None, why)
        for step, gib, why in (
            ("baseline 00_orig.py (fp32, torch's default AdamW)", 26.2617, _FROM_SCRATCH),
            (
                "step 1: the causal mask made on the fly (steps 2-4, TF32, fused AdamW and "
                "pinned memory, print the same 26.2422)",
                26.2422,
                _FROM_SCRATCH,
            ),
            ("step 5: the model cast to bfloat16", 13.7871, _FROM_SCRATCH),
            ("step 8: torch.compile(model)", 6.1875, _COMPILE),
            ("step 9: vocabulary padded to 50304, compiled", 5.8906, _COMPILE),
            ("step 10: batch 32, compiled", 22.5078, _COMPILE),
            ("DDP on 4 A100s, batch 32 each, compiled", 22.7969, _COMPILE),
        )
    ),
    *(
        Measured(
            f"torchao README, Llama 2 7B full BF16 fine-tune, {impl}, 1x A100",
            gb,
            TORCHAO,
            f"torchtune 52d1b838's single-device full fine-tune of Llama 2 7B on Alpaca, full "
            f"BF16, AdamW from {impl}; the batch, sequence length and checkpointing are not "
            "given in the README or PR 812's description as read",
            "allocated",
            None,
            _COMPILE + " (PR 746 gives each run's compile time, 4 minutes for PyTorch's fused "
            "AdamW); and the batch and sequence length are not published",
            unit=GB,
        )
        for impl, gb in (
            ("PyTorch (fused)", 51.6),
            ("bitsandbytes 8-bit", 39.3),
            ("torchao 8-bit", 39.1),
            ("torchao 4-bit", 33.2),
        )
    ),
    *(
        Measured(
            f"{name} LLaMA-7B pre-training, 1 GPU, batch {batch}" + (", checkpointing" * ckpt),
            gb,
            GALORE.format(repo=repo, path=path, commit=commit, comment=comment),
            f"{path}: the repository's own LLaMA (configs/llama_7b.json), C4, --dtype bfloat16 "
            f"(pure bf16), --batch_size {batch}, --optimizer {optim}, --single_gpu"
            + (", --activation_checkpointing" if ckpt else ""),
            "allocated",
            None,
            "GaLore's low-rank projected 8-bit Adam (and Q-GaLore's int8 weights) is not an "
            "optimizer the calculator models; and which statistic the comment gives is not said",
            unit=GB,
        )
        for name, repo, path, commit, comment, batch, ckpt, optim, gb in (
            (
                "GaLore 8-bit",
                "jiaweizzhao/GaLore",
                "scripts/single_gpu/llama_7b.sh",
                "8460814",
                "22.72G, 0.37s/it",
                1,
                False,
                "galore_adamw8bit_per_layer",
                22.72,
            ),
            (
                "Q-GaLore",
                "VITA-Group/Q-GaLore",
                "scripts/single_gpu/llama_7b.sh",
                "dd09cd3",
                "Memory cost: 15.08 G",
                1,
                False,
                "q_galore_adamw8bit_per_layer",
                15.08,
            ),
            (
                "Q-GaLore",
                "VITA-Group/Q-GaLore",
                "scripts/single_gpu/llama_7b_checkpointing.sh",
                "dd09cd3",
                "Memory cost: 15.26G, BSZ=16",
                16,
                True,
                "q_galore_adamw8bit_per_layer",
                15.26,
            ),
        )
    ),
)


MEASURED = (
    Measured("torchtitan FSDP, 8 GPUs", 82.4, TORCHTITAN, TORCHTITAN_RUN, "reserved", _titan(8)),
    Measured(
        "torchtitan FSDP, 128 GPUs", 67.0, TORCHTITAN, TORCHTITAN_RUN, "reserved", _titan(128)
    ),
    Measured(
        "torchtune Llama 3.2 3B + packed dataset",
        60.0,
        TORCHTUNE,
        TORCHTUNE_RUN + "; packed to 4096, no compile, no checkpointing, plain cross-entropy "
        "on the fp32-upcast logits (TransformerDecoder's output(h).float())",
        "active",
        dict(
            preset=LLAMA_3B,
            batch=2,
            seq=4096,
            precision="pure-bf16",
            optimizer="adamw",
            checkpointing="none",
        ),
    ),
    *(
        Measured(
            f"litgpt LoRA, Llama 2 {size}, micro-batch {micro}",
            gb,
            LITGPT,
            LITGPT_RUN,
            "allocated",
            _litgpt(f"llama-2-{size.lower()}", micro),
            unit=GB,
        )
        for size, micro, gb in (("7B", 1, 21.30), ("7B", 2, 29.07), ("13B", 1, 38.12))
    ),
    *(
        Measured(
            f"litgpt QLoRA (bnb.nf4-dq), Llama 2 {size}",
            gb,
            LITGPT,
            LITGPT_RUN + "; every nn.Linear (the head too) replaced by bitsandbytes' NF4 "
            "Linear4bit with double quantization (Lightning 71aed75's BitsandbytesPrecision, "
            "quantized from fp16 as the model is made on the GPU), bnb.optim.PagedAdamW",
            "allocated",
            _litgpt(f"llama-2-{size.lower()}", 1, "bnb-nf4"),
            unit=GB,
        )
        for size, gb in (("7B", 13.84), ("13B", 22.55))
    ),
    *(
        Measured(
            f"torchtune LoRA {label}, rank {rank}, Llama 2 7B",
            gib,
            TORCHTUNE_LORA,
            TORCHTUNE_LORA_RUN
            + (
                "; LoRA on q and v"
                if targets == "qv"
                else "; LoRA on q, k, v, output, the MLP and the output projection (the "
                "last not modelled: rank x (4096 + 32000) more weights)"
            ),
            "reserved",
            _tune_lora(targets, rank),
            unit=GB,
        )
        for label, targets, rank, gib in (
            ("Q and V only", "qv", 8, 15.57),
            ("all layers", "all", 8, 15.87),
            ("Q and V only", "qv", 64, 15.86),
            ("all layers", "all", 64, 17.04),
        )
    ),
    Measured(
        "torchtune QLoRA, Llama 2 7B",
        9.29,
        TORCHTUNE_QLORA,
        TORCHTUNE_QLORA_RUN,
        "reserved",
        dict(_tune_lora("all", 8, "nf4", accumulation=16), nf4_chunk=0),
        unit=GB,
        missing=_FRAGMENTATION,
    ),
    *(
        Measured(
            f"torchtitan FSDP + {label}, {gpus} GPUs",
            gib,
            TORCHTITAN,
            TORCHTITAN_RUN + f" + {label}",
            "reserved",
            None,
            _COMPILE,
        )
        for label, gpus, gib in (
            ("torch.compile", 8, 77.0),
            ("torch.compile + Float8", 8, 76.8),
            ("torch.compile", 128, 62.0),
            ("torch.compile + Float8", 128, 61.8),
        )
    ),
    *(
        Measured(
            f"torchtitan FSDP {8 // cp} x CP {cp}, seq {seq}",
            gib,
            TORCHTITAN,
            "Table 2: Llama 3.1 8B, 8 GPUs, local batch 1, full AC, torch.compile + Float8",
            "reserved",
            None,
            _COMPILE + "; Float8 linears not modelled",
        )
        for cp, seq, gib in ((1, 32768, 83.9), (2, 65536, 84.2), (4, 131072, 84.0))
    ),
    *(
        Measured(
            f"Trainy, Llama 3.1 8B, {nodes * 8} H200 ({nodes} nodes)",
            gib,
            TRAINY,
            "local batch 2, torch.compile, Float8 (FSDP Float8 all-gather)",
            "reserved",
            None,
            _COMPILE + "; Float8 linears not modelled",
        )
        for nodes, gib in ((4, 47.96), (8, 46.97))
    ),
    Measured(
        "torchtune Llama 3.2 3B baseline",
        25.5,
        TORCHTUNE,
        TORCHTUNE_RUN + "; unpacked: each batch padded to its longest sample",
        "active",
        None,
        "unpacked batches are padded to their longest sample, whose length is not published",
    ),
    *(
        Measured(
            f"torchtune Llama 3.2 3B + {label}",
            gib,
            TORCHTUNE,
            TORCHTUNE_RUN + f"; packed, torch.compile, ... + {label}",
            "active",
            None,
            _COMPILE + " (each later row adds its technique on top of compile)",
        )
        for label, gib in (
            ("compile", 51.0),
            ("chunked cross-entropy", 42.9),
            ("activation checkpointing", 24.9),
            ("optimizer step in backward", 23.1),
            ("activation offloading", 21.8),
            ("8-bit AdamW", 17.6),
            ("LoRA", 8.5),
            ("QLoRA", 4.6),
        )
    ),
    *(
        Measured(
            f"Lightning Fabric FSDP guide, {strategy}",
            mb / 1000,
            LIGHTNING,
            f"1B-parameter nn.Transformer (encoder-decoder) demo, Adam, {strategy}",
            "allocated",
            None,
            "an encoder-decoder nn.Transformer of unpublished batch and sequence: not the "
            "decoder family the calculator models",
            unit=GB,
        )
        for strategy, mb in (
            ("DDP", 26953),
            ("FSDP NO_SHARD", 23181),
            ("FSDP SHARD_GRAD_OP", 11815),
            ("FSDP FULL_SHARD", 11578),
            ("FSDP FULL_SHARD + CPU offload", 2825),
        )
    ),
    *(
        Measured(
            f"litgpt LoRA, FSDP1 on {gpus} A100, Llama 2 {size}, micro-batch {micro}",
            gb,
            LITGPT_MULTI,
            LITGPT_MULTI_RUN,
            "allocated",
            dict(
                _litgpt(f"llama-2-{size.lower()}", micro),
                sharding="fsdp1",
                n_gpus=gpus,
                checkpointing="full",
                gradient_sync="last",  # fabric.no_backward_sync: FSDP1's no_sync
            ),
            unit=GB,
        )
        for size, micro, gpus, gb in (
            ("7B", 1, 2, 22.18),
            ("7B", 2, 2, 22.47),
            ("7B", 4, 2, 23.39),
            ("13B", 1, 4, 35.57),
        )
    ),
    Measured(
        "litgpt full fine-tune, FSDP1 on 4 A10G, Gemma 2B",
        17.43,
        LITGPT_HUB,
        "config_hub/finetune/gemma-2b/full.yaml at 84a73fd0: bf16-true (weights, gradients and "
        "AdamW state bf16), torch.optim.AdamW, 4 devices, micro-batch 1, global batch 16 (4 "
        "micro-batches per step, the first 3 under fabric.no_backward_sync), max_seq_length "
        "512 (Alpaca2k; the longest batch assumed to reach it), FSDP1 FULL_SHARD per Block with "
        "activation checkpointing per Block (finetune/full.py); litgpt's Gemma keeps lm_head "
        "apart from the embedding (convert_hf_checkpoint copies it): 3,030,460,416 weights",
        "allocated",
        dict(
            preset=GEMMA_2B_UNTIED,
            batch=1,
            seq=512,
            precision="pure-bf16",
            optimizer="adamw",
            checkpointing="full",
            sharding="fsdp1",
            n_gpus=4,
            grad_accumulation=4,
            gradient_sync="last",  # fabric.no_backward_sync: FSDP1's no_sync
            # the course's block: block="litgpt" is 8641822's, and 84a73fd0's differs (its
            # RMSNorm upcasts to fp32 and adds Gemma's unit offset, litgpt/model.py 413-437;
            # GemmaMLP's GELU, 317; an fp32 RoPE cache, 352-370); under full checkpointing a
            # block keeps its input alone either way
            logits_kept=True,  # finetune/full.py: logits = model(input_ids) stays bound
        ),
        unit=GB,
    ),
    *(
        Measured(
            f"litgpt full fine-tune, {model}",
            gb,
            f"Lightning-AI/litgpt config_hub/finetune/README.md (row written in {commit}); "
            "'Peak memory' is max_memory_allocated() / 1e9",
            recipe,
            "allocated",
            None,
            "a parallel block (attention and MLP read the same input, GPT-NeoX style): the "
            "calculator models sequential blocks" + extra,
            unit=GB,
        )
        for model, gb, commit, recipe, extra in (
            (
                "phi-2",
                14.44,
                "3e9fd36c, 2024-03-15",
                "phi-2/full.yaml at 3e9fd36c: bf16-true, AdamW, micro-batch 4, seq 512",
                "; and the table says 1xA10G where the yaml at the same commit says devices: 2",
            ),
            (
                "StableLM 3B alpha on 2 A10G",
                21.23,
                "0d207708, 2024-03-17",
                "stablelm-base-alpha-3b/full.yaml at 0d207708: bf16-true, AdamW, 2 devices "
                "(FSDP1), micro-batch 1, seq 512",
                "",
            ),
        )
    ),
    Measured(
        "torchtune README LoRA, 1x RTX 4090, Llama 2 7B",
        17.18,
        TORCHTUNE_README,
        TORCHTUNE_README_RUN + "; lora_finetune_single_device, llama2/7B_lora_single_device: "
        "the tutorial's Q-and-V rank-8 row's config (unchanged between ff594c231 and "
        "fef3ed10d but for a comment), measured a day later on another card",
        "reserved",
        _tune_lora("qv", 8),
        unit=GB,
        missing="not this recipe's figure: 17.18 GB is what the same table gave at a95c6b931 "
        "(2024-03-21) for that day's lora_finetune_single_device config, as "
        "torch.cuda.max_memory_allocated() estimated on A100s under a memory fraction, and "
        "fef3ed10d kept it; that config's Alpaca-cleaned was not truncated (max_seq_len came "
        "in 73647e26e, 2024-03-30), so its longest batch is the longest sample (litgpt counts "
        "1304 tokens), where the calculator's allocated peak is 15.42 GB (-10.2 %). This row "
        "stays on fef3ed10d's config, the one the table links",
    ),
    Measured(
        "torchtune README LoRA, FSDP1 on 2x RTX 4090, Llama 2 7B",
        20.95,
        TORCHTUNE_README,
        TORCHTUNE_README_RUN + "; lora_finetune_distributed, llama2/7B_lora: LoRA rank 8 on q "
        "and v, gradient accumulation 32 (loss.backward every micro-batch, no no_sync), no "
        "activation checkpointing; FSDP1 FULL_SHARD with lora_fsdp_wrap_policy (each LoRA A "
        "and B its own unit, so no unit mixes frozen and trainable weights), no "
        "MixedPrecision, model built on rank 0's CPU and broadcast (sync_module_states)",
        "reserved",
        dict(
            _tune_lora("qv", 8, accumulation=32),
            checkpointing="none",
            sharding="fsdp1",
            n_gpus=2,
        ),
        unit=GB,
    ),
    Measured(
        "torchtune README full fine-tune, FSDP1 on 4x RTX 4090, Llama 2 7B",
        22.9,
        TORCHTUNE_README,
        TORCHTUNE_README_RUN + "; full_finetune_distributed, llama2/7B_full: alpaca_dataset, "
        "no accumulation, activation checkpointing per layer, FSDP1 FULL_SHARD per "
        "TransformerDecoderLayer, no MixedPrecision, AdamW with torch's default (foreach), "
        "model built on rank 0's CPU and broadcast (sync_module_states)",
        "reserved",
        dict(
            preset="llama-2-7b",
            batch=2,
            seq=512,
            precision="pure-bf16",
            optimizer="adamw",
            checkpointing="full",
            sharding="fsdp1",
            n_gpus=4,
        ),
        unit=GB,
    ),
    Measured(
        "torchtune README full fine-tune low memory, 1x RTX 4090, Llama 2 7B",
        14.97,
        TORCHTUNE_README,
        TORCHTUNE_README_RUN + "; full_finetune_single_device, llama2/7B_full_low_memory: "
        "bitsandbytes.optim.PagedAdamW (32-bit: every moment of 100,000 elements or more in "
        "CUDA unified memory, outside max_memory_reserved), one per parameter "
        "(optimizer_in_bwd), activation checkpointing, no accumulation",
        "reserved",
        dict(
            preset="llama-2-7b",
            batch=2,
            seq=512,
            precision="pure-bf16",
            optimizer="paged-adamw",
            checkpointing="full",
            optimizer_in_backward=True,
        ),
        unit=GB,
    ),
    Measured(
        "torchtitan FSDP 1 x CP 8, seq 262144",
        84.5,
        TORCHTITAN,
        "Table 2: Llama 3.1 8B, 8 GPUs, local batch 1, full AC, torch.compile + Float8",
        "reserved",
        None,
        _COMPILE + "; Float8 linears not modelled",
    ),
    *(
        Measured(
            f"torchtitan {label}",
            gib,
            TORCHTITAN,
            recipe,
            "reserved",
            None,
            _COMPILE + "; Float8 linears (and AsyncTP) not modelled",
        )
        for label, gib, recipe in (
            (
                "Llama 3.1 70B, FSDP 32 x TP 8",
                71.9,
                "Table 4: 256 GPUs, local batch 16, full AC, torch.compile + Float8",
            ),
            (
                "Llama 3.1 70B, FSDP 32 x TP 8 + AsyncTP",
                67.6,
                "Table 4: 256 GPUs, local batch 16, full AC, torch.compile + Float8",
            ),
            *(
                (
                    f"Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, {schedule}",
                    gib,
                    "Table 5: 512 GPUs, local batch 32, full AC, torch.compile + Float8 + "
                    "AsyncTP; the largest peak over the PP ranks",
                )
                for schedule, gib in (("1F1B", 82.5), ("interleaved 1F1B", 72.7))
            ),
            *(
                (
                    f"Llama 3.1 405B, FSDP {8 // cp} x CP {cp} x TP 8 x PP 8, seq {seq}",
                    gib,
                    "Table 6: 512 GPUs, local batch 8, full AC, torch.compile + Float8 + "
                    "AsyncTP, 1F1B; the largest peak over the PP ranks",
                )
                for cp, seq, gib in (
                    (1, 32768, 75.3),
                    (2, 65536, 75.9),
                    (4, 131072, 77.1),
                    (8, 262144, 84.9),
                )
            ),
        )
    ),
    *(
        Measured(
            f"DeepSpeed ZeRO-{stage}, LLaMA-7B, 8 A800, micro-batch {micro} of {total}"
            + (", HF gradient checkpointing" if ckpt else "")
            + (", optimizer offload" if opt_off else "")
            + (", parameter offload" if param_off else "")
            + (", ZeRO++" if zpp else ""),
            peak,
            DEEPSPEED_GIST,
            f"ZeRO stage {stage}, batch {micro} per GPU per iteration, {total} per step, seq 4096",
            "allocated",
            None,
            "the table gives the stage, checkpointing, offload and batch, but not the precision "
            "(bf16 or fp16, and so DeepSpeed's gradient bytes), the attention implementation "
            "(eager attention keeps each layer's 4096 x 4096 scores) or whether GPU Mem is GB or "
            "GiB (7 % apart); the gist's training code was not read here",
        )
        for stage, ckpt, opt_off, param_off, zpp, micro, total, peak in (
            (2, False, False, False, False, 1, 64, 44.8),
            (2, True, False, False, False, 1, 64, 23.5),
            (2, True, True, False, False, 1, 64, 16.9),
            (2, True, False, False, False, 4, 64, 38.6),
            (3, False, False, False, False, 2, 64, 75.7),
            (3, True, False, False, False, 2, 64, 20.4),
            (3, True, True, False, False, 2, 64, 9.4),
            (3, True, True, True, False, 4, 64, 7.9),
            (3, True, True, True, True, 4, 64, 7.9),
            (3, True, False, False, False, 8, 64, 39.1),
            (3, True, False, False, False, 8, 128, 63.9),
        )
    ),
    *HELD_OUT,
    *HELD_OUT_2,
)

MODELLED = [row for row in MEASURED if row.knobs is not None]
HELD_OUT_MODELLED = [row for row in HELD_OUT if row.knobs is not None]
HELD_OUT_2_MODELLED = [row for row in HELD_OUT_2 if row.knobs is not None]
#: the 55 rows the module docstring's counts before the second held-out set are about
BEFORE_HELD_OUT_2 = [row for row in MODELLED if row not in HELD_OUT_2_MODELLED]


def predicted(row: Measured) -> float:
    r = fit.will_it_fit(**row.knobs)
    extra = r.headroom["allocator reserve"] if row.compares == "reserved" else 0
    return (r.peak_bytes + extra) / row.unit


def difference(row: Measured) -> float:
    return predicted(row) / row.measured - 1


@pytest.mark.heavy  # 65 rows, 8 s of CPU in all (those with LoRA dropout run the pass)
@pytest.mark.parametrize("row", MODELLED, ids=lambda row: row.what)
def test_the_calculator_is_within_ten_percent_of_each_published_peak_or_names_its_miss(row):
    d = difference(row)
    said = f"{row.what}: predicted {predicted(row):.2f}, measured {row.measured} ({d:+.1%})"
    if row.missing:
        assert abs(d) > TOLERANCE, f"{said}: it agrees now; drop its 'missing' note"
    else:
        assert abs(d) <= TOLERANCE, f"{said}; {row.source}"


def _not_its_recipe(row: Measured) -> bool:
    """A row whose published figure is not its recipe's (its ``missing`` says how we know)."""
    return row.missing == _NOT_ITS_RECIPE or row.missing.startswith("not this recipe's figure")


def _counts(rows):
    within = [row for row in rows if abs(difference(row)) <= TOLERANCE]
    within20 = [row for row in rows if abs(difference(row)) <= 2 * TOLERANCE]
    return len(within), len(within20), len(rows)


@pytest.mark.heavy  # asks every published row: 8 s of CPU the first time
def test_the_misses_are_the_rows_that_say_so():
    """The fractions the module's docstring states: 43 of 55 within 10 %, 48 within 20 %; of
    them the held-out rows 23 of 33 and 27, the earlier rows 20 of 22 and 21; 43 of the 52
    whose figure is their recipe's. The second held-out set on its own: 9 of 10 and 9."""
    earlier = [row for row in BEFORE_HELD_OUT_2 if row not in HELD_OUT_MODELLED]
    assert _counts(BEFORE_HELD_OUT_2) == (43, 48, 55)
    assert _counts(HELD_OUT_MODELLED) == (23, 27, 33)
    assert _counts(earlier) == (20, 21, 22)
    own = [row for row in BEFORE_HELD_OUT_2 if not _not_its_recipe(row)]
    assert _counts(own) == (43, 47, 52)
    assert _counts(HELD_OUT_2_MODELLED) == (9, 9, 10)
    within = [row for row in MODELLED if abs(difference(row)) <= TOLERANCE]
    assert {r.what for r in MODELLED if r not in within} == {r.what for r in MODELLED if r.missing}


def _fsdp1(row: Measured) -> bool:
    return row.knobs.get("sharding", "none").startswith("fsdp1")


@pytest.mark.heavy  # asks every published row: 8 s of CPU the first time
def test_fsdp1s_median_would_overshoot_the_other_profiles_reserved_rows(monkeypatch):
    """The module docstring's what-ifs: FSDP1's reserve (the median of the FSDP1 pairs that
    count, ``fit.reserve_pairs``) for every profile, and the assumed 5 % for FSDP1 too."""
    from tutorial_utils.fit import headroom

    earlier = [row for row in BEFORE_HELD_OUT_2 if row not in HELD_OUT_MODELLED]
    agree = [
        r
        for r in earlier
        if r.compares == "reserved" and not _fsdp1(r) and abs(difference(r)) <= TOLERANCE
    ]
    fsdp1 = headroom.RESERVES["fsdp1"]
    assert f"{fsdp1.fraction:+.1%}" == "+42.9%" and len(agree) == 7
    for profile, term in headroom.RESERVES.items():
        new = dataclasses.replace(term, fraction=fsdp1.fraction)
        monkeypatch.setitem(headroom.RESERVES, profile, new)
    assert all(0.29 <= difference(r) <= 0.39 for r in agree), [difference(r) for r in agree]
    assert _counts(earlier)[0] == 14
    monkeypatch.undo()
    assumed = dataclasses.replace(fsdp1, fraction=headroom.ASSUMED_RESERVE, band=None)
    monkeypatch.setitem(headroom.RESERVES, "fsdp1", assumed)
    assert _counts(BEFORE_HELD_OUT_2)[:2] == (39, 47) and _counts(HELD_OUT_MODELLED)[:2] == (21, 28)
    assert _counts(earlier)[:2] == (18, 19)


@pytest.mark.heavy  # asks every published row: 8 s of CPU the first time
def test_only_fsdp1_reserved_rows_see_fsdp1s_reserve():
    """The per-profile term moves a row only when it runs FSDP1 and compares a reserved peak:
    every other row gets the assumed 5 % (or no reserve at all, for an allocated peak)."""
    from tutorial_utils.fit import headroom

    for row in MODELLED:
        r = fit.will_it_fit(**row.knobs)
        fraction = r.headroom["allocator reserve"] / r.peak_bytes
        expected = headroom.RESERVES["fsdp1"].fraction if _fsdp1(row) else 0.05
        # bytes_for truncates fraction x peak to whole bytes: at most one byte off
        assert fraction == pytest.approx(expected, abs=1 / r.peak_bytes), row.what


def test_the_rows_that_cannot_be_their_recipe_hold_less_than_its_states():
    """Two litgpt config-hub full fine-tunes publish a peak below what their yaml's model
    states alone take (bf16 weights, gradients and two AdamW moments: 8 B a weight, counted
    from the shape, not by the calculator): no run of that recipe printed them."""
    rows = [row for row in HELD_OUT_MODELLED if row.missing == _NOT_ITS_RECIPE]
    assert len(rows) == 2
    for row in rows:
        weights = fit.shapes.counts(fit.shapes.config(row.knobs["preset"])[1]).total
        assert row.knobs["precision"] == "pure-bf16" and row.knobs["optimizer"] == "adamw"
        assert row.measured * row.unit < 8 * weights, row.what


def test_every_row_says_where_it_comes_from_and_what_it_ran():
    assert len(MEASURED) >= 15
    sources = {row.source.split()[0] for row in MEASURED}
    assert len(sources) >= 4, sources
    projects = {row.source.split()[0] for row in MODELLED}  # torchtitan, torchtune, litgpt
    assert len(projects) >= 3, projects
    for row in MEASURED:
        assert row.source and row.configuration
        assert row.compares in ("reserved", "active", "allocated") or (
            row.compares == "nvidia-smi" and row.knobs is None
        )
        assert (row.knobs is None) == bool(row.not_modelled)


def test_the_compile_rows_fall_in_the_band_the_answer_shows():
    """The compile band (``report.COMPILE_BAND``) is made of these very rows, so this is a
    check of its arithmetic, not of the calculator: each compile row lies inside the band
    drawn around its own eager row."""
    from tutorial_utils.fit.report import COMPILE_BAND

    for eager, compiled in ((82.4, (77.0, 76.8)), (67.0, (62.0, 61.8)), (60.0, (51.0,))):
        for value in compiled:
            assert COMPILE_BAND[0] * eager - 1e-9 <= value <= COMPILE_BAND[1] * eager + 1e-9


def test_the_3b_config_is_the_released_model():
    assert fit.shapes.counts(LLAMA_3B).total == 3_212_749_824
    assert fit.shapes.config("llama-3.2-3b")[1] == LLAMA_3B


# DeepSpeed's estimators, read at deepspeedai/DeepSpeed edaa722 (2026-08-22):
# deepspeed/runtime/zero/stage_1_and_2.py, estimate_zero2_model_states_mem_needs (no offload):
#   GPU bytes = 2 N (16-bit weights, whole) + 18 N / G, its comment listing the 18 as 2 B 16-bit
#   gradients + 4 B fp32 gradients + 4 B fp32 weights + 8 B Adam moments.
# deepspeed/runtime/zero/stage3.py, estimate_zero3_model_states_mem_needs (no offload):
#   GPU bytes = 4 * largest_layer_params + 18 N / G, where model_to_params takes the largest
#   layer as the module with the most parameters of its own (recurse=False).
# Written here from that reading, not copied.


def _deepspeed_zero2(n: int, gpus: int) -> int:
    return 2 * n + 18 * n // gpus


def _deepspeed_zero3(n: int, largest_layer: int, gpus: int) -> int:
    return 4 * largest_layer + 18 * n // gpus


def _largest_module(cfg: DecoderConfig) -> int:
    import torch

    with torch.device("meta"):
        model = Decoder(cfg, n_layers=1)
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


@pytest.mark.parametrize("gpus", [2, 8, 64])
@pytest.mark.parametrize("preset", ["gpt2-1.5b", "llama-8b", "llama-70b"])
def test_zero2_model_states_equal_deepspeeds_estimator(preset, gpus):
    r = fit.will_it_fit(
        preset, seq=128, precision="bf16-master-fp32-grads", sharding="zero2", n_gpus=gpus
    )
    ours = sum(r.model_states.values())
    assert abs(ours - _deepspeed_zero2(r.n_parameters, gpus)) <= 4  # each category floored


@pytest.mark.parametrize("gpus", [2, 8, 64])
@pytest.mark.parametrize("preset", ["gpt2-1.5b", "llama-8b", "llama-70b"])
def test_zero3_model_states_equal_deepspeeds_estimator_but_two_named_terms(preset, gpus):
    """Two differences, both named: DeepSpeed's ZeRO-3 estimator uses the same 18 B/param as
    ZeRO-2's comment lists (16-bit and fp32 gradients, fp32 weights, Adam), with no shard of
    the 16-bit weights, which we count (2 N / G); and its gathered layer is the largest module
    (the embedding), ours the largest FSDP unit under torchtitan's wrapping (the root:
    embedding, final norm and head). With those two terms put back, the bytes are the same."""
    cfg = PRESETS[preset]
    r = fit.will_it_fit(
        preset, seq=128, precision="bf16-master-fp32-grads", sharding="zero3", n_gpus=gpus
    )
    n, block_n = (fit.shapes.counts(cfg).total, fit.shapes.counts(cfg).block)
    unit = max(n - cfg.n_layers * block_n, block_n)
    deepspeed = _deepspeed_zero3(n, _largest_module(cfg), gpus)
    named = 2 * n // gpus + 4 * (unit - _largest_module(cfg))
    assert abs(r.states_bytes - (deepspeed + named)) <= 4


def test_the_person_in_the_issue_gets_the_model_states_deepspeed_counts():
    """The 8B model's states alone, 16 B/param: 119.7 GiB, what the issue expects."""
    r = fit.will_it_fit("Llama-3-8B", seq=4096, batch=4, precision="bf16", optimizer="adam")
    assert round(sum(r.model_states.values()) / GiB, 1) == 119.7
    assert fit_inputs.recipe("bf16") == r.precision == "autocast-bf16"
