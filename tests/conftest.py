"""Shared fixtures: a machine with CUDA mocked present, and one with a CUDA build but no driver."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

GiB = 2**30
ROOT = Path(__file__).resolve().parent.parent

# torch and hypothesis are imported where they are used, not here: with ``-n 2`` the process that
# hands out the tests (xdist's controller) imports this file before it starts the workers, runs
# no test, and would spend 2 s of CPU importing them first.


def pytest_configure(config):
    """Hypothesis runs derandomized and without an example database: the same test gives the
    same result on every run and every machine (a failure found once is not replayed from
    .hypothesis/ on one machine only). HYPOTHESIS_PROFILE=explore searches with fresh random
    examples instead, for a maintainer looking for new failures by hand.

    Loaded before any test file is imported (its ``settings(...)`` objects take their defaults
    from the profile then), in every process that runs tests: not in xdist's controller."""
    if getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"):
        return
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    settings.register_profile("explore", derandomize=False, database=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def load_file(path: Path, name: str | None = None) -> types.ModuleType:
    """Import a file that is not in a package (tools/, benchmarks/, notebooks/scripts/) by its path.

    The module is registered in ``sys.modules`` under ``name`` (the file's stem by default)
    before it runs, as a real import would: dataclasses look their module up there.
    """
    import importlib.util

    name = name or Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def frozen_before_each_file():
    """Before each test file, move every object that exists (torch's modules, what earlier files
    imported and left: about 350k) to the collector's permanent generation.

    ``memory.measure``, ``budget`` and the graders start by booking the tensors that exist: one
    ``gc.get_referrers`` pass over every object the collector tracks, 40-70 ms in a test process,
    which ``make quick`` paid about 350 times. That pass does not visit the permanent
    generation, so after the freeze it sees only what this file's tests and fixtures make (made
    later, and found as in a notebook). A tensor an earlier file leaked is frozen too, and no
    longer counts against this file's budgets. Frozen objects are never freed, as modules are
    not anyway; unreachable ones are collected first.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Every test's tensors are tiny: one intra-op thread runs them fastest, above all with two
    test workers sharing two cores (no thread contention). Set once, for the whole session."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend torch is a CUDA build that sees ``fake_cuda.count`` GPUs (2 by default)."""
    import torch

    state = types.SimpleNamespace(count=2, total=16 * GiB, free=10 * GiB)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state.count)

    def props(index):
        if not 0 <= index < state.count:
            raise AssertionError("Invalid device id")
        return types.SimpleNamespace(
            name=f"NVIDIA Fake {index}",
            total_memory=state.total,
            major=9,
            minor=0,
            uuid=f"0000000{index}-0000-0000-0000-000000000000",
        )

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (state.free, state.total))
    return state


class FakeAllocator:
    """torch.cuda's caching-allocator counters, one set per fake GPU, moved by hand.

    ``alloc(n, device)`` books ``n`` bytes (negative frees them): ``allocated`` follows, ``peak``
    and ``reserved`` only grow, as the real counters do; ``reset_peak_memory_stats`` brings the
    peak down to what is allocated, ``empty_cache`` the reserved pool. A test may also set
    ``reserved[i]`` (the cache keeps freed blocks) or ``current`` (``torch.cuda.current_device``).
    ``log`` gets ``"sync"`` at every ``torch.cuda.synchronize`` (a test may add its own entries
    to see the order), ``synced`` the device index each one waited for.
    """

    def __init__(self, machine: types.SimpleNamespace):
        self.machine = machine  # fake_cuda's state: count, total, free
        self.current = 0
        self.allocated: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.reserved: dict[int, int] = {}
        self.fraction = 1.0  # torch's default: the whole device
        self.fractions_set: list[float] = []
        self.log: list[str] = []
        self.synced: list[int] = []

    def index(self, device=None) -> int:
        """The GPU index that ``device`` (None, an int, a string or a torch.device) names."""
        if device is None:
            i = self.current
        elif isinstance(device, int):
            i = device
        else:
            import torch

            device = torch.device(device)
            i = self.current if device.index is None else device.index
        if not 0 <= i < self.machine.count:
            raise AssertionError("Invalid device id")
        return i

    def alloc(self, nbytes: int, device=0) -> None:
        i = self.index(device)
        self.allocated[i] = self.allocated.get(i, 0) + nbytes
        self.peak[i] = max(self.peak.get(i, 0), self.allocated[i])
        self.reserved[i] = max(self.reserved.get(i, 0), self.allocated[i])

    def install(self, monkeypatch) -> FakeAllocator:
        import torch

        cuda = torch.cuda

        def synchronize(device=None):
            self.synced.append(self.index(device))
            self.log.append("sync")

        def reset_peak(device=None):
            i = self.index(device)
            self.peak[i] = self.allocated.get(i, 0)

        def empty_cache():
            for i in self.reserved:
                self.reserved[i] = self.allocated.get(i, 0)

        def set_fraction(fraction, device=None):
            self.index(device)
            self.fraction = fraction
            self.fractions_set.append(fraction)

        counter = {"allocated": self.allocated, "peak": self.peak, "reserved": self.reserved}
        for name, key in [
            ("memory_allocated", "allocated"),
            ("max_memory_allocated", "peak"),
            ("memory_reserved", "reserved"),
            ("max_memory_reserved", "reserved"),
        ]:
            monkeypatch.setattr(
                cuda, name, lambda device=None, key=key: counter[key].get(self.index(device), 0)
            )
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "synchronize", synchronize)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", reset_peak)
        monkeypatch.setattr(cuda, "empty_cache", empty_cache)
        monkeypatch.setattr(
            cuda, "get_per_process_memory_fraction", lambda device=None: self.fraction
        )
        monkeypatch.setattr(cuda, "set_per_process_memory_fraction", set_fraction)
        return self


