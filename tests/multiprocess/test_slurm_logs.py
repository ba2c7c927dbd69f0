"""SLURM: a training job submitted without --output logs to its run directory
(`<run_dir>/slurm-<job id>.out`), not to the submit directory (the repository root)."""

import pytest
from test_slurm import cluster, needs_slurm, sbatch, tiny_run, wait_for_job  # noqa: F401

from pretrain.paths import REPO_ROOT


@needs_slurm
@pytest.mark.slow
def test_train_job_logs_to_its_run_directory(cluster, prepared_corpus, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    job = sbatch(
        cluster,
        "--ntasks=1",
        "slurm/train.sbatch",
        *tiny_run(prepared_corpus, run_dir, "trainer.max_steps=2"),
    )
    state = wait_for_job(cluster, job)
    default_log = REPO_ROOT / f"slurm-pretrain-{job}.out"
    log = run_dir / f"slurm-{job}.out"
    assert state == "COMPLETED", (log.read_text() if log.exists() else default_log.read_text())[
        -3000:
    ]
    assert not default_log.exists()
    text = log.read_text()
    assert f"job {job} restart 0" in text and f"Run directory: {run_dir}" in text
