"""The hang watchdog (trainer.hang_timeout_s) on 2 CPU ranks (gloo): a rank stuck in a step
(its peer waits in the gradient all-reduce) and a data-loader worker stuck after a few
batches are each found, every rank writes its stacks to its log and exits 75, no process of
the run is left, and resume=auto then continues the sample count from the last checkpoint.

The collectives' own timeout is set far above the watchdog's, so the watchdog is what stops
the run."""

import csv
import time
from pathlib import Path

import pytest
from conftest import cpu_run_overrides
from dist_helpers import RECORDING_MLM, read_records
from fault_helpers import MARKER, marked_processes, new_marker
from zygote import run_pretrain

from pretrain.cluster.preemption import PREEMPTED_EXIT_STATUS

STEPS = 8
BATCH = 4  # sequences per rank and micro-batch: 8 per optimizer step on 2 ranks


def launch(shards_dir: Path, run_dir: Path, marker: str, *extra: str, env: dict | None = None):
    args = cpu_run_overrides(
        shards_dir,
        run_dir,
        *RECORDING_MLM,
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.log_every_n_steps=1",
        f"trainer.max_steps={STEPS}",
        "trainer.checkpoint_every_n_steps=2",
        "trainer.hang_timeout_s=3",
        "trainer.collective_timeout_s=300",
        "trainer.startup_timeout_s=90",
        *extra,
        batch_size=BATCH,
    )
    records = {"PRETRAIN_TEST_RECORD_DIR": str(run_dir.parent / "records"), MARKER: marker}
    (run_dir.parent / "records").mkdir(exist_ok=True)
    return run_pretrain(args, run_dir.parent, records | (env or {}), timeout=300)


def wait_until_gone(marker: str, timeout_s: float = 30) -> list:
    """The run's processes still alive after waiting up to `timeout_s` for them to go (the
    forkserver and resource tracker end once their last worker has)."""
    deadline = time.monotonic() + timeout_s
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def samples_seen(run_dir: Path) -> dict[int, float]:
    """{step: train/samples_seen} over every launch's CSV log."""
    seen = {}
    for path in sorted((run_dir / "csv").glob("version_*/metrics.csv")):
        for row in csv.DictReader(path.open()):
            if row.get("train/samples_seen"):
                seen[int(row["step"])] = float(row["train/samples_seen"])
    return seen


def check_stopped(result, run_dir: Path, marker: str, where: str, step: int = 3) -> None:
    """Every rank exited 75 after the watchdog named a stalled rank and the step; rank 1
    stood in the file `where` after `step` (its stacks, rank 0's line of where each rank
    stood); no process of the run is left."""
    output = result.stdout[-3000:] + result.stderr[-5000:]
    assert result.returncode == PREEMPTED_EXIT_STATUS, output
    stalls = [line for line in result.stderr.splitlines() if "made no progress for" in line]
    assert stalls and all("trainer.hang_timeout_s=3" in line for line in stalls), output
    logs = {0: run_dir / "train.log", 1: run_dir / "train_ddp_process_1.log"}
    for rank, path in logs.items():
        text = path.read_text()
        assert "every thread's stack:" in text and 'File "' in text, (rank, text[-2000:])
    assert f'{where}", line' in logs[1].read_text()  # faulthandler's frame of its stack
    stood = [line for line in result.stderr.splitlines() if "where the ranks stood" in line]
    assert len(stood) == 1 and "stalled: rank" in stood[0], output
    assert f"rank 1 after step {step}, in {where}:" in stood[0], output
    assert "exited with status 75" in logs[0].read_text()  # rank 0 saw rank 1's status
    assert not wait_until_gone(marker)


def check_resumes(shards_dir: Path, run_dir: Path, marker: str, *extra: str) -> None:
    """A relaunch (resume=auto) trains to max_steps, its sample count continuing the
    checkpoint's: 8 samples per step from step 0, in both launches."""
    stopped_at = max(samples_seen(run_dir))
    result = launch(shards_dir, run_dir, marker, *extra)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "Resuming from" in result.stdout
    seen = samples_seen(run_dir)
    assert max(seen) > stopped_at
    assert all(count == 2 * BATCH * (step + 1) for step, count in seen.items()), seen
    trained = [e["step"] for e in read_records(run_dir.parent / "records")[0] if "step" in e]
    assert trained[-1] == STEPS - 1


@pytest.mark.slow
def test_a_rank_stuck_in_a_step_stops_every_rank_with_the_requeue_status(prepared_corpus, tmp_path):
    marker, run_dir = new_marker(), tmp_path / "run"
    hang = {"PRETRAIN_TEST_HANG_STEP": "3", "PRETRAIN_TEST_HANG_RANK": "1"}
    result = launch(prepared_corpus, run_dir, marker, env=hang)
    check_stopped(result, run_dir, marker, "dist_helpers.py")
    assert any("after step 3" in line for line in result.stderr.splitlines())
    check_resumes(prepared_corpus, run_dir, marker)


@pytest.mark.slow
def test_a_stuck_data_loader_worker_stops_every_rank_with_the_requeue_status(
    prepared_corpus, tmp_path
):
    marker, run_dir = new_marker(), tmp_path / "run"
    hang = {"PRETRAIN_TEST_WORKER_HANG_BATCHES": "4", "PRETRAIN_TEST_WORKER_HANG_RANK": "1"}
    worker = ("objective._target_=dist_helpers.HangingWorkerMLM", "data.num_workers=1")
    result = launch(prepared_corpus, run_dir, marker, *worker, env=hang)
    # rank 1 waits for its worker's 5th batch, step 4's: the loader fetches it a step ahead
    # (`data.loader.StepAlignedLoader`), at step 3's start, so it stalls after step 2
    check_stopped(result, run_dir, marker, "dataloader.py", step=2)
    check_resumes(prepared_corpus, run_dir, marker, *worker)
