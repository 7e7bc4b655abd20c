"""The profiles against 2 gloo ranks: what each rank holds under DDP, ZeRO-1, FSDP2 and FSDP1,
and what it saves for backward under TP + SP, 1F1B pipelining and ring attention (CP).

Notebook 09's ``zero_stages.py`` trains 3 x Linear(256, 256) with Adam five ways on 2 CPU
ranks and counts, on each rank, the bytes of its parameters, gradients and optimizer state
(its own shards only) and the gathered parameters FSDP2 holds as each layer starts its forward
and between forward and backward. The calculator's ``profiles.spread`` is asked the same
question for the same shape (a ``Counts`` of three one-linear blocks) and must give the same
bytes. Adam's 0-d ``step`` counters (4 bytes per tensor) are on the CPU here and stay on the
CPU on a GPU, so the calculator leaves them out: they are taken off the measurement. One
torchrun launch of 2 ranks (about 30 s): marked slow, as ``tests/test_sharding_scripts.py``.
FSDP1 is counted by ``fit_fsdp1_ranks.py``, TP + SP by notebook 10's ``tensor_parallel.py``,
1F1B by notebook 08's ``pipeline_gpipe.py`` and CP by ``fit_cp_ranks.py`` (notebook 12's ring
attention): each a launch of 2 ranks of 10-20 s, marked heavy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tutorial_utils.distributed import launch
from tutorial_utils.fit.profiles import Mesh, spread
from tutorial_utils.fit.shapes import Counts
from tutorial_utils.fit.states import model_states  # noqa: F401  (the terms it composes)

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "scripts" / "zero_stages.py"
LAYER = 256 * 256 + 256
PSI, TENSORS, STEPS_BYTES = 3 * LAYER, 6, 4 * 6
MLP = Counts(PSI, LAYER, 256 * 256, (256 * 256, 256), (), 3)
WHOLE_FP32 = {"weights": 4 * PSI, "gradients": 4 * PSI, "master weights": 0}
WHOLE_FP32["optimizer state"] = 8 * PSI


@pytest.fixture(scope="module")
def ranks():
    result = launch(SCRIPT, nproc=2, timeout=300, echo=None)
    return {rank: rep["results"] for rank, rep in result.reports.items()}


def _spread(sharding: str, weight_bytes: int = 4, **kw):
    return spread(WHOLE_FP32, MLP, weight_bytes, weight_bytes, sharding, 2, Mesh(), **kw)


def _states(run: dict) -> tuple[int, int, int]:
    return run["params_at_rest"], run["grads"], run["optimizer_state"] - STEPS_BYTES


@pytest.mark.slow
def test_each_rank_holds_the_states_the_profiles_say(ranks):
    for rank in (0, 1):
        for setup, sharding in (("DDP", "none"), ("ZeRO-3", "fsdp2"), ("ZeRO-2", "fsdp2")):
            s = _spread(sharding).states
            calc = (s["weights"], s["gradients"], s["optimizer state"])
            assert _states(ranks[rank][setup]) == calc, (rank, setup)
    # ZeroRedundancyOptimizer splits by whole parameter (unevenly): the two ranks' optimizer
    # state together is the whole, and each rank's share is what the calculator's even split is
    # on average
    z1 = _spread("zero1").states["optimizer state"]
    both = sum(
        ranks[r]["ZeRO-1"]["optimizer_state"] - 4 * ranks[r]["ZeRO-1"]["owned_tensors"]
        for r in (0, 1)
    )
    assert both == 2 * z1 == WHOLE_FP32["optimizer state"]


@pytest.mark.slow
def test_fsdp2_gathers_what_the_profile_says(ranks):
    for rank in (0, 1):
        zero3 = _spread("fsdp2")  # reshard_after_forward=True: one unit at a time
        assert ranks[rank]["ZeRO-3"]["gathered_at_forward"] == [zero3.unit_weights] * 3
        assert ranks[rank]["ZeRO-3"]["gathered_between_fwd_bwd"] == zero3.kept_gathered == 0
        kept = _spread("fsdp2", reshard_after_forward=False)  # every unit, kept to backward
        assert ranks[rank]["ZeRO-2"]["gathered_between_fwd_bwd"] == kept.kept_gathered
        assert ranks[rank]["ZeRO-2"]["gathered_at_forward"][-1] == kept.kept_gathered
        # MixedPrecisionPolicy(param_dtype=bf16): the gathered unit in 2 bytes per parameter
        bf16 = _spread("fsdp2", weight_bytes=2)
        assert ranks[rank]["ZeRO-3 bf16"]["gathered_at_forward"] == [bf16.unit_weights] * 3


@pytest.mark.slow
def test_fsdp2_in_bf16_holds_the_bytes_of_the_mixed_recipe(ranks):
    """FSDP2 with bf16 parameters keeps fp32 shards and fp32 gradients where the calculator's
    "mixed" recipe counts bf16 weights and gradients and an fp32 master copy: the categories
    differ, their sum (16 bytes per parameter with Adam, over 2 ranks) is the same."""
    whole = {"weights": 2 * PSI, "gradients": 2 * PSI, "master weights": 4 * PSI}
    whole["optimizer state"] = 8 * PSI
    s = spread(whole, MLP, 2, 2, "fsdp2", 2, Mesh()).states
    for rank in (0, 1):
        assert sum(_states(ranks[rank]["ZeRO-3 bf16"])) == sum(s.values())


# FSDP1: three Linear(256, 256) blocks, each its own unit, and in the root unit a stem
# (Linear(256, 256) and a 1-parameter gain: the root's size is odd, and padded) before them and
# a head Linear(256, 511, bias=False) after them, as a decoder's root holds embedding and head
FSDP1_SCRIPT = Path(__file__).resolve().parent / "fit_fsdp1_ranks.py"
HEAD = 256 * 511
ROOT = LAYER + 1 + HEAD
FSDP1_PSI = 3 * LAYER + ROOT
FSDP1_MODEL = Counts(FSDP1_PSI, LAYER, HEAD, (256 * 256, 256), (256 * 256, 256, 1, HEAD), 3)


@pytest.fixture(scope="module")
def fsdp1_ranks():
    result = launch(FSDP1_SCRIPT, nproc=2, timeout=300, echo=None)
    return {rank: rep["results"] for rank, rep in result.reports.items()}


def _fsdp1(sharding: str, weight_bytes: int = 4, **kw):
    """fp32: Adam over fp32 weights; bf16: the "mixed" recipe (bf16 weights and gradients, an
    fp32 master copy), 16 bytes per parameter as FSDP1 with fp32 shards holds them."""
    whole = {"weights": weight_bytes * FSDP1_PSI, "gradients": weight_bytes * FSDP1_PSI}
    whole["master weights"] = 4 * FSDP1_PSI if weight_bytes == 2 else 0
    whole["optimizer state"] = 8 * FSDP1_PSI
    return spread(whole, FSDP1_MODEL, weight_bytes, weight_bytes, sharding, 2, Mesh(), **kw)


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("strategy", "sharding"),
    [("FULL_SHARD", "fsdp1"), ("HYBRID_SHARD", "fsdp1"), ("SHARD_GRAD_OP", "fsdp1-grad-op")],
)
def test_fsdp1_holds_what_the_profile_says(fsdp1_ranks, strategy, sharding):
    """Each rank's padded flat shards, sharded gradients and Adam moments; the gathered units
    as each block starts its forward; and, at the moment each unit's unsharded gradient is
    made, the gathered units, that gradient and the head's gradient waiting in autograd: their
    largest sum is the profile's ``gathered`` plus ``kept_gathered``. HYBRID_SHARD over a
    (1 replica, 2 shards) mesh is FULL_SHARD."""
    calc = _fsdp1(sharding)
    for rank in (0, 1):
        run = fsdp1_ranks[rank][strategy]
        assert run["unit_numel"] == [ROOT, LAYER, LAYER, LAYER]
        assert sum(run["shards"]) == calc.states["weights"] == 4 * (FSDP1_PSI + 1) // 2
        assert sum(run["grads"]) == calc.states["gradients"]
        assert run["optimizer_state"] == calc.states["optimizer state"]
        moments = [sum(m.values()) for m in run["at_gradient"]]
        assert len(moments) == 4, "one gradient per unit: three blocks and the root"
        assert max(moments) == calc.gathered + calc.kept_gathered, (rank, moments)
        # the head's gradient waits through every block's backward, gone once the root's made
        waiting = [m["pending_head_grad"] for m in run["at_gradient"]]
        assert waiting == [4 * HEAD] * 3 + [0]
        if sharding == "fsdp1":  # the root, kept gathered, and the block
            assert run["gathered_at_forward"] == [calc.unit_weights] * 3
        else:  # every unit, gathered one by one and kept
            assert run["gathered_at_forward"][-1] == calc.kept_gathered


@pytest.mark.heavy
def test_fsdp1_in_bf16_gathers_in_bf16_and_holds_the_mixed_recipe(fsdp1_ranks):
    """``MixedPrecision(param_dtype=bfloat16)``: units gathered and their unsharded gradients
    made in bf16 (2 bytes per padded parameter), fp32 shards, gradients and Adam moments at
    rest: the categories differ from the mixed recipe's, their sum is the same."""
    calc = _fsdp1("fsdp1", weight_bytes=2)
    for rank in (0, 1):
        run = fsdp1_ranks[rank]["FULL_SHARD bf16"]
        assert run["gathered_at_forward"] == [calc.unit_weights] * 3
        moments = [sum(m.values()) for m in run["at_gradient"]]
        assert max(moments) == calc.gathered + calc.kept_gathered, (rank, moments)
        held = sum(run["shards"]) + sum(run["grads"]) + run["optimizer_state"]
        assert held == sum(calc.states.values())


