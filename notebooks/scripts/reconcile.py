"""Notebook 03 section 6: one Adam step of a model, measured four ways, printed as one table.

The tools: the saved-tensor hook the learner typed in section 3, PyTorch's private
``MemTracker``, and the course's ledger (``memory.breakdown``); this file only runs them side by
side. The notebook asserts what the table shows. Run as a script, it adds what the notebook
leaves out: a conv net, and the s² term of explicit attention.
"""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from tutorial_utils import formulas, memory
from tutorial_utils.units import format_bytes


def _loss(out):
    return out.float().square().mean()


def _by_category(snapshot) -> dict:  # {category: bytes} for the CPU, with plain names
    return {getattr(k, "value", k): v for k, v in snapshot[torch.device("cpu")].items()}


def _saved_bytes(model, inputs) -> int:
    """What forward saves for backward: each storage once, parameters, buffers, input left out."""
    kept = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers(), inputs]}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st._cdata not in kept:
            seen.setdefault(st._cdata, st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(inputs)
    return sum(seen.values())


def _memtracker(model, inputs) -> dict:
    """MemTracker's bytes per category when one Adam step ends, and its peak."""
    model.zero_grad(set_to_none=True)
    opt = torch.optim.Adam(model.parameters())
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        opt.zero_grad(set_to_none=True)
        _loss(model(inputs)).backward()
        opt.step()
    booked = _by_category(tracker.get_tracker_snapshot("current"))
    booked["peak"] = _by_category(tracker.get_tracker_snapshot("peak"))["Total"]
    model.zero_grad(set_to_none=True)
    return booked


def reconcile(name: str, model: torch.nn.Module, inputs: torch.Tensor, formula_acts: int) -> dict:
    """Print formula, PyTorch tool, ledger and allocator side by side; return what they gave."""
    n = sum(p.numel() for p in model.parameters())
    states = formulas.model_state_bytes(
        n, "fp32", "adam", n_tensors=len(list(model.parameters())), step_counter_bytes=4
    )
    hook = _saved_bytes(model, inputs)
    mt = _memtracker(model, inputs)
    ledger = memory.breakdown(model, inputs, loss_fn=_loss, optimizer=torch.optim.Adam)
    rows = {
        "parameters": (states.weights, mt["Parameter"], ledger.parameters, None),
        "gradients": (states.gradients, mt["Gradient"], ledger.gradients, None),
        "optimizer state": (states.optimizer_state, mt["Optstate"], ledger.optimizer_state, None),
        "activations": (formula_acts, hook, ledger.activations, None),
        "peak": (None, mt["peak"], None, ledger.peak),
    }
    print(f"{name}: {n:,} parameters, fp32, Adam")
    print(f"  {'':16}{'formula':>12}{'PyTorch tool':>14}{'ledger':>12}{'allocator':>12}")
    for what, values in rows.items():
        cells = [format_bytes(v) if v is not None else "-" for v in values]
        print(
            f"  {what:16}"
            + "".join(f"{c:>{w}}" for c, w in zip(cells, (12, 14, 12, 12), strict=True))
        )
    # the loss's square() saves the model's output: the ledger counts it, the hook on the model not
    output_bytes = model(inputs).detach().untyped_storage().nbytes()
    return {"rows": rows, "output_bytes": output_bytes, "gap": ledger.peak - mt["peak"]}


def _main() -> None:
    """What notebook 03 leaves to a terminal: a conv net reconciled (section 6), and the s² term
    that explicit attention saves and SDPA does not (section 3). Run from ``notebooks/``:
    ``python scripts/reconcile.py``."""
    from tutorial_utils import models
    from tutorial_utils.decoder import Decoder, DecoderConfig

    torch.manual_seed(0)
    # The conv net (batch b, 32 x 32 images, c = 16 channels): each convolution saves its input,
    # each BatchNorm its input and two statistics per channel, each ReLU its output (which the
    # next layer saves too), the head its input (b, 2c).
    b, c, p = 8, 16, 32 * 32
    conv_acts = 4 * (
        b * c * p  # conv1 output, saved by BatchNorm1
        + b * c * p  # ReLU1 output, saved by conv2
        + b * 2 * c * p  # conv2 output, saved by BatchNorm2
        + b * 2 * c * p  # ReLU2 output (the pooling's input)
        + 2 * c
        + 2 * 2 * c  # BatchNorm means and 1/std per channel
        + b * 2 * c  # the pooled features, saved by the head
    )
    conv = models.ConvNet(channels=16)
    r = reconcile("ConvNet (b=8, 32x32, c=16)", conv, models.image_batch(b, 32), conv_acts)
    formula, hook, ledger, _ = r["rows"]["activations"]
    assert formula == hook == ledger - r["output_bytes"]
    peak = r["rows"]["peak"][3]
    # scratch inside an operator (a convolution's buffers): the allocator sees it, MemTracker not
    print(f"  allocator peak - MemTracker peak = {r['gap']:+,} B ({r['gap'] / peak:+.1%})\n")

    # Written out, softmax(q k^T / sqrt(d)) v saves the (b, a, s, s) probabilities, 4 a s^2 b
    # bytes in fp32, and the (s, s) causal mask (1 byte each); SDPA saves its output and a
    # log-sum-exp per head and token instead.
    block = Decoder(DecoderConfig(d_model=64, n_heads=4)).blocks[0]
    explicit = Decoder(DecoderConfig(d_model=64, n_heads=4, attention="explicit")).blocks[0]
    explicit.load_state_dict(block.state_dict())
    a, bb = 4, 2
    for s in (16, 32, 64):
        inp = torch.randn(bb, s, 64, requires_grad=True)
        fused, written = _saved_bytes(block, inp), _saved_bytes(explicit, inp)
        print(f"s={s:>2}: SDPA saves {fused:>8,} B, explicit {written:>8,} B")
        assert written - fused == 4 * a * s * s * bb + s * s - 4 * a * s * bb, (s, written - fused)
    print("explicit - SDPA = 4as²b probabilities + s² mask - 4asb log-sum-exp, at every s")


if __name__ == "__main__":
    _main()
