"""Published pairs of peak reserved and peak allocated memory, and the rules that count them.

The allocator's reserve (``fit.headroom``) is what PyTorch's caching allocator holds beyond
the tensors at the peak: ``torch.cuda.max_memory_reserved()`` over
``torch.cuda.max_memory_allocated()``, minus one. This module records every such pair we
found in public logs, with where it was printed, and decides which of them may stand behind
the calculator's term. It imports no torch.

Rules 1 to 6 were written down before any pair was weighed against the published-rows table
(``tests/test_fit_published.py``). A pair counts when all of these hold:

1. The device is an NVIDIA GPU (CUDA). MPS, XLA, XPU, NPU and Gaudi are left out: on some of
   them the two figures are equal by construction, and none runs the CUDA caching allocator.
2. It comes from a training run that has taken at least one full optimizer step: a step's log
   line, or a summary printed after training. Not after model init, not inference.
3. The run is eager (no ``torch.compile``), as stated or as its recipe's default.
4. Both figures come from one call, on one rank, over one window: the allocated figure is the
   peak of allocated bytes (``max_memory_allocated``, ``allocated_bytes.all.peak``), not the
   "active" peak and not the current value; the reserved figure is the peak of reserved bytes
   (``max_memory_reserved``), not ``nvidia-smi`` (which adds the CUDA context).
5. The model and the recipe or script are named, and the model is a dense decoder-only
   language model (the family the calculator models; not an encoder, not a mixture of
   experts).
6. The allocator runs with its defaults (not ``expandable_segments``) where the source says.
7. How the run spread over its GPUs (``PROFILES``: one GPU, DDP, FSDP1, FSDP2, ZeRO, other) is
   decided from its source's code or text, never from its ratio (``profile_from`` says what
   decided it), and the pair counts only for that profile. Rule 7 was added on 2026-12-07,
   after the pairs had been weighed; it excludes none of the pairs that counted before it, and
   it is why the term is one per profile (``fit.headroom``: FSDP1 frees each all-gathered unit
   with ``record_stream`` from a stream of its own; one GPU, DDP and FSDP2 do not).

One pair per run: the last step line the source prints (or its only summary). Each profile's
term is the median over its counted pairs of ``reserved / allocated - 1``, with their range as
a band; with fewer than ``MIN_PAIRS`` pairs, ``fit.headroom`` keeps an assumed fraction for
that profile and says how many pairs it found.

Found so far (searched 2026-12-07: GitHub issues and pull requests, tutorials and blog
posts): 5 pairs count, all FSDP1: CUDA training runs of Llama-family models, at +11.6 %,
+23.7 %, +42.9 %, +55.6 % and +79.5 %: llama-recipes' FSDP runs, Liger's Medusa example and
Answer.AI's two LoRA runs on 2 RTX 3090s (context 512 and 2048). That is 5, so FSDP1's term is
their median, +42.9 %, with the band +11.6 to +79.5 %; no pair counts for any other profile.
The two Answer.AI pairs are on the page that gives held-out rows of the published table: those
rows compare the same runs' allocated figures (which the reserve does not touch), and its
reserved rows are other runs of the same script. Where the figures are whole GiB
(llama-recipes' ``MemoryTrace`` truncates with ``int``), the ratio is that of the printed
numbers; the truncation alone allows +36 to +48 % and +47 to +61 % for those two. Seen but not
recorded, because we could not name the page they are on: three llama-recipes logs in
committed files (31 / 42, 9 / 12 and 19 / 20 GB). Named in the task but not found in our
search: WeatherGenerator's PR 2628 (a weather model, which rule 5 would leave out).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

__all__ = [
    "COUNTED",
    "MIN_PAIRS",
    "PAIRS",
    "PROFILES",
    "ReservePair",
    "counted",
    "excluded_because",
    "summary",
]

#: fewer counted pairs than this and the reserve stays an assumption (fit.headroom)
MIN_PAIRS = 5

#: How a run spread over its GPUs, as rule 7 records it (the key) and says it (the value):
#: FSDP1 is FullyShardedDataParallel under any ShardingStrategy, FSDP2 is fully_shard, "other"
#: another library's own parallelism (Megatron-LM, NeMo) or a prototype.
PROFILES = {
    "single": "one GPU",
    "ddp": "DDP",
    "fsdp1": "FSDP1",
    "fsdp2": "FSDP2",
    "zero": "DeepSpeed ZeRO",
    "other": "other",
    "unknown": "not said",
}


@dataclass(frozen=True)
class ReservePair:
    """One published pair, as printed. ``allocated`` and ``reserved`` are the figures exactly as
    the source prints them (strings), in ``unit``; ``quote`` is the printed text that holds
    both. The other fields are what the rules read."""

    url: str
    date: str  # when it was posted, as far as the page shows it
    hardware: str
    model: str
    recipe: str
    allocated: str
    reserved: str
    unit: str
    quote: str
    device: str = "cuda"  # "cuda", "mps", "xpu", ...
    moment: str = "training"  # "training" (past one optimizer step), "init", "no step", ...
    counters: str = "peaks"  # "peaks" (rule 4), "active", "current", "nvidia-smi", "two runs"
    eager: bool = True
    family: str = "decoder"  # "decoder", "encoder", "moe", "unnamed"
    allocator: str = "default"  # "default" or "expandable_segments"
    profile: str = "unknown"  # how the run spread over GPUs (PROFILES), read from its source
    profile_from: str = ""  # the code or text that decides ``profile``
    note: str = ""

    @property
    def reserve(self) -> float:
        """The reserve this pair shows: reserved over allocated, minus one."""
        return float(self.reserved) / float(self.allocated) - 1


def excluded_because(pair: ReservePair) -> str:
    """'' when ``pair`` counts; otherwise the first rule it fails, in words."""
    if pair.device != "cuda":
        return f"rule 1: {pair.device}, not CUDA"
    if pair.moment != "training":
        return f"rule 2: {pair.moment}, not past a full optimizer step"
    if not pair.eager:
        return "rule 3: torch.compile"
    if pair.counters != "peaks":
        return f"rule 4: {pair.counters}, not both peaks from one call"
    if pair.family != "decoder":
        return f"rule 5: {pair.family}, not a named dense decoder-only model"
    if pair.allocator != "default":
        return f"rule 6: {pair.allocator}"
    if pair.profile not in PROFILES or pair.profile == "unknown" or not pair.profile_from:
        return "rule 7: the source does not say how the run spread over its GPUs"
    return ""


def counted(profile: str) -> tuple[ReservePair, ...]:
    """The pairs that count (``COUNTED``) and ran under ``profile`` (one of ``PROFILES``)."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    return tuple(pair for pair in COUNTED if pair.profile == profile)


