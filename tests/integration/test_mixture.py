"""A mixture of two prepared corpora (`data.sources`, data/mixture.py): each source's share
of every block of samples exactly, the same global order for any ranks and workers, a resume
that seeks each source's partitions, and the refusals."""

from dataclasses import replace

import pytest
from torch.utils.data import DataLoader

from pretrain.config import compose_config
from pretrain.data.stream import EpochStream, rank_sequences
from pretrain.errors import ConfigError
from pretrain.runtime.run import build_stream

pytestmark = pytest.mark.usefixtures("one_thread")


def mixture_spec(help_dir, doc_dir, *overrides, help_share="weight: 0.7", doc="weight: 0.3"):
    sources = (
        f"data.sources=[{{name: help, shards_dir: '{help_dir}', {help_share}}}, "
        f"{{name: docs, shards_dir: '{doc_dir}', {doc}}}]"
    )
    _, spec, _ = build_stream(
        compose_config(
            [
                sources,
                "data.max_seq_length=64",
                "data.batch_size=8",
                "data.mix_block_samples=10",
                "data.stream_partitions=4",
                "data=full_sentences",
                "objective=mlm",
                *overrides,
            ]
        )
    )
    return spec


def source_of(sequence, spec) -> str:
    partition = sequence["mark"].partition
    return next(
        s.name
        for s in spec.sources
        if partition >= s.offset and (partition < s.offset + s.stream_partitions)
    )


