"""A real two-node Slurm cluster on this machine, and the course's Slurm script run on it unchanged.

The cluster is ``tools/cluster.py`` (what ``make cluster`` starts): munged, slurmctld and two
slurmd (nodes n1 and n2, both 127.0.0.1). It is started once for this file and stopped by PID at
the end, including when a test fails. Without Slurm it is installed with apt when we are root;
otherwise every test here is skipped with one sentence saying why.

Each job runs a copy of ``notebooks/scripts`` (the sbatch script, ddp_train.py, common.py
byte for byte), submitted the way a learner does on the course's CPU cluster:
``sbatch --gpus-per-node=0 --cpus-per-task=1 slurm_ddp.sbatch``. Each rank reports through
``TUTORIAL_REPORT_DIR`` (exported into the job by sbatch), and the checks are notebook 07's:
two ranks train exactly like one process on the global batch; rank 0 alone writes the checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DistributedSampler

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "notebooks" / "scripts"
sys.path.insert(0, str(ROOT / "tools"))
import cluster as slurm  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CPU_CLUSTER = ["--gpus-per-node=0", "--cpus-per-task=1"]  # the course's nodes have no GPU
# how a rank that aborts at exit shows in a job's output (torchrun's summary, srun, the C++ runtime)
ABORT = re.compile(r"terminate called|SIGABRT|Signal 6|core dumped|exit code 134|exitcode\s*:\s*-6")


def start_cluster(folder):
    """A cluster in ``folder``, tied to this process; the test is skipped without root or Slurm."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests start munged, slurmctld and slurmd, which needs root")
    try:
        slurm.ensure_installed(timeout_s=600)
    except slurm.Unavailable as exc:
        pytest.skip(str(exc))
    return slurm.start(folder, port=None, tied_to_parent=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """The two-node cluster, up (both nodes idle) for the whole session; stopped at the end."""
    up = start_cluster(tmp_path_factory.mktemp("slurm"))
    print(f"\ncluster up in {up.start_seconds:.1f} s ({up!r})")
    try:
        yield up
    finally:
        stopped = slurm.stop(up)
        assert not stopped.left, f"processes of the cluster still running: {stopped}"
        assert not slurm.processes_of(up.conf), "a process of the cluster outlived it"


@pytest.fixture
def job_dir(tmp_path):
    """A copy of notebooks/scripts to submit from (a job writes its output and checkpoint there)."""
    folder = tmp_path / "scripts"
    shutil.copytree(SCRIPTS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "reports").mkdir()
    return folder


def job_env(up: slurm.Cluster, folder: Path, reports: Path | None = None) -> dict[str, str]:
    env = up.env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])  # torchrun
    env["TUTORIAL_REPORT_DIR"] = str(reports or folder / "reports")
    env["OMP_NUM_THREADS"] = "1"
    env.pop("SLURM_JOB_ID", None)
    return env


