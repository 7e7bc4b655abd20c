"""Write ``fit/activation_terms.py``: the fake-tensor pass's activations as formulas, per family.

    python tools/fit_activation_terms.py   # about 11 minutes on 2 loaded cores; rewrites the file

Why: ``fit.activations`` runs one block and the head on fake tensors, exact but it needs torch
(seconds to import). Every figure it books is, for a block family (norm x MLP), a recipe's
module dtype, a checkpointing mode and a LoRA target set, a sum of whole-number multiples of
the shape's products (tokens x d_model, d_model x d_ff, ...), or the larger of 0 and such a
sum less the weight gradients (or what is held) where a moment's bytes fall under what is
already counted. This tool runs the pass on random small shapes of each case, solves for the
multiples, checks them on every shape it ran (all must agree to the byte; otherwise the case
gets no formula and the calculator keeps the pass) and writes them.
``tests/test_fit_activation_terms.py`` checks them again against the pass on every preset
family's real shapes (Llama, Mistral, Qwen2, Gemma, GPT-2), to the byte.
"""

from __future__ import annotations

import argparse
import pprint
import random
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tutorial_utils.decoder_config import DecoderConfig  # noqa: E402
from tutorial_utils.fit import activation_formulas as af  # noqa: E402
from tutorial_utils.fit.activations import activations  # noqa: E402
from tutorial_utils.fit.states import Lora  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "src/tutorial_utils/fit/activation_terms.py"
RECIPES = {"autocast": "autocast-bf16", "bf16-module": "bf16-master", "fp32": "fp32"}
#: fp32 training is asked for least (and its block's moments take more sums): the pass, unless
#: ``--fp32`` asks this tool to solve for it too.
#: The matmul policies (every-matmul, selective) recompute part of a block in backward, whose
#: peak is the largest of more sums than this tool separates: the pass answers them.
CHECKPOINTING = ("none", "full")
LORA = ("none", "attention", "qv", "all")
FAMILIES = ("rms-swiglu", "layer-gelu")
ROWS = 48


def random_config(family: str, head: str, rng: random.Random) -> DecoderConfig:
    heads = rng.choice([2, 4, 8])
    head_dim = rng.choice([4, 8, 16])
    groups = rng.choice([1, 2, heads])
    h = heads * head_dim
    if family == "rms-swiglu":
        d_head = rng.choice([None, None, head_dim * 2])  # Gemma: d_head x heads != d_model
        return DecoderConfig(
            vocab=rng.choice([8, 16, 32]) * h + rng.choice([0, 5]),
            d_model=h,
            n_layers=1,
            n_heads=heads,
            n_kv_heads=heads // groups,
            d_ff=rng.choice([2, 3, 4]) * h + rng.choice([0, 8]),
            norm="rms",
            mlp="swiglu",
            bias=False,
            tied=head == "tied",
            max_positions=0,
            d_head=d_head,
            qkv_bias=rng.choice([True, False]),
        )
    return DecoderConfig(
        vocab=rng.choice([8, 16, 32]) * h + rng.choice([0, 5]),
        d_model=h,
        n_layers=1,
        n_heads=heads,
        d_ff=rng.choice([4 * h, 3 * h + 8]),
        tied=head == "tied",
        max_positions=rng.choice([0, 512]),
    )


def independent(X: np.ndarray) -> np.ndarray:
    """The columns of ``X`` that no earlier column set determines (GPT-2's q, k and v widths
    are all d_model; a sum over equal columns would be split into fractions)."""
    keep: list[int] = []
    for j in range(X.shape[1]):
        if np.abs(X[:, j]).sum() and np.linalg.matrix_rank(X[:, [*keep, j]]) > len(keep):
            keep.append(j)
    return np.array(keep, dtype=int)


def solve(X: np.ndarray, y: np.ndarray) -> dict[str, Fraction] | None:
    """Whole-number (or eighth) multiples of the features that give ``y`` exactly, or None."""
    keep = independent(X)
    c, *_ = np.linalg.lstsq(X[:, keep], y, rcond=None)
    coef = np.zeros(X.shape[1])
    coef[keep] = np.round(c * 8) / 8
    if np.abs(X @ coef - y).max() != 0:
        return None
    named = zip(af.FEATURES, coef, strict=True)
    return {n: Fraction(v).limit_denominator(8) for n, v in named if v}


