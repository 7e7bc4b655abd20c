"""The course decoder's shape, without torch: ``DecoderConfig`` and the real models' ``PRESETS``.

One job: the fields that say how big each part of ``decoder.Decoder`` is, checked when made.
Kept apart from the model's code so that what only reads a shape (``formulas``, the "will it
fit" command line) answers without importing torch, which takes seconds; ``decoder``
re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["PRESETS", "DecoderConfig", "llama_fields", "preset"]


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a decoder. The defaults are a toy that trains on a CPU in milliseconds."""

    vocab: int = 1000
    d_model: int = 64  # h
    n_layers: int = 2  # L
    n_heads: int = 4  # a
    n_kv_heads: int | None = None  # None: one key/value head per query head; fewer: GQA (Llama)
    d_ff: int | None = None  # the MLP's hidden width; None: 4 * d_model
    norm: str = "layer"  # "layer" (GPT-2: weight and bias) or "rms" (Llama: weight only)
    mlp: str = "gelu"  # "gelu" (two matrices, GPT-2) or "swiglu" (three, Llama)
    bias: bool = True  # biases in every Linear but the output head (GPT-2 yes, Llama no)
    tied: bool = True  # the output head shares the embedding's weight
    max_positions: int = 1024  # learned position embeddings (GPT-2); 0 for none (Llama: RoPE)
    attention: str = "sdpa"  # "sdpa" (F.scaled_dot_product_attention) or "explicit"
    d_head: int | None = None  # each head's width; None: d_model // n_heads (Gemma: 256)
    qkv_bias: bool = False  # biases on q, k and v even when ``bias`` is False (Qwen2)

    def __post_init__(self) -> None:
        # The smallest each size may be: no layers is an embedding alone (fit.py counts the
        # head that way), no positions is RoPE's; None is "the default" where the field allows.
        smallest = {"vocab": 1, "d_model": 1, "n_layers": 0, "n_heads": 1}
        smallest |= {"n_kv_heads": 1, "d_ff": 1, "max_positions": 0}
        for name, low in smallest.items():
            value = getattr(self, name)
            if value is None and name in ("n_kv_heads", "d_ff"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(
                    f"DecoderConfig.{name} must be a whole number >= {low}, not {value!r}"
                )
        if self.d_head is not None and (
            not isinstance(self.d_head, int) or isinstance(self.d_head, bool) or self.d_head < 1
        ):
            raise ValueError(
                f"DecoderConfig.d_head must be a whole number >= 1, not {self.d_head!r}"
            )
        if self.d_head is None and (self.n_heads < 1 or self.d_model % self.n_heads):
            raise ValueError(
                f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads}): "
                "each head gets d_model / n_heads dimensions"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})"
            )
        choices = {"norm": ("layer", "rms"), "mlp": ("gelu", "swiglu")}
        choices["attention"] = ("sdpa", "explicit")
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"DecoderConfig.{name} must be one of {allowed}, not {getattr(self, name)!r}"
                )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def q_dim(self) -> int:
        """The width of the queries (and of attention's output): d_model unless ``d_head``."""
        return self.n_heads * self.head_dim

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model


def llama_fields(vocab, h, layers, heads, kv, ff, tied=False, **more) -> dict:
    """A Llama-style decoder's fields (RMSNorm, SwiGLU, no biases, rotary positions), as
    ``DecoderConfig(**llama_fields(...))`` takes them; ``more`` for a family's own (Gemma's
    ``d_head``, Qwen's ``qkv_bias``). The calculator's presets are written with it too."""
    return dict(
        vocab=vocab,
        d_model=h,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=kv,
        d_ff=ff,
        norm="rms",
        mlp="swiglu",
        bias=False,
        tied=tied,
        max_positions=0,
        **more,
    )


#: Real models' shapes (no weights): GPT-2 small and XL as OpenAI released them, Llama 3.2 1B,
#: Llama 3.1 8B and 70B as Meta's config.json files give them.
PRESETS: dict[str, DecoderConfig] = {
    "gpt2-124m": DecoderConfig(vocab=50257, d_model=768, n_layers=12, n_heads=12),
    "gpt2-1.5b": DecoderConfig(vocab=50257, d_model=1600, n_layers=48, n_heads=25),
    **{
        name: DecoderConfig(**llama_fields(128256, h, layers, heads, 8, ff, tied=tied))
        for name, h, layers, heads, ff, tied in (
            ("llama-1b", 2048, 16, 32, 8192, True),
            ("llama-8b", 4096, 32, 32, 14336, False),
            ("llama-70b", 8192, 80, 64, 28672, False),
        )
    },
}


def preset(name: str, **changes) -> DecoderConfig:
    """A preset's config, with any field changed: ``preset("llama-8b", n_layers=1)``."""
    if name not in PRESETS:
        raise ValueError(f"no preset named {name!r}; choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **changes)
