"""SLURM: the sbatch template (2 tasks, DDP with gloo), a sweep through the submitit launcher,
a run preempted by scancel and by its time limit that requeues and resumes with the
uninterrupted run's losses, and corpus preparation as a job array. They need a cluster
(`slurm/local-cluster start`, as .ci/run does) and skip only when `sinfo` is not installed. The sliced preparation itself is tested
without SLURM too."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    cpu_run_overrides,
    three_file_corpus,
)
from dist_helpers import RECORDING_MLM
from test_prepare_array import corpus_documents, planted_corpus
from test_train import step_losses

from data_pipelines.prepare import prepare
from data_pipelines.prepare_config import PrepareConfig, TokenizerSettings
from data_pipelines.slices import merge_slices, prepare_slice, prepare_tokenizer
from pretrain.config import compose_config
from pretrain.paths import REPO_ROOT
from pretrain.runtime.run import train

TESTS_DIR = Path(__file__).parent
LOCAL_CONF = Path(os.environ.get("LOCAL_CLUSTER_DIR", "/tmp/pretrain-slurm")) / "slurm.conf"
TERMINAL = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
)


def slurm_env() -> dict[str, str]:
    env = dict(os.environ, PRETRAIN_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    if "SLURM_CONF" not in env and LOCAL_CONF.is_file():
        env["SLURM_CONF"] = str(LOCAL_CONF)
    return env


def _cluster_up() -> str | None:
    """None when a cluster answers, else why the SLURM tests skip."""
    if shutil.which("sinfo") is None:
        return "sinfo is not installed: no SLURM here (CI starts slurm/local-cluster)"
    return None


needs_slurm = pytest.mark.skipif(_cluster_up() is not None, reason=str(_cluster_up()))


@pytest.fixture(scope="module")
def cluster() -> dict[str, str]:
    """The environment of the cluster's clients; fails (not skips) when it does not answer."""
    env = slurm_env()
    result = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, (
        f"sinfo is installed but no cluster answers ({result.stderr.strip()}); start one with "
        "`slurm/local-cluster start`"
    )
    return env


def sbatch(env: dict, *args: str) -> str:
    result = subprocess.run(
        ["sbatch", "--parsable", "--export=ALL", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip().split(";")[0]


def show_job(env: dict, job_id: str) -> str:
    """`scontrol show job -o`: one line of `Name=value` fields per job (or array task)."""
    return subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True
    ).stdout


def job_field(env: dict, job_id: str, name: str) -> str:
    match = re.search(rf"\b{name}=(\S+)", show_job(env, job_id))
    return match.group(1) if match else ""


def release_requeued(env: dict, job_id: str, *updates: str, timeout_s: float = 240) -> None:
    """Start a job that requeued itself now, not after SLURM's 2-minute hold (BeginTime), with
    `updates` (e.g. "TimeLimit=10"): once it is PENDING and no node is still completing it,
    from the next whole second. slurmd refuses a launch whose credential is not newer than the
    revocation of the job's last run, both in whole seconds ("Job credential revoked": seen
    once on a loaded machine, the release 0.1 s after the requeue)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = job_field(env, job_id, "JobState")
        nodes = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True
        ).stdout
        if state == "PENDING" and "completing" not in nodes:
            break
        assert time.monotonic() < deadline, f"job {job_id} not requeued (state {state}; {nodes})"
        time.sleep(0.2)
    done = time.time()
    while int(time.time()) == int(done):  # the credential's time is in whole seconds
        time.sleep(0.05)
    subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", "StartTime=now", *updates], env=env, check=True
    )


def wait_for_job(env: dict, job_id: str, timeout_s: float = 600) -> str:
    """The job's final state (every task of an array done), polled each 0.5 s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = re.findall(r"\bJobState=(\S+)", show_job(env, job_id))
        if states and all(s in TERMINAL for s in states):
            return "COMPLETED" if all(s == "COMPLETED" for s in states) else ",".join(states)
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=env)
    raise AssertionError(f"job {job_id} did not finish in {timeout_s} s")


