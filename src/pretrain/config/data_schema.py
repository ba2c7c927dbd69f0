"""The run config's `data` section: where the shards are and how documents become batches.

Types, defaults and the checks of its own values (a check that needs another section lives
with the component that owns it, run by `pretrain.config.validation.validate_run`).
"""

from dataclasses import dataclass, field
from typing import Any

from pretrain.data.partitions import DEFAULT_STREAM_PARTITIONS
from pretrain.errors import require, require_unit_interval


@dataclass
class SourceConfig:
    """One corpus of a mixture (`data.sources`): a prepared corpus (a directory or URL) and
    its share of the samples, as `weight` (normalized over the sources) or `epochs` (passes
    over it per mixed epoch, i.e. a share in proportion to epochs x its tokens); one of the
    two. data/mixture.py says what happens when a source runs out."""

    name: str = ""
    shards_dir: str = ""
    weight: float | None = None
    epochs: float | None = None

    def __post_init__(self) -> None:
        key = f"data.sources[{self.name or '?'}]"
        require(bool(self.name), f"{key}.name", self.name, "must name the source")
        require(bool(self.shards_dir), f"{key}.shards_dir", self.shards_dir, "must be set")
        require(
            (self.weight is None) != (self.epochs is None),
            f"{key}.weight",
            self.weight,
            "set exactly one of weight (share of the samples) and epochs (passes per epoch)",
        )
        share = self.weight if self.weight is not None else self.epochs
        require(share > 0, f"{key}.weight", share, "must be positive")