@pytest.mark.heavy
@pytest.mark.parametrize(("strategy", "weight_bytes"), [("", 4), (" bf16", 2)])
def test_fsdp1_under_no_sync_keeps_what_the_profile_says(fsdp1_ranks, strategy, weight_bytes):
    """k = 2 micro-batches, the first under ``no_sync()``: after it each rank keeps every
    unit's gradient unsharded and unpadded, in the dtype the unit computes in (bf16 under
    ``MixedPrecision(param_dtype=bfloat16)``), the profile's ``unsharded_grads``. In the syncing
    micro-batch the largest moment, the first block's gradient made beside all of them (the
    others still unsharded), is the profile's gathered units plus those gradients; without
    no_sync (the same profile) it is the gathered units alone."""
    calc = _fsdp1("fsdp1", weight_bytes, no_sync=True)
    plain = _fsdp1("fsdp1", weight_bytes)
    assert plain.unsharded_grads == 0 and plain.gathered == calc.gathered
    dtype = {4: "float32", 2: "bfloat16"}[weight_bytes]
    for rank in (0, 1):
        run = fsdp1_ranks[rank][f"FULL_SHARD{strategy} no_sync"]
        kept = run["kept_after_no_sync"]
        assert [k["numel"] for k in kept] == run["unit_numel"] == [ROOT, LAYER, LAYER, LAYER]
        assert {k["dtype"] for k in kept} == {dtype}, kept
        assert sum(k["bytes"] for k in kept) == calc.unsharded_grads == weight_bytes * FSDP1_PSI
        moments = [sum(m.values()) for m in run["at_gradient"]]
        assert len(moments) == 4, "one gradient per unit: three blocks and the root"
        assert (
            max(moments)
            == moments[0]
            == (calc.gathered + calc.kept_gathered + calc.unsharded_grads)
        ), (rank, moments)
    # LoRA on the blocks: a root with no trainable weight keeps no gradient
    frozen = _fsdp1("fsdp1", weight_bytes, no_sync=True, frozen_root=True)
    assert frozen.unsharded_grads == weight_bytes * 3 * LAYER