def tiny_run(shards: Path, run_dir: Path, *extra: str) -> list[str]:
    return cpu_run_overrides(shards, run_dir, "trainer.log_every_n_steps=1", *extra)


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


def prepare_settings(inputs: list[str], out_dir: Path) -> PrepareConfig:
    return PrepareConfig(
        inputs=inputs,
        out_dir=str(out_dir),
        tokenizer=TokenizerSettings(vocab_size=1000, min_frequency=2),
        docs_per_shard=40,
        num_proc=1,
    )


def test_merge_names_the_missing_slice(tmp_path):
    from data_pipelines.prepare import PrepareError

    cfg = prepare_settings(three_file_corpus(tmp_path / "text"), tmp_path / "out")
    with pytest.raises(PrepareError, match="prepare-tokenizer"):
        prepare_slice(cfg, 0, 3)
    prepare_tokenizer(cfg)
    prepare_slice(cfg, 0, 3, progress=False)
    with pytest.raises(PrepareError, match="slice 1 of 3 is missing"):
        merge_slices(cfg)
    with pytest.raises(PrepareError, match=r"must lie in 0\.\.2"):
        prepare_slice(cfg, 3, 3)


@pytest.mark.slow
@needs_slurm
def test_two_task_ddp_job_through_the_sbatch_template(cluster, prepared_corpus, tmp_path):
    run_dir = tmp_path / "run"
    job = sbatch(  # no --output: the job logs to its run directory, not the repository root
        cluster,
        "--nodes=1",
        "--ntasks-per-node=2",
        "slurm/train.sbatch",
        *tiny_run(prepared_corpus, run_dir, "strategy=ddp", "trainer.devices=2"),
        "trainer.max_steps=6",
    )
    state = wait_for_job(cluster, job)
    log, default_log = run_dir / f"slurm-{job}.out", REPO_ROOT / f"slurm-pretrain-{job}.out"
    text = (log if log.exists() else default_log).read_text()
    assert state == "COMPLETED", text[-3000:]
    assert not default_log.exists() and f"job {job} restart 0: 2 task(s)" in text
    assert "MEMBER: 2/2" in text and "distributed_backend=gloo" in text
    assert last_checkpoint(run_dir)["global_step"] == 6