_LLAMA_RECIPES_TRACE = (
    "llama-recipes' MemoryTrace around one epoch: max_memory_allocated and "
    "max_memory_reserved as int(bytes / 2**30), printed by rank 0"
)

_LLAMA_RECIPES_FSDP1 = (
    "llama-recipes' finetuning.py with --enable_fsdp wraps the model in FullyShardedDataParallel "
    "(limit_all_gathers=True; src/llama_recipes/finetuning.py, read at 0e1e94b)"
)

_ANSWERAI = (
    "fsdp_qlora train.py --model_name meta-llama/Llama-2-7b-hf --batch_size 1 --context_length "
    "{seq} --train_type lora --use_gradient_checkpointing True --reentrant_checkpointing True "
    "--use_cpu_offload False --dataset dummy --dataset_samples 1024 (the page's template), "
    "eager, 2 GPUs"
)
_ANSWERAI_FSDP1 = (
    "train.py wraps the model in FullyShardedDataParallel (imported as FSDP, line 40 at 50efa1e) "
    "with --sharding_strategy's default full_shard (FULL_SHARD) and limit_all_gathers=True"
)
_ANSWERAI_PEAKS = (
    "train.py (from 50efa1e, 2024-03-26, 'print reserved memory, log allocated & reserved') "
    "resets the peaks before the first epoch and after it reads max_memory_allocated and "
    "max_memory_reserved on rank 0, / 2**30; the table shows the reserved one, the note under "
    "it the allocated one. Held-out rows of tests/test_fit_published.py compare this run's "
    "allocated figure, which the reserve does not touch"
)

