"""Notebook 03 section 6: one Adam step of a model, measured four ways, printed as one table.

The tools are the ones the learner typed in section 5 (the saved-tensor hook, ``MemTracker``)
and the course's ledger (``memory.breakdown``); this file only runs them side by side. The
notebook asserts what the table shows.
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