@pytest.fixture
def fake_allocator(fake_cuda, monkeypatch) -> FakeAllocator:
    """A CUDA machine (``fake_cuda``: 2 GPUs of 16 GiB) whose allocator counters a test moves
    by hand: ``fake_allocator.alloc(n, device)``. See ``FakeAllocator``."""
    return FakeAllocator(fake_cuda).install(monkeypatch)


@pytest.fixture
def cuda_build_without_driver(monkeypatch):
    """A CUDA build of torch on a machine with no NVIDIA driver: is_available() warns and says
    False."""
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")

    def is_available():
        warnings.warn(
            "CUDA initialization: Found no NVIDIA driver on your system.", UserWarning, stacklevel=2
        )
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def broken_nvidia_smi(tmp_path, monkeypatch):
    """An ``nvidia-smi`` on PATH that fails the way it does when the driver is gone (exit 9)."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(
        "#!/bin/sh\n"
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\n'
        "exit 9\n"
    )
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    return exe


# =========================================================================================
# Processes and NVML (helper "proc"): a fake pynvml, fake nvidia-smi programs, a real `make lab`
# =========================================================================================


class FakeNvml(types.SimpleNamespace):
    """A small ``pynvml``: GPUs in NVML (PCI) order, each ``(name, uuid, total, used, util)``.

    ``fail_after``: the number of memory queries that succeed before every query raises
    ``NVMLError`` (``None``: never fails) -- a driver going away in the middle of a run.
    ``missing``: no driver (``nvmlInit`` raises ``NVMLError_LibraryNotFound``).
    ``hang_s``: ``nvmlInit`` blocks this long first (a wedged driver), or until ``release`` is
    set: a test sets it once it has seen that nobody waited for the hung call.
    """

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self, gpus, fail_after=None, missing=False, hang_s=0.0):
        super().__init__()
        self.gpus = list(gpus)
        self.fail_after = fail_after
        self.missing = missing
        self.hang_s = hang_s
        self.release = threading.Event()
        self.init_calls = 0
        self.shutdown_calls = 0
        self.memory_queries = 0

    def nvmlInit(self):
        if self.hang_s:
            self.release.wait(self.hang_s)
        if self.missing:
            raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")
        self.init_calls += 1

    def nvmlShutdown(self):
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self):
        return b"570.1"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.gpus[h][0].encode()

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h][1]

    def nvmlDeviceGetMemoryInfo(self, h):
        self.memory_queries += 1
        if self.fail_after is not None and self.memory_queries > self.fail_after:
            raise self.NVMLError("GPU is lost")
        _, _, total, used, _ = self.gpus[h]
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, h):
        util = self.gpus[h][4]
        if util is None:
            raise self.NVMLError_NotSupported("Not Supported")
        return types.SimpleNamespace(gpu=util, memory=0)


def install_fake_nvml(monkeypatch, fake: FakeNvml, uuids: dict[str, int] | None = None) -> FakeNvml:
    """Make ``tutorial_utils.nvml`` talk to ``fake`` (and map UUIDs to CUDA indices as given)."""
    from tutorial_utils import nvml

    monkeypatch.setattr(nvml, "pynvml", fake)
    monkeypatch.setattr(nvml, "_initialized", 0)
    monkeypatch.setattr(nvml, "cuda_uuids", lambda: dict(uuids or {}))
    return fake


@pytest.fixture
def fake_nvml(monkeypatch):
    """A FakeNvml with two GPUs whose NVML order is the reverse of torch's CUDA order."""
    fake = FakeNvml(
        [
            ("NVIDIA B", "GPU-bbbb", 80 * GiB, 3 * GiB, 55),  # NVML #0 = cuda:1
            ("NVIDIA A", "GPU-aaaa", 40 * GiB, 1 * GiB, None),  # NVML #1 = cuda:0, no utilization
        ]
    )
    return install_fake_nvml(monkeypatch, fake, {"GPU-aaaa": 0, "GPU-bbbb": 1})


