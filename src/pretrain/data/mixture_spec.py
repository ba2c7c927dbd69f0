"""A mixture's run-level pieces (`data.sources`): its stream spec, each source opened and
checked as one corpus, and its content hash. Above the data module and the stream, which the
mixture's sampling (`mixture.py`) sits below."""

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pretrain.data.mixing import PhasedMix, mix_schedule, source_shares
from pretrain.data.mixture import SourceStream, source_seed
from pretrain.data.partitions import stream_partitions
from pretrain.errors import ConfigError


def mixture_mix(
    run: Any, names: list[str], shares: list[float], epoch_tokens: int, stage_lengths: Any = None
) -> Any:
    """The mixture's schedule: a `MixSchedule` of `shares` (the sources' own), or, when a
    stage of objective.stages sets `source_weights` ({name: weight}; a source left out gets
    none in that phase), a `PhasedMix` of one schedule per stage (a stage without them: the
    sources' own shares), its phases' starts counted with `stage_lengths` (the corruption's
    `StageLengths`, a context-extension phase) when given. ConfigError naming the key when
    a share rounds to no sample."""
    stages = run.objective.stages or []
    block = run.data.mix_block_samples
    try:
        if not any("source_weights" in stage for stage in stages):
            return mix_schedule(names, shares, block)
        phases = []
        for stage in stages:
            weights = stage.get("source_weights")
            if weights is None:
                phases.append(mix_schedule(names, shares, block))
                continue
            raw = [float(weights.get(name, 0.0)) for name in names]
            phases.append(mix_schedule(names, [w / sum(raw) for w in raw], block))
    except ValueError as error:
        raise ConfigError(f"data.sources: {error}") from error
    until = tuple(int(stage["until_tokens"]) for stage in stages[:-1])
    return PhasedMix(tuple(phases), until, run.data.max_seq_length, epoch_tokens, stage_lengths)


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
        shard_tokens, documents = corpus.manifest.shard_counts(training)
        parts = stream_partitions(run, documents)
        sources.append(
            SourceStream(
                name=config.name,
                offset=offset,
                shard_paths=corpus.manifest.shard_path_table.take(training),
                shard_tokens=shard_tokens,
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
    vocab = opened[0][1].vocab
    data.tokenizer_dir = str(opened[0][1].tokenizer_dir)
    corruption = build_corruption(run, vocab)
    lengths = getattr(corruption, "stage_lengths", None)
    mix = mixture_mix(run, [s.name for s in sources], shares, sum(tokens), lengths)
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
    corpora (their manifests' content_sha256), and a mix per phase's counts and ends, so a
    relaunch onto other sources or another mix is seen."""
    held = [
        (s.name, count, s.content_sha256)
        for s, count in zip(spec.sources, spec.mix.counts, strict=True)
    ]
    if isinstance(spec.mix, PhasedMix):
        held.append(([phase.counts for phase in spec.mix.phases], spec.mix.until_tokens))
    return hashlib.sha256(repr(held).encode()).hexdigest()
