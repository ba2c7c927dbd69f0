"""The resume matrix: a run continued by a chain of launches trains, at every step, what one
uninterrupted launch trains there (the same samples, and losses equal to 1e-5), on 2 CPU ranks.

Each cell is one configuration (objective, strategy, accumulation) and one chain of stops:
- `max_steps`: the launch ends at trainer.max_steps (its final checkpoint), in mid-epoch or
  exactly at an epoch's last step;
- `sigterm`: a preemption signal arrives during an optimizer step (with accumulation: at its
  first micro-batch, inside the accumulation); the run saves at the step's end and stops;
and every launch after the first resumes (resume=auto) from the newest checkpoint. Stops land
in mid-epoch, at an epoch end, in the epoch after an epoch-end resume (a second save), and the
last launch crosses another epoch end. The schedule is constant after a short warm-up, so the
learning rate does not depend on max_steps (a decaying one: tests/integration/test_extend_run.py).

Cells, a subset of objective x strategy x accumulation in which every objective, strategy,
accumulation and kind of stop appears (15 launches in all): MLM on ZeRO-2 with accumulation
(stops: max_steps mid-epoch, then a signal inside an accumulation after an epoch end);
SOP (a pair objective) on DDP without accumulation (epoch end, then a signal); XLNet's memory
stream on DDP with accumulation (a signal inside an accumulation, then the epoch end), and
reshaped from 1 rank to 2 with the same global batch; MLM on a mixture of two corpora
(data.sources) on DDP (max_steps mid-epoch, then a signal), and reshaped with a stop at an
epoch end. Reshaped MLM chains: the micro-batch and
accumulation, the ranks and the data-loader workers changed at each launch (resume=auto),
every step holding the samples, `train/samples_seen` and the loss (1e-3) of one launch.
"""

import csv
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import cpu_run_overrides
from dist_helpers import read_records
from zygote import recorded_launch

GUARD_S = 1800  # a launch that would hang fails the test after this long (a guard, not a timer)
RANKS = 2

RECORDING = (
    "optim.schedule=constant",
    "optim.warmup_steps=2",
    "trainer.log_every_n_steps=1",
    "trainer.checkpoint_every_n_steps=1000",
    "data.max_seq_length=128",
    "data.batch_size=16",
)
NO_DROPOUT = (  # a step's loss depends on the weights, samples and masks only
    "model.hidden_dropout_prob=0",
    "model.attention_probs_dropout_prob=0",
    # half of bert_tiny's width: a step costs a third (what is tested is the order, the
    # masks and the state carried across launches, not the model's size)
    "model.hidden_size=64",
    "model.intermediate_size=256",
)
MLM = (
    *NO_DROPOUT,
    "objective=mlm",
    "objective._target_=dist_helpers.RecordingMLM",
    "data=full_sentences",
)
SOP = (
    *NO_DROPOUT,
    "objective=sop",
    "objective._target_=dist_helpers.RecordingMLM",
    "data=segment_pair",
)
XLNET = (
    "model=xlnet_tiny",
    "model.dropout=0",
    "objective=xlnet",
    "objective._target_=dist_helpers.RecordingXLNet",
    "data=xlnet_memory",
    "data.max_seq_length=96",
    "data.batch_size=8",
    "model.reuse_len=64",  # epochs of ~22 steps: one partition (~9 documents) per slot of 32
)


def launch(
    shards_dir: Path, run_dir: Path, *extra: str, env: dict | None = None, ranks: int = RANKS
):
    """`pretrain` on `ranks` CPU processes; records go to `<run_dir>-records`."""
    overrides = cpu_run_overrides(shards_dir, run_dir, *RECORDING, *extra)
    return recorded_launch([*overrides, f"trainer.devices={ranks}"], run_dir, env, timeout=GUARD_S)


def steps(records: dict[int, list[dict]]) -> dict[int, list[tuple[int, list[str], float]]]:
    """{rank: [(step, keys, loss) of every micro-batch, in order]}."""
    return {
        rank: [(e["step"], e["keys"], e["loss"]) for e in entries if "step" in e]
        for rank, entries in records.items()
    }