@pytest.mark.heavy
def test_fsdp1_reshards_frozen_blocks_in_backward(fsdp1_ranks):
    """torchtune's LoRA wrapping (each adapter Linear a unit, each block a unit around them,
    every weight but the adapters frozen): a frozen flat parameter has no gradient hook, and
    FSDP1 reshards it once its unit's input gradient is made. At each adapter's gradient the
    root is gathered (kept from forward on) and at most two blocks (this one and the next,
    prefetched): the profile's root plus two blocks, never the whole base. Block 0's input (the
    frozen stem's output) needs no gradient, so block 0 waits for the end of backward; the
    later blocks are resharded before it runs."""
    calc = _fsdp1("fsdp1", trainable_fraction=3 * 2 * 2048 / FSDP1_PSI, frozen_root=True)
    block_w = calc.unit_weights - calc.kept_gathered
    assert block_w == 4 * LAYER and calc.kept_gathered == 4 * (ROOT + 1)  # padded to 2 ranks
    for rank in (0, 1):
        run = fsdp1_ranks[rank]["FULL_SHARD LoRA"]
        assert run["kinds"] == ["root"] + ["block", "adapter", "adapter"] * 3
        assert run["unit_numel"] == [ROOT] + [LAYER, 256 * 8, 8 * 256] * 3
        moments = run["at_adapter_gradient"]
        assert len(moments) == 6, "one gradient per adapter unit: A and B in three blocks"
        assert {m["root"] for m in moments} == {calc.kept_gathered}
        base = [m["root"] + sum(m["blocks"]) for m in moments]
        assert max(base) == calc.kept_gathered + 2 * block_w, (rank, moments)
        assert all(sum(b > 0 for b in m["blocks"]) <= 2 for m in moments), moments
        assert moments[-1]["blocks"] == [block_w, 0, 0], "blocks 1 and 2 resharded by then"
        assert run["after_backward"] == {"root": 0, "blocks": [0, 0, 0], "adapters": 0}