def wait_for_text(path: Path, text: str, timeout_s: float = 600) -> str:
    """The log at `path` once it holds `text`, polled each 0.2 s."""
    deadline = time.monotonic() + timeout_s
    while text not in (log := path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"no {text!r} in {path}:\n{log[-3000:]}"
        time.sleep(0.2)
    return log


def wait_for_steps(run_dir: Path, timeout_s: float = 300) -> None:
    """Returns once the run in `run_dir` has trained steps: its CSV metrics, which the logger
    first writes at step 100 (CSVLogger's flush period), are on disk; polled each 0.2 s."""
    deadline = time.monotonic() + timeout_s
    while not list(run_dir.glob("csv/version_*/metrics.csv")):
        assert time.monotonic() < deadline, f"{run_dir}: no step logged in {timeout_s} s"
        time.sleep(0.2)


def saved_steps(log: str) -> list[int]:
    return [int(step) for step in re.findall(r"preemption: saved step (\d+)", log)]


@pytest.mark.slow
@needs_slurm
def test_preempted_by_scancel_and_the_time_limit_resumes_with_the_uninterrupted_losses(
    cluster, prepared_corpus, tmp_path
):
    """One run through SLURM's preemption paths, with 2 data-loader workers per task: an
    `scancel --full --signal=TERM` (every process of the job, workers included) saves and
    exits 75 without requeueing; the same command submitted again with a 4-minute limit and
    `--signal=B:USR1@190` (the batch shell, i.e. srun, which forwards it) saves, requeues
    itself and, released with a longer limit, finishes. The per-step losses of the three
    launches are the uninterrupted run's."""
    # SLURM sends the warning at its first time-limit check (every 30 s) that finds the job
    # within 190 + 30 s of its limit: with 4 minutes, 20 to 50 s after the start (a signal
    # during start-up is held until the first step). With 3 minutes and @170 it could come at
    # the start itself and end the batch shell before Python's handler existed (seen under
    # load: the job ended by SIGUSR1 94 ms after it started). The job then has at least 190 s
    # to save and exit: a start-up under CI load can take over a minute. The jobs wait at
    # steps 120 and 160 until a signal has come (dist_helpers' HOLD), so they are training
    # when it comes however fast the machine is (the uninterrupted reference does not wait).
    steps = 200
    overrides = tiny_run(
        prepared_corpus,
        tmp_path / "run",
        *RECORDING_MLM,
        f"trainer.max_steps={steps}",
        "trainer.checkpoint_every_n_steps=10000",
        "data.num_workers=2",
    )
    cluster = cluster | {
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), cluster.get("PYTHONPATH", "")]),
        "PRETRAIN_TEST_HOLD_STEP": "120,160",
    }
    log = tmp_path / "job.out"
    job = sbatch(cluster, "--ntasks=1", f"--output={log}", "slurm/train.sbatch", *overrides)
    wait_for_text(log, "Total params")  # training has begun (handlers are installed)
    wait_for_steps(tmp_path / "run")  # and trained steps: a save after step 0
    subprocess.run(["scancel", "--full", "--signal=TERM", job], env=cluster, check=True)
    assert wait_for_job(cluster, job) == "FAILED", log.read_text()[-3000:]
    assert job_field(cluster, job, "ExitCode") == "75:0"  # preempted, resumable
    text = log.read_text()
    assert "DataLoader worker" not in text and "Traceback" not in text, text[-3000:]
    (after_term,) = saved_steps(text)
    assert 0 < after_term < steps and f"preempted at step {after_term} of {steps}" in text
    assert last_checkpoint(tmp_path / "run")["global_step"] == after_term
    assert "requeued" not in text  # SIGTERM: a cancelled job stays cancelled

    job = sbatch(
        cluster,
        "--ntasks=1",
        "--time=4",
        "--signal=B:USR1@190",
        f"--output={log}",
        "slurm/train.sbatch",
        *overrides,
    )
    reference = tmp_path / "reference"  # the uninterrupted run, trained here meanwhile
    train(compose_config([*overrides, f"run_dir={reference}"]))
    wait_for_text(log, "requeueing SLURM job", 300)
    release_requeued(cluster, job, "TimeLimit=10")  # the job saves, stops its workers, exits
    assert wait_for_job(cluster, job, 600) == "COMPLETED", log.read_text()[-3000:]
    text = log.read_text()
    assert saved_steps(text)[0] == after_term
    after_usr1 = saved_steps(text)[1]
    assert after_term < after_usr1 < steps, text[-3000:]
    assert "restart 1" in text and "Traceback" not in text
    assert f"Resuming from {tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}" in text
    resumed, expected = step_losses(tmp_path / "run"), step_losses(reference)
    assert sorted(resumed) == sorted(expected) == list(range(steps))
    for step, loss in expected.items():
        assert resumed[step] == pytest.approx(loss, abs=1e-5), step  # float32 sums
    assert last_checkpoint(tmp_path / "run")["global_step"] == steps


