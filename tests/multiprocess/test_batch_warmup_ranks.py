"""The batch-size warm-up across a reshape, on CPU ranks (gloo): a run trained 3 steps on 1
rank (8 accumulated micro-batches a full step) and continued on 2 ranks (4 each) from the
middle of its warm-up trains, at every later step, the samples and losses (1e-5) of an
uninterrupted 2-rank run, while the global batch grows 8 -> 8 -> 16 -> 24 -> 32 samples. The
weights are held (lr 1e-12): the two shapes group a step's samples into micro-batches
differently, and a micro-batch's loss is its mean over its own predicted tokens, which would
change the updates (as in the XLNet reshape of test_resume_matrix.py)."""

from pathlib import Path

import pytest
from conftest import cpu_run_overrides
from dist_helpers import RECORDING_MLM, read_records
from zygote import recorded_launch

GUARD_S = 1800  # a launch that would hang fails the test after this long (a guard, not a timer)

CONFIG = (
    *RECORDING_MLM,
    "strategy=ddp",
    "data.batch_size=4",
    "data.global_batch_size=32",
    "data.batch_size_warmup_start=8",
    "data.batch_size_warmup_tokens=3072",  # 64-token samples: 8, 8, 16, 24, then 32 a step
    "optim.optimizer.lr=1e-12",
    "optim.schedule=constant",
    "optim.warmup_steps=2",
    "trainer.log_every_n_steps=1",
)
STEP_SIZES = [8, 8, 16, 24, 32, 32]


def launch(shards_dir: Path, run_dir: Path, steps: int, ranks: int) -> None:
    """`pretrain` for `steps` steps on `ranks` CPU processes; records go to `<run_dir>-records`."""
    overrides = cpu_run_overrides(shards_dir, run_dir, *CONFIG, f"trainer.max_steps={steps}")
    result = recorded_launch([*overrides, f"trainer.devices={ranks}"], run_dir, timeout=GUARD_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]


def by_step(records: dict[int, list[dict]]) -> dict[tuple[int, int], tuple[list, list]]:
    """{(rank, step): (keys of its micro-batches in order, their losses)}."""
    steps: dict[tuple[int, int], tuple[list, list]] = {}
    for rank, entries in records.items():
        for entry in entries:
            if "step" in entry:
                keys, losses = steps.setdefault((rank, entry["step"]), ([], []))
                keys.extend(entry["keys"])
                losses.append(entry["loss"])
    return steps


@pytest.mark.slow
def test_a_warmup_resumed_on_two_ranks_from_one_continues_the_uninterrupted_run(
    prepared_corpus, tmp_path
):
    launch(prepared_corpus, tmp_path / "whole", 6, ranks=2)
    parts = tmp_path / "parts"
    launch(prepared_corpus, parts, 3, ranks=1)
    launch(prepared_corpus, parts, 6, ranks=2)
    want = by_step(read_records(tmp_path / "whole-records"))
    got = by_step(read_records(tmp_path / "parts-records"))
    for step, size in enumerate(STEP_SIZES):
        ranks = (0,) if step < 3 else (0, 1)
        trained = sorted(key for rank in ranks for key in got[(rank, step)][0])
        assert trained == sorted(want[(0, step)][0] + want[(1, step)][0]), step
        assert len(trained) == size
    for rank in (0, 1):
        for step in range(3, 6):
            keys, losses = got[(rank, step)]
            assert keys == want[(rank, step)][0], (rank, step)
            assert losses == pytest.approx(want[(rank, step)][1], abs=1e-5), (rank, step)