# TP + SP: notebook 10's block (LayerNorm, q/k/v/o, a 4h GELU MLP, biases, SDPA), fp32, on 2 ranks
TP_SCRIPT = SCRIPT.parent / "tensor_parallel.py"


@pytest.mark.heavy
def test_a_tp_sp_rank_saves_what_the_block_share_says():
    """``tensor_parallel.py`` counts, once per storage, what autograd saves in its block on one
    process and on each of 2 TP + SP ranks (PyTorch's plan). The calculator's block, the same
    shape on fake tensors, must hold the first; ``tp_block_held`` must turn it into the second:
    every activation halved but the two all-gathered Linear inputs, kept whole."""
    from tutorial_utils.decoder import DecoderConfig
    from tutorial_utils.fit.activations import activations
    from tutorial_utils.fit.profiles import tp_block_held

    reports = launch(TP_SCRIPT, nproc=2, timeout=300, echo=None).reports
    b, s, h, a = (reports[0][k] for k in ("B", "S", "H", "heads"))
    cfg = DecoderConfig(vocab=16, d_model=h, n_layers=1, n_heads=a, attention="sdpa")
    held = activations(cfg, b, s, "fp32", "none")[0].held
    for rank in (0, 1):
        assert reports[rank]["single"]["saved_fused"] == held
        measured = reports[rank]["TP+SP"]["saved_fused"]
        assert measured == tp_block_held(held, b, s, h, 4, 2, kept=True), rank
        assert measured - held // 2 == 4 * b * s * h, "each rank keeps 2 gathered inputs whole"


