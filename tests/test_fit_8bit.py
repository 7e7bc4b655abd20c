"""bitsandbytes' AdamW (8-bit, paged 8-bit, paged 32-bit), measured: the calculator's state
term against a replay of the library's allocations and, where bitsandbytes is installed,
against the library itself.

bitsandbytes is not a dependency of the course (CI's install budget), so what its optimizers
allocate is replayed in PyTorch's own ops, as ``Optimizer8bit.__init__``, ``fill_qmap``,
``get_state_buffer`` and ``Optimizer2State.init_state`` read in
``bitsandbytes/optim/optimizer.py`` at 0.41.1 (18e827d6, the pin of litgpt's resource tables:
blocks of 2048) and at 0.50.1 (37d2a938: blocks of 256 since 0.44.0), and measured with
``memory.measure("cpu")``, which counts every tensor storage: ``states.bnb_adamw_bytes`` must
equal it to the byte, for both block sizes, 8-bit and 32-bit, plain and paged. The paged
replay makes a large moment with the accountant's dispatch mode off, so that it is not
counted, as ``F.get_paged`` wraps CUDA unified memory (``cudaMallocManaged``) that PyTorch's
CUDA allocator never sees.

Where bitsandbytes 0.50 or later is installed (``pip install bitsandbytes``: its CPU backend
runs the 8-bit step), the last tests build its own optimizers over the same model, step them,
and hold their state to the replay and to the term, and their second step to keeping
nothing; they skip where it is absent. (The step's scratch inside the library's CPU kernel is
that backend's, not the CUDA kernel's: see ``fit.temporaries``.) The model has a tensor
under 4096 elements (fp32 moments), one of exactly 4096 (8-bit), ones that end in a partial
block, and one over 100,000 (paged).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from tutorial_utils import fit, memory
from tutorial_utils.decoder import Decoder, DecoderConfig
from tutorial_utils.fit import states
from tutorial_utils.fit.temporaries import step_temporaries
from tutorial_utils.units import format_bytes

CFG = DecoderConfig(vocab=1601, d_model=64, n_layers=2, n_heads=4)
BLOCKS = {"0.41.1": 2048, "0.50.1": 256}


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    params = list(Decoder(CFG).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def _replay(params, block: int, paged: bool, bits: int = 8) -> tuple[dict, int, int, list]:
    """The state bitsandbytes' ``AdamW8bit`` (``PagedAdamW8bit`` if ``paged``; ``bits=32``:
    ``AdamW32bit``, ``PagedAdamW``) makes for ``params``: (the state by parameter, bytes the
    accountant saw, bytes in unified memory, the unified buffers)."""
    unified = []

    def get_state_buffer(p, dtype):  # Optimizer8bit.get_state_buffer
        if not paged or p.numel() < 1e5:
            return torch.zeros_like(p, dtype=dtype, device=p.device)
        with _disable_current_modes():  # F.get_paged: memory PyTorch's allocator never counts
            buffer = torch.zeros(tuple(p.shape), dtype=dtype)
        unified.append(buffer)
        return buffer

    state = {}
    with memory.measure("cpu") as m:
        if bits == 8:  # __init__: fill_qmap(): create_dynamic_map(signed=True / False), 256
            # fp32 each; init_state's .to(p.device) keeps the same tensors on their device
            qmaps = {"dynamic": torch.zeros(256), "udynamic": torch.zeros(256)}
        for p in params:  # step() -> init_state() for each parameter with a gradient
            n = p.numel()
            if bits == 32 or n < 4096:  # or p.numel() < config["min_8bit_size"]: float32
                s = {
                    "state1": get_state_buffer(p, torch.float32),
                    "state2": get_state_buffer(p, torch.float32),
                }
            else:
                blocks = n // block + (1 if n % block else 0)  # config["block_wise"]
                s = {
                    "state1": get_state_buffer(p, torch.uint8),
                    "qmap1": qmaps["dynamic"],
                    "state2": get_state_buffer(p, torch.uint8),
                    "qmap2": qmaps["udynamic"],
                    "absmax1": torch.zeros((blocks,), dtype=torch.float32, device=p.device),
                    "absmax2": torch.zeros((blocks,), dtype=torch.float32, device=p.device),
                }
            state[p] = s  # percentile_clipping 100, max_unorm 0: no gnorm_vec, no unorm_vec
    paged_bytes = sum(b.untyped_storage().nbytes() for b in unified)
    return state, m.delta_bytes, paged_bytes, unified


KINDS = {"adamw8bit": (8, False), "paged-adamw8bit": (8, True), "paged-adamw": (32, True)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("version", BLOCKS)
def test_the_state_term_is_what_the_librarys_allocations_hold_to_the_byte(version, kind):
    bits, paged = KINDS[kind]
    params = _params()
    _, seen, in_unified, _ = _replay(params, BLOCKS[version], paged, bits)
    numels = [p.numel() for p in params]
    assert (seen, in_unified) == states.bnb_adamw_bytes(numels, bits, paged, BLOCKS[version])


@pytest.mark.parametrize("kind", KINDS)
def test_the_calculator_counts_that_state_for_the_model(kind):
    """End to end: ``will_it_fit``'s optimizer state for the same model (its tensors are the
    Decoder's) is the replay's, today's block of 256; paged, the part PyTorch's allocator
    holds, with the rest in a note. bf16 weights: the 32-bit moments are fp32 all the same."""
    bits, paged = KINDS[kind]
    params = [p.to(torch.bfloat16) for p in _params()]
    r = fit.will_it_fit(CFG, batch=1, seq=8, precision="pure-bf16", optimizer=kind)
    _, seen, in_unified, _ = _replay(params, states.ADAMW8BIT_BLOCK, paged, bits)
    assert r.model_states["optimizer state"] == seen
    assert in_unified == (2 * 102_464 * bits // 8 if paged else 0)  # the embedding's moments
    said = [note for note in r.notes if "unified memory" in note]
    assert len(said) == paged
    if paged:
        assert f"keeps {format_bytes(in_unified)} of its moments" in said[0]


def test_each_rule_of_the_term_moves_it():
    """So that the tests above can fail for each rule: the threshold, the block, the maps, the
    32-bit moments and the paging threshold each change the bytes of this model."""
    numels = [p.numel() for p in Decoder(CFG).parameters()]
    plain, _ = states.bnb_adamw_bytes(numels)
    fp32 = sum(8 * n for n in numels if n < 4096)
    eight = [n for n in numels if n >= 4096]
    assert 4096 in eight and any(n % 256 for n in eight) and max(numels) >= 100_000
    absmax = sum(8 * math.ceil(n / 256) for n in eight)
    assert plain == fp32 + sum(2 * n for n in eight) + absmax + states.QMAPS
    old, _ = states.bnb_adamw_bytes(numels, block=2048)
    assert plain - old == absmax - sum(8 * math.ceil(n / 2048) for n in eight) > 0
    in_allocator, in_unified = states.bnb_adamw_bytes(numels, paged=True)
    assert in_allocator + in_unified == plain and in_unified == 2 * max(numels)
    assert states.bnb_adamw_bytes(numels, 32) == (8 * sum(numels), 0)  # no maps, no absmax
    assert states.bnb_adamw_bytes(numels, 32, paged=True)[1] == 8 * max(numels)
    assert states.bnb_adamw_bytes([4095]) == (8 * 4095, 0)  # fp32 moments, no maps
    assert states.bnb_adamw_bytes([]) == (0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_bitsandbytes_step_makes_no_temporaries_in_the_calculator(kind):
    """The CUDA kernels step in place (``temporaries``' docstring): no step temporaries, so the
    step's moment is the states and the gradients."""
    numels = [p.numel() for p in Decoder(CFG).parameters()]
    for impl in ("foreach", "fused", "forloop"):
        assert step_temporaries(numels, kind, impl) == 0
    r = fit.will_it_fit(CFG, batch=1, seq=8, precision="fp32", optimizer=kind)
    assert r.peaks["optimizer step"] == sum(r.model_states.values())


# --- the library itself, where it is installed -------------------------------------------


def _bitsandbytes():  # the module, or skip
    bnb = pytest.importorskip("bitsandbytes")
    major, minor = (int(x) for x in bnb.__version__.split(".")[:2])
    if (major, minor) < (0, 50):
        pytest.skip(f"bitsandbytes {bnb.__version__} has no CPU 8-bit step (0.50 or later)")
    return bnb


def _run(optimizer_class) -> tuple[list, object, int, int]:
    """Build the library's optimizer and step it twice: (params, optimizer, bytes the
    construction and the first step kept, bytes the second step kept)."""
    params = _params()
    with memory.measure("cpu") as first:
        opt = optimizer_class(params, lr=1e-3)
        opt.step()
    with memory.measure("cpu") as second:
        opt.step()
    return params, opt, first.delta_bytes, second.delta_bytes


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW32bit"])
def test_the_librarys_state_is_the_replay_and_the_term_to_the_byte(name):
    """The calculator's block (256, since 0.44.0) is the installed library's."""
    bnb = _bitsandbytes()
    bits = 8 if name == "AdamW8bit" else 32
    params, opt, kept, then = _run(getattr(bnb.optim, name))
    replay, _, _, _ = _replay(params, states.ADAMW8BIT_BLOCK, paged=False, bits=bits)
    for p in params:
        real = opt.state[p]
        tensors = {k: v for k, v in real.items() if torch.is_tensor(v)}
        assert tensors.keys() == replay[p].keys()
        for key, v in tensors.items():
            assert (v.dtype, v.shape) == (replay[p][key].dtype, replay[p][key].shape), key
        if "qmap1" in real:  # one pair of maps, shared by every tensor
            first = next(opt.state[q] for q in params if "qmap1" in opt.state[q])
            assert real["qmap1"] is first["qmap1"] and real["qmap2"] is first["qmap2"]
    assert kept == states.bnb_adamw_bytes([p.numel() for p in params], bits)[0]
    assert then == 0  # the second step updates the state in place and keeps nothing


@pytest.mark.parametrize("name", ["PagedAdamW8bit", "PagedAdamW"])
def test_the_librarys_paged_optimizers_fall_back_on_the_cpu(name):
    """Paging needs CUDA: on the CPU bitsandbytes warns and allocates every moment as the plain
    optimizer does, so the paged split is checked by the replay only."""
    bnb = _bitsandbytes()
    bits = 8 if name == "PagedAdamW8bit" else 32
    with pytest.warns(UserWarning, match="Paged optimizers are not supported on CPU"):
        params, _, kept, then = _run(getattr(bnb.optim, name))
    assert kept == sum(states.bnb_adamw_bytes([p.numel() for p in params], bits, paged=True))
    assert then == 0
