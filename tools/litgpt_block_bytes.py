"""Run litgpt's own LoRA block, at a commit, on fake tensors with the course's accountant.

    python tools/litgpt_block_bytes.py /work/.mirror/Lightning-AI+litgpt/repo --commit 8641822

Why: the calculator's ``block="litgpt"`` re-creates what litgpt's block saves for backward
(``fit.litgpt_block``) without importing litgpt, which CI cannot. This tool is the one place
litgpt's own code runs: it reads ``lit_gpt/{model,lora,config,rmsnorm}.py`` from a clone at the
commit (``git show``, into a temporary folder; nothing of litgpt enters the repository) and
imports them with stubs for the three names they take from ``lit_gpt/utils.py`` (which imports
Lightning) and ``lightning_utilities`` (``find_multiple``, ``map_old_state_dict_weights``,
``RequirementCache``: none is called in a block's forward). It builds ``lit_gpt.lora.Block`` as
``finetune/lora.py`` at that commit configured it (LoRA r=8, alpha 16, dropout 0.05 on query
and value, or the other targets; ``lit_gpt.model.Block`` for a full fine-tune; ``bf16-true``:
every weight bf16; the RoPE cache fp32, as ``model.max_seq_length = longest_seq_length``
rebuilds it outside ``init_module``: were it the fp16 cache built inside, bf16 times fp16 would
promote to fp32 all the same) and books one forward and backward with
``fit.activations._fake_pass``, the calculator's own books. Two stand-ins, as the calculator's
own block has them: ``nn.Dropout`` runs CUDA's fused kernel (``torch.native_dropout``, a bool
mask; on a CPU ``F.dropout`` keeps a mask in the input's dtype), and under QLoRA (the shapes on
a ``bnb-nf4`` base) every ``nn.Linear`` is ``fit.activations._Nf4Linear("bnb")`` (Lightning's
``BitsandbytesPrecision`` replaces them all with bitsandbytes' ``Linear4bit``). flash-attn is
not installed (``FlashAttention2Available`` False): SDPA, as the calculator's block.

It prints one line per shape: litgpt's Pass, the re-creation's, and the course's block's;
``tests/test_fit_litgpt_block.py`` records litgpt's figures with the commit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from tutorial_utils.fit import activations as fa  # noqa: E402
from tutorial_utils.fit import shapes  # noqa: E402
from tutorial_utils.fit.states import Lora  # noqa: E402

FILES = ("model.py", "lora.py", "config.py", "rmsnorm.py")


def import_litgpt(clone: Path, commit: str) -> types.ModuleType:
    """``lit_gpt.lora`` at ``commit``, from the clone's git objects, with stubs for Lightning."""
    folder = Path(tempfile.mkdtemp(prefix="litgpt-")) / "lit_gpt"
    folder.mkdir()
    for name in FILES:
        text = subprocess.run(
            ["git", f"--git-dir={clone}", "show", f"{commit}:lit_gpt/{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (folder / name).write_text(text)
    package = types.ModuleType("lit_gpt")
    package.__path__ = [str(folder)]
    utils = types.ModuleType("lit_gpt.utils")
    utils.find_multiple = lambda n, k: n if n % k == 0 else n + k - n % k
    utils.map_old_state_dict_weights = lambda state, mapping, prefix: state
    imports = types.ModuleType("lightning_utilities.core.imports")
    imports.RequirementCache = lambda requirement: False  # no flash-attn: SDPA
    for name, module in {
        "lit_gpt": package,
        "lit_gpt.utils": utils,
        "lightning_utilities": types.ModuleType("lightning_utilities"),
        "lightning_utilities.core": types.ModuleType("lightning_utilities.core"),
        "lightning_utilities.core.imports": imports,
    }.items():
        sys.modules[name] = module
    import importlib

    importlib.import_module("lit_gpt.model")  # first, as lit_gpt/__init__.py imports them
    return importlib.import_module("lit_gpt.lora")


class _WithRope(nn.Module):
    """litgpt's block called as ``block(x, cos, sin)``: GPT.forward passes ``self.cos[:T]``,
    a view of the model's buffer (booked before the pass, as the block's weights are)."""

    def __init__(self, block: nn.Module, seq: int, head_size: int):
        super().__init__()
        self.block = block
        self.register_buffer("cos", torch.empty(seq, head_size))  # fp32
        self.register_buffer("sin", torch.empty(seq, head_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, self.cos, self.sin)


def _native_dropout(self, x):  # CUDA's dropout kernel: a bool mask
    return torch.native_dropout(x, self.p, self.training)[0] if self.p else x


#: The course's LoRA targets -> litgpt's Config switches (None: a full fine-tune, no LoRA).
TARGETS = {
    "qv": dict(to_query=True, to_value=True),
    "attention": dict(to_query=True, to_key=True, to_value=True, to_projection=True),
    "all": dict(to_query=True, to_key=True, to_value=True, to_projection=True, to_mlp=True),
}

#: (litgpt's name, the preset, batch, seq, checkpointing, LoRA targets or None, base): the
#: resource tables' rows (Alpaca's longest sample, 1304 tokens; the FSDP1 rows checkpoint each
#: Block), a grouped-query model (Llama 2 70B: 8 groups), the other targets, no LoRA.
SHAPES = (
    ("Llama-2-7b-hf", "llama-2-7b", 1, 1304, "none", "qv", "bf16"),
    ("Llama-2-7b-hf", "llama-2-7b", 1, 1304, "none", "qv", "bnb-nf4"),
    ("Llama-2-13b-hf", "llama-2-13b", 2, 1304, "none", "qv", "bf16"),
    ("Llama-2-13b-hf", "llama-2-13b", 1, 1304, "none", "qv", "bnb-nf4"),
    ("Llama-2-7b-hf", "llama-2-7b", 4, 1304, "full", "qv", "bf16"),
    ("Llama-2-70b-hf", "llama-2-70b", 1, 512, "none", "qv", "bf16"),
    ("Llama-2-70b-hf", "llama-2-70b", 1, 512, "none", "all", "bf16"),
    ("Llama-2-7b-hf", "llama-2-7b", 2, 256, "none", "attention", "bnb-nf4"),
    ("Llama-2-7b-hf", "llama-2-7b", 2, 256, "none", None, "bf16"),
)


def litgpt_pass(lora_mod, name, batch, seq, checkpointing, targets, base) -> fa.Pass:
    switches = TARGETS[targets] if targets else {}
    config = lora_mod.Config.from_name(name, r=8, alpha=16, dropout=0.05, **switches)

    def build():
        if targets is None:  # finetune/full.py: lit_gpt.model.Block, every weight trained
            block = sys.modules["lit_gpt.model"].Block(config)
        else:
            block = lora_mod.Block(config)
            lora_mod.mark_only_lora_as_trainable(block)
        if base == "bnb-nf4":
            for parent in list(block.modules()):
                for child_name, child in list(parent.named_children()):
                    if type(child) is nn.Linear:
                        setattr(parent, child_name, fa._Nf4Linear(child, "bnb"))
        block = block.to(torch.bfloat16)
        return _WithRope(block, seq, config.head_size)

    def block_input():
        return torch.empty(batch, seq, config.n_embd, dtype=torch.bfloat16, requires_grad=True)

    original = nn.Dropout.forward
    nn.Dropout.forward = _native_dropout
    try:  # "as built": the block is bf16 already and RoPE's cache stays fp32
        return fa._fake_pass(build, block_input, lambda y: y.sum(), "as-built", checkpointing)
    finally:
        nn.Dropout.forward = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clone", type=Path, help="a litgpt clone's git directory")
    parser.add_argument("--commit", default="8641822")
    args = parser.parse_args()
    lora_mod = import_litgpt(args.clone, args.commit)
    for name, preset, batch, seq, ckpt, targets, base in SHAPES:
        theirs = litgpt_pass(lora_mod, name, batch, seq, ckpt, targets, base)
        cfg = shapes.config(preset)[1]
        lora = Lora(8, targets, base, 0.05) if targets else None
        course = fa.activations(cfg, batch, seq, "bf16-master", ckpt, lora)[0]
        ours = fa.activations(cfg, batch, seq, "bf16-master", ckpt, lora, block="litgpt")[0]
        print(f"{preset} batch {batch} seq {seq} {ckpt} {targets} {base}:")
        print(f"  litgpt {args.commit}: {theirs}")
        print(f"  re-creation:     {ours}  {'same' if ours == theirs else 'DIFFERENT'}")
        print(f"  course's block:  {course}  held {theirs.held - course.held:+,} B")


if __name__ == "__main__":
    main()
