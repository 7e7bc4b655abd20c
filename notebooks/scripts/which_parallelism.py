"""Notebook 10 §4: the track's decision table and one model on one cluster.

Not a torchrun script: the notebook imports it and passes what its own runs reported, a dict
rank -> report (``tensor_parallel.py``, ``mesh_2d.py``). DDP, ZeRO and pipelines are not run
again: their rows come from ``tutorial_utils.formulas``, the functions notebooks 09 (sections 1
and 2) and 08 (section 4) prove equal to their runs to the byte. Everything here is
bookkeeping; the notebook checks the results against closed forms.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from tutorial_utils.formulas import pipeline_in_flight, zero_rank_bytes

GiB = 2**30
PIPELINE_M = 8  # notebook 08 section 4's micro-batches


def state(z: dict) -> int:
    """Bytes of parameters (at rest), gradients and Adam state on one rank."""
    return z["params"] + z["grads"] + z["state"]


def decision_table(tp, mesh2d) -> dict[str, tuple[str, str, str, str]]:
    """approach: (where it was measured, what a rank holds, what it moves per step, pick it when),
    for section 1's block on the runs' 2 ranks."""
    one, world = tp[0]["single"], tp[0]["world"]
    psi = one["params"] // 4
    ddp = zero_rank_bytes("DDP", psi, world)
    table = {}
    for setup, when in (
        ("DDP", "a training state that fits one device: the default (notebook 07)"),
        ("ZeRO-1", "an optimizer state that does not fit; any link DDP runs on"),
        ("ZeRO-2", "gradients that do not fit either; a step still gathers every parameter"),
        ("ZeRO-3", "parameters that do not fit either; fast links pay for its 1.5x DDP's traffic"),
    ):
        z = zero_rank_bytes(setup, psi, world)
        held = f"{state(z) / state(ddp):.0%} of the training state"
        held += f", +{z['gathered'] / (4 * psi):.0%} of the parameters gathered in a step" * bool(
            z["gathered"]
        )
        table[setup] = (
            "09 s. 1-2",
            held,
            f"{z['moved'] / (4 * psi):.0f}x the parameters' bytes",
            when,
        )

    for name, when in (
        ("GPipe", "deep models over slow links (between machines); pays the bubble (p-1)/(m+p-1)"),
        ("1F1B", "as GPipe, holding activations of at most p micro-batches (notebook 08)"),
    ):
        in_flight = pipeline_in_flight(name, PIPELINE_M, world, 0)
        held = f"1/{world} of the layers; at its peak, stage 0 the activations of "
        held += f"{in_flight} of {PIPELINE_M} micro-batches"
        table[f"PP, {name}"] = (
            "08 s. 4",
            held,
            "1 activation and its gradient, to a neighbour",
            when,
        )

    for name, when in (
        ("TP", "layers too big or too slow for one device; fast links only (inside a machine)"),
        ("TP+SP", "as TP, and long sequences: fewer activations for the same traffic"),
    ):
        r = tp[0][name]
        calls = Counter(r["forward_comm"]) + Counter(r["backward_comm"])
        moved = ", ".join(
            f"{n} {k.split('_')[0]}-{k.split('_')[1]}{'s' * (n > 1)}"
            for k, n in sorted(calls.items())
        )
        held = f"{r['params'] / one['params']:.0%} of the parameters, "
        held += f"{r['saved'] / one['saved']:.0%} of the activations"
        table[name] = ("10 s. 1-2", held, f"{moved} of an activation", when)

    m2 = mesh2d[0]
    tp_calls = sum(m2[ph]["tp all_reduce"]["calls"] for ph in ("forward_comm", "backward_comm"))
    table["2-D, FSDP2 x TP"] = (
        "10 s. 3 (2 blocks)",
        f"{m2['param_bytes'] / m2['single_param_bytes']:.0%} of the parameters",
        f"dp: {dp_factor(m2):.0f}x a tp rank's parameters; tp: {tp_calls} all-reduces",
        "many machines: TP inside each (fast links), FSDP2 across them",
    )
    return table


def print_table(table: dict) -> None:
    for approach, (model_run, held, moved, when) in table.items():
        print(f"{approach:<16} {model_run:<19} holds {held}")
        print(f"{'':<16} {'':<19} moves {moved}")
        print(f"{'':<16} {'':<19} for   {when}")


def tp_local(m2: dict) -> int:
    """Bytes of parameters a tp rank of the 2 x 2 run held before FSDP2 cut them."""
    split = sum(m2["param_numel"][n] for n in m2["tp_split"])
    return 4 * (split // 2 + sum(m2["param_numel"].values()) - split)


def dp_factor(m2: dict) -> float:
    """FSDP2's traffic on dp in one step, per byte a tp rank holds (measured: 3)."""
    moved = sum(
        v["bytes"]
        for phase in ("forward_comm", "backward_comm")
        for k, v in m2[phase].items()
        if k.startswith("dp")
    )
    return moved / tp_local(m2)


