"""SLURM across nodes, for real: on a two-node cluster on this host (`slurm/local-cluster
start --nodes 2`, as .ci/run starts it), a job of 2 nodes x 1 task trains the same steps with
the same losses as 1 node x 2 tasks (same global batch, data and masks), and a 2-node job
preempted by USR1 requeues and resumes with the uninterrupted losses. Skips, saying why, when
the cluster has fewer than two nodes."""

import shutil
import socket
import subprocess
import time

import pytest
from test_slurm import (
    job_field,
    last_checkpoint,
    saved_steps,
    sbatch,
    slurm_env,
    tiny_run,
    wait_for_job,
    wait_for_text,
)
from test_train import step_losses


def _nodes() -> int:
    """Nodes of the cluster whose names resolve (rank 0's node name is the rendezvous address)."""
    if shutil.which("sinfo") is None:
        return 0
    result = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], env=slurm_env(), capture_output=True, text=True
    )
    names = set(result.stdout.split()) if result.returncode == 0 else set()
    try:
        return len([socket.gethostbyname(name) for name in names])
    except OSError:
        return 0


two_nodes = pytest.mark.skipif(
    _nodes() < 2,
    reason="needs a SLURM cluster of two nodes whose names resolve: "
    "slurm/local-cluster start --nodes 2",
)


@pytest.mark.slow
@two_nodes
def test_two_nodes_train_like_two_tasks_on_one(prepared_corpus, tmp_path):
    env = slurm_env()
    runs = {}
    for shape in ("--nodes=2 --ntasks-per-node=1", "--nodes=1 --ntasks-per-node=2"):
        nodes = shape.split()[0].split("=")[1]
        run_dir = tmp_path / f"nodes{nodes}"
        job = sbatch(
            env,
            *shape.split(),
            "slurm/train.sbatch",
            *tiny_run(prepared_corpus, run_dir, "strategy=ddp", "trainer.max_steps=6"),
            f"trainer.num_nodes={nodes}",
            f"trainer.devices={2 // int(nodes)}",
        )
        state = wait_for_job(env, job, 300)
        text = (run_dir / f"slurm-{job}.out").read_text()
        assert state == "COMPLETED", text[-3000:]
        assert f"job {job} restart 0: 2 task(s) on " in text
        runs[nodes] = (step_losses(run_dir), text)
    (two, log_two), (one, _) = runs["2"], runs["1"]
    assert "n[1-2]" in log_two or ("n1" in log_two and "n2" in log_two), log_two[-2000:]
    assert sorted(two) == sorted(one) == list(range(6))
    for step, loss in one.items():
        assert two[step] == pytest.approx(loss, abs=1e-5), step


@pytest.mark.slow
@two_nodes
def test_a_preempted_two_node_job_requeues_and_resumes_exactly(prepared_corpus, tmp_path):
    """`scancel --signal=USR1` of a 2-node job (srun forwards it to both ranks; their
    data-loader workers ignore it): both ranks save one checkpoint at the same step, rank 0
    requeues the job, and the requeued job resumes on both nodes to max_steps with the
    per-step losses of an uninterrupted 2-node run, no traceback in the log."""
    env = slurm_env()
    steps = 300
    job_args = ("--nodes=2", "--ntasks-per-node=1", "slurm/train.sbatch")
    settings = (
        "strategy=ddp",
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "data.num_workers=2",
        f"trainer.max_steps={steps}",
        "trainer.checkpoint_every_n_steps=10000",
    )
    reference = tmp_path / "reference"
    job = sbatch(env, *job_args, *tiny_run(prepared_corpus, reference, *settings))
    run_dir = tmp_path / "run"
    preempted = sbatch(env, *job_args, *tiny_run(prepared_corpus, run_dir, *settings))
    log = run_dir / f"slurm-{preempted}.out"
    wait_for_text(log, "Total params", 300)
    time.sleep(3)
    subprocess.run(["scancel", "--signal=USR1", preempted], env=env, check=True)
    wait_for_text(log, "requeued SLURM job", 300)
    deadline = time.monotonic() + 240
    while (state := job_field(env, preempted, "JobState")) != "PENDING":
        assert time.monotonic() < deadline, f"the job was not requeued (state {state})"
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", f"JobId={preempted}", "StartTime=now"], env=env)
    assert wait_for_job(env, preempted, 600) == "COMPLETED", log.read_text()[-3000:]
    assert wait_for_job(env, job, 600) == "COMPLETED"
    text = log.read_text()
    (saved,) = set(saved_steps(text))  # both ranks saved the same step
    assert 0 < saved < steps and "restart 1" in text and "Traceback" not in text, text[-3000:]
    assert last_checkpoint(run_dir)["global_step"] == steps
    resumed, expected = step_losses(run_dir), step_losses(reference)
    assert sorted(resumed) == sorted(expected) == list(range(steps))
    for step, loss in expected.items():
        assert resumed[step] == pytest.approx(loss, abs=1e-5), step
