"""Write ``fit/activation_terms.py``: the fake-tensor pass's activations as formulas, per family.

    python tools/fit_activation_terms.py   # about an hour on 2 loaded cores; rewrites the file
    python tools/fit_activation_terms.py --only rms-swiglu,tied,autocast,full,none  # one case

Why: ``fit.activations`` runs one block and the head on fake tensors, exact but it needs torch
(seconds to import). Every figure it books is, for a block family (norm x MLP), a recipe's
module dtype, a checkpointing mode and a LoRA target set, a sum of whole-number multiples of
the shape's products (tokens x d_model, d_model x d_ff, ...), or the larger of 0 and such a
sum less the weight gradients (or what is held) where a moment's bytes fall under what is
already counted. This tool runs the pass on random small shapes of each case, solves for the
multiples, checks them on every shape it ran (all must agree to the byte; otherwise the case
gets no formula and the calculator keeps the pass) and writes them.

A backward's peak is the largest of several sums: one per moment (under checkpointing, the
recomputed block's saved tensors, then each gradient as it is made). Where one or two sums do
not give every row, ``fit_traced`` reads the pass's bookings one by one (``Trace``): rows that
booked the same operators in the same order give, at each booking, a sum solved exactly across
them; the field is the largest of the sums that reach some row's peak and exceed none.
``tests/test_fit_activation_terms.py`` checks them again against the pass on every preset
family's real shapes (Llama, Mistral, Qwen2, Gemma, GPT-2), to the byte.

``rms-swiglu-litgpt`` is litgpt 8641822's Llama block (``block="litgpt"``, ``fit.litgpt_block``)
with one kv head per query head (under grouped queries its reshapes copy: the pass answers);
``--only rms-swiglu-litgpt`` solves its 64 cases alone (about 30 minutes on 2 loaded cores).

QLoRA's cases (``QLORA``: the LoRA targets over an NF4 base) draw shapes whose linears quantize
(multiples of 64 weights) and solve to a sixty-fourth (``DENOMINATOR``: one fp32 scale per 64
weights). Cross-entropy in chunks (``ce-chunks`` cases) solves the head alone, on rows whose
token count splits into equal pieces (``activation_formulas.pieces``); the block's figures are
the unchunked case's.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tutorial_utils import anatomy  # noqa: E402
from tutorial_utils.decoder_config import DecoderConfig  # noqa: E402
from tutorial_utils.fit import activation_formulas as af  # noqa: E402
from tutorial_utils.fit.activations import activations  # noqa: E402
from tutorial_utils.fit.states import Lora  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "src/tutorial_utils/fit/activation_terms.py"
RECIPES = {"autocast": "autocast-bf16", "bf16-module": "bf16-master", "fp32": "fp32"}
#: fp32 training is asked for least: the pass, unless ``--fp32`` asks this tool to solve for
#: it too. Under checkpointing backward recomputes part of a block, and its peak is the largest
#: of several sums (one per moment of the backward): ``traced`` finds each moment's sum.
CHECKPOINTING = ("none", "full", "every-second-matmul", "every-matmul")
LORA = ("none", "attention", "qv", "all")
#: QLoRA: the same targets over a frozen base in NF4 (``activation_formulas.lora_word``).
QLORA = tuple(f"{t}+{base}" for base in ("nf4", "bnb-nf4") for t in LORA[1:])
#: Cross-entropy in chunks changes the head only: its cases solve the head's fields, keyed
#: (family, head, recipe, ``af.CHUNKED``, frozen head), and take the block's from the question's
#: own key (``activation_formulas._case``). Where no formula holds for every count of chunks
#: (a tied head's backward, and fp32's: their moments move with the count), one is solved per
#: count the widget offers, ``f"{af.CHUNKED}-{n}"``.
FROZEN_HEADS = ("none", "lora", "lora+bnb-nf4")
CE_CHUNKS = (2, 3, 4, 8, 16)
PER_COUNT = (2, 4, 8, 16)
#: Multiples are solved to this fraction: NF4's dequantization makes one fp32 scale per 64
#: weights (a sixteenth of a byte per weight).
DENOMINATOR = 64
FAMILIES = ("rms-swiglu", "layer-gelu", "rms-swiglu-litgpt")  # the last: block="litgpt"
ROWS = 48


def random_config(family: str, head: str, rng: random.Random, nf4: bool = False) -> DecoderConfig:
    """A small random shape; with ``nf4``, one whose every linear has a multiple of 64 weights
    (NF4 quantizes blocks of 64), drawn again until it has."""
    while True:
        cfg = _random_config(family, head, rng)
        linears = [cfg.d_model * (cfg.q_dim + 2 * cfg.kv_heads * cfg.head_dim)]
        linears += [cfg.q_dim * cfg.d_model, cfg.d_model * cfg.ff, cfg.vocab * cfg.d_model]
        if not nf4 or all(n % 64 == 0 for n in linears):
            return cfg


def _random_config(family: str, head: str, rng: random.Random) -> DecoderConfig:
    heads = rng.choice([2, 4, 8])
    head_dim = rng.choice([4, 8, 16])
    groups = rng.choice([1, 2, heads])
    h = heads * head_dim
    if family == "rms-swiglu-litgpt":  # litgpt's Llama block: heads span d_model, no biases;
        return DecoderConfig(  # one kv head per query head (its reshapes copy under GQA: the pass)
            vocab=rng.choice([8, 16, 32]) * h + rng.choice([0, 5]),
            d_model=h,
            n_layers=1,
            n_heads=heads,
            n_kv_heads=heads,
            d_ff=rng.choice([2, 3, 4]) * h + rng.choice([0, 8]),
            norm="rms",
            mlp="swiglu",
            bias=False,
            tied=head == "tied",
            max_positions=0,
        )
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
        max_positions=rng.choice([0, 512, 640, 1024]),  # P varies: P*h is not a multiple of h
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
    """Whole-number (or ``1 / DENOMINATOR``) multiples of the features that give ``y`` exactly,
    or None."""
    keep = independent(X)
    c, *_ = np.linalg.lstsq(X[:, keep], y, rcond=None)
    coef = np.zeros(X.shape[1])
    coef[keep] = np.round(c * DENOMINATOR) / DENOMINATOR
    if np.abs(X @ coef - y).max() != 0:
        return None
    named = zip(af.FEATURES, coef, strict=True)
    return {n: Fraction(v).limit_denominator(DENOMINATOR) for n, v in named if v}


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
    if (part, field) in WINDOWS:
        return fit_traced(rows, part, field)
    return None


class Trace:
    """Every booking of the fake pass, as (window, operator, bytes in use then): wrapped around
    the accountant's ``run`` while a row is computed. A moment's peak is reached at a booking,
    so a window's peak is the largest of its bookings' figures."""

    events: list | None = None
    _run = anatomy._FakeAccountant.run

    @staticmethod
    def run(acc, func, args, kwargs, call):
        if Trace.events is None or not acc.windows:
            return Trace._run(acc, func, args, kwargs, call)
        before, acc.peak = acc.peak, acc.current
        out = Trace._run(acc, func, args, kwargs, call)
        window = acc.windows[-1]
        Trace.events.append((window, window.start, str(func), acc.peak - window.start))
        acc.peak = max(before, acc.peak)
        return out


anatomy._FakeAccountant.run = Trace.run


def traced(*args) -> tuple:
    """``activations(*args)`` (not cached) and its four windows' bookings: block forward, block
    backward, head forward, head backward; each a list of (operator, bytes over the window's
    start)."""
    Trace.events = []
    try:
        found = activations.__wrapped__(*args)
    finally:
        events, Trace.events = Trace.events, None
    order = list({id(e[0]): e[0] for e in events})  # (each window is kept alive by events)
    windows = [[(e[2], e[3]) for e in events if id(e[0]) == w] for w in order]
    assert len(windows) == 4, len(windows)
    return found, windows


#: (part, field) -> which window's bookings give its sums, and what a sum is compared with
#: (a booking is bytes over its window's start: forward starts before the part ran, backward
#: after its forward, with ``held`` in use).
WINDOWS = {("block", "backward_over"): (1, "grads"), ("head", "backward_over"): (3, "grads")}
WINDOWS |= {("head", "forward_over"): (2, "held")}


def fit_traced(rows, part: str, field: str):
    """The field as the largest of the bookings' sums: rows whose pass booked the same operators
    in the same order are solved together, one sum per booking (exact on every row of the group,
    or dropped); then every sum that exceeds no row's figure and reaches some row's is kept,
    and the largest of them must give every row's figure."""
    window, less = WINDOWS[(part, field)]
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(name for name, _ in r["windows"][window]), []).append(i)
    X = np.array([[float(x) for x in r["features"]] for r in rows])
    candidates: dict[tuple, dict] = {}
    # a group whose q/k/v have biases (b = 1) cannot tell q from b*q: the products that depend
    # on a switch come first, so that its sums name them and stay 0 where the switch is off
    switched = [j for j, n in enumerate(af.FEATURES) if n[:2] in ("b*", "t*", "p*")]
    order = np.array(switched + [j for j in range(X.shape[1]) if j not in switched])
    for members in groups.values():
        keep = order[independent(X[members][:, order])]
        if len(members) < len(keep) + 4:
            continue  # too few rows to pin a sum down
        Y = np.array([[float(v) for _, v in rows[i]["windows"][window]] for i in members])
        c, *_ = np.linalg.lstsq(X[members][:, keep], Y, rcond=None)
        coef = np.zeros((X.shape[1], Y.shape[1]))
        coef[keep] = np.round(c * DENOMINATOR) / DENOMINATOR
        exact = np.abs(X[members] @ coef - Y).max(axis=0) == 0
        for j in np.flatnonzero(exact):
            named = zip(af.FEATURES, coef[:, j], strict=True)
            terms = {n: Fraction(v).limit_denominator(DENOMINATOR) for n, v in named if v}
            candidates.setdefault(tuple(sorted(terms.items())), terms)
    want = [getattr(r[part], field) for r in rows]
    cap = [w + af.subtracted(r[part], less) for w, r in zip(want, rows, strict=True)]
    # the window opens with the loss (a scalar, not in ``held``) in use: a constant to add
    extra = {
        cap[i] - max(v for _, v in r["windows"][window]) for i, r in enumerate(rows) if want[i]
    }
    if len(extra) != 1:
        return None
    (extra,) = extra
    for terms in candidates.values():
        terms["1"] = terms.get("1", 0) + extra
    values = {
        key: [af.evaluate(t, "nothing", r["features"], None) for r in rows]
        for key, t in candidates.items()
    }
    valid = {k: v for k, v in values.items() if all(x <= m for x, m in zip(v, cap, strict=True))}
    # every moment that is the peak of some row, in the order of how many rows it reaches
    reached = {
        k: sum(v[i] == cap[i] for i in range(len(rows)) if want[i]) for k, v in valid.items()
    }
    chosen = [candidates[k] for k in sorted(valid, key=lambda k: -reached[k]) if reached[k]]
    terms = {} if not chosen else chosen[0] if len(chosen) == 1 else chosen
    if [af.evaluate(terms, less, r["features"], r[part]) for r in rows] == want:
        return terms, less
    return None


