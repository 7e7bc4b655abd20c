"""Each knob's term against a real step on the CPU, counted by the course's accountant.

The calculator's terms for LoRA (what a frozen block with adapters saves, and the states of a
step that trains only the adapters), chunked cross-entropy (the fp32 upcast chunk by chunk)
and gradient accumulation (the gradients held through the next forward) are compared with the
same step run for real on the course's small decoder inside ``memory.measure("cpu")``, which
counts every tensor storage: to the byte. 8-bit AdamW and NF4 need bitsandbytes or torchao,
which the course does not install: said where they are modelled. Activation offloading is
measured by what a saved-tensor hook leaves behind; the copy in flight on a GPU's side stream
is not.
"""

from __future__ import annotations

import pytest
import torch

from tutorial_utils import fit, memory
from tutorial_utils.decoder import Decoder, DecoderConfig
from tutorial_utils.fit.activations import activations, cross_entropy, with_lora
from tutorial_utils.fit.shapes import counts, lora_counts
from tutorial_utils.fit.states import Lora, model_states
from tutorial_utils.fit.temporaries import step_temporaries

TOY = DecoderConfig(vocab=256, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
LLAMA_TOY = DecoderConfig(
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


@pytest.mark.parametrize("targets", ["qv", "attention", "all"])
@pytest.mark.parametrize("cfg", [TOY, LLAMA_TOY], ids=["gpt2-like", "llama-like"])
def test_a_lora_block_holds_what_the_fake_block_says(cfg, targets):
    b, s, lora = 2, 16, Lora(4, targets)
    fake = activations(cfg, b, s, "fp32", "none", lora)[0]
    torch.manual_seed(0)
    real = with_lora(Decoder(cfg, n_layers=1).blocks[0], cfg, lora)
    x = torch.randn(b, s, cfg.d_model, requires_grad=True)
    with memory.measure("cpu") as m:
        y = real(x)
    assert fake.held == m.delta_bytes  # saved tensors and the output, the input booked before
    y.sum().backward()
    grads = sum(p.grad.untyped_storage().nbytes() for p in real.parameters() if p.grad is not None)
    assert fake.grads == grads
    full = activations(cfg, b, s, "fp32", "none")[0]
    assert fake.held != full.held, "a frozen linear saves no input for its weight's gradient"


@pytest.mark.parametrize("targets", ["qv", "attention", "all"])
def test_a_lora_step_holds_the_states_the_calculator_counts(targets):
    """A real AdamW step that trains only the adapters: frozen weights, and the adapters'
    weights, gradients and two moments (Adam's CPU step counters left out, as on a GPU)."""
    lora = Lora(4, targets)
    torch.manual_seed(0)
    model = Decoder(LLAMA_TOY).requires_grad_(False)
    for i, block in enumerate(model.blocks):
        model.blocks[i] = with_lora(block, LLAMA_TOY, lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == lora_counts(LLAMA_TOY, 4, targets)[0]
    opt = torch.optim.AdamW(trainable)
    model(torch.zeros(2, 8, dtype=torch.long)).float().mean().backward()
    opt.step()
    held = sum(p.untyped_storage().nbytes() for p in model.parameters())
    held += sum(p.grad.untyped_storage().nbytes() for p in trainable)
    held += sum(
        v.untyped_storage().nbytes()
        for state in opt.state.values()
        for k, v in state.items()
        if k != "step"
    )
    assert sum(model_states(LLAMA_TOY, "fp32", "adamw", lora).bytes.values()) == held


@pytest.mark.parametrize("precision", ["fp32", "autocast-bf16"])
@pytest.mark.parametrize("chunks", [1, 4])
def test_chunked_cross_entropy_holds_what_the_fake_head_says(chunks, precision):
    b, s = 2, 16
    fake = activations(TOY, b, s, precision, "none", None, chunks)[1]
    torch.manual_seed(0)
    head = Decoder(TOY, n_layers=0)
    tokens = torch.zeros(b, s, dtype=torch.long)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32")
    with memory.measure("cpu") as m, autocast:
        logits = head(tokens)  # kept until backward, as a training loop's variable keeps it
        loss = cross_entropy(logits, chunks)
    out = loss.untyped_storage().nbytes()  # the fake books exclude the loss's scalar
    assert fake.held == m.delta_bytes - out
    assert fake.forward_over == m.peak_bytes - m.end_bytes + out


def test_chunks_shrink_the_fp32_upcast_of_the_logits():
    """Chunked: one chunk's fp32 copy at a time; what autograd saves (each chunk's fp32
    log-softmax) is the same in eager mode, so the saving is in the transient."""
    one, four = (activations(TOY, 2, 64, "autocast-bf16", "none", None, c)[1] for c in (1, 4))
    assert four.forward_over < one.forward_over
    r1 = fit.will_it_fit(TOY, batch=2, seq=64)
    r4 = fit.will_it_fit(TOY, batch=2, seq=64, ce_chunks=4)
    assert r4.peaks["end of forward"] < r1.peaks["end of forward"]


def test_gradient_accumulation_holds_the_gradients_through_the_next_forward():
    """Micro-batch 2's forward runs with micro-batch 1's gradients alive: measured, that is the
    gradients' bytes above micro-batch 1's forward, the term the calculator adds."""
    torch.manual_seed(0)
    model = Decoder(TOY)
    tokens = torch.zeros(2, 16, dtype=torch.long)
    peaks = []
    for _ in range(2):
        with memory.measure("cpu") as m:
            loss = cross_entropy(model(tokens))
        peaks.append(m.peak_bytes)
        loss.backward()
        del loss
    grads = sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
    assert peaks[1] - peaks[0] == grads
    one = fit.will_it_fit(TOY, batch=2, seq=16, precision="fp32")
    two = fit.will_it_fit(TOY, batch=2, seq=16, precision="fp32", grad_accumulation=2)
    assert two.peaks["end of forward"] - one.peaks["end of forward"] == grads


def test_lora_and_an_8bit_optimizer_answer_for_llama_8b():
    """The issue's two questions answer, with a number and a verdict, and shrink the states."""
    full = fit.will_it_fit("llama-3.1-8b", seq=2048, gpu="H100")
    lora = fit.will_it_fit("llama-3.1-8b", seq=2048, gpu="H100", lora_rank=16)
    eight = fit.will_it_fit("llama-3.1-8b", seq=2048, gpu="H100", optimizer="adamw8bit")
    qlora = fit.will_it_fit("llama-3.1-8b", seq=2048, lora_rank=16, lora_base="nf4")
    assert qlora.model_states["weights"] < lora.model_states["weights"]
    assert lora.total < eight.total < full.total
    assert "LoRA rank 16 on attention" in repr(lora) and lora.fits
    # 8-bit moments: 2 bytes per element and an fp32 scale per 256, for tensors of 4096 or more
    n = counts(fit.shapes.config("llama-8b")[1]).total
    assert 2 * n < eight.model_states["optimizer state"] < 2.04 * n


def test_tp_and_the_mesh_divide_the_states_and_the_activations():
    """llama-3.1-70b --tp 8 --gpus 64: the 8 GPUs of each TP group share every block, and FSDP
    shards over the 8 data-parallel groups."""
    alone = fit.will_it_fit("llama-3.1-70b", precision="mixed", sharding="fsdp2", n_gpus=8)
    tp = fit.will_it_fit("llama-3.1-70b", precision="mixed", sharding="fsdp2", n_gpus=64, tp=8)
    assert tp.model_states["weights"] == pytest.approx(alone.model_states["weights"] / 8, 1e-3)
    assert tp.categories["activations"] < alone.categories["activations"]
    with pytest.raises(ValueError, match="do not split into tp 8"):
        fit.will_it_fit("llama-3.1-70b", n_gpus=12, tp=8)


def test_the_optimizer_step_in_backward_holds_one_gradient_and_its_step_at_a_time():
    """Notebook 03 section 7's recipe: one AdamW per parameter, stepped by a post-accumulate-grad
    hook that then frees the gradient. Measured inside each hook: the step's temporaries are
    one parameter's (foreach over one tensor) and its gradient goes at once; after backward no
    gradient is left. The calculator's end-of-backward term is the largest of these: the
    largest parameter's gradient and its step."""
    torch.manual_seed(0)
    model = Decoder(TOY)
    params = list(model.parameters())
    opts = {p: torch.optim.AdamW([p], foreach=True) for p in params}
    tokens = torch.zeros(2, 16, dtype=torch.long)
    held = []

    def step(p):
        with memory.measure("cpu") as m:
            opts[p].step()
            grad = p.grad.untyped_storage().nbytes()
            p.grad = None
        held.append((grad + m.peak_above_start_bytes, m.delta_bytes, grad, p.numel()))

    for p in params:
        p.register_post_accumulate_grad_hook(step)
    for _ in range(2):  # the first step makes the states; the second is measured
        held.clear()
        cross_entropy(model(tokens)).backward()
    assert all(p.grad is None for p in params)
    for total, delta, grad, n in held:
        assert delta == -grad and total == grad + step_temporaries([n], "adamw", "foreach")
    r = fit.will_it_fit(TOY, batch=2, seq=16, precision="fp32", optimizer_in_backward=True)
    largest = max(held)[0]  # the largest parameter's gradient and its step's temporaries
    block = activations(TOY, 2, 16, "fp32", "none")[0]
    states = r.model_states
    fixed = states["weights"] + states["master weights"] + states["optimizer state"]
    assert r.peaks["end of backward"] == fixed + block.held + block.backward_over + largest
    assert "optimizer step" not in r.peaks, "no step after backward: it happened inside"


def test_activation_offload_leaves_the_head_on_the_device():
    """Activation offloading as torchtune does it: a saved-tensor hook moves what each block
    saves off the device (here into NumPy arrays, which the accountant does not count, as
    pinned host memory is not on a GPU) and keeps the parameters it saves; the output layer
    and the loss run outside the hook, as torchtune's ``NoOpManager`` keeps them. What stays
    at the end of forward is measured: the head's activations, the calculator's ``head.held``.
    The calculator adds one block for the copy in flight on a GPU's side stream, which a
    synchronous copy on the CPU cannot show: that one block is its allowance, not measured."""
    b, s = 2, 16
    torch.manual_seed(0)
    model = Decoder(TOY)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    moved = []

    def pack(t):
        if t.untyped_storage().data_ptr() in params:
            return t
        moved.append(t.shape)
        return t.detach().numpy().copy()

    def unpack(saved):
        return torch.from_numpy(saved) if not torch.is_tensor(saved) else saved

    offload = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *_: offload.__enter__())
        block.register_forward_hook(lambda *_: offload.__exit__(None, None, None))
    tokens = torch.zeros(b, s, dtype=torch.long)

    def left_on_device(model) -> tuple[int, torch.Tensor]:
        with memory.measure("cpu") as m:
            logits = model(tokens)  # kept until backward, as a training loop's variable keeps it
            loss = cross_entropy(logits)
        return m.delta_bytes - loss.untyped_storage().nbytes(), loss

    plain_kept = left_on_device(Decoder(TOY))[0]  # the control: no hook
    kept, loss = left_on_device(model)
    block, head = activations(TOY, b, s, "fp32", "none")
    assert kept == head.held
    assert plain_kept - kept == TOY.n_layers * block.held, "every block's activations moved"
    assert (b, s, TOY.d_model) in moved, "the blocks' saved inputs left the device"
    loss.backward()  # the moved tensors come back for backward
    assert all(p.grad is not None for p in model.parameters())
    r = fit.will_it_fit(TOY, batch=b, seq=s, precision="fp32", activation_offload=True)
    plain = fit.will_it_fit(TOY, batch=b, seq=s, precision="fp32")
    offloaded = plain.peaks["end of forward"] - r.peaks["end of forward"]
    assert offloaded == (TOY.n_layers - 1) * block.held  # all blocks but the one in flight
