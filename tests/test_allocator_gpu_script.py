"""notebooks/scripts/allocator_gpu.py, notebook 04's GPU-only demos: on a machine without CUDA
each says so in one sentence instead of failing deep inside PyTorch (on a GPU, strict nbval of
notebook 04 runs them and checks what they return)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from conftest import load_file

SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")


def _module():
    return load_file(SCRIPTS / "allocator_gpu.py")


@no_cuda
@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.oom_under_fraction(lambda: None, 2**20, "cuda"),
        lambda m: m.snapshot_live_blocks(lambda: None, "unused.pickle"),
    ],
    ids=["oom_under_fraction", "snapshot_live_blocks"],
)
def test_each_demo_says_it_needs_a_gpu(call):
    with pytest.raises(RuntimeError, match="needs the CUDA caching allocator"):
        call(_module())


@no_cuda
@pytest.mark.slow
def test_growing_batch_reports_a_failed_child_in_one_line():
    with pytest.raises(RuntimeError, match=r"the child Python failed .*needs a CUDA GPU"):
        _module().growing_batch(None, timeout_s=120)


def test_oom_message_reads_each_clause():
    """notebooks/scripts/oom_message.py on a message in the CUDA allocator's format (as in
    docs/troubleshooting.md), with numbers: notebook 04 checks a real one only on a GPU."""
    message = (
        "CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacity of 79.19 GiB"
        " of which 78.50 GiB is free. Including non-PyTorch memory, this process has 600.00 MiB"
        " memory in use. 91.42 MiB allowed; Of the allocated memory 59.48 MiB is allocated by"
        " PyTorch, and 2.52 MiB is reserved by PyTorch but unallocated. If reserved but"
        " unallocated memory is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True"
    )
    om = load_file(SCRIPTS / "oom_message.py")
    found = om.clauses(message)
    assert None not in found.values(), found
    assert found["free"] == "78.50 GiB" and found["allowed"] == "91.42 MiB"
    assert om.to_bytes(found["tried to allocate"]) == 32 * 2**20
    assert om.clauses("CUDA out of memory. Tried to allocate 2.00 MiB.")["allowed"] is None


def test_tensors_held_names_the_failed_calls_locals():
    """oom_message.tensors_held: the tensors the frames of an exception's traceback hold (what
    notebook 04 frees by dropping the exception), found by function and variable."""
    om = load_file(SCRIPTS / "oom_message.py")

    def failing_step():
        batch = torch.ones(4)  # noqa: F841 (the frame holds it: the point)
        raise torch.OutOfMemoryError("planted")

    def caught() -> BaseException:  # as a notebook cell would catch it (not this test's frame)
        try:
            failing_step()
        except torch.OutOfMemoryError as oom:
            return oom
        raise AssertionError("no error")

    err = caught()
    held = om.tensors_held(err)
    assert [(fn, name) for fn, name, _ in held] == [("failing_step", "batch")]
    del err
    gc.collect()  # caught()'s frame and its exception form a cycle
    assert held[0][2]() is None, "dropping the exception frees the frame's tensor"


def _alloc_conf():
    return load_file(SCRIPTS / "alloc_conf.py")


@pytest.mark.parametrize(
    ("version", "new", "old"),
    [
        ("2.8.0+cu128", None, True),
        ("2.9.1+cu128", False, True),  # pytorch/pytorch#183387
        ("2.10.0", None, True),
        ("2.11.0+cu130", True, True),
        ("2.13.0+cpu", True, True),
    ],
)
def test_which_name_04_expects_cuda_to_read(version, new, old):
    got = _alloc_conf().expected_on_cuda(version)
    assert got == {"PYTORCH_ALLOC_CONF": new, "PYTORCH_CUDA_ALLOC_CONF": old}


def test_growing_batch_sets_the_name_that_works_on_this_version():
    want = _alloc_conf().expected_on_cuda(torch.__version__)
    assert want[_module().ALLOC_CONF] is True


@pytest.mark.slow
def test_a_child_reads_back_each_name_and_only_that_one(monkeypatch):
    """04 §4's read-back on this machine: the child's allocator config parsed the setting from
    the one name set (the other removed from its environment, even if set here)."""
    ac = _alloc_conf()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    got = ac.read_back("PYTORCH_ALLOC_CONF", "expandable_segments:False")
    assert got["torch"] == torch.__version__
    if hasattr(torch._C, "_accelerator_getAllocatorSettings"):
        assert got["parsed"] == "expandable_segments:False", got
    with pytest.raises(ValueError, match="name must be one of"):
        ac.read_back("PYTORCH_NO_SUCH_CONF")
