"""Any number of ranks without planning (issue 54 item 4): the default partitioning serves
world sizes that do not divide it (512 ranks of 64 partitions, 3 ranks), the ranks' streams
tiling the one global order, so a run resumes exactly on any number of ranks."""

from dataclasses import replace

import pytest

from pretrain.config import compose_config
from pretrain.data.partitions import DEFAULT_STREAM_PARTITIONS
from pretrain.data.stream import check_world_size, rank_sequences
from pretrain.errors import ConfigError
from pretrain.runtime.run import build_stream


def stream_spec(shards_dir, *overrides):
    _, spec, _ = build_stream(
        compose_config([f"data.shards_dir={shards_dir}", "data.max_seq_length=64", *overrides])
    )
    return spec


def keys(sequences) -> list[str]:
    return [s["key"] for s in sequences]


@pytest.mark.parametrize(("ranks", "some"), [(512, (0, 1, 63, 64, 100, 511)), (3, (0, 1, 2))])
def test_ranks_that_do_not_divide_the_partitions_tile_the_global_order(
    prepared_corpus, ranks, some
):
    spec = stream_spec(prepared_corpus)
    assert spec.stream_partitions % ranks, "the case of a world size the partitions miss"
    whole = keys(rank_sequences(spec, 0))  # one rank: the global order
    for rank in some:
        mine = keys(rank_sequences(replace(spec, rank=rank, world_size=ranks), 0))
        expected = whole[rank::ranks]
        assert mine[: len(expected)] == expected, rank  # the same up to the global end
        assert len(mine) >= len(expected)


def test_a_resume_on_512_ranks_continues_the_global_order(prepared_corpus):
    """From a position reached on another shape (global sample `start`, a third of the
    epoch), rank 7 of 512 takes samples start + 7, start + 519, ... of the same order. (The
    epoch's length varies between preparations of the corpus, 955-1056 sequences: documents'
    keys name their input file, whose temporary path sets the shuffle; a fixed start of 1000
    left rank 7 nothing to take in some sessions.)"""
    spec = stream_spec(prepared_corpus)
    whole = keys(rank_sequences(spec, 0))
    start = len(whole) // 3
    mine = keys(rank_sequences(replace(spec, rank=7, world_size=512), 0, start))
    expected = whole[start + 7 :: 512]
    assert expected and mine[: len(expected)] == expected


def test_the_default_is_the_one_the_corpus_allows(prepared_corpus):
    assert stream_spec(prepared_corpus).stream_partitions <= DEFAULT_STREAM_PARTITIONS


def test_token_budgets_still_need_ranks_that_divide_the_partitions(prepared_corpus):
    spec = replace(stream_spec(prepared_corpus), tokens_per_batch=4096, world_size=3)
    with pytest.raises(ConfigError, match="data.stream_partitions"):
        check_world_size(spec)
