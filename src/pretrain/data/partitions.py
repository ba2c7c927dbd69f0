"""The canonical partitions of a run's stream: how many, from the run config and the corpus.

The global sample order depends on the seed and the partitions only, never on nodes, ranks
or workers (`stream.py`). XLNet's memory format (data.format=xlnet_memory) reads one
partition per memory slot of the global batch; other formats take data.stream_partitions
(null: `DEFAULT_STREAM_PARTITIONS`), made to fit the corpus. `run` below is a typed run
config (`pretrain.config.TrainConfig`, validated), named in docstrings: the config sits above
data in the layers. Imports nothing heavy at its top (the config's schema reads its default).
"""

from typing import Any

from pretrain.errors import ConfigError, require

DEFAULT_STREAM_PARTITIONS = 64  # data.stream_partitions: null, for formats without memory
MIN_SLOT_DOCUMENTS = 8  # training documents per XLNet memory slot, on average


def stream_partitions(run: Any, documents: int) -> int:
    """The canonical partitions of the run's stream on a corpus of `documents` training
    documents: XLNet's memory slots (`memory_partitions`; ConfigError when the corpus has
    fewer than MIN_SLOT_DOCUMENTS documents a slot: an epoch ends when the first slot's
    partition runs out), else data.stream_partitions (null: DEFAULT_STREAM_PARTITIONS) made
    to fit the corpus (`reading.effective_partitions`)."""
    from pretrain.data.reading import effective_partitions

    slots = memory_partitions(run)
    if slots is None:
        requested = run.data.stream_partitions or DEFAULT_STREAM_PARTITIONS
        return effective_partitions(requested, documents)
    if documents < MIN_SLOT_DOCUMENTS * slots:
        raise ConfigError(
            f"data.global_batch_size: xlnet_memory's {slots} memory slots (one canonical "
            f"partition each) need at least {MIN_SLOT_DOCUMENTS} training documents a slot, "
            f"the corpus {run.data.shards_dir} has {documents}; lower data.global_batch_size "
            "(or data.batch_size), or use a larger corpus"
        )
    return slots


def memory_partitions(run: Any) -> int | None:
    """The canonical partitions of XLNet's memory format (data.format=xlnet_memory): one per
    memory slot of the global batch, so a slot reads one partition's consecutive segments and
    a step's global batch holds one segment of every partition (`data/stream.py`): the global
    batch size in samples, half of it with model.bi_data (a slot is a forward and a backward
    row). None for other formats. ConfigError naming the keys when data.stream_partitions is
    another number (null: derived), with model.bi_data and an odd data.batch_size, or with
    data.tokens_per_batch."""
    from pretrain.data.input_formats import INPUT_FORMATS

    data = run.data
    if not INPUT_FORMATS[data.format].memory:
        return None
    bi_data = bool(getattr(run.model, "bi_data", False))
    require(
        data.tokens_per_batch is None,
        "data.tokens_per_batch",
        data.tokens_per_batch,
        "xlnet_memory keeps a memory per batch slot and needs fixed batches; set it to null",
    )
    require(
        not bi_data or data.batch_size % 2 == 0,
        "data.batch_size",
        data.batch_size,
        "must be even with model.bi_data (half of each batch is read forward, half backward)",
    )
    batch = run.batch_plan.global_batch_size
    slots = batch // 2 if bi_data else batch
    require(
        data.stream_partitions in (None, slots),
        "data.stream_partitions",
        data.stream_partitions,
        f"xlnet_memory reads one partition per memory slot: must be null or {slots} (the "
        f"global batch of {batch} samples, data.global_batch_size or data.batch_size x "
        "accumulation x ranks; halved with model.bi_data)",
    )
    return slots
