"""A mixture of prepared corpora (`data.sources`) as one exact, elastic stream.

Each source is a full stream of its own (its shards, its canonical partitions, its order
keyed by (seed, source name, epoch)), and the mixture's global sample i is source s's k-th
sample of its own global order, (s, k) = `MixSchedule.locate(i)` (`data/mixing.py`): a
function of the shares and the sources' sizes only, so ranks (samples r, r + R, ... of the
mixed order, as for one corpus), data-loader workers and the batch size change nothing.
Source s's partition p is partition `offset_s + p` of the mixture, in marks and checkpoint
positions alike; a resume seeks each source's partitions as one corpus's
(`stream.partition_sequences`), and the per-source samples consumed follow from the
mixture's (`MixSchedule.counts_before`).

A source that runs out ends the epoch: the epoch stops at the first global sample whose
source's partition is used up (every rank at the same place, as for one corpus), and the
next epoch reshuffles every source. So a source whose share outruns its size (a high
`weight`, or more `epochs` than the others) sets the epoch's length and is read once per
epoch, the others in part, a new draw each epoch: over a run of max_steps each source is
seen at its share. objective.stages work on the mixture's global order (a sample's progress
counts its global index i, `mixture_progress`), and a stage may set its own mix
(`source_weights`: `mixing.PhasedMix`), and its own sequence length (a context-extension
phase: source s's partition p packs its n-th sequence to the stage's length of global sample
`index_of(s, n x P_s + p)`). Not supported (refused in one line): token-budget batches and
XLNet's memory stream (data_schema.py).
"""

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from pretrain.data.mixing import row_sources
from pretrain.data.positions import MARK_COLUMNS, PartitionPosition


@dataclass(frozen=True)
class SourceStream:
    """One source of a mixture's `StreamSpec` (picklable): its name, its first partition's
    number in the mixture, and the stream settings that differ from the mixture's."""

    name: str
    offset: int
    shard_paths: Any  # a `ShardPaths`
    shard_tokens: tuple[int, ...]
    stream_partitions: int
    seed: int
    content_sha256: str  # its manifest's (`Manifest.content_sha256`)
    storage: Any = None  # a `StorageSpec` for a corpus at a URL


def source_seed(seed: int, name: str) -> int:
    """The seed of source `name`'s own order: the run's, keyed by the name (so adding a
    source leaves the others' orders as they were)."""
    return (seed << 32) | zlib.crc32(name.encode())


def source_spec(spec: Any, source: SourceStream) -> Any:
    """The one-corpus `StreamSpec` of `source` within the mixture's `spec`."""
    return replace(
        spec,
        shard_paths=source.shard_paths,
        shard_tokens=source.shard_tokens,
        stream_partitions=source.stream_partitions,
        seed=source.seed,
        storage=source.storage,
        sources=(),
        mix=None,
    )


def mixture_taker(
    spec: Any,
    epoch: int,
    start_sample: int,
    resume: dict[int, PartitionPosition] | None,
    partition_sequences: Callable,
) -> Callable[[int], dict | None]:
    """take(i): the mixture's global sample i (>= start_sample, rising), None when its
    source's partition is used up. A partition is opened when first asked for (a worker
    reads only those its batches draw from), sought to its checkpoint position when that
    agrees with `start_sample`, else read from the epoch's start and its samples before
    `start_sample` skipped. `partition_sequences`: the stream's (`stream.py` passes it: the
    mixture sits below the stream)."""
    from itertools import islice

    mix = spec.mix.of_epoch(epoch)  # a `MixSchedule`, or a `PhasedMix`'s `EpochMix`
    locate = mix.locate
    specs = [source_spec(spec, source) for source in spec.sources]
    offsets = [source.offset for source in spec.sources]
    parts = [one.stream_partitions for one in specs]
    before = mix.counts_before(start_sample)
    lengths = getattr(spec.corruption, "stage_lengths", None)
    tokens = sum(spec.shard_tokens)  # every source's: T of the stages' progress
    # by the partition's number in the mixture (offsets[s] + p): its stream, once opened,
    # and the number in its partition of the stream's next sequence
    streams: list[Iterator[dict] | None] = [None] * spec.stream_partitions
    numbers = [0] * spec.stream_partitions

    def opened(s: int, p: int) -> Iterator[dict]:
        used = max(0, -(-(before[s] - p) // parts[s]))  # its samples before start_sample
        position = (resume or {}).get(offsets[s] + p)
        length = None
        if lengths is not None:  # a context-extension stage: by the sample's global index
            length = partial(_sample_length, lengths, mix.index_of, s, p, parts[s], epoch, tokens)
        if position is not None and position.samples == used:
            sequences = partition_sequences(specs[s], epoch, p, position, offsets[s] + p, length)
        else:
            sequences = partition_sequences(specs[s], epoch, p, None, offsets[s] + p, length)
            sequences = islice(sequences, used, None)
        numbers[offsets[s] + p] = used
        return iter(sequences)

    def take(i: int) -> dict | None:
        s, k = locate(i)
        n, p = divmod(k, parts[s])
        g = offsets[s] + p  # the partition's number in the mixture, in its marks too
        stream = streams[g]
        if stream is None:
            stream = streams[g] = opened(s, p)
        skip = n - numbers[g]  # its samples of other ranks' or workers' batches
        numbers[g] = n + 1
        return next(stream if skip == 0 else islice(stream, skip, None), None)

    return take


def _sample_length(
    lengths: Any, index_of: Callable, s: int, p: int, parts: int, epoch: int, tokens: int, n: int
) -> int:
    """Tokens of source `s`'s partition `p`'s (of `parts`) n-th sequence under a
    context-extension stage: its stage's length (`StageLengths`) as the mixture's global
    sample index_of(s, n x parts + p) of the epoch (of `tokens` tokens)."""
    return lengths.length_of(index_of(s, n * parts + p), epoch, tokens)


def mixture_progress(spec: Any, marks: np.ndarray, epoch: int) -> np.ndarray:
    """(rows,) int64: each row's training progress in tokens, e x T + min(i x L, T)
    (`stages.sample_progress_tokens`), i its global sample index in the mixture: its
    source's k-th sample (k = number x P_s + p from its mark) is `index_of(s, k)`. `marks`:
    (rows, 8) int64; L = data.max_seq_length, T = every source's training tokens; under a
    context-extension stage, `StageLengths.progress` of i."""
    marks = np.asarray(marks)
    mix = spec.mix.of_epoch(epoch)
    epoch_tokens = sum(spec.shard_tokens)
    index = np.empty(len(marks), np.int64)
    for row, (s, mark) in enumerate(zip(row_sources(spec, marks), marks, strict=True)):
        source = spec.sources[s]
        p = int(mark[MARK_COLUMNS["partition"]]) - source.offset
        k = int(mark[MARK_COLUMNS["number"]]) * source.stream_partitions + p
        index[row] = mix.index_of(int(s), k)
    lengths = getattr(spec.corruption, "stage_lengths", None)
    if lengths is not None:  # a context-extension stage: samples of other lengths
        return lengths.progress(index, epoch, epoch_tokens)
    return epoch * epoch_tokens + np.minimum(index * spec.max_seq_length, epoch_tokens)
