"""Models by name or by config.json: their shapes, each with its source, without torch.

One job: turn what a person names (``Llama-3.1-8B``, ``meta-llama/Llama-3.1-8B``, ``mistral-7b``,
``qwen2.5-7b``) or the path of a Hugging Face ``config.json`` into the fields of a
``decoder.DecoderConfig`` (a plain dict here: torch is imported only once an answer is asked
for), or say in one sentence what to type instead, with "did you mean" for a near miss. No
network: the shapes come from the table below or from the file.

Each preset's shape is its model's published ``config.json`` on the Hugging Face Hub (the
``source`` of each row), read field by field: ``vocab_size``, ``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
``tie_word_embeddings`` and, where given, ``head_dim`` (GPT-2: ``n_embd``, ``n_layer``,
``n_head``, ``n_positions``). What the course's decoder leaves out changes no byte of memory:
rotary embeddings and Gemma's embedding scale have no weights; Gemma's GeGLU has SwiGLU's three
matrices and saves the same tensors; Qwen2's biases are on q, k and v only (``qkv_bias``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..decoder_config import llama_fields as _llama
from .inputs import key, pick

__all__ = ["MODELS", "PRESETS", "Preset", "from_config_json", "learned_positions", "model"]

_HUB = "https://huggingface.co/{}/blob/main/config.json"


@dataclass(frozen=True)
class Preset:
    """A model's shape (``decoder.DecoderConfig``'s fields), the names people give it, and the
    config.json it was read from."""

    fields: dict
    names: tuple[str, ...]
    source: str


def _gpt2(h, layers, heads) -> dict:
    return dict(vocab=50257, d_model=h, n_layers=layers, n_heads=heads)


def _row(repo: str, fields: dict, *names: str) -> Preset:
    return Preset(fields, (repo.lower(), *names), _HUB.format(repo))


#: The course's five original keys come first (``decoder.PRESETS`` holds the same shapes; a
#: test checks), then the rest by family.
PRESETS: dict[str, Preset] = {
    "gpt2-124m": _row("openai-community/gpt2", _gpt2(768, 12, 12), "gpt2", "gpt-2", "gpt2-small"),
    "gpt2-1.5b": _row("openai-community/gpt2-xl", _gpt2(1600, 48, 25), "gpt2-xl", "gpt-2-xl"),
    "llama-1b": _row(
        "meta-llama/Llama-3.2-1B",
        _llama(128256, 2048, 16, 32, 8, 8192, tied=True),
        "llama-3.2-1b",
        "llama3.2-1b",
    ),
    "llama-8b": _row(
        "meta-llama/Llama-3.1-8B",
        _llama(128256, 4096, 32, 32, 8, 14336),
        "llama-3-8b",
        "llama3-8b",
        "llama-3.1-8b",
        "llama3.1-8b",
        "meta-llama/meta-llama-3-8b",
        "meta-llama/meta-llama-3.1-8b",
    ),
    "llama-70b": _row(
        "meta-llama/Llama-3.1-70B",
        _llama(128256, 8192, 80, 64, 8, 28672),
        "llama-3-70b",
        "llama3-70b",
        "llama-3.1-70b",
        "llama3.1-70b",
        "llama-3.3-70b",
        "meta-llama/meta-llama-3-70b",
        "meta-llama/meta-llama-3.1-70b",
    ),
    "llama-3.2-3b": _row(
        "meta-llama/Llama-3.2-3B",
        _llama(128256, 3072, 28, 24, 8, 8192, tied=True),
        "llama3.2-3b",
        "llama-3b",
    ),
    "llama-3.1-405b": _row(
        "meta-llama/Llama-3.1-405B",
        _llama(128256, 16384, 126, 128, 8, 53248),
        "llama3.1-405b",
        "llama-405b",
        "405b",
        "meta-llama/meta-llama-3.1-405b",
    ),
    "llama-2-7b": _row(
        "meta-llama/Llama-2-7b-hf", _llama(32000, 4096, 32, 32, 32, 11008), "llama2-7b"
    ),
    "llama-2-13b": _row(
        "meta-llama/Llama-2-13b-hf", _llama(32000, 5120, 40, 40, 40, 13824), "llama2-13b"
    ),
    "llama-2-70b": _row(
        "meta-llama/Llama-2-70b-hf", _llama(32000, 8192, 80, 64, 8, 28672), "llama2-70b"
    ),
    "mistral-7b": _row(
        "mistralai/Mistral-7B-v0.1",
        _llama(32000, 4096, 32, 32, 8, 14336),
        "mistral-7b-v0.1",
        "mistral",
    ),
    **{
        f"qwen2.5-{size}": _row(
            f"Qwen/Qwen2.5-{size.upper()}",
            _llama(vocab, h, layers, heads, kv, ff, tied=tied, qkv_bias=True),
            f"qwen2.5-{size}-instruct",
            f"qwen/qwen2.5-{size}-instruct",
        )
        for size, vocab, h, layers, heads, kv, ff, tied in (
            ("0.5b", 151936, 896, 24, 14, 2, 4864, True),
            ("1.5b", 151936, 1536, 28, 12, 2, 8960, True),
            ("3b", 151936, 2048, 36, 16, 2, 11008, True),
            ("7b", 152064, 3584, 28, 28, 4, 18944, False),
            ("14b", 152064, 5120, 48, 40, 8, 13824, False),
            ("32b", 152064, 5120, 64, 40, 8, 27648, False),
            ("72b", 152064, 8192, 80, 64, 8, 29568, False),
        )
    },
    "gemma-2b": _row(
        "google/gemma-2b", _llama(256000, 2048, 18, 8, 1, 16384, tied=True, d_head=256)
    ),
    "gemma-7b": _row(
        "google/gemma-7b", _llama(256000, 3072, 28, 16, 16, 24576, tied=True, d_head=256)
    ),
}
#: Each preset and the names people give it (kept for the old ``fit_inputs.MODELS``).
MODELS: dict[str, tuple[str, ...]] = {name: p.names for name, p in PRESETS.items()}


def learned_positions(name: str) -> int:
    """How many learned positions a preset has (GPT-2: 1024), 0 for rotary ones."""
    return PRESETS[name].fields.get("max_positions", 1024)


def model(name: str) -> str:
    """The preset for a model name: ``model('meta-llama/Llama-3.1-8B') == 'llama-8b'``."""
    aliases = {alias: preset for preset, p in PRESETS.items() for alias in p.names}
    if isinstance(name, str) and key(name).endswith(".json"):
        raise ValueError(f"{name!r} looks like a file: give it as --config {name}")
    return pick("model", name, tuple(PRESETS), aliases)


#: config.json's ``model_type`` values read, and how their layers differ.
_FAMILIES = ("llama", "mistral", "qwen2", "gemma", "gpt2")


def from_config_json(path) -> tuple[str, dict]:
    """(a label, ``DecoderConfig``'s fields) from a Hugging Face ``config.json``: Llama, Mistral,
    Qwen2, Gemma or GPT-2 families (``model_type``); one sentence for anything else."""
    file = Path(path)
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"no config file at {str(path)!r}: give the path of a config.json"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read {str(path)!r} as a config.json: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{str(path)!r} is not a config.json: it holds no object of fields")
    family = str(config.get("model_type", "")).lower()
    if family not in _FAMILIES:
        raise ValueError(
            f"{str(path)!r} has model_type {config.get('model_type')!r}: the calculator reads "
            f"{', '.join(_FAMILIES)} configs; give the dimensions of another model by hand"
        )
    label = str(config.get("_name_or_path") or file.parent.name or file.name)

    def need(*names, default=None):
        for n in names:
            if config.get(n) is not None:
                value = config[n]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(
                        f"{str(path)!r}: {n} must be a whole number >= 1, not {value!r}"
                    )
                return value
        if default is None:
            raise ValueError(f"{str(path)!r} has no {names[0]}: is it a model's config.json?")
        return default

    if family == "gpt2":
        h = need("n_embd")
        fields = dict(
            vocab=need("vocab_size"),
            d_model=h,
            n_layers=need("n_layer"),
            n_heads=need("n_head"),
            d_ff=need("n_inner") if config.get("n_inner") is not None else None,
            max_positions=need("n_positions", default=1024),
            tied=bool(config.get("tie_word_embeddings", True)),
        )
        return f"{label} ({family})", fields
    heads = need("num_attention_heads")
    h = need("hidden_size")
    fields = _llama(
        need("vocab_size"),
        h,
        need("num_hidden_layers"),
        heads,
        need("num_key_value_heads", default=heads),
        need("intermediate_size"),
        tied=bool(config.get("tie_word_embeddings", family == "gemma")),
    )
    head_dim = config.get("head_dim")
    if head_dim and head_dim * heads != h:
        fields["d_head"] = need("head_dim")
    if family == "qwen2" or config.get("attention_bias"):
        fields["qkv_bias"] = True
    return f"{label} ({family})", fields
