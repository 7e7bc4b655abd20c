"""Any model: presets with their sources, config.json files, explicit dimensions, near misses.

The presets' shapes are held to torchtune's model builders (pytorch/torchtune at bd2a0fc,
``torchtune/models/*/_model_builders.py``: ``vocab_size``, ``num_layers``, ``num_heads``,
``num_kv_heads``, ``embed_dim``, ``intermediate_dim``, ``head_dim``), which read the same
config.json files; the config.json reader to files written from published config.json
fields (citsjtu2020/LLM-Prof ``sglang/Model_Config.md`` at 8434c8d holds Qwen2.5-7B's).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tutorial_utils import fit
from tutorial_utils.fit import cli, presets, shapes

#: torchtune's builders at bd2a0fc: (vocab, layers, heads, kv heads, embed, intermediate)
TORCHTUNE = {
    "llama-8b": (128256, 32, 32, 8, 4096, 14336),  # llama3_1_8b
    "llama-70b": (128256, 80, 64, 8, 8192, 28672),  # llama3_1_70b
    "llama-3.1-405b": (128256, 126, 128, 8, 16384, 53248),  # llama3_1_405b
    "llama-2-13b": (32000, 40, 40, 40, 5120, 13824),  # llama2_13b
    "llama-2-70b": (32000, 80, 64, 8, 8192, 28672),  # llama2_70b
    "mistral-7b": (32000, 32, 32, 8, 4096, 14336),  # mistral_7b
    "qwen2.5-0.5b": (151936, 24, 14, 2, 896, 4864),
    "qwen2.5-1.5b": (151936, 28, 12, 2, 1536, 8960),
    "qwen2.5-3b": (151936, 36, 16, 2, 2048, 11008),
    "qwen2.5-7b": (152064, 28, 28, 4, 3584, 18944),
    "qwen2.5-14b": (152064, 48, 40, 8, 5120, 13824),
    "qwen2.5-32b": (152064, 64, 40, 8, 5120, 27648),
    "qwen2.5-72b": (152064, 80, 64, 8, 8192, 29568),
    "gemma-2b": (256000, 18, 8, 1, 2048, 16384),  # head_dim=256
    "gemma-7b": (256000, 28, 16, 16, 3072, 24576),  # head_dim=256
}


@pytest.mark.parametrize("name", sorted(TORCHTUNE))
def test_each_preset_has_the_shape_torchtune_builds_and_a_source(name):
    f = presets.PRESETS[name].fields
    got = (f["vocab"], f["n_layers"], f["n_heads"], f["n_kv_heads"], f["d_model"], f["d_ff"])
    assert got == TORCHTUNE[name]
    assert presets.PRESETS[name].source.startswith("https://huggingface.co/")
    if name.startswith("gemma"):
        assert f["d_head"] == 256


@pytest.mark.heavy
def test_every_preset_the_issue_names_answers_with_a_number_and_a_verdict():
    for name in ("mistral-7b", "qwen2.5-7b", "llama-3.1-405b", "gemma-2b", "llama-2-7b"):
        r = fit.will_it_fit(name, seq=256, gpu="A100-80GB")
        assert r.total > 0 and r.verdict.split()[0] in ("fits", "does")


def test_the_parameter_counts_follow_the_shapes():
    """Qwen2's q/k/v biases and Gemma's 256-wide heads are counted: without them these totals
    are off by 200 K and 1.6 B parameters."""
    count = {n: shapes.counts(shapes.config(n)[1]).total for n in ("qwen2.5-7b", "gemma-7b")}
    assert count == {"qwen2.5-7b": 7_615_616_512, "gemma-7b": 8_537_680_896}


def _qwen_config(tmp_path):
    config = {  # Qwen2.5-7B's config.json fields, as published
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_a_config_json_is_read_as_its_preset(tmp_path):
    label, fields = presets.from_config_json(_qwen_config(tmp_path))
    assert fields == presets.PRESETS["qwen2.5-7b"].fields and "qwen2" in label
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_embd": 768,
                "n_layer": 12,
                "n_head": 12,
                "vocab_size": 50257,
                "n_positions": 1024,
            }
        )
    )
    _, fields = presets.from_config_json(gpt2)
    assert shapes.config(fields)[1] == shapes.config("gpt2")[1]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "cannot read"),
        ('{"model_type": "t5"}', "has model_type 't5'"),
        ('{"model_type": "llama", "hidden_size": 64}', "has no num_attention_heads"),
        ('{"model_type": "llama", "num_attention_heads": -2}', "must be a whole number"),
        ("[1, 2]", "holds no object"),
    ],
)
def test_a_bad_config_json_is_one_sentence(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        presets.from_config_json(path)
    with pytest.raises(ValueError, match="no config file"):
        presets.from_config_json(tmp_path / "missing.json")


@pytest.mark.heavy
def test_the_command_line_takes_a_config_and_dimensions(tmp_path, capsys):
    path = _qwen_config(tmp_path)
    assert cli.main(["--config", str(path), "--seq", "256", "--gpu", "H200"]) == 1
    out = capsys.readouterr().out
    assert "7.62 B params" in out and "does not fit on one H200" in out
    dims = "vocab=32000,d_model=4096,n_layers=32,n_heads=32,d_ff=11008"
    assert cli.main(["--dims", dims, "--seq", "256"]) == 0
    assert "6.74 B params" in capsys.readouterr().out  # Llama 2 7B's shape
    assert cli.main(["--dims", "vocab=10,d_model=4", "--seq", "8"]) == 2
    assert "--dims needs n_heads, n_layers too" in capsys.readouterr().err
    assert cli.main(["mistral-7b", "--config", str(path)]) == 2
    assert "give one model" in capsys.readouterr().err


def test_a_near_miss_gets_did_you_mean_before_torch_is_imported():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tutorial_utils.fit import cli; "
            "code = cli.main(['qwen2.5-8b']); assert 'torch' not in sys.modules; sys.exit(code)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "did you mean 'qwen2.5-7b'" in done.stderr