PAIRS = (
    # --- the pairs that count -------------------------------------------------------------
    ReservePair(
        url="https://github.com/meta-llama/llama-cookbook/pull/742",
        date="2024-10-22",
        hardware="8 GPUs (CUDA, NCCL; card not named)",
        model="Llama 3.1 8B Instruct",
        recipe="llama-recipes finetuning.py --enable_fsdp, alpaca_dataset, batch 2, 1 epoch",
        allocated="21",
        reserved="30",
        unit="GiB, truncated",
        quote="Max CUDA memory allocated was 21 GB\nMax CUDA memory reserved was 30 GB",
        note=_LLAMA_RECIPES_TRACE,
        profile="fsdp1",
        profile_from=_LLAMA_RECIPES_FSDP1,
    ),
    ReservePair(
        url="https://github.com/meta-llama/llama-cookbook/pull/206",
        date="2023-09-16",
        hardware="8 GPUs (CUDA; card not named)",
        model="Llama 2 7B",
        recipe="llama-recipes finetuning.py --enable_fsdp --use_peft --peft_method lora "
        "pure_bf16, 3 epochs; one of the PR's tests B-E (samsum or alpaca, packing or "
        "padding): the excerpt does not say which",
        allocated="18",
        reserved="28",
        unit="GiB, truncated",
        quote="Max CUDA memory allocated was 18 GB\nMax CUDA memory reserved was 28 GB",
        note=_LLAMA_RECIPES_TRACE,
        profile="fsdp1",
        profile_from=_LLAMA_RECIPES_FSDP1,
    ),
    ReservePair(
        url="https://github.com/linkedin/Liger-Kernel/pull/110",
        date="2024-08 (after PR 11 of 2024-08-14)",
        hardware="not stated",
        model="Llama 3 8B with Medusa heads",
        recipe="Liger-Kernel examples/medusa (scripts llama3_8b_medusa.sh / llama3_8b_stage2.sh, "
        "Hugging Face Trainer with FSDP through accelerate, Liger's Triton kernels, eager)",
        allocated="26279.24",
        reserved="47172.0",
        unit="MiB",
        quote="'step_peak_memory_allocated_MB': 26279.24, 'total_peak_memory_allocated_MB': "
        "26279.24, 'step_peak_memory_reserved_MB': 47172.0",
        note="examples/medusa/callback.py resets the peaks at each step's start and reads "
        "max_memory_allocated and max_memory_reserved at its end; the lines at epochs 1.0, "
        "1.5 and 2.0 (the last shown in full) print the same figures",
        profile="fsdp1",
        profile_from="examples/medusa/fsdp/acc-fsdp.conf: distributed_type FSDP with "
        "fsdp_sharding_strategy "
        "HYBRID_SHARD (a ShardingStrategy of FullyShardedDataParallel; fully_shard has none) "
        "and no fsdp_version, under accelerate==0.29.3 (examples/medusa/requirements.txt), "
        "whose FSDP plugin wraps FullyShardedDataParallel",
    ),
    ReservePair(
        url="https://github.com/AnswerDotAI/fsdp_qlora/blob/4cd6923/benchmarks_03_2024.md",
        date="2024-05-03 (runs of February and March 2024)",
        hardware="2x RTX 3090 24GB (no NVLink)",
        model="Llama 2 7B (LoRA)",
        recipe=_ANSWERAI.format(seq=512),
        allocated="8.28",
        reserved="10.24",
        unit="GiB",
        quote="|    LoRA    |      512       |       10.24       |  2,597   | ... NB: While the "
        "reported peak reserved memory for both 512 and 2048 context length is roughly the "
        "same, the peak allocated memory is 8.28 GiB vs 9.16 GiB, respectively.",
        profile="fsdp1",
        profile_from=_ANSWERAI_FSDP1,
        note=_ANSWERAI_PEAKS,
    ),
    ReservePair(
        url="https://github.com/AnswerDotAI/fsdp_qlora/blob/4cd6923/benchmarks_03_2024.md",
        date="2024-05-03 (runs of February and March 2024)",
        hardware="2x RTX 3090 24GB (no NVLink)",
        model="Llama 2 7B (LoRA)",
        recipe=_ANSWERAI.format(seq=2048),
        allocated="9.16",
        reserved="10.22",
        unit="GiB",
        quote="|    LoRA    |      2048      |       10.22       |  3,090   | ... NB: While the "
        "reported peak reserved memory for both 512 and 2048 context length is roughly the "
        "same, the peak allocated memory is 8.28 GiB vs 9.16 GiB, respectively.",
        profile="fsdp1",
        profile_from=_ANSWERAI_FSDP1,
        note=_ANSWERAI_PEAKS,
    ),
    # --- the pairs that do not --------------------------------------------------------------
    ReservePair(
        url="https://github.com/meta-pytorch/torchtune/pull/2406",
        date="2025-02-18",
        hardware="MacBook Pro (MPS)",
        model="Llama 3.1 8B Instruct",
        recipe="torchtune full_finetune_single_device, batch 1, max_seq_len 2048, AC on",
        allocated="57.90928649902344",
        reserved="57.90928649902344",
        unit="GiB",
        quote="Step 6 | ... peak_memory_alloc:57.90928649902344 "
        "peak_memory_reserved:57.90928649902344",
        device="mps",
        note="on MPS torchtune reports driver-allocated memory for both",
        profile="single",
        profile_from="the recipe: full_finetune_single_device",
    ),
    ReservePair(
        url="https://github.com/meta-pytorch/torchtune/pull/2605",
        date="2025-04-21",
        hardware="4 Intel GPUs (XPU)",
        model="Llama 2 7B",
        recipe="torchtune full_finetune_distributed, llama2/7B_full, max_steps_per_epoch=10",
        allocated="14.54538631439209",
        reserved="28.7265625",
        unit="GiB",
        quote="Step 5 | ... peak_memory_alloc:14.54538631439209 peak_memory_reserved:28.7265625",
        device="xpu",
        profile="fsdp2",
        profile_from="full_finetune_distributed, which torchtune moved to fully_shard in 2024-09 "
        "(PR 1536: "
        "'Last recipe to move to FSDP2')",
    ),
    ReservePair(
        url="https://github.com/meta-llama/llama-cookbook/pull/41",
        date="2023-07-25",
        hardware="4x A100 40GB (AWS)",
        model="Llama 2 7B",
        recipe="llama_finetuning.py --enable_fsdp --use_peft --peft_method lora --pure_bf16",
        allocated="15.22",
        reserved="19.36",
        unit="GB",
        quote="this only uses 15.22 GB peak active memory and 19.36 GB peak reserved memory",
        counters="active",
        profile="fsdp1",
        profile_from=_LLAMA_RECIPES_FSDP1,
    ),
    ReservePair(
        url="https://github.com/meta-llama/llama-cookbook/pull/165",
        date="2023-09-05",
        hardware="8 GPUs (CUDA)",
        model="LLaMA 7B",
        recipe="llama-recipes FSDP fine-tuning with use_cache=True, a prototype FSDP",
        allocated="14.93",
        reserved="19.52",
        unit="GB",
        quote="- Peak active: 14.93 GB\n- Peak reserved: 19.52 GB",
        counters="active",
        profile="other",
        profile_from="the PR: 'The numbers from a prototype FSDP implementation' (its memory "
        "snapshots are "
        "named snapshot_7b_perparam_8gpus: per-parameter sharding, before FSDP2's RFC)",
    ),
    ReservePair(
        url="https://github.com/NVIDIA/Megatron-LM/issues/60",
        date="not shown in the excerpt read",
        hardware="64x V100 32GB",
        model="GPT-2 2.6B",
        recipe="Megatron-LM pretraining, model parallel 2, data parallel 8, fp16",
        allocated="12606.06201171875",
        reserved="17482.0",
        unit="MB (MiB)",
        quote="after 5 iterations memory (MB) | allocated: 10250.5693359375 | max allocated: "
        "12606.06201171875 | reserved: 17482.0 | max reserved: 17482.0",
        moment="no step",
        note="'number of skipped iterations: 5': the loss scaler skipped every optimizer step",
        profile="other",
        profile_from="Megatron-LM's own model and data parallelism",
    ),
    ReservePair(
        url="https://github.com/NVIDIA-NeMo/Speech/issues/14850",
        date="not shown in the excerpt read",
        hardware="not stated",
        model="Qwen3-30B-A3B",
        recipe="NeMo scripts/performance/llm/pretrain_qwen3_30b_a3b.py",
        allocated="53930270720",
        reserved="57675874304",
        unit="bytes",
        quote="iteration 11/29 | ... | max_memory_reserved: 57675874304 | max_memory_allocated: "
        "53930270720",
        family="moe",
        profile="other",
        profile_from="NeMo's Megatron-core parallelism",
    ),
    ReservePair(
        url="https://github.com/princeton-nlp/LLM-Shearing/issues/24",
        date="2023-11-21",
        hardware="not stated",
        model="Sheared-LLaMA (a pruned Llama 2 7B; size as configured not stated)",
        recipe="LLM-Shearing continue_pretrain.sh (Composer, FSDP), batch 366",
        allocated="44.6420",
        reserved="51.3280",
        unit="GB",
        quote="Train memory/peak_allocated_mem: 44.6420 ... "
        "Train memory/peak_reserved_mem: 51.3280",
        moment="no working step",
        note="the reporter: the loss stays at 10.375, 'it seems that the gradient is not "
        "calculated and it is not training normally'",
        profile="fsdp1",
        profile_from="the recipe: Composer's FSDP, in 2023, before FSDP2's per-parameter sharding "
        "(RFC pytorch#114299, 2023-11): torch's FSDP was the flat-parameter one",
    ),
    ReservePair(
        url="https://github.com/huggingface/peft/issues/1469",
        date="2024-10-11",
        hardware="not stated",
        model="facebook/esm2_t6_8M_UR50D",
        recipe="peft examples/sequence_classification/LoRA.ipynb, torchtune's get_memory_stats "
        "after optimizer.step()",
        allocated="0.7242832183837891",
        reserved="1.9453125",
        unit="GiB",
        quote="'peak_memory_alloc': 0.7242832183837891, 'peak_memory_reserved': 1.9453125",
        family="encoder",
        profile="single",
        profile_from="a single-process notebook (LoRA.ipynb)",
    ),
    ReservePair(
        url="https://github.com/huggingface/peft/issues/1469",
        date="2024-10-11",
        hardware="not stated",
        model="bert-base-uncased",
        recipe="as the row above",
        allocated="1.5451140403747559",
        reserved="3.33984375",
        unit="GiB",
        quote="'peak_memory_alloc': 1.5451140403747559, 'peak_memory_reserved': 3.33984375",
        family="encoder",
        note="the thread's third model, bloomz-560m, is cut off in what we could read",
        profile="single",
        profile_from="a single-process notebook (LoRA.ipynb)",
    ),
    ReservePair(
        url="https://github.com/pytorch/pytorch/issues/40989",
        date="2020-07-05",
        hardware="not stated",
        model="not named ('test_function(param)')",
        recipe="not named",
        allocated="15006",
        reserved="16726",
        unit="MB",
        quote="| `1` | `False` | 15006 MB | 16726 MB",
        family="unnamed",
        note="the columns are memory_summary's allocated and reserved peak usage",
    ),
    ReservePair(
        url="https://github.com/mosaicml/llm-foundry/issues/117",
        date="2023-05-12",
        hardware="RTX 3080 16GB",
        model="MPT-125M",
        recipe="llm-foundry train.py, the README's 10-batch example",
        allocated="3.8951",
        reserved="13.5500",
        unit="GB",
        quote="Train memory/allocated_mem: 3.8951 ... Train memory/reserved_mem: 13.5500",
        counters="current",
        profile="unknown",
    ),
    ReservePair(
        url="https://github.com/foundation-model-stack/fms-acceleration/pull/14",
        date="2024-05-17",
        hardware="1 GPU (card not named in the row)",
        model="Mistral-7B-v0.1",
        recipe="fms-acceleration benchmark, LoRA, batch 4",
        allocated="26.11",
        reserved="29.03",
        unit="GiB",
        quote="| 29.03 | 26.11 | 15.12 | 3597",
        counters="nvidia-smi",
        note="'peak nvidia mem reserved' polls nvidia-smi (the PR's first method)",
        profile="single",
        profile_from="the row: 1 GPU",
    ),
    ReservePair(
        url="https://github.com/PrimeIntellect-ai/prime-rl/pull/1126",
        date="2025-10-20",
        hardware="2 GPUs, 23.7 GiB each",
        model="the debug MoE config",
        recipe="prime_rl/trainer/sft/train.py @ configs/debug/moe/sft/train.toml",
        allocated="5.2",
        reserved="7.8",
        unit="GiB",
        quote="before ... Peak Mem.: 5.2/23.7 GiB ... after ... Peak Mem.: 7.8/23.7 GiB",
        counters="two runs",
        profile="unknown",
    ),
    ReservePair(
        url="https://github.com/meta-pytorch/torchtune/issues/1398",
        date="2024-08-23",
        hardware="not stated",
        model="Llama 3.1 8B (QLoRA)",
        recipe="torchtune lora_finetune_single_device llama3_1/8B_qlora_single_device",
        allocated="6.19",
        reserved="6.27",
        unit="GiB",
        quote="GPU peak memory allocation: 6.19 GiB\n        GPU peak memory reserved: 6.27 GiB",
        moment="init",
        profile="single",
        profile_from="the recipe: lora_finetune_single_device",
    ),
    ReservePair(
        url="https://github.com/meta-pytorch/torchtune/pull/1909",
        date="2024-10-30",
        hardware="not stated",
        model="Llama 3.2 1B (DoRA)",
        recipe="torchtune lora_finetune_single_device llama3_2/1B_lora_single_device",
        allocated="2.52",
        reserved="2.56",
        unit="GiB",
        quote="GPU peak memory allocation: 2.52 GiB\n        GPU peak memory reserved: 2.56 GiB",
        moment="init",
        profile="single",
        profile_from="the recipe: lora_finetune_single_device",
    ),
    ReservePair(
        url="https://github.com/meta-pytorch/torchtune/pull/389",
        date="not shown in the excerpt read",
        hardware="not stated",
        model="Llama 2 7B",
        recipe="torchtune full_finetune, bf16 with SGD (the RFC's first optimization)",
        allocated="13.51",
        reserved="28.14",
        unit="GB",
        quote="After Model Setup :\n        Memory Allocated: 13.51 GB\n        Memory "
        "Reserved: 28.14 GB",
        moment="init",
        counters="current",
        profile="unknown",
    ),
    ReservePair(
        url="https://github.com/sgl-project/sglang/pull/18865",
        date="2026-02-15",
        hardware="not stated",
        model="a diffusion model (not named in the excerpt)",
        recipe="sglang diffusion inference, perf_dump_path",
        allocated="53044.04",
        reserved="62406.0",
        unit="MB",
        quote='"peak_allocated_mb": 53044.04,\n      "peak_reserved_mb": 62406.0',
        moment="inference",
        profile="unknown",
    ),
    ReservePair(
        url="https://github.com/pytorch/torchtune/blob/0914d5cfb/docs/source/tutorials/"
        "qlora_finetune.rst",
        date="2024-04-15",
        hardware="not stated",
        model="Llama 2 7B (LoRA)",
        recipe="torchtune lora_finetune_single_device",
        allocated="13.96",
        reserved="13.98",
        unit="GB",
        quote="13.98 against 13.96 GB",
        moment="init",
        note="read by an earlier session (the figures fit.headroom cited before)",
        profile="single",
        profile_from="the recipe: lora_finetune_single_device",
    ),
    ReservePair(
        url="https://github.com/pytorch/torchtune/blob/0cd8bc4ca/docs/source/tutorials/"
        "e2e_flow.rst",
        date="not recorded",
        hardware="not stated",
        model="Llama 3.2 3B (LoRA)",
        recipe="torchtune lora_finetune_single_device",
        allocated="6.21",
        reserved="6.27",
        unit="GiB",
        quote="6.27 against 6.21 GiB",
        moment="init",
        note="read by an earlier session (the figures fit.headroom cited before)",
        profile="single",
        profile_from="the recipe: lora_finetune_single_device",
    ),
)

#: the pairs that pass every rule
COUNTED = tuple(pair for pair in PAIRS if not excluded_because(pair))


def summary(pairs: tuple[ReservePair, ...] = COUNTED) -> tuple[float, float, float]:
    """The median reserve of ``pairs`` and their range: ``(median, low, high)``."""
    if not pairs:
        raise ValueError("no published pair counts: there is no reserve to summarise")
    reserves = [pair.reserve for pair in pairs]
    return statistics.median(reserves), min(reserves), max(reserves)


def figures_in(text: str) -> list[str]:
    """The numbers of ``text`` as printed (``'21'``, ``'26279.24'``)."""
    return re.findall(r"\d+(?:\.\d+)?", text)
