"""SLURM across nodes, for real: on a two-node cluster on this host (`slurm/local-cluster
start --nodes 2`, as .ci/run starts it), a job of 2 nodes x 1 task trains the same steps with
the same losses as 1 node x 2 tasks (same global batch, data and masks). Skips, saying why,
when the cluster has fewer than two nodes."""

import subprocess

import pytest
from test_slurm import needs_slurm, sbatch, slurm_env, tiny_run, wait_for_job
from test_train import step_losses


def _nodes() -> int:
    result = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], env=slurm_env(), capture_output=True, text=True
    )
    return len(set(result.stdout.split())) if result.returncode == 0 else 0


two_nodes = pytest.mark.skipif(
    needs_slurm.args[0] or _nodes() < 2,
    reason="needs a SLURM cluster of two nodes: slurm/local-cluster start --nodes 2",
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
