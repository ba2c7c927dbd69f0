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
seen at its share. Not supported (refused in one line): token-budget batches, XLNet's memory
stream (data_schema.py) and objective.stages (`check_mixture_objective`).
"""

import hashlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pretrain.data.mixing import MixSchedule, mix_schedule, source_shares
from pretrain.data.partitions import stream_partitions
from pretrain.data.positions import PartitionPosition
from pretrain.errors import ConfigError

SOURCE_KEY = "source_rows"  # (batch,) int64: each row's source in a mixture's batches


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
) -> Callable[[int], dict | None]:
    """take(i): the mixture's global sample i (>= start_sample, rising), None when its
    source's partition is used up. A partition is opened when first asked for (a worker
    reads only those its batches draw from), sought to its checkpoint position when that
    agrees with `start_sample`, else read from the epoch's start and its samples before
    `start_sample` skipped."""
    from itertools import islice

    from pretrain.data.stream import partition_sequences

    mix: MixSchedule = spec.mix
    specs = [source_spec(spec, source) for source in spec.sources]
    before = mix.counts_before(start_sample)
    streams: dict[tuple[int, int], Iterator[dict]] = {}
    numbers: dict[tuple[int, int], int] = {}

    def opened(s: int, p: int) -> Iterator[dict]:
        source, parts = spec.sources[s], specs[s].stream_partitions
        used = max(0, -(-(before[s] - p) // parts))  # its samples before start_sample
        position = (resume or {}).get(source.offset + p)
        if position is not None and position.samples == used:
            sequences = partition_sequences(specs[s], epoch, p, position)
        else:
            sequences = islice(partition_sequences(specs[s], epoch, p), used, None)
        numbers[s, p] = used
        return (
            sequence | {"mark": sequence["mark"]._replace(partition=source.offset + p)}
            for sequence in sequences
        )

    def take(i: int) -> dict | None:
        s, k = mix.locate(i)
        parts = specs[s].stream_partitions
        p, n = k % parts, k // parts
        if (s, p) not in streams:
            streams[s, p] = opened(s, p)
        skip = n - numbers[s, p]  # its samples of other ranks' or workers' batches
        numbers[s, p] = n + 1
        return next(islice(streams[s, p], skip, None), None)

    return take


def row_sources(spec: Any, marks: Any) -> Any:
    """(rows,) int64: the source (its index in spec.sources) of each row, from the rows'
    marks ((rows, 7) int64, `positions.StreamMark` a row: the partition is column 0)."""
    import numpy as np

    offsets = np.asarray([source.offset for source in spec.sources])
    return np.searchsorted(offsets, np.asarray(marks)[:, 0], side="right").astype(np.int64) - 1


def source_samples(spec: Any, samples: int) -> dict[str, int]:
    """{source name: its samples among the mixture's first `samples` global samples}; {}
    for one corpus."""
    if not getattr(spec, "sources", ()):
        return {}
    return dict(zip(spec.mix.names, spec.mix.counts_before(samples), strict=True))


def check_mixture_objective(run: Any, corruption: Any) -> None:
    """ConfigError naming the key where the objective needs what a mixture lacks: the
    stage schedule's progress and lengths are counted in one corpus's samples."""
    if getattr(corruption, "uses_progress", False) or getattr(corruption, "stage_lengths", None):
        raise ConfigError(
            "objective.stages: a stage schedule is not supported with data.sources (its "
            "progress counts one corpus's samples); drop the stages or train on one corpus"
        )


def mixture_stream_spec(run: Any, build_corruption: Callable) -> Any:
    """The `StreamSpec` of the typed run's `data.sources`: each source opened and checked
    as one corpus (`open_corpus`: its manifest, shards and tokenizer; data.holdout_shards
    and data.bad_shards apply to each), all with the first source's tokenizer (ConfigError
    naming both sources otherwise), the mixture's shard paths and tokens the sources' in
    order, its partitions theirs one after another. `build_corruption(run, vocab)` makes
    the objective's corruption. Local paths become absolute in `run.data.sources`."""
    from pathlib import Path

    from pretrain.data.datamodule import open_corpus, split_holdout, unrepeated_shards
    from pretrain.data.reading import stream_spec
    from pretrain.data.shard_table import ShardPaths
    from pretrain.storage import local_path

    data = run.data
    opened, sources, offset = [], [], 0
    for config in data.sources:
        corpus = open_corpus(config.shards_dir, data.tokenizer_dir, data)
        if corpus.storage is None:
            config.shards_dir = str(Path(local_path(config.shards_dir)).resolve())
        if opened and corpus.manifest.tokenizer_sha256 != opened[0][1].manifest.tokenizer_sha256:
            first = opened[0][0]
            raise ConfigError(
                f"data.sources: {config.name} ({config.shards_dir}) was tokenized with another "
                f"tokenizer than {first.name} ({first.shards_dir}); prepare both with one"
            )
        training = range(len(split_holdout(corpus, data.holdout_shards)[0]))
        training = unrepeated_shards(corpus.manifest, training, data.bad_shards)
        shards = [corpus.manifest.shards[i] for i in training]
        parts = stream_partitions(run, sum(shard["documents"] for shard in shards))
        sources.append(
            SourceStream(
                name=config.name,
                offset=offset,
                shard_paths=ShardPaths([str(corpus.manifest.shard_paths[i]) for i in training]),
                shard_tokens=tuple(shard["tokens"] for shard in shards),
                stream_partitions=parts,
                seed=source_seed(run.seed, config.name),
                content_sha256=corpus.manifest.content_sha256,
                storage=corpus.storage,
            )
        )
        opened.append((config, corpus))
        offset += parts
    tokens = [sum(source.shard_tokens) for source in sources]
    shares = source_shares(
        [c.weight for c in data.sources], [c.epochs for c in data.sources], tokens
    )
    try:
        mix = mix_schedule([s.name for s in sources], shares, data.mix_block_samples)
    except ValueError as error:
        raise ConfigError(f"data.sources: {error}") from error
    vocab = opened[0][1].vocab
    data.tokenizer_dir = str(opened[0][1].tokenizer_dir)
    corruption = build_corruption(run, vocab)
    check_mixture_objective(run, corruption)
    spec = stream_spec(
        run,
        shard_paths=tuple(path for s in sources for path in s.shard_paths),
        shard_tokens=tuple(t for s in sources for t in s.shard_tokens),
        stream_partitions=offset,
        vocab=vocab,
        corruption=corruption,
    )
    return replace(spec, sources=tuple(sources), mix=mix)


def mixture_sha256(spec: Any) -> str:
    """Hex sha256 of what a mixture holds: its sources' names, counts per block and
    corpora (their manifests' content_sha256), so a relaunch onto other sources is seen."""
    held = [
        (s.name, count, s.content_sha256)
        for s, count in zip(spec.sources, spec.mix.counts, strict=True)
    ]
    return hashlib.sha256(repr(held).encode()).hexdigest()