def fit_field(rows, part: str, field: str):
    """(terms, what is subtracted before the max with 0) for one field, or None. A moment may
    be the larger of two sums (the MLP's backward or attention's, say): when one sum does not
    give every row, the rows the best sum misses get a second, and the larger is taken."""
    X = np.array([[float(x) for x in r["features"]] for r in rows])
    values = np.array([float(getattr(r[part], field)) for r in rows])
    want = [getattr(r[part], field) for r in rows]
    choices = ("nothing", "grads", "held", "held+grads")
    for less in choices[:1] if field in ("held", "grads") else choices:
        minus = np.array([float(af.subtracted(r[part], less)) for r in rows])
        up = np.ones(len(rows), bool) if less == "nothing" else values > 0
        target = values + minus
        terms = solve(X[up], target[up])
        if terms is not None:
            if [af.evaluate(terms, less, r["features"], r[part]) for r in rows] == want:
                return terms, less
            continue
        if less == "nothing":
            continue
        ups = list(np.flatnonzero(up))
        while len(ups) > len(independent(X[ups])) + 4:  # drop the worst row until one sum fits
            keep = independent(X[ups])
            c, *_ = np.linalg.lstsq(X[ups][:, keep], target[ups], rcond=None)
            miss = np.abs(X[ups][:, keep] @ c - target[ups])
            if miss.max() < 0.25:
                break
            ups.pop(int(miss.argmax()))
        first = solve(X[ups], target[ups])
        if first is None:
            continue
        one = np.array([float(af.evaluate(first, "nothing", r["features"], None)) for r in rows])
        rest = [i for i in np.flatnonzero(up) if one[i] != target[i]]
        if len(rest) < len(independent(X[rest])) + 4 if rest else True:
            continue  # too few rows to pin a second sum down: no formula
        second = solve(X[rest], target[rest])
        if second is None:
            continue
        got = [af.evaluate([first, second], less, r["features"], r[part]) for r in rows]
        if got == want:
            return [first, second], less
    return None


def write(table: dict, missing: list) -> None:
    text = (
        "# ruff: noqa: E501\n"
        '"""Generated by ``tools/fit_activation_terms.py`` (do not edit): the fake-tensor pass\'s\n'
        "activations as multiples of the shape's products, per (family, recipe, checkpointing,\n"
        "LoRA targets); ``activation_formulas`` reads them. Checked by\n"
        '``tests/test_fit_activation_terms.py``."""\n\n'
        f"# fmt: off\nTERMS = {pprint.pformat(table, width=99, sort_dicts=True)}\n"
        "\n#: The cases with no formula (the calculator runs the pass for them).\n"
        f"MISSING = {missing!r}\n"
    )
    OUT.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fp32", action="store_true", help="solve for fp32 training too")
    args = parser.parse_args()
    table, missing = {}, []
    # the questions people ask most first (each case is written as soon as it is solved):
    # Llama-style untied heads (Llama 3.1 8B/70B/405B, Mistral, Qwen2.5 7B+), GPT-2, then the
    # tied Llama-style heads (Llama 3.2 1B/3B, Gemma, small Qwen2.5)
    recipes = [r for r in RECIPES if args.fp32 or r != "fp32"]
    kinds = (("rms-swiglu", "untied"), ("layer-gelu", "tied"), ("rms-swiglu", "tied"))
    kinds += (("layer-gelu", "untied"),)
    cases = [
        (ckpt, recipe, targets, family, tying)
        for lora_first in (True, False)
        for family, tying in kinds
        for targets in (LORA[:2] if lora_first else LORA[2:])
        for ckpt in CHECKPOINTING
        for recipe in recipes
    ]
    for ckpt, recipe, targets, family, tying in cases:
        precision = RECIPES[recipe]
        rng = random.Random(args.seed)
        rows = []
        for _ in range(args.rows + (16 if tying == "tied" else 0)):  # two sums: more rows
            cfg = random_config(family, tying, rng)
            batch, seq = rng.choice([1, 2, 3]), rng.choice([4, 8, 16, 64, 256, 512])
            rank = rng.choice([2, 4, 8]) if targets != "none" else 0
            lora = Lora(rank, targets) if rank else None
            block, head = activations(cfg, batch, seq, precision, ckpt, lora)
            feats = af.features(cfg, batch, seq, rank)
            rows.append({"features": feats, "block": block, "head": head})
        key = (family, tying, recipe, ckpt, targets)
        entry = {}
        for part, field in af.FIELDS:
            found = fit_field(rows, part, field)
            if found is None:
                missing.append((*key, part, field))
                break
            terms, less = found
            whole = [
                {k: str(v) if v.denominator > 1 else int(v) for k, v in t.items()}
                for t in (terms if isinstance(terms, list) else [terms])
            ]
            entry[f"{part}.{field}"] = (whole if len(whole) > 1 else whole[0], less)
        else:
            table[key] = entry
        print(key, "ok" if key in table else f"no formula: {missing[-1]}", flush=True)
        write(table, missing)
    print(f"wrote {OUT}: {len(table)} cases, {len(missing)} without a formula")


if __name__ == "__main__":
    main()
