"""XLNet's memory stream on canonical partitions (data.format=xlnet_memory): one partition per
memory slot of the global batch, so every global memory row gets the same consecutive
segments whatever the ranks, accumulation and data-loader workers (`stream.memory_rows`)."""

from dataclasses import replace

import pytest
from torch.utils.data import DataLoader

from pretrain.config import ConfigError, compose_config, validate
from pretrain.data.stream import EpochStream, memory_rows
from pretrain.runtime.run import build_stream

STEPS = 12
MICRO_BATCH = 4  # rows per rank and forward pass
REUSE = 16


def memory_spec(shards_dir, *overrides):
    overrides = [
        "experiment=xlnet_demo", f"data.shards_dir={shards_dir}", "data.global_batch_size=8",
        f"data.batch_size={MICRO_BATCH}", "data.max_seq_length=48", f"model.reuse_len={REUSE}",
        *overrides,
    ]  # fmt: skip
    return build_stream(compose_config(overrides))[1]


def global_rows(spec, ranks: int, accumulation: int, workers: int, bi_data: bool) -> dict:
    """{(step, global memory row): (key, new_document, token ids)} of the first STEPS
    optimizer steps, read as `ranks` ranks with `accumulation` micro-batches each."""
    rows = {}
    for rank in range(ranks):
        layout = memory_rows(rank, ranks, accumulation, MICRO_BATCH, bi_data)
        stream = EpochStream(replace(spec, rank=rank, world_size=ranks), 0)
        loader = DataLoader(stream, batch_size=None, num_workers=workers)
        for n, batch in zip(range(STEPS * accumulation), loader, strict=False):
            step, phase = divmod(n, accumulation)
            for i, row in enumerate(layout[phase].tolist()):
                ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
                rows[(step, row)] = (batch["keys"][i], bool(batch["new_document"][i]), ids)
    return rows


@pytest.mark.parametrize("bi_data", [False, True])
def test_each_slot_gets_the_same_segments_on_one_rank_accumulating_and_on_two(
    prepared_corpus, bi_data
):
    """1 rank x 2 accumulated micro-batches and 2 ranks x 1 (with 2 data-loader workers) give
    every global memory row the same segment at every step, and a row's segment t + 1
    continues segment t (reuse_len tokens further in its document) or starts a document."""
    spec = memory_spec(prepared_corpus, f"model.bi_data={str(bi_data).lower()}")
    assert spec.stream_partitions == (4 if bi_data else 8)  # one per slot of the global batch
    one = global_rows(spec, ranks=1, accumulation=2, workers=0, bi_data=bi_data)
    two = global_rows(spec, ranks=2, accumulation=1, workers=2, bi_data=bi_data)
    assert len(one) == STEPS * 8 and one == two
    for (step, row), (key, new_document, _) in one.items():
        document, offset = key.rsplit("@", 1)
        assert document.endswith("/backward") == (bi_data and row >= 4)
        if new_document:
            assert offset == "0"
        else:
            before, before_offset = one[(step - 1, row)][0].rsplit("@", 1)
            assert (before, int(before_offset) + REUSE) == (document, int(offset))
    assert sum(new for _, new, _ in one.values()) > 8  # slots move on to new documents


def test_memory_rows_of_all_ranks_cover_the_global_batch_once():
    """Every shape's rows (rank, micro-batch, row) are a permutation of the global rows; with
    bi_data row b + batch/2 is row b's slot read backward (its row + slots)."""
    for ranks, accumulation in [(1, 4), (2, 2), (4, 1)]:
        rows = [memory_rows(r, ranks, accumulation, 4, bi_data=True) for r in range(ranks)]
        assert sorted(int(x) for r in rows for x in r.flatten()) == list(range(16))
        for r in rows:
            assert (r[:, 2:] == r[:, :2] + 8).all()


def test_stream_partitions_must_be_the_memory_slots():
    base = ["experiment=xlnet_demo", "data.batch_size=4", "data.global_batch_size=8"]
    assert validate(compose_config([*base, "data.stream_partitions=8"]))
    with pytest.raises(ConfigError, match="data.stream_partitions = 64: .* null or 8"):
        validate(compose_config([*base, "data.stream_partitions=64"]))
    with pytest.raises(ConfigError, match="data.stream_partitions = 8: .* null or 4"):
        validate(compose_config([*base, "data.stream_partitions=8", "model.bi_data=true"]))


def test_bi_data_memory_resumed_with_another_micro_batch(prepared_corpus, tmp_path):
    """bi_data (a slot is a forward and a backward row), global batch 16: 2 steps of 8 x 2
    accumulated micro-batches, resumed from their checkpoint as 4 x 4: every later step's
    loss equals (1e-5) an uninterrupted 4 x 4 run's, so each row got its own slot's segments
    and memory back. Weights held (lr 1e-12): the shapes group rows differently."""
    import csv

    import torch

    from pretrain.runtime.run import train

    def run(run_dir, batch_size: int, *extra: str) -> list[float]:
        overrides = [
            "experiment=xlnet_demo", f"data.shards_dir={prepared_corpus}", f"run_dir={run_dir}",
            "logger=csv", "trainer.enable_progress_bar=false", "data.num_workers=0",
            "data.global_batch_size=16", f"data.batch_size={batch_size}",
            "data.max_seq_length=48", f"model.reuse_len={REUSE}", "model.mem_len=16",
            "model.bi_data=true", "model.dropout=0.0", "optim.optimizer.lr=1e-12",
            "optim.schedule=constant", "optim.warmup_steps=2",
            "trainer.checkpoint_every_n_steps=2", "trainer.log_every_n_steps=1", *extra,
        ]  # fmt: skip
        train(compose_config(overrides))
        with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
            return [float(r["train/plm_loss"]) for r in csv.DictReader(f) if r["train/plm_loss"]]

    whole = run(tmp_path / "whole", 4, "trainer.max_steps=5")
    run(tmp_path / "first", 8, "trainer.max_steps=2")
    checkpoint = tmp_path / "first" / "checkpoints" / "last.ckpt"
    memory = torch.load(checkpoint, weights_only=True)["xlnet_memory"]
    assert memory["mask"].shape[0] == 16  # 8 slots, forward and backward rows
    resumed = run(tmp_path / "second", 4, "trainer.max_steps=5", f"resume={checkpoint}")
    assert resumed == pytest.approx(whole[2:], abs=1e-5)


def test_a_corpus_too_small_for_the_slots_is_refused(prepared_corpus):
    """300 documents make at most 37 slots of 8 documents each: 64 slots are refused."""
    with pytest.raises(ConfigError, match="data.global_batch_size: xlnet_memory's 64 memory"):
        memory_spec(prepared_corpus, "data.global_batch_size=64")