def write(table: dict, missing: list, out: Path = OUT) -> None:
    """The table as one JSON string that the module parses when imported: a few milliseconds,
    where a Python literal of some hundred cases takes tens to compile (without a ``.pyc``)."""
    cases = json.dumps([[list(key), table[key]] for key in sorted(table)], separators=(",", ":"))
    text = (
        "# ruff: noqa: E501\n"
        '"""Generated by ``tools/fit_activation_terms.py`` (do not edit): the fake-tensor pass\'s\n'
        "activations as multiples of the shape's products, per (family, head, recipe,\n"
        "checkpointing, LoRA targets and base); ``activation_formulas`` reads them. Checked by\n"
        '``tests/test_fit_activation_terms.py``."""\n\n'
        "import json\n\n"
        f"# fmt: off\n_CASES = {cases!r}\n"
        "#: (family, head, recipe, checkpointing, LoRA) -> {'part.field': (terms, subtracted)}\n"
        "TERMS = {\n"
        "    tuple(key): {field: tuple(value) for field, value in entry.items()}\n"
        "    for key, entry in json.loads(_CASES)\n"
        "}\n"
        "\n#: The cases with no formula (the calculator runs the pass for them).\n"
        f"MISSING = {missing!r}\n"
    )
    out.write_text(text)


