"""docs/troubleshooting.md quotes messages as printed: raise each one a CPU can, compare the quote.

Every box preceded by ``<!-- checked: KEY -->`` has a probe here that raises the real error (or
produces the real text) and returns ``"Type: message"``. The quote, with ``<...>`` standing for
any text, must match it. A box added without a probe, or a probe whose box was removed, fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tutorial_utils import devices, distributed, doctor, lab, memory, monitor

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
BOX_RE = re.compile(r"<!-- checked: (\w+) -->\n```text\n(.*?)\n```", re.DOTALL)


def quoted() -> dict[str, str]:
    return dict(BOX_RE.findall(PAGE.read_text(encoding="utf-8")))


def as_pattern(quote: str) -> re.Pattern:
    """The quote as a regular expression: ``<...>`` placeholders match any text."""
    parts = re.split(r"<[^<>]+>", quote)
    return re.compile(".+?".join(re.escape(p) for p in parts), re.DOTALL)


def printed(exc: BaseException) -> str:
    """How the last line of a traceback shows ``exc``: its class name, then its message."""
    name = type(exc).__name__
    if type(exc) is torch.OutOfMemoryError:
        name = "torch.OutOfMemoryError"
    return f"{name}: {exc}"


def raised(fn) -> str:
    try:
        fn()
    except Exception as exc:
        return printed(exc)
    raise AssertionError(f"{fn} did not raise")


@contextlib.contextmanager
def busy_port():
    """A port held by a listening socket for the duration of the block."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


# --------------------------------------------------------------------------- probes


def probe_no_cuda_build(request):
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build: it cannot show the CPU build's error")
    return raised(lambda: torch.zeros(1, device="cuda"))


def probe_no_cuda_build_course(request):
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build: it cannot show the CPU build's error")
    return raised(lambda: devices.pick_device("cuda"))


def probe_no_driver_course(request):
    request.getfixturevalue("cuda_build_without_driver")
    return devices.cuda_unavailable_reason()


def probe_cpu_budget_oom(request):
    def oom():
        # The budget counts what is already in use (other tests' tensors too): 1 MiB above it.
        with memory.Tracker("cpu") as before:
            pass
        with memory.budget(before.start_bytes + 2**20):
            torch.zeros(2**20)  # 4 MiB

    return raised(oom)


def probe_cross_device_meta(request):
    return raised(lambda: torch.zeros(2) + torch.zeros(2, device="meta"))


def probe_launch_timeout(request):
    script = request.getfixturevalue("tmp_path") / "hangs.py"
    script.write_text("import time\ntime.sleep(600)\n")
    return raised(lambda: distributed.launch(script, nproc=1, timeout=5, echo=None))


def probe_no_nccl(request):
    if torch.distributed.is_nccl_available():
        pytest.skip("this torch has NCCL: it cannot show the error of a build without it")
    store = torch.distributed.HashStore()
    try:
        with pytest.warns(UserWarning):  # "Attempted to get default timeout for nccl backend"
            return raised(
                lambda: torch.distributed.init_process_group(
                    "nccl", store=store, rank=0, world_size=1
                )
            )
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def probe_lab_port_busy(request):
    capsys = request.getfixturevalue("capsys")
    with busy_port() as port:
        code = lab.main(["--notebook-dir", str(ROOT / "notebooks"), "--port", str(port)])
    assert code == 2
    return capsys.readouterr().err.strip()


def probe_launch_port_busy(request):
    script = request.getfixturevalue("tmp_path") / "never_runs.py"
    script.write_text("raise SystemExit('must not start')\n")
    with busy_port() as port:
        return raised(lambda: distributed.launch(script, nproc=1, port=port, echo=None))


def probe_launch_shadowed_module(request):
    folder = request.getfixturevalue("tmp_path")
    script = folder / "never_runs.py"
    script.write_text("raise SystemExit('must not start')\n")
    (folder / "queue.py").write_text("")
    return raised(lambda: distributed.launch(script, nproc=1, echo=None))


def probe_widgets_missing(request):
    (problem,) = doctor.DoctorReport(widgets_ok=False).missing(["widgets"])
    return problem


def probe_gputil_no_nvidia_smi(request):
    monkeypatch = request.getfixturevalue("monkeypatch")
    empty = request.getfixturevalue("tmp_path") / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    gputil = pytest.importorskip("GPUtil")
    assert gputil.getGPUs() == [], "GPUtil itself should fail silently, as the page says"
    return raised(monitor.gputil_gpus)


def probe_distutils(request):
    gputil = importlib.util.find_spec("GPUtil")
    if gputil is None:
        pytest.skip("GPUtil is not installed")
    if sys.version_info < (3, 12):
        # The cause, which this Python can show: GPUtil imports distutils, slated for removal.
        source = Path(gputil.origin).with_name("GPUtil.py").read_text()
        assert "from distutils import spawn" in source
        proc = subprocess.run(
            [sys.executable, "-S", "-W", "error", "-c", "import distutils"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "slated for removal in Python 3.12" in proc.stderr
        pytest.skip("Python < 3.12 still has distutils; the cause was checked instead")
    proc = subprocess.run(  # -S: without site, setuptools cannot put its distutils in place
        [sys.executable, "-S", "-c", "import distutils"], capture_output=True, text=True, timeout=60
    )
    return proc.stderr.strip().splitlines()[-1]


def probe_no_mps(request):
    if devices.mps_available():
        pytest.skip("this machine has MPS")
    return raised(lambda: devices.pick_device("mps"))


PROBES = {
    name.removeprefix("probe_"): fn for name, fn in globals().items() if name.startswith("probe_")
}


def test_every_checked_box_has_a_probe_and_every_probe_a_box():
    boxes = quoted()
    assert len(boxes) >= 10, "the page lost its checked boxes"
    assert set(boxes) == set(PROBES), (
        f"boxes without a probe: {sorted(set(boxes) - set(PROBES))}; "
        f"probes without a box: {sorted(set(PROBES) - set(boxes))}"
    )


SLOW_PROBES = {"launch_timeout"}  # a real torchrun launch that waits out its timeout


@pytest.mark.parametrize(
    "key",
    [pytest.param(k, marks=pytest.mark.slow) if k in SLOW_PROBES else k for k in sorted(PROBES)],
)
def test_quoted_message_is_what_is_printed(key, request):
    quote = quoted()[key]
    actual = PROBES[key](request)
    assert as_pattern(quote).search(actual), (
        f"docs/troubleshooting.md quotes, for {key}:\n  {quote}\nbut this is printed now:\n  "
        f"{actual}\nUpdate the page (and its cause / fix if they changed too)."
    )


def test_placeholders_do_not_match_everything():
    """A quote must keep enough fixed text to be a check, not only placeholders."""
    for key, quote in quoted().items():
        fixed = re.sub(r"<[^<>]+>", "", quote)
        assert len(fixed.strip()) >= 25, f"the quote for {key} is mostly placeholders"
    assert not as_pattern("Torch not compiled with CUDA enabled").search("CUDA works")


def test_contents_links_point_at_headings():
    text = PAGE.read_text(encoding="utf-8")
    anchors = set()
    for heading in re.findall(r"^## (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    for link in re.findall(r"\]\(#([^)]+)\)", text):
        assert link in anchors, f"contents link #{link} matches no heading"


def test_gloo_default_timeout_is_what_the_page_says():
    from datetime import timedelta

    from torch.distributed import constants

    assert constants.default_pg_timeout == timedelta(minutes=30)
    assert "30 minutes for\ngloo" in PAGE.read_text(encoding="utf-8")