def fake_program(folder: Path, name: str, body: str, monkeypatch=None) -> Path:
    """Write the shell script ``folder/name``; with ``monkeypatch``, put it first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    if monkeypatch is not None:
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return exe


@pytest.fixture
def hanging_nvidia_smi(tmp_path, monkeypatch):
    """An ``nvidia-smi`` that never answers, as on a wedged driver: it starts a child and waits.

    Every process it starts writes its pid to ``hanging_nvidia_smi.pids`` (a file), so a test can
    check that none is left running.
    """
    pids = tmp_path / "nvidia-smi.pids"
    exe = fake_program(
        tmp_path / "hangbin",
        "nvidia-smi",
        f"echo $$ >> {pids}\nsleep 1000 &\necho $! >> {pids}\nwait\n",
        monkeypatch,
    )
    return types.SimpleNamespace(exe=exe, pids=pids)


def move_ref(batch, device):
    """The reference answer to notebook 01's move-a-batch exercise: every tensor inside nested
    dicts, lists and tuples moved to ``device``, everything else kept as it is."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: move_ref(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_ref(v, device) for v in batch)
    return batch


def wait_until(cond, timeout_s: float = 10.0) -> bool:
    """Poll ``cond`` every 0.1 s until it is true or ``timeout_s`` has passed; its last value.

    For processes that were SIGKILLed: they are gone within milliseconds, but not at once, and
    one that was never killed is still there when the time is up."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def alive(pids) -> list[int]:
    """The pids among ``pids`` that still run (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@dataclass
class LabRun:
    proc: subprocess.Popen
    port: int
    log: Path

    def text(self) -> str:
        return self.log.read_text()

    def wait_ready(self, timeout_s: float = 120.0) -> str:
        """The token, once the launcher printed the address (fails if it exits first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = re.search(
                rf"is ready at: http://127\.0\.0\.1:{self.port}/lab[^?\s]*\?token=(\w+)",
                self.text(),
            )
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                pytest.fail(f"make lab exited early:\n{self.text()}")
            time.sleep(0.3)
        pytest.fail(f"make lab was not ready after {timeout_s} s:\n{self.text()}")


@pytest.fixture
def start_lab(tmp_path):
    """Start ``python -m tutorial_utils lab`` for real (own Jupyter folders); stopped afterwards."""
    runs: list[LabRun] = []

    def start(port: int | None = None, config: str = "", env: dict | None = None) -> LabRun:
        if port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        k = len(runs)
        cfg = tmp_path / f"cfg{k}"
        cfg.mkdir()
        if config:
            (cfg / "jupyter_server_config.py").write_text(config)
        full_env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(cfg),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / f"rt{k}"),
            "JUPYTER_DATA_DIR": str(tmp_path / f"data{k}"),
            "TMPDIR": str(tmp_path),
            **(env or {}),
        }
        log = tmp_path / f"lab{k}.log"
        with log.open("w") as fh:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tutorial_utils",
                    "lab",
                    "--no-browser",
                    "--port",
                    str(port),
                ],
                cwd=ROOT,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )
        runs.append(LabRun(proc, port, log))
        return runs[-1]

    yield start
    for run in runs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.proc.pid, signal.SIGTERM)
        try:
            run.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()


# --------------------------------------------------- answers that compare equal to anything
# Wrong answers a checker must never accept (tests/test_exercises_faults.py and _properties.py).


class EqualToAll:
    """An answer equal to everything (like ``mock.ANY``)."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return "EqualToAll()"


class EqInt(int):
    """An int that says it equals everything."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


class EqFloat(float):
    """A float that says it equals everything, and differs from nothing."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __sub__(self, other):
        return 0.0

    __hash__ = float.__hash__