@dataclass
class DataConfig:
    """Where the shards are and how documents become batches. Lengths in tokens."""

    format: str = "segment_pair"
    shards_dir: str = "data/builtin"
    tokenizer_dir: str | None = None
    max_seq_length: int = 128
    short_seq_probability: float = 0.1
    nsp_random_probability: float = 0.5
    batch_size: int = 32
    num_workers: int = 0
    shuffle_buffer_documents: int = 1000
    random_document_pool: int = 100
    holdout_shards: int = 0
    # Canonical partitions of every epoch's stream: the global sample order depends on them
    # and on the seed only, never on nodes, ranks or workers; ranks must divide it.
    # null: derived, one per memory slot of the global batch for xlnet_memory, else 64.
    stream_partitions: int | None = DEFAULT_STREAM_PARTITIONS
    # Samples per optimizer step over all ranks; null = batch_size x accumulation x ranks.
    # When set, trainer.accumulate_grad_batches is derived from it (pretrain.batching).
    global_batch_size: int | None = None
    # Batches by token budget instead (RoBERTa): about this many tokens per optimizer step
    # over all ranks, in micro-batches of a varying number of sequences (data/stream.py);
    # null = batches of data.batch_size sequences. Excludes global_batch_size.
    tokens_per_batch: int | None = None
    # Batch-size warm-up (ModernBERT; pretrain/data/batch_warmup.py): the global batch starts
    # at batch_size_warmup_start samples and grows in multiples of it to global_batch_size
    # over the first batch_size_warmup_tokens tokens; null = the full batch from the start.
    batch_size_warmup_tokens: int | None = None
    batch_size_warmup_start: int | None = None
    # Packed rows (full_sentences) carry each token's document (document_ids, batch x seq),
    # and the model attends within a document only, positions restarting at each (ModernBERT).
    document_masks: bool = False
    # Read every shard whole and check it (sha256, blocks, counts) before training starts.
    verify_shards: bool = False
    # A shard that fails its checks, or repeats another shard's content (the manifest's
    # sha256 of shards and blocks): `error` stops the run naming it; `skip` leaves it out of
    # the epoch (every rank alike), with a warning line per shard and a count.
    bad_shards: str = "error"
    # A corpus at a URL (s3://, gs://, az://, hf://, http(s)://) is read through a local cache
    # (pretrain.storage): its directory (null: node-local $TMPDIR/pretrain-cache-<user>,
    # shared by the ranks of a node), its limit in bytes (null: unbounded; least recently used
    # shards evicted, never one in use), shards fetched ahead of each reader, attempts per
    # download (backoff with jitter between), and fsspec's options (endpoint_url, profile...;
    # keep secrets in the environment, as this config is saved with every checkpoint).
    cache_dir: str | None = None
    cache_limit: int | None = None
    prefetch_shards: int = 8
    download_attempts: int = 5
    storage_options: dict[str, Any] = field(default_factory=dict)
    # A mixture of prepared corpora (data/mixture.py): empty = the one corpus at shards_dir
    # (then read, else ignored); each global block of mix_block_samples samples holds every
    # source's share, rounded, in a fixed order (data/mixing.py).
    sources: list[SourceConfig] = field(default_factory=list)
    mix_block_samples: int = 1000

    def __post_init__(self) -> None:
        from pretrain.data.input_formats import INPUT_FORMATS  # torch: only when validated

        require(
            self.cache_limit is None or self.cache_limit > 0,
            "data.cache_limit",
            self.cache_limit,
            "must be a positive number of bytes, or null (unbounded)",
        )
        require(
            self.prefetch_shards >= 0,
            "data.prefetch_shards",
            self.prefetch_shards,
            "must be 0 or more",
        )
        require(
            self.download_attempts >= 1,
            "data.download_attempts",
            self.download_attempts,
            "must be at least 1",
        )

        require(
            self.format in INPUT_FORMATS,
            "data.format",
            self.format,
            f"must be one of {', '.join(INPUT_FORMATS)}",
        )
        require(
            self.max_seq_length >= 8,
            "data.max_seq_length",
            self.max_seq_length,
            "must be at least 8",
        )
        require_unit_interval(
            "data.short_seq_probability", self.short_seq_probability, open_low=False
        )
        require_unit_interval("data.nsp_random_probability", self.nsp_random_probability)
        require(self.batch_size >= 1, "data.batch_size", self.batch_size, "must be at least 1")
        require(self.num_workers >= 0, "data.num_workers", self.num_workers, "must be 0 or more")
        require(
            self.shuffle_buffer_documents >= 1,
            "data.shuffle_buffer_documents",
            self.shuffle_buffer_documents,
            "must be at least 1",
        )
        require(
            self.bad_shards in ("error", "skip"),
            "data.bad_shards",
            self.bad_shards,
            "must be error or skip",
        )
        require(
            self.stream_partitions is None or self.stream_partitions >= 1,
            "data.stream_partitions",
            self.stream_partitions,
            "must be at least 1",
        )
        require(
            self.random_document_pool >= 1,
            "data.random_document_pool",
            self.random_document_pool,
            "must be at least 1",
        )
        require(
            self.global_batch_size is None or self.global_batch_size >= 1,
            "data.global_batch_size",
            self.global_batch_size,
            "must be at least 1, or null (batch_size x accumulation x ranks)",
        )
        require(
            self.tokens_per_batch is None or self.tokens_per_batch >= self.max_seq_length,
            "data.tokens_per_batch",
            self.tokens_per_batch,
            "must be at least data.max_seq_length, or null (batches of data.batch_size)",
        )
        require(
            self.tokens_per_batch is None or self.global_batch_size is None,
            "data.tokens_per_batch",
            self.tokens_per_batch,
            "sets the batch in tokens: leave data.global_batch_size null with it",
        )
        self.check_batch_size_warmup()
        self.check_sources()

    def check_sources(self) -> None:
        """data.sources: unique names, weights or epochs alike, and only where a mixture is
        supported (not token-budget batches or XLNet's memory stream)."""
        from pretrain.data.input_formats import INPUT_FORMATS

        require(
            self.mix_block_samples >= 1,
            "data.mix_block_samples",
            self.mix_block_samples,
            "must be at least 1",
        )
        if not self.sources:
            return
        self.sources = [  # a saved config's plain dicts (checkpoint.relaunch) become typed
            s if isinstance(s, SourceConfig) else SourceConfig(**s) for s in self.sources
        ]
        names = [source.name for source in self.sources]
        require(len(set(names)) == len(names), "data.sources", names, "must have distinct names")
        kinds = {source.weight is None for source in self.sources}
        require(
            len(kinds) == 1,
            "data.sources",
            names,
            "give every source a weight, or every source epochs, not both kinds",
        )
        require(
            self.tokens_per_batch is None,
            "data.tokens_per_batch",
            self.tokens_per_batch,
            "is not supported with data.sources (a mixture counts samples); set it to null",
        )
        require(
            not INPUT_FORMATS[self.format].memory,
            "data.format",
            self.format,
            "keeps a memory per batch slot, which data.sources cannot mix; use one corpus",
        )

    def check_batch_size_warmup(self) -> None:
        """data.batch_size_warmup_*: both set or both null; the start divides the full
        global batch (set explicitly), and batches are counted in samples."""
        tokens, start = self.batch_size_warmup_tokens, self.batch_size_warmup_start
        if tokens is None and start is None:
            return
        require(
            tokens is not None and tokens >= 1,
            "data.batch_size_warmup_tokens",
            tokens,
            "must be a positive number of tokens when data.batch_size_warmup_start is set",
        )
        require(
            self.global_batch_size is not None and start is not None and start >= 1,
            "data.batch_size_warmup_start",
            start,
            "must be a positive number of samples, with data.global_batch_size set (the full "
            "batch the warm-up grows to)",
        )
        require(
            self.global_batch_size % start == 0,
            "data.batch_size_warmup_start",
            start,
            f"must divide data.global_batch_size ({self.global_batch_size}): the batch grows "
            "in whole multiples of it",
        )