def epoch_ends(stdout: str) -> list[int]:
    """The steps at which the run's epochs ended, from its log."""
    return [int(m) for m in re.findall(r"epoch \d+ ends at step (\d+)", stdout)]


def run_chain(shards_dir: Path, tmp_path: Path, config: tuple, total: int, stops) -> None:
    """Train `total` steps in one launch, then in a chain of launches: `stops(ends)` (`ends`:
    the steps where the whole run's epochs ended) gives each launch's stop, ("max_steps", N)
    or ("sigterm", N) (a signal to rank 1 in step N: it saves after step N and exits 75); a
    last launch trains to `total`. Every micro-batch of every rank must match."""
    whole = launch(shards_dir, tmp_path / "whole", *config, f"trainer.max_steps={total}")
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-5000:]
    ends = epoch_ends(whole.stdout)
    assert len(ends) == 2 and ends[1] < total, ends  # the chain crosses two epoch ends
    for kind, step in [*stops(ends), ("max_steps", total)]:
        env = {}
        if kind == "sigterm":
            env = {"PRETRAIN_TEST_SIGTERM_STEP": str(step), "PRETRAIN_TEST_SIGTERM_RANK": "1"}
            step = total
        result = launch(
            shards_dir, tmp_path / "parts", *config, f"trainer.max_steps={step}", env=env
        )
        status = 75 if kind == "sigterm" else 0
        assert result.returncode == status, result.stdout[-3000:] + result.stderr[-5000:]
    want = read_records(tmp_path / "whole-records")
    got = read_records(tmp_path / "parts-records")
    for rank in range(RANKS):
        got_steps, want_steps = steps(got)[rank], steps(want)[rank]
        assert [s for s, _, _ in got_steps] == [s for s, _, _ in want_steps], (rank, ends)
        for (step, keys, loss), (_, want_keys, want_loss) in zip(
            got_steps, want_steps, strict=True
        ):
            assert keys == want_keys, (rank, step, ends)
            assert loss == pytest.approx(want_loss, abs=1e-5), (rank, step, ends)
        last, reference = got[rank][-1], want[rank][-1]  # the weights at the end, too
        assert last["param_checksum"] == pytest.approx(reference["param_checksum"], rel=1e-6)
        assert last["loaders"][-1] == reference["loaders"][-1]


@pytest.mark.slow
def test_mlm_zero2_accumulation(prepared_corpus, tmp_path):
    """ZeRO-2, 2 micro-batches per step: max_steps in mid-epoch 0, then a launch that crosses
    the end of epoch 0 and gets a signal at the first micro-batch of a step in epoch 1
    (inside the accumulation). A stop exactly at an epoch end: test_sop_ddp."""
    run_chain(
        prepared_corpus,
        tmp_path,
        (*MLM, "strategy=deepspeed_zero2", "data.global_batch_size=64"),
        total=15,
        stops=lambda ends: [("max_steps", 3), ("sigterm", ends[0] + 1)],
    )


@pytest.mark.slow
def test_sop_ddp(prepared_corpus, tmp_path):
    """A pair objective on DDP without accumulation: max_steps at the end of epoch 0, then a
    signal in mid-epoch 1."""
    run_chain(
        prepared_corpus,
        tmp_path,
        (*SOP, "strategy=ddp"),
        total=36,
        stops=lambda ends: [("max_steps", ends[0]), ("sigterm", ends[0] + 2)],
    )


def mixture(help_dir: Path, docs_dir: Path) -> tuple[str, ...]:
    """data.sources of two corpora, 70/30 in blocks of 10 samples."""
    sources = (
        f"data.sources=[{{name: help, shards_dir: '{help_dir}', weight: 0.7}}, "
        f"{{name: docs, shards_dir: '{docs_dir}', weight: 0.3}}]"
    )
    return (sources, "data.mix_block_samples=10")


def source_samples(run_dir: Path) -> dict[int, tuple[float, float]]:
    """{step: (train/source/help/samples, train/source/docs/samples)} of every launch (CSV)."""
    seen = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        for row in csv.DictReader(path.open()):
            if row.get("train/source/help/samples"):
                help_samples = float(row["train/source/help/samples"])
                seen[int(row["step"])] = (help_samples, float(row["train/source/docs/samples"]))
    return seen


