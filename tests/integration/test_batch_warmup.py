"""The batch-size warm-up through the real run (`data.batch_size_warmup_*`): the global batch
grows 4 -> 8 -> 12 -> 16 samples over the first steps; the samples trained are those of a run
without warm-up, in the same order, only grouped into steps differently; a step of the warm-up
is the mean gradient over its samples (its losses are those of a run with that global batch);
and a run resumed in the middle of the warm-up trains what an uninterrupted one trains."""

import csv
from pathlib import Path

import pytest
from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.data.batch_warmup import BatchSizeWarmup
from pretrain.objectives.mlm import MaskedLanguageModel
from pretrain.runtime.run import train

pytestmark = pytest.mark.usefixtures("one_thread")

TRAINED: list[tuple[int, list[str]]] = []  # (step, keys) of every micro-batch trained


class KeyRecordingMLM(MaskedLanguageModel):
    """MLM that notes the sample keys of each micro-batch it trains, by optimizer step."""

    def start_batch(self, task, batch, batch_idx) -> None:
        super().start_batch(task, batch, batch_idx)
        TRAINED.append((task.global_step, list(batch["keys"])))


RUN = (
    "objective=mlm",
    f"objective._target_={__name__}.KeyRecordingMLM",
    "data=full_sentences",
    "data.num_workers=0",
    "data.batch_size=4",
    "model.hidden_dropout_prob=0",
    "model.attention_probs_dropout_prob=0",
    "optim.schedule=constant",
    "optim.warmup_steps=2",
    "trainer.log_every_n_steps=1",
)
# 64-token samples: 4 samples a step while under 512 tokens, 8 under 1,024, 12 under 1,536
WARMUP = (
    "data.global_batch_size=16",
    "data.batch_size_warmup_start=4",
    "data.batch_size_warmup_tokens=1536",
)
STEP_SIZES = [4, 4, 8, 12, 16, 16]


def run(shards_dir: Path, run_dir: Path, *extra: str) -> dict[int, list[str]]:
    """Train; returns {step: keys trained in it} of this launch."""
    TRAINED.clear()
    train(compose_config(cpu_run_overrides(shards_dir, run_dir, *RUN, *extra)))
    steps: dict[int, list[str]] = {}
    for step, keys in TRAINED:
        steps.setdefault(step, []).extend(keys)
    return steps


def losses(run_dir: Path) -> dict[int, float]:
    """{step: train/loss} from every CSV log of the run directory."""
    found = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("train/loss"):
                    found[int(row["step"])] = float(row["train/loss"])
    return found


def test_the_schedule_grows_in_multiples_of_the_start():
    warmup = BatchSizeWarmup(4, 16, 1536, 64)
    assert [warmup.global_batch(step) for step in range(6)] == STEP_SIZES
    assert [warmup.samples_before(step) for step in range(7)] == [0, 4, 8, 16, 28, 44, 60]
    big = BatchSizeWarmup(768, 4608, 50_000_000_000, 1024)  # ModernBERT-base's
    sizes = [big.global_batch(step) for step in range(0, 40_000, 100)]
    assert sizes == sorted(sizes) and sizes[0] == 768 and sizes[-1] == 4608
    full = big.level_starts[-1]  # the first full step: the first at or past 50B tokens
    assert big.samples_before(full) * 1024 >= 50_000_000_000
    assert big.samples_before(full - 1) * 1024 < 50_000_000_000


def test_warmup_groups_the_same_samples_into_growing_steps(prepared_corpus, tmp_path):
    warm = run(prepared_corpus, tmp_path / "warm", *WARMUP, "trainer.max_steps=6")
    assert [len(warm[step]) for step in range(6)] == STEP_SIZES
    plain = run(prepared_corpus, tmp_path / "plain", "trainer.max_steps=15")  # 4 a step
    order = [key for step in range(15) for key in plain[step]]
    assert [key for step in range(6) for key in warm[step]] == order[: sum(STEP_SIZES)]
    # the first two steps (4 samples each) are those of the 4-sample run: the same update
    want, got = losses(tmp_path / "plain"), losses(tmp_path / "warm")
    assert [got[0], got[1]] == pytest.approx([want[0], want[1]], abs=1e-5)


def test_a_run_resumed_in_the_warmup_trains_what_an_uninterrupted_one_trains(
    prepared_corpus, tmp_path
):
    whole = run(prepared_corpus, tmp_path / "whole", *WARMUP, "trainer.max_steps=6")
    first = run(prepared_corpus, tmp_path / "parts", *WARMUP, "trainer.max_steps=3")
    second = run(prepared_corpus, tmp_path / "parts", *WARMUP, "trainer.max_steps=6")
    assert sorted(first) == [0, 1, 2] and sorted(second) == [3, 4, 5]
    assert {**first, **second} == whole
    want, got = losses(tmp_path / "whole"), losses(tmp_path / "parts")
    assert sorted(want) == sorted(got) == list(range(6))
    assert [got[s] for s in range(6)] == pytest.approx([want[s] for s in range(6)], abs=1e-5)
