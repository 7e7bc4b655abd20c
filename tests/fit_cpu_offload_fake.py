"""What one FSDP2 rank keeps on its accelerator with and without ``CPUOffloadPolicy``, counted.

    python tests/fit_cpu_offload_fake.py

``tests/fake_fsdp2_counts.py`` runs it once per test run in a child process, with ``--both``
(what it registers is for the whole process: a device type and a process group), and
``tests/test_fit_cpu_offload.py`` compares what it prints with the calculator's ``cpu_offload``
term. It runs PyTorch's own code for the step; only the hardware
is stood in for:

- **The device.** A CPU-only torch has no CUDA, and a fake tensor on ``cuda`` cannot enter
  autograd there (autograd asks CUDA's device guard for a stream). PyTorch's own hook for a
  device written in Python (``torch.utils.backend_registration.
  _setup_privateuseone_for_python_backend``) registers one, named ``accel`` here, whose streams
  and events are the CPU's. Under ``FakeTensorMode`` no byte is allocated: tensors carry their
  shape, dtype and device, so the bytes on ``accel`` and on ``cpu`` can be told apart.
- **The ranks.** ``init_process_group("fake")`` (``torch.testing._internal.distributed.
  fake_pg``): rank 0 of 4, collectives that move no data, as torchtitan's memory-estimation
  script ran FSDP2.

The model is the course's decoder (Llama-like, fp32), wrapped as torchtitan wraps it
(``fully_shard`` on each block, then on the root), with foreach AdamW, once with
``CPUOffloadPolicy(pin_memory=False)`` and once without, the control. (``pin_memory=True``
differs only in making the copies asynchronous, ``_fsdp_collectives.py`` lines 729-743, and
fake tensors cannot be pinned.) Five recipes (``RECIPES``): one batch; two micro-batches
accumulated; the optimizer step in backward (notebook 03, section 7); every block kept
gathered from forward to backward (``reshard_after_forward=False``); and bf16 parameters with
fp32 gradient reduction (``MixedPrecisionPolicy``, as torchtitan). Each takes two steps; the
second is counted by PyTorch's ``FSDPMemTracker``, which books every storage by its device and
by what FSDP uses it for, read after every operator:

- ``end of forward``: the most held while the loss is made (what is held after it, by
  category);
- ``in backward``: the most held in each of three parts of backward, which hooks on the
  blocks' outputs mark (``start of backward``: the loss's, the head's and the final norm's;
  ``middle of backward``: the later blocks'; ``end of backward``: the first block's and the
  embedding's), with what is held then by category; ``backward peak``: the most of all;
- ``after backward``: what is held once backward is done (every gradient reduce-scattered);
- ``optimizer step``: the most held during ``optimizer.step()``;
- ``in the hooks``: with the optimizer step in backward, the most held while each hook steps;
- ``on the cpu``: after backward, the CPU's sharded parameters, gradients and optimizer state.

The logits stay referenced until backward is done, as the calculator's head pass keeps them
(litgpt's loop does; torchtitan's deletes them before backward). Attention runs the kernel a
CPU runs (``_fused_attention``): on the stand-in device SDPA would take its math path, which
saves the (batch, heads, seq, seq) probabilities that a GPU's fused kernels do not (11,776
bytes more per block here).

``--profile``: the same without offloading, for the FSDP2 profile's moments, over
``SHAPES`` (``tests/test_fit_fsdp2_moments.py``).

What FSDP2 does with the policy (torch 2.13.0, ``torch/distributed/fsdp/_fully_shard/``, git
cf30153c4c131c8164ee7798e5022d810682e2cb): each sharded parameter is moved to the CPU as it is
made (``_fsdp_param.py`` 312-316); an all-gather copies the unit's shards back to the device
(``all_gather_inputs``, 894-900), into the all-gather buffer, and frees the copies
(``_fsdp_collectives.py`` 337-361); the reduce-scattered gradient shard is copied to the CPU,
where it is accumulated or becomes ``.grad`` (711-743); the optimizer then steps on the CPU.
Prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from tutorial_utils.decoder import Decoder, DecoderConfig  # noqa: E402
from tutorial_utils.fit.activations import cross_entropy  # noqa: E402

CFG = DecoderConfig(
    vocab=256,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,
    norm="rms",
    mlp="swiglu",
    bias=False,
    tied=False,
    max_positions=0,
)
BATCH, SEQ, WORLD = 2, 16, 4
#: One step; two micro-batches accumulated (the counted forward, backward and step are the
#: second's); the optimizer step in backward (each parameter stepped as its gradient is made)
RECIPES = (
    "one batch",
    "2 micro-batches",
    "optimizer in backward",
    "reshard_after_forward=False",
    "bf16 parameters",
)
ACCEL = "accel"  # a torch.device once main() has registered it


class Accel:
    """The stand-in accelerator's device module: the CPU's streams and events, one device."""

    Stream = torch.cpu.Stream
    Event = torch.Event
    current_stream = staticmethod(torch.cpu.current_stream)
    stream = staticmethod(torch.cpu.stream)

    def synchronize(self, device=None) -> None:
        pass

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def set_device(self, device) -> None:
        pass

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass


class Highest(TorchDispatchMode):
    """Reads the tracker's bytes on ``ACCEL`` after every operator and keeps the highest, with
    what they were by category then. Entered inside the tracker, so it reads after it books."""

    def __init__(self, tracker: FSDPMemTracker):
        super().__init__()
        self.tracker, self.bytes, self.categories = tracker, 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor run its local operators, which we see
        out = func(*args, **(kwargs or {}))
        if held(self.tracker) > self.bytes:
            self.categories = by_category(self.tracker)
            self.bytes = self.categories.pop("Total")
        return out


def by_category(tracker: FSDPMemTracker, device: str = ACCEL) -> dict[str, int]:
    """What the tracker books on ``device`` now, by what FSDP uses it for (zeros left out)."""
    snapshot = tracker.get_tracker_snapshot()
    on = next((v for k, v in snapshot.items() if k.type == device), {})
    return {getattr(k, "value", k): v for k, v in on.items() if v}


def held(tracker: FSDPMemTracker) -> int:
    return by_category(tracker).get("Total", 0)


class Windows(Highest):
    """``Highest`` by window: the most held in each part of backward, named by ``now`` (hooks
    on the blocks' outputs move it on as backward reaches them)."""

    def __init__(self, tracker: FSDPMemTracker):
        super().__init__(tracker)
        self.now, self.peaks, self.at = "start of backward", {}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        now = held(self.tracker)
        if now > self.peaks.get(self.now, -1):
            self.peaks[self.now] = now
            self.at[self.now] = by_category(self.tracker)
        if now > self.bytes:
            self.categories = by_category(self.tracker)
            self.bytes = self.categories.pop("Total")
        return out


def _mark_backward(model, counted: dict) -> None:
    """Hooks on the last block's and the first block's outputs: when backward reaches them, the
    window moves on (the head's backward is the start; every block but the first the middle;
    the first block and the embedding the end). Prepended, so each runs before FSDP2's own
    pre-backward hook on the same output (``_fsdp_state.py`` ``_register_pre_backward_hook``):
    the block's all-gather copy-out and its prefetch fall in the block's window."""

    def on_output(name):
        def forward_hook(module, args, output):
            def grad_hook(grad):
                if counted.get("windows") is not None:
                    counted["windows"].now = name
                return grad

            output.register_hook(grad_hook)

        return forward_hook

    if len(model.blocks) > 1:
        model.blocks[-1].register_forward_hook(on_output("middle of backward"), prepend=True)
    model.blocks[0].register_forward_hook(on_output("end of backward"), prepend=True)


def _fused_attention(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """What ``scaled_dot_product_attention`` runs on a CPU (and a GPU's fused kernels save
    alike: the output and a log-sum-exp per row): the stand-in device has no fused kernel of
    its own, so SDPA would take its math path and save the (B, heads, T, T) probabilities."""
    assert attn_mask is None and dropout_p == 0.0
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return fused(q, k, v, dropout_p, is_causal, scale=scale)[0]


def step(mesh, offload: bool, recipe: str, cfg: DecoderConfig = CFG) -> dict:
    """Two steps of ``recipe`` (see ``RECIPES``) with or without offloading; the second counted."""
    policy = CPUOffloadPolicy(pin_memory=False) if offload else OffloadPolicy()
    options: dict = {}
    if recipe == "reshard_after_forward=False":  # every block kept gathered to its backward
        options["reshard_after_forward"] = False
    if recipe == "bf16 parameters":  # torchtitan's: gathered and computed in bf16
        options["mp_policy"] = MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    with FakeTensorMode():
        with torch.device(ACCEL):
            model = Decoder(cfg)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, offload_policy=policy, **options)
        fully_shard(model, mesh=mesh, offload_policy=policy, **options)
        tokens = torch.zeros(BATCH, SEQ, dtype=torch.long, device=ACCEL)
        counted: dict = {"tokens": tokens.untyped_storage().nbytes(), "in the hooks": []}
        _mark_backward(model, counted)
        if recipe == "optimizer in backward":  # notebook 03, section 7: one AdamW a parameter
            optimizer = None
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(_step_in_backward(counted))
        else:
            optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((tokens,))
        counted["tracker"] = tracker
        with tracker:
            for _ in range(2):  # the first step makes the optimizer state; the second counts
                tracker.reset_mod_stats()
                counted["in the hooks"].clear()
                if recipe == "2 micro-batches":  # the first micro-batch's gradients are kept
                    cross_entropy(model(tokens)).backward()
                    tracker.reset_mod_stats()  # the tracker's per-module books: one pass each
                with Highest(tracker) as forward:
                    # the logits stay referenced through backward, as the calculator's head
                    # pass keeps them (and litgpt's loop; torchtitan's deletes them first)
                    logits = model(tokens)
                    with Highest(tracker) as at_loss:  # the loss and its 0-d buffers
                        loss = cross_entropy(logits)
                counted["forward peak"] = forward.bytes
                counted["end of forward"] = at_loss.bytes
                counted["at the end of forward"] = by_category(tracker)
                del counted["at the end of forward"]["Total"]
                with Windows(tracker) as backward:
                    counted["windows"] = backward
                    loss.backward()
                counted["windows"] = None
                counted["backward peak"] = backward.bytes
                counted["at the backward peak"] = backward.categories
                counted["in backward"] = dict(backward.peaks)
                counted["at the peaks in backward"] = dict(backward.at)
                del logits
                counted["after backward"] = held(tracker)
                counted["on the cpu"] = by_category(tracker, "cpu")
                del loss
                if optimizer is not None:
                    with Highest(tracker) as stepping:
                        optimizer.step()
                    counted["optimizer step"] = stepping.bytes
                    optimizer.zero_grad()
        counted["shards on"] = sorted({p.to_local().device.type for p in model.parameters()})
    del counted["tracker"], counted["windows"]
    return counted


def _step_in_backward(counted: dict):
    """A post-accumulate-grad hook that steps its parameter's own AdamW and frees its gradient,
    counting the most the device holds while it steps. FSDP2 runs it on the sharded parameter
    once its gradient shard is made (on the CPU when offloaded: ``_fsdp_collectives.py``)."""
    optimizers: dict = {}

    def hook(p: torch.Tensor) -> None:
        opt = optimizers.setdefault(p, torch.optim.AdamW([p], foreach=True))
        with Highest(counted["tracker"]) as stepping:
            opt.step()
        counted["in the hooks"].append(stepping.bytes)
        p.grad = None

    return hook


#: The FSDP2 profile's shapes: (blocks, ranks, vocabulary), two of each of the first two, so a
#: term per block or per rank that is wrong cannot hide (``--profile``). The vocabulary is a
#: knob for what is not held yet: with (2, 2, 4096) the middle and end of backward are not
#: what the profile says (``test_fit_fsdp2_moments.py``'s docstring)
SHAPES = ((2, 4, 256), (3, 4, 256), (3, 2, 256))


def main() -> None:
    """``--profile``: the FSDP2 profile's grid (``SHAPES``, every recipe, no offloading).
    Without it: each recipe with and without offloading at ``CFG`` over ``WORLD`` ranks.
    ``--both``: the grid, and offloading at its first shape, whose grid runs are the controls
    (the same steps: ``step(mesh, False, recipe)`` at ``CFG`` over ``WORLD``); one child for
    both tests (``fake_fsdp2_counts.py``)."""
    both = "--both" in sys.argv[1:]
    profile = both or "--profile" in sys.argv[1:]
    _setup_privateuseone_for_python_backend(ACCEL, backend_module=Accel())
    torch.nn.functional.scaled_dot_product_attention = _fused_attention
    shape = {"config": dataclasses.asdict(CFG), "batch": BATCH, "seq": SEQ, "world": WORLD}
    grid, runs = [], {}
    for layers, world, vocab in SHAPES if profile else ((CFG.n_layers, WORLD, CFG.vocab),):
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
        mesh = init_device_mesh(ACCEL, (world,))  # made before the fake mode: it reads ranks
        cfg = dataclasses.replace(CFG, n_layers=layers, vocab=vocab)
        offload_here = (layers, world, vocab) == (CFG.n_layers, WORLD, CFG.vocab) and (
            both or not profile
        )
        try:
            controls = {recipe: step(mesh, False, recipe, cfg) for recipe in RECIPES}
            if offload_here and not runs:
                runs = {
                    recipe: {"control": controls[recipe], "offload": step(mesh, True, recipe)}
                    for recipe in RECIPES
                }
        finally:
            dist.destroy_process_group()
        grid.append({**shape, "config": dataclasses.asdict(cfg), "world": world, "runs": controls})
    out: dict = {"torch": torch.__version__}
    if profile:
        out["grid"] = grid
    if runs:
        out["offload"] = {**shape, "torch": torch.__version__, "runs": runs}
    if not profile:
        out = out["offload"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