@pytest.mark.slow
def test_mlm_mixture_ddp(prepared_corpus, docstring_corpus, tmp_path):
    """A mixture of two corpora (data.sources, 70/30 in blocks of 10) on DDP: max_steps in
    mid-epoch 0, then a signal in mid-epoch 1; each launch seeks every source's partitions,
    and every step logs the per-source samples of one launch. An epoch-end resume of a
    mixture: test_mlm_mixture_reshaped_resume."""
    run_chain(
        prepared_corpus,
        tmp_path,
        (*MLM, "strategy=ddp", *mixture(prepared_corpus, docstring_corpus)),
        total=40,
        stops=lambda ends: [("max_steps", 5), ("sigterm", ends[0] + 2)],
    )
    whole = source_samples(tmp_path / "whole")
    assert len(whole) == 40 and source_samples(tmp_path / "parts") == whole


@pytest.mark.slow
def test_xlnet_memory_ddp_accumulation(prepared_corpus, tmp_path):
    """XLNet's memory, carried across micro-batches and launches, 2 micro-batches per step: a
    signal inside the accumulation in mid-epoch 0, then max_steps at the end of epoch 0."""
    run_chain(
        prepared_corpus,
        tmp_path,
        (*XLNET, "strategy=ddp", "data.global_batch_size=32"),
        total=46,
        stops=lambda ends: [("sigterm", 2), ("max_steps", ends[0])],
    )


@pytest.mark.slow
def test_xlnet_memory_reshaped_from_one_rank_to_two(prepared_corpus, tmp_path):
    """XLNet's memory across a reshape with the same global batch (32 slots): 3 steps on 1 rank
    (4 accumulated micro-batches), then 2 ranks (2 each) from its checkpoint: every later
    micro-batch of every rank has the segments and the loss (1e-5) of an uninterrupted 2-rank
    run, so each slot's segments and memory continue. The weights are held (lr 1e-12): the two
    shapes group the rows into micro-batches differently, which would change the updates."""
    config = (*XLNET, "strategy=ddp", "data.global_batch_size=32", "optim.optimizer.lr=1e-12")
    whole = launch(prepared_corpus, tmp_path / "whole", *config, "trainer.max_steps=7")
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-5000:]
    parts = tmp_path / "parts"
    first = launch(prepared_corpus, parts, *config, "trainer.max_steps=3", ranks=1)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
    second = launch(prepared_corpus, parts, *config, "trainer.max_steps=7")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-5000:]
    assert "Resuming from" in second.stdout
    want, got = (
        steps(read_records(tmp_path / "whole-records")),
        steps(read_records(parts.parent / "parts-records")),
    )
    early = sorted(key for s, keys, _ in got[0] if s < 3 for key in keys)
    assert early == sorted(key for r in want for s, keys, _ in want[r] if s < 3 for key in keys)
    for rank in range(RANKS):
        later = [entry for entry in got[rank] if entry[0] >= 3]
        reference = [entry for entry in want[rank] if entry[0] >= 3]
        assert [s for s, _, _ in later] == [s for s, _, _ in reference] == [3, 3, 4, 4, 5, 5, 6, 6]
        for (step, keys, loss), (_, want_keys, want_loss) in zip(later, reference, strict=True):
            assert keys == want_keys, (rank, step)
            assert loss == pytest.approx(want_loss, abs=1e-5), (rank, step)


def step_losses(records: dict[int, list[dict]]) -> dict[int, tuple[list[str], float]]:
    """{step: (sorted sample keys of all ranks' micro-batches, the step's loss)}: the mean of
    the micro-batches' losses weighed by their predicted tokens, the mean over the step's."""
    sums: dict[int, list] = {}
    for entries in records.values():
        for e in entries:
            if "step" in e:
                keys, weighed, tokens = sums.setdefault(e["step"], [[], 0.0, 0])
                sums[e["step"]] = [
                    keys + e["keys"],
                    weighed + e["loss"] * e["tokens"],
                    tokens + e["tokens"],
                ]
    return {step: (sorted(k), w / t) for step, (k, w, t) in sums.items()}