def submit(
    up, folder, *args: str, wait: bool = False, timeout_s: float = 300, reports: Path | None = None
) -> tuple[int, int]:
    """sbatch the script in ``folder``; (job id, sbatch's exit status). Jobs that may run at the
    same time need ``reports`` folders of their own (each rank writes rank<R>.json there)."""
    cmd = ["sbatch", "--parsable", *(["--wait"] if wait else []), *CPU_CLUSTER]
    done = subprocess.run(
        [*cmd, "slurm_ddp.sbatch", *args],
        cwd=folder,
        env=job_env(up, folder, reports),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    match = re.match(r"(\d+)", done.stdout.strip())
    assert match, f"sbatch did not submit: {done.stdout} {done.stderr}"
    return int(match.group(1)), done.returncode


def job_field(up, job: int, name: str) -> str:
    text = up.run("scontrol", "show", "job", str(job)).stdout
    match = re.search(rf"\b{name}=(\S+)", text)
    return match.group(1) if match else ""


def wait_for(cond, timeout_s: float, what: str, up=None, job=None, out: Path | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.3)
    detail = out.read_text() if out is not None and out.exists() else ""
    state = job_field(up, job, "JobState") if up is not None and job is not None else ""
    pytest.fail(f"{what} did not happen within {timeout_s:.0f} s (job state {state}):\n{detail}")


def reports(folder: Path) -> dict[int, dict]:
    return {
        int(p.stem[4:]): json.loads(p.read_text()) for p in (folder / "reports").glob("rank*.json")
    }


def reference_params(epochs: int, world: int = 2, batch: int = 8) -> torch.Tensor:
    """One process, the same model and data, each step on the ranks' samples together (check 2
    of notebook 07), for ``epochs`` epochs."""
    sys.path.insert(0, str(SCRIPTS))
    from ddp_train import build_data, build_model

    data = build_data()
    X, Y = data.tensors
    ref = build_model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    samplers = [DistributedSampler(data, world, r, shuffle=True, seed=0) for r in range(world)]
    for epoch in range(epochs):
        for s in samplers:
            s.set_epoch(epoch)
        shards = [list(s) for s in samplers]
        for k in range(0, len(shards[0]), batch):
            idx = [i for shard in shards for i in shard[k : k + batch]]
            loss = F.mse_loss(ref(X[idx]), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return torch.cat([p.detach().flatten() for p in ref.parameters()])


def gap_to_reference(params: torch.Tensor, epochs: int) -> tuple[float, float]:
    """How far trained parameters are from one process's, relative to the largest, and the bound:
    4 SGD steps an epoch, each summing 8 and 32 products and 16 samples in another order, within
    2 x 56 fp32 roundings (2**-24) (notebook 07, check 2, derives it)."""
    ref = reference_params(epochs)
    gap = ((params - ref).abs().max() / ref.abs().max()).item()
    return gap, 4 * epochs * 2 * (8 + 32 + 16) * 2**-24


def assert_no_process_of(up, job: int) -> None:
    left = wait_for(
        lambda: not slurm.processes_of(up.conf, job) or None, 20, f"job {job}'s processes ending"
    )
    assert left, f"processes of job {job} left running: {slurm.processes_of(up.conf, job)}"


# --------------------------------------------------------------------------- the cluster


def test_both_nodes_are_idle_and_on_this_machine(cluster):
    out = cluster.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
    assert out == ["n1", "idle", "n2", "idle"], out
    nodes = cluster.run("scontrol", "show", "node").stdout
    assert nodes.count("NodeAddr=127.0.0.1") == 2
    # how long it took to start: benchmarks/cluster_times.py (start() gives up after 60 s)


# --------------------------------------------------------------------------- the course's script


def test_the_course_script_trains_like_one_process_across_two_nodes(cluster, job_dir):
    started = time.monotonic()
    job, rc = submit(cluster, job_dir, wait=True)
    wall = time.monotonic() - started
    out = (job_dir / f"ddp-train-{job}.out").read_text()
    assert rc == 0, f"job {job} failed (sbatch --wait exit {rc}):\n{out}"
    assert job_field(cluster, job, "JobState") == "COMPLETED"
    runs = reports(job_dir)
    assert sorted(runs) == [0, 1], f"reports from ranks {sorted(runs)}:\n{out}"
    assert {r["node"] for r in runs.values()} == {"n1", "n2"}, "one rank per node"
    assert all(r["world"] == 2 and r["backend"] == "gloo" for r in runs.values())
    assert runs[0]["params"] == runs[1]["params"], "the two copies of the model differ"
    diff, tol = gap_to_reference(torch.tensor(runs[0]["params"]), 3)
    assert diff < tol, f"two nodes differ from one process on the global batch by {diff:.1e}"
    # the checkpoint: written once, by rank 0 alone, with the trained weights
    assert [r["saved_checkpoint"] for r in (runs[0], runs[1])] == [[3], []]
    assert out.count("checkpoint saved") == 1
    state = torch.load(job_dir / f"ddp-train-{job}.pt")
    assert state["epoch"] == 3
    saved = torch.cat([t.flatten() for t in state["model"].values()])
    assert torch.equal(saved, torch.tensor(runs[0]["params"]))
    assert not ABORT.search(out), f"a rank aborted:\n{out}"
    assert_no_process_of(cluster, job)
    print(
        f"\njob {job}: {job_field(cluster, job, 'RunTime')} run time, {wall:.1f} s to sbatch --wait"
    )


def test_a_failing_rank_fails_the_whole_job_named_and_leaves_nothing(cluster, job_dir):
    job, rc = submit(cluster, job_dir, "crash_demo.py", wait=True)
    out = (job_dir / f"ddp-train-{job}.out").read_text()
    assert rc != 0, f"sbatch --wait said the job succeeded:\n{out}"
    assert job_field(cluster, job, "JobState") == "FAILED"
    root_cause = out.split("Root Cause (first observed failure):", 1)
    assert len(root_cause) == 2, f"torchrun named no root cause:\n{out}"
    assert re.search(r"rank\s*: 1 \(local_rank: 0\)", root_cause[1]), out
    assert "rank 1: my shard is missing, giving up" in out
    # the other node's torchrun (rank 0 sleeps 120 s) was stopped, not waited for: srun
    # terminated the step when the first task failed (--kill-on-bad-exit), and both tasks ended
    # with an error (terminated, or exited when torchrun stopped its sleeping rank)
    assert re.search(r"srun: error: n[12]: task [01]: Exited with exit code 1", out), out
    assert re.search(r"_step_signal: Terminating StepId=\d+\.0", out), out
    ended = re.findall(
        r"srun: error: n[12]: task ([01]): (?:Terminated|Exited with exit code [1-9])", out
    )
    assert sorted(ended) == ["0", "1"], out
    # how long such a job runs: benchmarks/cluster_times.py
    assert_no_process_of(cluster, job)


# --------------------------------------------------------------------------- requeue on preemption


def test_usr1_checkpoints_requeues_and_the_job_resumes_where_it_stopped(cluster, job_dir):
    """What --signal=B:USR1@60 does before the time limit, sent by hand: checkpoint, requeue."""
    ckpt = job_dir / "ckpt.pt"
    job, _ = submit(
        cluster, job_dir, "ddp_train.py", "--epochs", "100000", "--checkpoint", "ckpt.pt"
    )
    out = job_dir / f"ddp-train-{job}.out"
    try:
        text = lambda: out.read_text() if out.exists() else ""  # noqa: E731
        stops = []
        for run in (0, 1):
            if run == 1:  # the requeued run must start from the checkpoint, not from scratch
                wait_for(
                    lambda: "resumed from the checkpoint" in text(),
                    120,
                    "the resume",
                    cluster,
                    job,
                    out,
                )
                assert f"resumed from the checkpoint at epoch {stops[0]}" in text()
            seen = len(re.findall(r"^epoch \d+:", text(), re.M))
            wait_for(
                lambda s=seen: len(re.findall(r"^epoch \d+:", text(), re.M)) >= s + 2,
                120,
                f"run {run} training",
                cluster,
                job,
                out,
            )
            signalled = cluster.run("scancel", "--signal=USR1", "--batch", str(job))
            assert signalled.returncode == 0, signalled.stderr
            wait_for(
                lambda r=run: job_field(cluster, job, "Restarts") == str(r + 1),
                120,
                f"requeue {run + 1}",
                cluster,
                job,
                out,
            )
            found = re.findall(r"checkpoint saved by rank 0 at epoch (\d+) \(asked to stop", text())
            assert len(found) == run + 1, text()
            stops.append(int(found[-1]))
            state = torch.load(ckpt)
            assert state["epoch"] == stops[-1]
            saved = torch.cat([t.flatten() for t in state["model"].values()])
            diff, tol = gap_to_reference(saved, stops[-1])
            assert diff < tol, f"checkpoint at epoch {stops[-1]} differs from one process by {diff}"
            # requeued: COMPLETING while the old run's processes are cleaned up, then PENDING
            state = job_field(cluster, job, "JobState")
            assert state in {"COMPLETING", "PENDING", "REQUEUED", "RUNNING"}, state
            # Slurm holds a requeued job until the old run's credentials expire (cred_expire,
            # 20 s on the course's cluster); starting it sooner gets it killed as non-startable
        assert stops[1] > stops[0]
        assert f"job {job}, run 1:" in text()
    finally:
        cluster.run("scancel", str(job))
    assert_no_process_of(cluster, job)


# --------------------------------------------------------------------------- torchrun, no Slurm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_agents_side_by_side_train_like_one_process(tmp_path, job_dir):
    """What a learner types in two terminals: the same command, --node-rank 0 and 1."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(TUTORIAL_REPORT_DIR=str(job_dir / "reports"), OMP_NUM_THREADS="1")
    procs = []
    for node_rank in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
            f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-terminals",
            "ddp_train.py", "--epochs", "3", "--checkpoint", "ckpt.pt",
        ]  # fmt: skip
        log = (tmp_path / f"agent{node_rank}.log").open("w")
        procs.append(
            subprocess.Popen(cmd, cwd=job_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        )  # fmt: skip
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
    logs = "\n".join((tmp_path / f"agent{k}.log").read_text() for k in (0, 1))
    assert codes == [0, 0], f"torchrun exit statuses {codes}:\n{logs}"
    runs = reports(job_dir)
    assert sorted(runs) == [0, 1] and runs[0]["params"] == runs[1]["params"], logs
    diff, tol = gap_to_reference(torch.tensor(runs[0]["params"]), 3)
    assert diff < tol, f"two agents differ from one process on the global batch by {diff:.1e}"
    assert sum(len(r["saved_checkpoint"]) for r in runs.values()) == 1
    assert torch.load(job_dir / "ckpt.pt")["epoch"] == 3
    assert "node_rank is only used for static rdzv_backend" in logs  # c10d picks ranks itself
    assert not ABORT.search(logs), logs


# --------------------------------------------------------------------------- clean exit


def test_twenty_two_node_jobs_end_without_an_abort(cluster, job_dir):
    """The 2-node job, 20 times: every run ends with exit 0 and no rank aborts at exit."""
    jobs = []
    for k in range(20):  # the script's own default job; two may run at once (2 CPUs a node)
        (job_dir / "reports" / str(k)).mkdir()
        jobs.append(submit(cluster, job_dir, reports=job_dir / "reports" / str(k))[0])
    done = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
    wait_for(lambda: all(job_field(cluster, j, "JobState") in done for j in jobs), 1200, "20 jobs")
    states = {j: job_field(cluster, j, "JobState") for j in jobs}
    outs = {j: (job_dir / f"ddp-train-{j}.out").read_text() for j in jobs}
    aborted = [j for j in jobs if ABORT.search(outs[j])]
    failed = [j for j in jobs if states[j] != "COMPLETED"]
    print(f"\n20 two-node jobs: {len(aborted)} with an abort, {len(failed)} not COMPLETED")
    assert not aborted and not failed, (
        f"{len(aborted)} of 20 jobs aborted ({aborted}), {len(failed)} failed; first:\n"
        + outs[(aborted or failed)[0]]
    )


# --------------------------------------------------------------------------- stopping


def test_stop_ends_its_jobs_and_daemons_and_leaves_the_learners_terminal(tmp_path):
    """`make cluster-stop` from the terminal that exported SLURM_CONF (as `make cluster` says):
    the terminal's other programs keep running; the cluster's jobs and daemons are gone; and
    the daemons listened on loopback only where the host name resolves there."""
    up = start_cluster(tmp_path / "c")
    env = up.env()
    terminal = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
    try:
        listening = subprocess.run(
            ["ss", "-ltnH", "sport", ">=", str(up.port), "and", "sport", "<=", str(up.port + 2)],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        hosts = {line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines()}
        if up.loopback:
            assert hosts == {up.loopback}, listening
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/bash\nsrun -N1 sleep 300 &\nsetsid sleep 301 &\nwait\n")
        job = up.run("sbatch", "--parsable", "-N1", "-o", str(tmp_path / "job.out"), str(script))
        job_id = job.stdout.strip()
        wait_for(lambda: len(slurm.processes_of(up.conf, job_id)) >= 3, 30, "the job running")
        stopped = slurm.stop(tmp_path / "c")  # by folder, as `make cluster-stop` does
        assert not stopped.left, stopped
        assert terminal.poll() is None, "stop killed a program of the learner's terminal"
        assert not slurm.job_processes(up.conf) and not slurm.processes_of(up.conf, job_id)
    finally:
        terminal.kill()
        terminal.wait()
        slurm.stop(up)
