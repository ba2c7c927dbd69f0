"""Each data-loader worker builds only its share of a rank's batches (issue 54 item 2): the
batches a `StepAlignedLoader` hands out, their order, masks, stream marks and the epoch's
tail are those of one worker reading everything."""

from dataclasses import replace
from itertools import islice

import pytest
import torch

from pretrain.config import compose_config
from pretrain.data.loader import (
    STREAM_BATCH_KEY,
    StepAlignedLoader,
    in_stream_order,
    is_end_of_epoch,
)
from pretrain.data.stream import EpochStream, rank_sequences, worker_batches, worker_partitions
from pretrain.runtime.run import build_stream


def stream_spec(shards_dir, *overrides):
    _, spec, _ = build_stream(
        compose_config([f"data.shards_dir={shards_dir}", "data.max_seq_length=64", *overrides])
    )
    return spec


def served(spec, workers, start=0, accumulation=1):
    """(batches, tail samples, drained samples) of a rank's loader with `workers` workers."""
    loader = StepAlignedLoader(
        EpochStream(spec, 0, start, errors_as_batches=True),
        accumulation=accumulation,
        full_batch=spec.batch_size,
        num_workers=workers,
        generator=torch.Generator().manual_seed(0),
    )
    batches = list(loader)
    assert is_end_of_epoch(batches[-1])
    return batches[:-1], loader.tail_samples, loader.drain(len(batches) - 1)


def same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a["keys"] == b["keys"]
        assert a.keys() == b.keys()
        for name, value in a.items():
            if isinstance(value, torch.Tensor):  # dtypes too: workers send them slimmed
                assert value.dtype == b[name].dtype and torch.equal(value, b[name]), name


@pytest.mark.parametrize(
    ("batch_size", "ranks", "workers"), [(8, 1, 2), (4, 2, 2), (8, 1, 3), (3, 2, 2)]
)
def test_workers_shares_give_the_batches_of_one_reader(prepared_corpus, batch_size, ranks, workers):
    """Disjoint shares (batch x workers divides the rank's partitions: 8 x 2 of 16, 4 x 2 of
    8) and shared partitions (3 workers; batches of 3) alike: the same batches, in order, to
    the same end and tail as with one worker reading them all."""
    spec = stream_spec(
        prepared_corpus, f"data.batch_size={batch_size}", "data.stream_partitions=16"
    )
    for rank in range(ranks):
        rank_spec = replace(spec, rank=rank, world_size=ranks)
        want = served(rank_spec, 0)
        got = served(rank_spec, workers)
        same_batches(got[0], want[0])
        assert got[1:] == want[1:]


def test_a_resume_with_shares_continues_the_same_batches(prepared_corpus):
    spec = stream_spec(prepared_corpus, "data.batch_size=8", "data.stream_partitions=16")
    start = 5 * spec.batch_size
    same_batches(served(spec, 2, start)[0], served(spec, 0, start)[0])


def test_disjoint_shares_when_batch_times_workers_divides_the_rank_partitions(prepared_corpus):
    """16 partitions, 1 rank, batches of 8: worker 0 reads 0-7, worker 1 reads 8-15; with
    batches of 16 both need all of them."""
    spec = replace(stream_spec(prepared_corpus), stream_partitions=16)
    assert worker_partitions(spec, 0, 8, 0, 2) == set(range(8))
    assert worker_partitions(spec, 0, 8, 1, 2) == set(range(8, 16))
    ranked = replace(spec, rank=1, world_size=2)  # partitions 1, 3, ..., 15
    assert worker_partitions(ranked, 0, 4, 0, 2) == {1, 3, 5, 7}
    assert worker_partitions(spec, 0, 16, 1, 2) == set(range(16))


def round_robin(generators):
    """What DataLoader's in-order iterator hands over from workers' streams: one each in
    turn, a worker that ends left out from then on."""
    active = list(generators)
    while active:
        for generator in list(active):
            batch = next(generator, None)
            if batch is None:
                active.remove(generator)
            else:
                yield batch


@pytest.mark.parametrize(
    ("ranks", "samples", "workers", "start"),
    [(1, 8, 2, 0), (1, 5, 3, 7), (3, 2, 2, 0), (3, 3, 4, 11), (2, 1, 3, 5)],
)
def test_shares_in_round_robin_are_the_ranks_batches(
    prepared_corpus, ranks, samples, workers, start
):
    """In one process: every rank's workers' shares, handed over as DataLoader does and put
    in order, are `rank_sequences` cut in batches, to the same end (ranks that divide the 16
    partitions or not, shared partitions, a resumed start)."""
    spec = replace(stream_spec(prepared_corpus), stream_partitions=16)
    for rank in range(ranks):
        rank_spec = replace(spec, rank=rank, world_size=ranks)
        sequences = rank_sequences(rank_spec, 0, start)
        want = []
        while batch := list(islice(sequences, samples)):
            want.append([s["key"] for s in batch])
        shares = [
            (
                {"keys": [s["key"] for s in batch], STREAM_BATCH_KEY: (number, last)}
                for number, batch, last in worker_batches(rank_spec, 0, samples, w, workers, start)
            )
            for w in range(workers)
        ]
        got = [batch["keys"] for batch in in_stream_order(round_robin(shares))]
        assert got == want, (rank, len(got), len(want))