def samples_seen(run_dir: Path) -> dict[int, float]:
    """{step: train/samples_seen} logged by every launch of `run_dir` (CSV)."""
    seen = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        for row in csv.DictReader(path.open()):
            if row.get("train/samples_seen"):
                seen[int(row["step"])] = float(row["train/samples_seen"])
    return seen


# (ranks, micro-batch, data-loader workers, stop) of each launch; global batch 32 throughout
RESHAPES = [(2, 16, 0, 3), (2, 8, 0, 5), (1, 16, 2, 7), (2, 4, 2, 9)]


@pytest.mark.slow
def test_mlm_reshaped_resume(prepared_corpus, tmp_path):
    """A run of global batch 32 continued by launches of another shape (resume=auto): 2 ranks
    of 16, then of 8 (accumulation 2), then 1 rank of 16 x 2 with 2 data-loader workers, then
    2 ranks of 4 x 4 with 2 workers. Every step holds the samples of one uninterrupted 2-rank
    launch of 16, logs its `train/samples_seen`, and has its loss within 1e-3 (dropout off;
    grouping the rows otherwise moves the sums in the last bits)."""
    reshaped_chain(prepared_corpus, tmp_path, (*MLM, "strategy=ddp"), 9, lambda ends: RESHAPES)


@pytest.mark.slow
def test_mlm_mixture_reshaped_resume(prepared_corpus, docstring_corpus, tmp_path):
    """A mixture (70/30 in blocks of 10) of global batch 32, one chain for an epoch-end and a
    reshaped resume: 2 ranks of 16 to step 3, then 1 rank of 8 x 4 to the end of epoch 0
    (step 18), then 2 ranks of 8 x 2 with 2 data-loader workers into epoch 1: every step holds
    the samples, loss, `train/samples_seen` and per-source samples of one 2-rank launch."""
    mix = (*MLM, "strategy=ddp", *mixture(prepared_corpus, docstring_corpus))
    ends = reshaped_chain(
        prepared_corpus,
        tmp_path,
        mix,
        total=21,
        reshapes=lambda ends: [(2, 16, 0, 3), (1, 8, 0, ends[0]), (2, 8, 2, 21)],
    )
    assert 3 < ends[0] < 21
    whole = source_samples(tmp_path / "whole")
    assert len(whole) == 21 and source_samples(tmp_path / "parts") == whole


def reshaped_chain(
    shards_dir: Path, tmp_path: Path, config: tuple, total: int, reshapes: Callable
) -> list[int]:
    """One launch of `config` (global batch 32, 2 ranks of 16) to step `total`, and a chain
    of launches of (ranks, micro-batch, workers, stop) each, `reshapes(ends)` (`ends`: the
    steps where that launch's epochs ended), the last stopping at `total`: every step holds
    the same samples, loss (1e-3) and `train/samples_seen`. Returns `ends`."""
    config = (*config, "data.global_batch_size=32")
    whole = launch(shards_dir, tmp_path / "whole", *config, f"trainer.max_steps={total}")
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-5000:]
    ends = epoch_ends(whole.stdout)
    parts = tmp_path / "parts"
    for ranks, micro, workers, stop in reshapes(ends):
        shape = (f"data.batch_size={micro}", f"data.num_workers={workers}")
        result = launch(
            shards_dir, parts, *config, *shape, f"trainer.max_steps={stop}", ranks=ranks
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    want = step_losses(read_records(tmp_path / "whole-records"))
    got = step_losses(read_records(tmp_path / "parts-records"))
    assert sorted(got) == sorted(want) == list(range(total))
    for step in range(total):
        assert got[step][0] == want[step][0], step  # the same samples
        assert got[step][1] == pytest.approx(want[step][1], abs=1e-3), step
    seen = samples_seen(parts)
    assert seen == samples_seen(tmp_path / "whole") == {s: 32.0 * (s + 1) for s in range(total)}
    return ends