def test_every_block_holds_each_sources_share_in_the_one_global_order(
    prepared_corpus, docstring_corpus
):
    spec = mixture_spec(prepared_corpus, docstring_corpus)
    order = list(rank_sequences(spec, 0))
    assert len(order) > 50
    names = [source_of(s, spec) for s in order]
    for start in range(0, len(names) - 10):  # every window of a block: 7 help, 3 docs
        assert names[start : start + 10].count("help") == 7, start
    # a source's samples are its own stream's global order: sample k of partition k mod P
    docs = [s["mark"] for s in order if source_of(s, spec) == "docs"]
    offset = spec.sources[1].offset
    assert [(m.partition - offset, m.number) for m in docs] == [
        (k % 4, k // 4) for k in range(len(docs))
    ]


def keys_and_ids(sequences):
    return [(s["key"], s["input_ids"].tolist()) for s in sequences]


def test_the_global_order_does_not_depend_on_ranks_or_workers(prepared_corpus, docstring_corpus):
    spec = mixture_spec(prepared_corpus, docstring_corpus)
    order = keys_and_ids(rank_sequences(spec, 1))
    for ranks in (2, 3):
        for rank in range(ranks):
            got = keys_and_ids(rank_sequences(replace(spec, rank=rank, world_size=ranks), 1))
            want = order[rank::ranks]
            assert got[: len(want) - 1] == want[: len(got)][: len(want) - 1], (ranks, rank)
    # data-loader workers, each building its share of the micro-batches: the same batches
    single = list(DataLoader(EpochStream(spec, 1), batch_size=None))
    stream = EpochStream(spec, 1, worker_shares=True)
    shared = [b for b in DataLoader(stream, batch_size=None, num_workers=2) if "keys" in b]
    shared.sort(key=lambda b: b["stream_batch"][0] if "stream_batch" in b else 0)
    n = min(len(single), len(shared))  # a worker may stop a batch short of the rank's end
    assert n >= len(single) - 1 > 3
    assert [b["keys"] for b in single[:n]] == [b["keys"] for b in shared[:n]]


def test_a_resume_seeks_each_sources_partitions_and_continues_exactly(
    prepared_corpus, docstring_corpus
):
    from pretrain.data.positions import next_position

    spec = mixture_spec(prepared_corpus, docstring_corpus)
    order = list(rank_sequences(spec, 0))
    for start in (len(order) // 3, len(order) - 7):
        positions = {}
        for sequence in order[:start]:
            positions[sequence["mark"].partition] = next_position(sequence["mark"])
        for ranks in (1, 2):
            for rank in range(ranks):
                shape = replace(spec, rank=rank, world_size=ranks)
                got = keys_and_ids(rank_sequences(shape, 0, start, positions))
                want = keys_and_ids(order[start + rank :: ranks])
                assert got[: len(want)] == want, (start, ranks, rank)


def test_epochs_set_the_shares_by_passes_over_each_sources_tokens(
    prepared_corpus, docstring_corpus
):
    spec = mixture_spec(prepared_corpus, docstring_corpus, help_share="epochs: 1", doc="epochs: 2")
    help_tokens, doc_tokens = (sum(s.shard_tokens) for s in spec.sources)
    share = 2 * doc_tokens / (help_tokens + 2 * doc_tokens)
    assert spec.mix.counts[1] == round(share * 10)


def test_refusals_name_the_key(prepared_corpus, docstring_corpus):
    with pytest.raises(ConfigError, match="data.tokens_per_batch"):
        mixture_spec(prepared_corpus, docstring_corpus, "data.tokens_per_batch=4096")
    with pytest.raises(ConfigError, match="objective.stages"):
        mixture_spec(
            prepared_corpus,
            docstring_corpus,
            "model=modernbert_tiny",
            "model.local_attention=16",
            "+objective.stages=[{until_tokens:768,max_seq_length:32,global_rope_theta:10000},{}]",
        )
    with pytest.raises(ConfigError, match="weight"):
        mixture_spec(prepared_corpus, docstring_corpus, doc="epochs: 1")
    with pytest.raises(ConfigError, match="data.format"):
        mixture_spec(prepared_corpus, docstring_corpus, "data=xlnet_memory")


def test_sources_with_other_tokenizers_are_refused_naming_both(
    prepared_corpus, prepared_chinese_corpus
):
    with pytest.raises(ConfigError, match=r"docs \(.*\) was tokenized .* than help \("):
        mixture_spec(prepared_corpus, prepared_chinese_corpus)


def test_a_run_logs_and_saves_each_sources_samples_and_tokens(
    prepared_corpus, docstring_corpus, tmp_path
):
    """6 steps of 8 samples, blocks of 10 (7 help, 3 docs): the metrics log each source's
    samples as the schedule gives them, tokens summing to train/tokens_seen, and the last
    checkpoint holds them (callback state) with the data module's per-source samples."""
    import csv

    import torch
    from conftest import cpu_run_overrides

    from pretrain.data.mixing import mix_schedule
    from pretrain.runtime.run import train

    sources = (
        f"data.sources=[{{name: help, shards_dir: '{prepared_corpus}', weight: 0.7}}, "
        f"{{name: docs, shards_dir: '{docstring_corpus}', weight: 0.3}}]"
    )
    overrides = cpu_run_overrides(
        prepared_corpus,
        tmp_path / "run",
        sources,
        "data.mix_block_samples=10",
        "objective=mlm",
        "data=full_sentences",
        "trainer.max_steps=6",
        "trainer.log_every_n_steps=1",
    )
    run_dir = train(compose_config(overrides))
    rows = [
        row
        for path in run_dir.glob("csv/version_*/metrics.csv")
        for row in csv.DictReader(path.open())
        if row.get("train/source/help/samples")
    ]
    schedule = mix_schedule(["help", "docs"], [0.7, 0.3], 10)
    assert len(rows) == 6
    for row in rows:
        seen = int(float(row["train/samples_seen"]))
        help_samples, doc_samples = schedule.counts_before(seen)
        assert float(row["train/source/help/samples"]) == help_samples
        assert float(row["train/source/docs/samples"]) == doc_samples
        tokens = float(row["train/source/help/tokens"]) + float(row["train/source/docs/tokens"])
        assert tokens == float(row["train/tokens_seen"])
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    progress = next(v for k, v in state["callbacks"].items() if "ProgressLog" in k)
    assert progress["sources"]["help"][0] == 34 and progress["sources"]["docs"][0] == 14
    data_state = state["PretrainingDataModule"]
    assert data_state["source_samples"] == {"help": 34, "docs": 14}
