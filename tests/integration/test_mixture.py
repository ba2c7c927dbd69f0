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


def check_resumes_at(spec, order, starts) -> None:
    """Resumed at each of `starts` (the partitions' positions after order[:start]), on 1 and
    2 ranks, every rank's sequences continue epoch 0's `order` from there, dealt by rank."""
    from pretrain.data.positions import next_position

    for start in starts:
        positions = {}
        for sequence in order[:start]:
            positions[sequence["mark"].partition] = next_position(sequence["mark"])
        for ranks in (1, 2):
            for rank in range(ranks):
                shape = replace(spec, rank=rank, world_size=ranks)
                got = keys_and_ids(rank_sequences(shape, 0, start, positions))
                want = keys_and_ids(order[start + rank :: ranks])
                assert got[: len(want)] == want, (start, ranks, rank)


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

    spec = mixture_spec(prepared_corpus, docstring_corpus)
    order = list(rank_sequences(spec, 0))
    check_resumes_at(spec, order, (len(order) // 3, len(order) - 7))


def test_an_epoch_of_two_sources_decodes_each_shared_shard_once(prepared_corpus, docstring_corpus):
    """The sources' 6 + 38 shards are each read by several partitions, in turn across the
    sources: each source's decoded shards are held apart (`reading.decoded_shard`)."""
    from pretrain.data.reading import decoded_shard

    spec = mixture_spec(prepared_corpus, docstring_corpus)
    decoded_shard.cache_clear()
    assert len(list(rank_sequences(spec, 0))) > 1000
    info = decoded_shard.cache_info()
    assert info.hits > 0 and info.misses == info.currsize <= len(spec.shard_paths)


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
    with pytest.raises(ConfigError, match=r"objective.stages\[1\].source_weights.*names no"):
        mixture_spec(prepared_corpus, docstring_corpus, stages(last="{web: 1}"))
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


def test_a_source_over_http_reads_the_samples_of_its_local_copy(
    prepared_corpus, docstring_corpus, tmp_path
):
    """The docstrings source served over HTTP (storage_servers.FaultyHTTPServer, a 500 on every
    third request) through the shard cache: the mixture's global order, samples and tokens,
    is the one read with both sources local."""
    from storage_servers import FaultyHTTPServer

    local = mixture_spec(prepared_corpus, docstring_corpus)
    server = FaultyHTTPServer(docstring_corpus).start()
    try:
        server.faults.fail_every = 3
        remote = mixture_spec(prepared_corpus, server.url, f"data.cache_dir={tmp_path / 'cache'}")
        assert remote.sources[1].storage is not None and remote.sources[0].storage is None
        got = keys_and_ids(rank_sequences(remote, 1))
    finally:
        server.stop()
    want = keys_and_ids(rank_sequences(local, 1))
    assert len(want) > 50 and got == want


def stages(first: str = "{help: 0.7, docs: 0.3}", last: str = "{help: 0.2, docs: 0.8}") -> str:
    """objective.stages of a mix per phase: `first` for 1,536 tokens (24 samples of 64), then
    `last`, which also masks 10% (a stage's corruption setting beside its mix)."""
    return (
        f"+objective.stages=[{{until_tokens: 1536, source_weights: {first}}}, "
        f"{{mlm_probability: 0.1, source_weights: {last}}}]"
    )


def test_a_mix_per_phase_changes_the_shares_at_the_stage_and_resumes_in_mid_phase(
    prepared_corpus, docstring_corpus
):
    from pretrain.data.mixture import mixture_progress
    from pretrain.data.reading import MARKS_KEY

    spec = mixture_spec(prepared_corpus, docstring_corpus, stages())
    order = list(rank_sequences(spec, 0))
    assert len(order) > 80
    names = [source_of(s, spec) for s in order]
    assert names[:20].count("help") == 14  # 70/30 before sample 24 (1,536 / 64 tokens)
    for start in range(24, len(names) - 10):  # 20/80 in every window after it
        assert names[start : start + 10].count("help") == 2, start
    marks = [s["mark"] for s in order]
    progress = mixture_progress(spec, marks, 0)  # what the stages' corruption keys to
    tokens = sum(spec.shard_tokens)
    assert progress.tolist() == [min(64 * i, tokens) for i in range(len(order))]
    batch = next(iter(EpochStream(spec, 0)))
    assert MARKS_KEY in batch and len(batch["keys"]) == 8
    check_resumes_at(spec, order, (50,))  # in the second phase
    # a source left out of a phase, and one only in the second (mmBERT's decay phase)
    spec = mixture_spec(prepared_corpus, docstring_corpus, stages("{help: 1}", "{docs: 1}"))
    names = [source_of(s, spec) for s in rank_sequences(spec, 0)]
    assert set(names[:24]) == {"help"} and set(names[24:]) == {"docs"}


def test_a_context_extension_stage_over_a_mixture_keeps_each_phases_mix_and_resumes(
    prepared_corpus, docstring_corpus
):
    """A first stage of 32-token samples (768 tokens: 24 samples) at 70/30, then 64 tokens
    at 20/80: each partition packs its sequences to the length of their global sample."""
    from pretrain.data.mixture import mixture_progress

    short = "until_tokens: 768, max_seq_length: 32, global_rope_theta: 10000"
    spec = mixture_spec(
        prepared_corpus,
        docstring_corpus,
        "model=modernbert_tiny",
        "model.local_attention=16",
        f"+objective.stages=[{{{short}, source_weights: {{help: 0.7, docs: 0.3}}}}, "
        "{source_weights: {help: 0.2, docs: 0.8}}]",
    )
    order = list(rank_sequences(spec, 0))
    assert len(order) > 80
    names = [source_of(s, spec) for s in order]
    assert names[:20].count("help") == 14
    for start in range(24, len(names) - 10):
        assert names[start : start + 10].count("help") == 2, start
    lengths = [len(s["input_ids"]) for s in order]
    assert max(lengths[:24]) == 32 and min(lengths[24:40]) > 32  # packed to its stage's length
    tokens = sum(spec.shard_tokens)
    want = [32 * i if i < 24 else min(768 + 64 * (i - 24), tokens) for i in range(len(order))]
    assert mixture_progress(spec, [s["mark"] for s in order], 0).tolist() == want
    check_resumes_at(spec, order, (10, 50))  # in mid-phase, each phase


def test_a_run_stopped_in_mid_phase_logs_each_phases_shares(
    prepared_corpus, docstring_corpus, tmp_path
):
    """4 steps of 8 samples (the mix changes at sample 24, in step 3), then a resume to 6:
    every step logs the per-source samples of the phased schedule."""
    import csv

    from conftest import cpu_run_overrides

    from pretrain.runtime.run import train

    sources = (
        f"data.sources=[{{name: help, shards_dir: '{prepared_corpus}', weight: 0.7}}, "
        f"{{name: docs, shards_dir: '{docstring_corpus}', weight: 0.3}}]"
    )
    run_dir = tmp_path / "run"
    for steps in (4, 6):
        overrides = cpu_run_overrides(
            prepared_corpus,
            run_dir,
            sources,
            stages(),
            "data.mix_block_samples=10",
            "objective=mlm",
            "data=full_sentences",
            f"trainer.max_steps={steps}",
            "trainer.log_every_n_steps=1",
            "optim.schedule=constant",  # the resume trains on (a decay would end at step 4)
        )
        train(compose_config(overrides))
    _, spec, _ = build_stream(compose_config(overrides))
    mix = spec.mix.of_epoch(0)
    logged = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        for row in csv.DictReader(path.open()):
            if row.get("train/source/help/samples"):
                counts = (row["train/source/help/samples"], row["train/source/docs/samples"])
                logged[int(row["step"])] = tuple(float(c) for c in counts)
    assert logged == {step: mix.counts_before(8 * (step + 1)) for step in range(6)}
    assert logged[2] == (17, 7)  # samples 0 .. 23 at 70/30 (blocks of 10, then 0 1 0 0)
    assert (logged[5][0] - 17, logged[5][1] - 7) == (5, 19)  # 24 at 20/80 (then 1 1 0 1)