def ar_per_block(m2: dict) -> float:
    """TP all-reduces of one activation per block and step (measured on 2 blocks: 4)."""
    act_bytes = m2["B"] // 2 * m2["S"] * m2["H"] * 4  # one activation of a dp group, fp32
    fwd, bwd = m2["forward_comm"]["tp all_reduce"], m2["backward_comm"]["tp all_reduce"]
    return (fwd["bytes"] + bwd["bytes"]) / (2 * act_bytes)


@dataclass
class Cluster:
    """One model (L blocks of notebook 10's block at hidden size h) on N devices of `budget`."""

    blocks: int
    hidden: int
    heads: int
    devices: int
    seq: int
    batch: int  # sequences per step, over all ranks
    budget: int  # bytes per device
    headroom: int  # bytes kept free per device
    psi: float = 0.0  # parameters of the whole model
    n_split: float = 0.0  # of them, in tensors TP splits
    dp2: int = 2  # the 2-D mesh: dp x tp = devices
    # setup: (mesh, state, gathered, (sequences per rank, TP degree), dp bytes, tp bytes)
    parts: dict = field(default_factory=dict)
    # setup: total bytes per rank (fused attention, explicit softmax, fused with full checkpointing)
    totals: dict = field(default_factory=dict)

    def activations(self, b: int, t: int = 1, attention: str = "fused") -> float:
        """Bytes one block saves for backward on a rank: b sequences, TP degree t (section 2).

        ``attention="explicit"``: the softmax written out saves its (s, s) probabilities,
        4as^2b bytes; ``"fused"`` (``scaled_dot_product_attention``): a log-sum-exp instead,
        4asb bytes. Everything else is the same tensors."""
        if attention not in ("fused", "explicit"):
            raise ValueError(f"attention must be 'fused' or 'explicit', not {attention!r}")
        sbh, sb = self.seq * b * self.hidden, self.seq * b
        ash = self.heads * (self.seq if attention == "explicit" else 1) / self.hidden
        if t == 1:
            return sbh * (64 + 4 * ash) + 16 * sb
        return sbh * (16 + 48 / t + 4 * ash / t) + 16 * sb

    def checkpointed(self, b: int, t: int = 1) -> float:
        """Bytes of activations with full checkpointing: every block's input, and one block
        recomputed at a time in backward (with fused attention)."""
        return self.blocks * 4 * self.seq * b * self.hidden + self.activations(b, t)

    def fit(self, tp, mesh2d) -> Cluster:
        """Scale the runs' measurements to this model and cluster; fill `parts` and `totals`."""
        m2 = mesh2d[0]
        scale = self.hidden // m2["H"]  # the runs' blocks had h = 64
        shapes = {n.removeprefix("0."): s for n, s in m2["param_shapes"].items() if n[:2] == "0."}
        at_target = {n: math.prod(d * scale for d in s) for n, s in shapes.items()}
        block_psi = sum(at_target.values())
        self.psi = self.blocks * block_psi
        split_names = set(tp[0]["TP"]["split_params"])
        self.n_split = self.blocks * sum(at_target[n] for n in split_names)
        n_dev, L = self.devices, self.blocks

        for setup in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"):  # notebook 09's formulas, N ranks
            z = zero_rank_bytes(setup, self.psi, n_dev)
            # ZeRO-3: one block gathered at a time (09 s. 1), and the next, prefetched (09 s. 4)
            gathered = 2 * 4 * block_psi if setup == "ZeRO-3" else z["gathered"]
            b = (self.batch // n_dev, 1)
            self.parts[setup] = (f"dp={n_dev}", state(z), gathered, b, z["moved"], 0.0)

        def shards(name, sizes):  # how many pieces the 2-D run cut tensor `name` into
            layout = m2["layout"][f"0.{name}"]  # [[mesh dimension, placement kind], ...]
            return math.prod(sizes[dim] for dim, kind in layout if "Shard" in kind)

        def tp_rank_elements(t):  # elements a tp rank holds before FSDP2 cuts them
            return L * sum(v / (t if n in split_names else 1) for n, v in at_target.items())

        act_seq = self.seq * self.hidden * 4  # one sequence's activation at a block's boundary
        ar = ar_per_block(m2)
        tp_comm = L * ar * 2 * self.batch * act_seq  # the group processes the whole batch
        tp_state = 16 * tp_rank_elements(n_dev)
        self.parts["TP"] = (f"tp={n_dev}", tp_state, 0.0, (self.batch, n_dev), 0.0, tp_comm)
        dp2, tp2 = self.dp2, n_dev // self.dp2
        sizes = {"dp": dp2, "tp": tp2}
        self.parts["2-D"] = (
            f"dp={dp2} x tp={tp2}",
            16 * L * sum(v / shards(n, sizes) for n, v in at_target.items()),
            2 * 4 * tp_rank_elements(tp2) / L,  # a block of this tp rank, and the next
            (self.batch // dp2, tp2),
            dp_factor(m2) * 4 * tp_rank_elements(tp2),
            L * ar * 2 * (self.batch // dp2) * act_seq,  # a dp group's sequences
        )
        for setup, (_, state_b, gathered, (b, t), _, _) in self.parts.items():
            base = state_b + gathered + self.headroom
            self.totals[setup] = (
                base + L * self.activations(b, t, "fused"),
                base + L * self.activations(b, t, "explicit"),
                base + self.checkpointed(b, t),
            )
        return self

    def show(self) -> None:
        print(
            f"{self.blocks} blocks, h = {self.hidden}: Psi = {self.psi / 1e9:.2f} billion; "
            f"{self.devices} x {self.budget / GiB:.0f} GiB; GiB per rank"
        )
        heads = ("fused attention", "explicit softmax", "fused + ckpt")
        print(f"{'':<22}{'':>24}" + "".join(f"  {h:<17}" for h in heads) + f"{'moved, GB':>12}")
        print(
            f"{'':<22}{'state':>6}{'gathered':>9}{'headroom':>9}"
            + f"  {'act.':>5}{'total':>7} {'fits':<4}" * 3
            + f"{'dp':>6}{'tp':>6}"
        )
        for setup, (mesh, state_b, gathered, (b, t), comm_dp, comm_tp) in self.parts.items():
            acts = (
                self.blocks * self.activations(b, t, "fused"),
                self.blocks * self.activations(b, t, "explicit"),
                self.checkpointed(b, t),
            )
            cols = "".join(
                f"  {a / GiB:>5.1f}{total / GiB:>7.1f} {'yes' if total <= self.budget else 'no':<4}"
                for a, total in zip(acts, self.totals[setup], strict=True)
            )
            print(
                f"{setup:<7}{mesh:<15}{state_b / GiB:>6.1f}{gathered / GiB:>9.1f}"
                f"{self.headroom / GiB:>9.1f}{cols}{comm_dp / 1e9:>6.1f}{comm_tp / 1e9:>6.1f}"
            )
        print("fused: scaled_dot_product_attention, as it runs today; explicit: the softmax")
        print("written out, as Korthikanti et al. counted it; ckpt: full activation checkpointing")
        print("moved: GB per rank and step over each kind of link (dp, tp)")