@pytest.mark.heavy
def test_1f1b_holds_the_micro_batches_the_mesh_says():
    """``pipeline_gpipe.py`` (notebook 08) runs 2 stages of 8 Linear(512, 512) layers with 8
    micro-batches and counts, with a saved-tensor hook, the activations each stage holds at its
    worst moment, and what one micro-batch leaves on it alone. Under 1F1B the first stage holds
    ``Mesh.in_flight`` micro-batches (the last stage one); GPipe, which the calculator does not
    model, holds all 8."""
    script = SCRIPT.parent / "pipeline_gpipe.py"
    args = ["--microbatches", "1", "--compare", "8"]
    reports = launch(script, nproc=2, args=args, timeout=300, echo=None).reports
    mesh = Mesh(pp=2, microbatches=8)
    first, last = reports[0]["compare"], reports[1]["compare"]
    assert first["1F1B"]["peak_bytes"] == mesh.in_flight * first["one_microbatch_bytes"] > 0
    assert last["1F1B"]["peak_bytes"] == last["one_microbatch_bytes"]
    assert first["GPipe"]["peak_bytes"] == 8 * first["one_microbatch_bytes"]


@pytest.mark.heavy
def test_a_ring_attention_rank_saves_what_attention_on_its_chunk_saves():
    """CP: notebook 12's ring attention on 2 ranks saves, on each, exactly what SDPA saves on
    the rank's S/2 positions in one process (q, k, v, the output and an fp32 log-sum-exp per
    head and position): so the calculator's context-parallel term, every block's activations
    at seq/cp tokens, counts attention right."""
    from tutorial_utils import fit, formulas
    from tutorial_utils.decoder import DecoderConfig

    script = Path(__file__).resolve().parent / "fit_cp_ranks.py"
    reports = launch(script, nproc=2, timeout=300, echo=None).reports
    for rank in (0, 1):
        r = reports[rank]
        b, heads, s, dh = r["B"], r["H"], r["S"] // r["world"], r["DH"]
        local = formulas.attention_saved_bytes(s, b, heads * dh, heads, 4, dropout=False)
        assert r["ring"] == r["sdpa"] == local, rank
    toy = DecoderConfig(vocab=64, d_model=32, n_layers=2, n_heads=4)
    cp = fit.will_it_fit(toy, batch=2, seq=64, precision="fp32", n_gpus=2, cp=2)
    half = fit.will_it_fit(toy, batch=2, seq=32, precision="fp32")
    assert cp.categories["activations"] == half.categories["activations"]


def test_will_it_fit_holds_the_unsharded_gradients_only_under_no_sync():
    """``gradient_sync="last"`` turns the FSDP1 profile's no_sync term on where micro-batches
    accumulate, and changes nothing else: the default, one micro-batch, and the step itself
    (its sharded gradients) stay as they were. Other profiles refuse it in one sentence."""
    from tutorial_utils import fit
    from tutorial_utils.decoder import DecoderConfig

    toy = DecoderConfig(vocab=256, d_model=32, n_layers=2, n_heads=4)
    ask = dict(batch=2, seq=16, precision="fp32", sharding="fsdp1", n_gpus=2)
    every = fit.will_it_fit(toy, grad_accumulation=2, **ask)
    last = fit.will_it_fit(toy, grad_accumulation=2, gradient_sync="last", **ask)
    assert (
        every.peaks == fit.will_it_fit(toy, grad_accumulation=2, **ask, gradient_sync="every").peaks
    )
    one = fit.will_it_fit(toy, **ask)
    assert one.peaks == fit.will_it_fit(toy, **ask, gradient_sync="last").peaks
    # fp32: 4 bytes for every weight, unpadded, on each rank, where "every" holds a half
    assert last.categories["gradients"] == 4 * last.n_parameters
    assert every.categories["gradients"] < last.categories["gradients"]
    assert last.peaks["optimizer step"] == every.peaks["optimizer step"]
    for bad in (dict(gradient_sync="sometimes"), dict(gradient_sync="last", sharding="zero3")):
        with pytest.raises(ValueError, match="gradient_sync"):
            fit.will_it_fit(toy, grad_accumulation=2, **{**ask, **bad})