def solve_case(key: tuple, n_rows: int, seed: int) -> dict | tuple[str, str]:
    """One case's entry (each field's terms and what is subtracted), or the (part, field) that
    no formula gives. A chunked cross-entropy case (``af.CHUNKED`` in the key) solves the head's
    fields only, on rows whose chunk count varies; its block runs unadapted or with LoRA on
    attention, whichever the frozen head goes with, without checkpointing."""
    family, tying, recipe, ckpt, words = key
    chunked = ckpt.startswith(af.CHUNKED)
    counts = (int(ckpt.rpartition("-")[2]),) if ckpt != af.CHUNKED and chunked else CE_CHUNKS
    targets, _, base = words.partition("+")
    if chunked:
        targets, ckpt = ("none" if words == "none" else "attention"), "none"
    base = base or "bf16"
    rng = random.Random(seed)
    rows = []
    for _ in range(n_rows + (16 if tying == "tied" or chunked else 0)):  # two sums: more rows
        cfg = random_config(family, tying, rng, nf4=base != "bf16")
        batch, seq, chunks = rng.choice([1, 2, 3]), rng.choice([4, 8, 16, 64, 256, 512]), 1
        while chunked:  # any length that splits into equal pieces (``af.pieces``)
            batch, seq, chunks = rng.choice([1, 2, 3]), rng.randint(3, 512), rng.choice(counts)
            if af.pieces(batch * seq, chunks) is not None:
                break
        rank = rng.choice([2, 4, 8]) if targets != "none" else 0
        lora = Lora(rank, targets, base) if rank else None
        which = "litgpt" if family.endswith("-litgpt") else "course"
        found, windows = traced(cfg, batch, seq, RECIPES[recipe], ckpt, lora, chunks, which)
        feats = af.features(cfg, batch, seq, rank, chunks)
        rows.append({"features": feats, "block": found[0], "head": found[1], "windows": windows})
    entry = {}
    for part, field in af.FIELDS:
        if chunked and part == "block":
            continue
        found = fit_field(rows, part, field)
        if found is None:
            return part, field
        terms, less = found
        whole = [
            {k: str(v) if v.denominator > 1 else int(v) for k, v in t.items()}
            for t in (terms if isinstance(terms, list) else [terms])
        ]
        entry[f"{part}.{field}"] = (whole if len(whole) > 1 else whole[0], less)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fp32", action="store_true", help="solve for fp32 training too")
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="solve only the cases whose key holds all the words of one of these (e.g. "
        "tied,autocast,full untied,none,attention); the others keep what the file has",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="where to write (default: fit/)")
    args = parser.parse_args()
    table, missing = {}, []
    if args.only is not None:
        from tutorial_utils.fit.activation_terms import MISSING, TERMS

        table, missing = dict(TERMS), list(MISSING)
    # the questions people ask most first (each case is written as soon as it is solved):
    # Llama-style untied heads (Llama 3.1 8B/70B/405B, Mistral, Qwen2.5 7B+), GPT-2, then the
    # tied Llama-style heads (Llama 3.2 1B/3B, Gemma, small Qwen2.5)
    recipes = [r for r in RECIPES if args.fp32 or r != "fp32"]
    kinds = (("rms-swiglu", "untied"), ("layer-gelu", "tied"), ("rms-swiglu", "tied"))
    kinds += (("layer-gelu", "untied"), ("rms-swiglu-litgpt", "untied"))
    kinds += (("rms-swiglu-litgpt", "tied"),)
    cases = [
        (family, tying, recipe, ckpt, targets)
        for lora_first in (True, False)
        for family, tying in kinds
        for targets in (LORA[:2] if lora_first else LORA[2:])
        for ckpt in CHECKPOINTING
        for recipe in recipes
    ]
    cases += [  # chunked cross-entropy: the head alone
        (family, tying, recipe, af.CHUNKED, frozen)
        for family, tying in kinds
        for frozen in FROZEN_HEADS
        for recipe in recipes
        if frozen != "lora+bnb-nf4" or tying == "untied"
    ]
    cases += [  # QLoRA
        (family, tying, recipe, ckpt, targets)
        for family, tying in kinds
        for targets in QLORA
        for ckpt in CHECKPOINTING
        for recipe in recipes
    ]
    for key in cases:
        if args.only is not None and not any(set(o.split(",")) <= set(key) for o in args.only):
            continue
        table.pop(key, None)
        missing = [m for m in missing if m[:5] != key]
        entry = solve_case(key, args.rows, args.seed)
        if isinstance(entry, dict):
            table[key] = entry
        else:
            missing.append((*key, *entry))
        print(key, "ok" if key in table else f"no formula: {missing[-1]}", flush=True)
        write(table, missing, args.out)
        if key[3] == af.CHUNKED and key not in table:  # one per count of chunks instead
            cases += [(*key[:3], f"{af.CHUNKED}-{n}", key[4]) for n in PER_COUNT]
    print(f"wrote {args.out}: {len(table)} cases, {len(missing)} without a formula")


if __name__ == "__main__":
    main()