@pytest.mark.slow
@needs_slurm
def test_a_warning_before_python_starts_is_handed_over_and_requeues(
    cluster, prepared_corpus, tmp_path
):
    """A warning signal that reaches the batch shell while it is still before Python (here:
    while it waits for its run-directory lookup, held at a gate) does not end the job: the
    shell notes it, Python takes it over, saves at its first step and requeues the job."""
    gate = tmp_path / "gate"
    gate.mkdir()
    wrapper = tmp_path / "python"  # the project's Python, held at the gate on its first call
    wrapper.write_text(
        "#!/bin/bash\n"
        f'if [ "$1" = -c ] && [ ! -e {gate}/go ]; then\n'
        f"  touch {gate}/waiting\n"
        f"  while [ ! -e {gate}/go ]; do sleep 0.1; done\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    run_dir = tmp_path / "run"
    overrides = tiny_run(prepared_corpus, run_dir, "trainer.max_steps=50", "data.num_workers=0")
    job = sbatch(
        cluster | {"PRETRAIN_PYTHON": str(wrapper)}, "--ntasks=1", "slurm/train.sbatch", *overrides
    )
    deadline = time.monotonic() + 300
    while not (gate / "waiting").exists():
        assert time.monotonic() < deadline, f"job {job} never reached its run-directory lookup"
        time.sleep(0.2)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=cluster, check=True)
    (gate / "go").touch()
    log, deadline = run_dir / f"slurm-{job}.out", time.monotonic() + 300
    try:
        while "requeueing SLURM job" not in (text := log.read_text() if log.exists() else ""):
            state = job_field(cluster, job, "JobState")
            if state in TERMINAL:  # its log is where SLURM put it: the repository root
                text = (REPO_ROOT / f"slurm-pretrain-{job}.out").read_text()
                raise AssertionError(f"job {job} ended ({state}) unrequeued:\n{text[-3000:]}")
            assert time.monotonic() < deadline, f"no requeue in {log}:\n{text[-3000:]}"
            time.sleep(0.2)
    finally:
        subprocess.run(["scancel", job], env=cluster)  # requeued: it would run again
        (REPO_ROOT / f"slurm-pretrain-{job}.out").unlink(missing_ok=True)
    assert "preemption: SIGUSR1 came during start-up" in text and "Traceback" not in text
    assert saved_steps(text) == [1]
    assert last_checkpoint(run_dir)["global_step"] == 1


@pytest.mark.slow
@needs_slurm
def test_sweep_through_the_submitit_launcher(cluster, prepared_corpus, tmp_path):
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("pretrain")),
            "-m",
            "hydra/launcher=slurm",
            "hydra.launcher.timeout_min=10",
            f"hydra.sweep.dir={sweep}",
            *tiny_run(prepared_corpus, sweep / "${run_name}", "trainer.max_steps=3"),
            "run_name=lr${optim.optimizer.lr}",
            "optim.optimizer.lr=1e-4,2e-4,3e-4",
        ],
        env=cluster,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    for lr in ("0.0001", "0.0002", "0.0003"):
        checkpoint = last_checkpoint(sweep / f"lr{lr}")
        assert checkpoint["global_step"] == 3
        assert checkpoint["config"]["optim"]["optimizer"]["lr"] == float(lr)
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 3  # three SLURM jobs
    # the local cluster has no job accounting: one line says so, no warning per sacct poll
    assert "SLURM job accounting is disabled" in result.stdout
    assert "Bypassing sacct error" not in result.stdout + result.stderr


@pytest.mark.slow
@needs_slurm
def test_preparation_as_a_job_array(cluster, tmp_path):
    """`slurm/prepare-array` on the local cluster's two nodes, 3 tasks over 8 files with exact
    and near duplicates planted across files, deduplicated globally (datatrove's stages):
    the documents one `prepare` in one process keeps, in its order."""
    inputs, planted = planted_corpus(tmp_path / "text")
    single_settings = prepare_settings(inputs, tmp_path / "single")
    single_settings.filters = ["exact_dedup", "near_dedup"]
    single = prepare(single_settings, progress=False)
    overrides = [
        f"inputs=[{','.join(inputs)}]",
        f"out_dir={tmp_path / 'array'}",
        "tokenizer.vocab_size=1000",
        "docs_per_shard=40",
        "num_proc=1",
        "filters=[exact_dedup,near_dedup]",
    ]
    result = subprocess.run(
        ["slurm/prepare-array", "3", f"--output={tmp_path}/%x-%A_%a.out", "--", *overrides],
        env=cluster,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    tokenizer_job, _, _, array_job, merge_job = result.stdout.split()
    assert wait_for_job(cluster, merge_job, 600) == "COMPLETED", "\n".join(
        p.read_text()[-2000:] for p in tmp_path.glob("*.out")
    )
    assert wait_for_job(cluster, array_job, 5) == "COMPLETED"  # all 3 tasks
    # each slice's last shard is short (the merge rewrites nothing): one run's documents
    kept = corpus_documents(tmp_path / "array")
    assert kept == corpus_documents(single) and len(kept) == 160  # every planted copy gone
    assert planted == 24
    filters = json.loads((tmp_path / "array" / "manifest.json").read_text())["filters"]
    assert filters["dedup_scope"] == "global", filters
