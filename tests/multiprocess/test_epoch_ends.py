"""Multi-rank runs across epoch ends: every rank takes the same number of steps in every epoch
(`pretrain.data.loader`), with ZeRO-2 on 2 and DDP on 4 CPU processes; every sample of a
completed epoch is trained by exactly one rank, except the logged tail; a stuck rank or a bad
shard fails the run instead of hanging it; a run resumed on 2 ranks continues the 1-rank order.
(Preemption and resume across epoch ends, DDP and ZeRO-2: test_resume_matrix.py.)"""

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cpu_run_overrides, damage_first_shard
from dist_helpers import RECORDING_MLM, read_records
from zygote import recorded_launch

from pretrain.config import compose_config
from pretrain.data.stream import EpochStream

GUARD_S = 900  # a run that would hang fails the test after this long (a guard, not a speed check)


def overrides(shards_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return cpu_run_overrides(
        shards_dir,
        run_dir,
        *RECORDING_MLM,
        "trainer.log_every_n_steps=5",
        "trainer.checkpoint_every_n_steps=1000",
        "optim.warmup_steps=2",
        *extra,
    )


def launch(
    shards_dir: Path, run_dir: Path, ranks: int, *extra: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`pretrain` with `ranks` CPU processes; records go to `<run_dir>-records`."""
    args = [*overrides(shards_dir, run_dir, *extra), f"trainer.devices={ranks}"]
    return recorded_launch(args, run_dir, env, timeout=GUARD_S)


def rank_streams(shards_dir: Path, ranks: int, epoch: int, *extra: str) -> dict[int, list[str]]:
    """{rank: sample keys of its whole stream in `epoch`}, built in this process."""
    from pretrain.runtime.run import build_stream

    _, spec, _ = build_stream(compose_config(overrides(shards_dir, Path("unused"), *extra)))
    return {
        rank: [
            key
            for batch in EpochStream(replace(spec, rank=rank, world_size=ranks), epoch)
            for key in batch["keys"]
        ]
        for rank in range(ranks)
    }


def trained_keys(records: list[dict], epoch: int) -> list[str]:
    return [k for e in records if e.get("epoch") == epoch for k in e["keys"]]


def check_epochs(shards_dir: Path, records: dict, ranks: int, steps: int, *extra: str) -> None:
    """Every rank trained `steps` steps, the same number in each epoch; the keys of a completed
    epoch are the head of each rank's stream, trained once, and the rest is the logged tail."""
    assert sorted(records) == list(range(ranks))
    entries = {r: [e for e in records[r] if "step" in e] for r in records}
    for r in records:
        assert [e["step"] for e in entries[r]] == list(range(steps)), r
    end = next(e for e in records[0] if e.get("end"))
    assert end["scheduler_steps"] == steps  # the learning rate moved once per step, not per epoch
    tails = end["loaders"]
    assert [epoch for epoch, _, _ in tails] == [0, 1], tails  # crossed two epoch ends
    for epoch, end_step, dropped in tails:
        per_rank = {r: [e["step"] for e in entries[r] if e["epoch"] == epoch] for r in records}
        assert len({tuple(s) for s in per_rank.values()}) == 1, per_rank  # same steps everywhere
        assert per_rank[0][-1] == end_step - 1
        streams = rank_streams(shards_dir, ranks, epoch, *extra)
        trained = {r: trained_keys(entries[r], epoch) for r in records}
        every = [k for keys in trained.values() for k in keys]
        assert len(every) == len(set(every)), f"epoch {epoch}: a sample was trained twice"
        for r in records:
            assert trained[r] == streams[r][: len(trained[r])], (epoch, r)
        untrained = sum(len(streams[r]) - len(trained[r]) for r in records)
        assert dropped == untrained, (epoch, dropped, untrained)
        batch = len(entries[0][0]["keys"])
        assert dropped <= 3 * batch * ranks, f"epoch {epoch}: tail of {dropped} sequences"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ranks", "strategy", "batch", "steps"),
    [(2, "deepspeed_zero2", 16, 70), (4, "ddp", 8, 70)],
)
def test_ranks_cross_epoch_ends_together(prepared_corpus, tmp_path, ranks, strategy, batch, steps):
    extra = (f"strategy={strategy}", f"data.batch_size={batch}", f"trainer.max_steps={steps}")
    result = launch(prepared_corpus, tmp_path / "run", ranks, *extra)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "epoch 1 ends at step" in result.stdout
    records = read_records(tmp_path / "run-records")
    check_epochs(prepared_corpus, records, ranks, steps, f"data.batch_size={batch}")


@pytest.mark.slow
def test_a_stuck_rank_fails_the_run_naming_the_step(prepared_corpus, tmp_path):
    """Rank 1 stops answering at step 3: rank 0's next collective gives up after
    trainer.collective_timeout_s (15 s: a loaded machine may keep one rank seconds behind the
    other between steps) and the run ends with an error, not a hang. Until the
    ranks meet at the first step they wait trainer.startup_timeout_s (90 s), so a loaded
    machine that starts one rank late does not time out at the start."""
    result = launch(
        prepared_corpus,
        tmp_path / "run",
        2,
        "strategy=ddp",
        "trainer.max_steps=10",
        "trainer.collective_timeout_s=15",
        "trainer.startup_timeout_s=90",
        env={"PRETRAIN_TEST_HANG_STEP": "3", "PRETRAIN_TEST_HANG_RANK": "1"},
    )
    assert result.returncode != 0
    stuck = [line for line in result.stderr.splitlines() if "got no answer" in line]
    # the short wait is the one the process group holds, read from the group (gloo's own
    # words vary: "15000ms", or under load "Application timeout caused pair closure")
    want = "trainer.collective_timeout_s=15 s (the process group's wait: 15 s) at step 3"
    assert stuck and want in stuck[0], result.stderr[-3000:]


@pytest.mark.slow
def test_a_bad_shard_stops_every_rank_at_the_same_step(prepared_corpus, tmp_path):
    """A shard changed on disk, read by both ranks' data-loader workers: every rank stops at
    the first step with one error line (the shard named), none hangs, status 2."""
    corpus = tmp_path / "corpus"
    shutil.copytree(prepared_corpus, corpus)
    shard = damage_first_shard(corpus)
    result = launch(corpus, tmp_path / "run", 2, "strategy=ddp", "data.num_workers=2")
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, result.stderr[-5000:]
    assert all("step 0" in e or str(shard) in e for e in errors), errors
    assert any(f"{shard}: sha256 differs" in e for e in errors)
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_worker_still_starting_when_a_bad_shard_stops_the_run_ends_silently(
    prepared_corpus, tmp_path
):
    """The bad-shard stop while a rank's second data-loader worker is still starting (held
    inside its start until the rank's main process has gone, `slow_start`): the run ends
    with its one-line errors and status 2, and no worker prints a traceback (its queues'
    semaphores gone with the main process): the loader's close ends a worker still
    starting. Before, this failed CI at random under load."""
    corpus = tmp_path / "corpus"
    shutil.copytree(prepared_corpus, corpus)
    damage_first_shard(corpus)
    held = tmp_path / "held"
    held.mkdir()
    env = {"PRETRAIN_TEST_SLOW_START_DIR": str(held)}
    extra = ("strategy=ddp", "data.num_workers=2", "objective._target_=slow_start.SlowStartMLM")
    result = launch(corpus, tmp_path / "run", 2, *extra, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(list(held.glob("*.first"))) == 2  # each rank's first worker went on
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.stderr, result.stderr[-5000:]


@pytest.mark.slow
def test_a_run_resumed_on_two_ranks_continues_the_one_rank_sample_order(prepared_corpus, tmp_path):
    """Elastic resume: 10 steps on 1 rank (global batch 16 = 8 x 2 accumulated), then the
    same run on 2 ranks (8 x 2 ranks): every later step trains the samples the 1-rank run
    trained at that step, none lost or repeated, across the epoch end."""
    extra = (
        "strategy=ddp",
        "data.global_batch_size=16",
        "trainer.checkpoint_every_n_steps=10",
        "optim.schedule_steps=70",  # the first launch stops at 10 of the 70-step schedule
    )
    whole = launch(prepared_corpus, tmp_path / "whole", 1, *extra, "trainer.max_steps=70")
    assert whole.returncode == 0, whole.stderr[-5000:]
    first = launch(prepared_corpus, tmp_path / "parts", 1, *extra, "trainer.max_steps=10")
    assert first.returncode == 0, first.stderr[-5000:]
    second = launch(prepared_corpus, tmp_path / "parts", 2, *extra, "trainer.max_steps=70")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-5000:]
    assert "Resuming from" in second.stdout

    def keys_by_step(records: dict, since: int = 0) -> dict[int, list[str]]:
        steps: dict[int, list[str]] = {}
        for entries in records.values():
            for e in entries:
                if "step" in e and e["step"] >= since:
                    steps.setdefault(e["step"], []).extend(e["keys"])
        return {step: sorted(keys) for step, keys in steps.items()}

    want = keys_by_step(read_records(tmp_path / "whole-records"))
    got = keys_by_step(read_records(tmp_path / "parts-records"), since=10)
    assert sorted(got) == list(range(10, 70))
    for step, keys in got.items():
        assert keys == want[step], step
    assert {e["epoch"] for e in read_records(tmp_path / "whole-records")[0] if "step" in e} == {
        0,
        1,
    }


@pytest.mark.slow
def test_a_token_budget_run_reshaped_mid_epoch_trains_each_steps_samples_once(
    prepared_corpus, tmp_path
):
    """Token-budget batches (data.tokens_per_batch, DOC-SENTENCES): 8 steps on 1 rank with 2
    accumulated micro-batches, then the same run on 2 ranks without accumulation, across the
    epoch end: every step trains the samples of the one global order's step (computed here,
    `test_token_budget.global_steps`), none lost or repeated."""
    from test_token_budget import global_steps

    from pretrain.runtime.run import build_stream

    budget = ("data=doc_sentences", "data.stream_partitions=4", "data.tokens_per_batch=2048")
    extra = (
        "strategy=ddp",
        *budget,
        "trainer.checkpoint_every_n_steps=8",
        "optim.schedule_steps=32",
    )
    first = launch(
        prepared_corpus,
        tmp_path / "run",
        1,
        *extra,
        "trainer.max_steps=8",
        "trainer.accumulate_grad_batches=2",
    )
    assert first.returncode == 0, first.stderr[-5000:]
    second = launch(prepared_corpus, tmp_path / "run", 2, *extra, "trainer.max_steps=32")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-5000:]
    assert "Resuming from" in second.stdout and "epoch 0 ends at step" in second.stdout
    trained: dict[tuple[int, int], list[str]] = {}
    records = read_records(tmp_path / "run-records")
    for entries in records.values():
        for e in entries:
            if "step" in e:
                trained.setdefault((e["epoch"], e["step"]), []).extend(e["keys"])
    assert sorted(step for _, step in trained) == list(range(32))
    _, spec, _ = build_stream(compose_config(overrides(prepared_corpus, tmp_path, *budget)))
    end = next(step for epoch, step, _ in records[0][-1]["loaders"] if epoch == 0)
    want = {0: global_steps(spec), 1: global_steps(spec, epoch=1)}
    assert len(want[0]) - 1 <= end <= len(want[0])  # the last step may lack a partition
    for (epoch, step), keys in trained.items():
        assert sorted(keys) == want[epoch][step - epoch * end], (epoch, step)
