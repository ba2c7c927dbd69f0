"""The reading steps every input format shares: which documents a reader (a canonical
partition) reads in an epoch and from which position
(a seek), a partition's shuffled chunks, the shuffle buffer, collation of sequences into a
padded batch and the conversion of a corrupted batch to tensors.

How an epoch's documents are split among R readers: shard order is shuffled per epoch
(keyed by (seed, epoch)); every shard counts as `units` = ceil(UNITS_PER_READER x R / shards)
units of equal tokens, and units are dealt in the epoch's order to the reader with the fewest
tokens so far (the manifest's token counts), so readers' planned shares differ by at most one
unit. A shard dealt to several readers is read by each of them and split document by
document in proportion to their units (`read_split`). Shares thus differ by about a unit plus
a document per shared shard, whatever the shard sizes, which keeps the tail an epoch drops
at its end small (`data/loader.py`). With one reader, every document is read in the epoch's
shard order. When there are fewer shards than UNITS_PER_READER x R, shards are read by
several readers: prepare a large corpus with enough shards to avoid that.
"""

import functools
import heapq
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pretrain.data.corpus_cache import corpus_lru
from pretrain.data.keyed_rng import STREAM_SHARD_ORDER, STREAM_SHUFFLE
from pretrain.data.shard_blocks import block_documents
from pretrain.data.shard_format import (
    ShardError,
    block_token_counts,
    checked_blocks,
    document_token_counts,
    read_documents,
)
from pretrain.data.shard_table import ShardPaths, ShardSharing
from pretrain.data.stages import PROGRESS_KEY, sample_progress_tokens
from pretrain.data.vocab import Vocabulary
from pretrain.errors import write_line

if TYPE_CHECKING:  # the storage layer is imported only for a corpus at a URL
    from pretrain.storage import StorageSpec

Corruption = Callable[[dict, int], dict]
UNITS_PER_READER = 32
MARKS_KEY = "stream_marks"  # (batch, 8) int64: a `positions.StreamMark` a row


@dataclass(frozen=True)
class StreamSpec:
    """Everything a data-loader worker needs to rebuild the stream (picklable); built from
    the typed run config by `stream_spec`, so its settings have no defaults of their own
    (the config's schema holds them). `shard_tokens`: tokens per shard (manifest), used to
    balance readers; empty = equal. `rank`, `world_size` and `accumulation` are the process's
    place, set by the data module (`datamodule.py`) once the trainer knows them."""

    shard_paths: Sequence[str]  # a `ShardPaths` (compact) from `stream_spec`
    vocab: Vocabulary
    corruption: Corruption
    format: str
    max_seq_length: int
    batch_size: int
    seed: int
    short_seq_probability: float
    nsp_random_probability: float
    pair_task: str
    shuffle_buffer_documents: int
    random_document_pool: int
    shard_tokens: tuple[int, ...]
    stream_partitions: int
    masking: str  # the objective's: static = dupe_factor copies of the masks
    dupe_factor: int
    bad_shards: str  # error | skip (data.bad_shards)
    tokens_per_batch: int | None  # a token budget per optimizer step (stream.py)
    document_masks: bool  # packed rows carry "document_ids" (data.document_masks)
    storage: "StorageSpec | None" = None  # a corpus at a URL; None: local paths
    rank: int = 0
    world_size: int = 1
    accumulation: int = 1  # micro-batches per optimizer step (with tokens_per_batch)
    # a mixture of corpora (data.sources, `data/mixture.py`): its sources (`SourceStream`s)
    # and schedule (`mixing.MixSchedule`); () and None for one corpus
    sources: tuple = ()
    mix: Any = None

    def mask_epoch(self, epoch: int) -> int:
        """The epoch that seeds the corruption's draws: the epoch itself (dynamic masking) or
        its copy among dupe_factor (static, BERT's dupe_factor copies of the data)."""
        return epoch % self.dupe_factor if self.masking == "static" else epoch


def stream_spec(
    run: Any,
    *,
    shard_paths: tuple[str, ...],
    shard_tokens: tuple[int, ...],
    stream_partitions: int,
    vocab: Vocabulary,
    corruption: Corruption,
    storage: "StorageSpec | None" = None,
) -> StreamSpec:
    """The `StreamSpec` of a typed run config (`run`: a TrainConfig): the data section's
    settings, the objective's masking, dupe_factor and sentence task (`pair_task`), the run's
    seed; the corpus's shard paths, tokens per shard and canonical partitions, its vocabulary,
    the objective's corruption and (a corpus at a URL) its storage as given."""
    data, objective = run.data, run.objective
    return StreamSpec(
        shard_paths=ShardPaths(shard_paths),
        vocab=vocab,
        corruption=corruption,
        format=data.format,
        max_seq_length=data.max_seq_length,
        batch_size=data.batch_size,
        seed=run.seed,
        short_seq_probability=data.short_seq_probability,
        nsp_random_probability=data.nsp_random_probability,
        pair_task=objective.sentence_task,
        shuffle_buffer_documents=data.shuffle_buffer_documents,
        random_document_pool=data.random_document_pool,
        shard_tokens=shard_tokens,
        stream_partitions=stream_partitions,
        masking=objective.masking,
        dupe_factor=objective.dupe_factor,
        bad_shards=data.bad_shards,
        tokens_per_batch=data.tokens_per_batch,
        document_masks=data.document_masks,
        storage=storage,
    )


def worker_role() -> tuple[int, int]:
    """(this data-loader worker's id, number of workers); DataLoader asks workers for batches
    round-robin from worker 0."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 0, 1
    return info.id, info.num_workers


def shard_sharing(spec: StreamSpec, epoch: int, readers: int) -> ShardSharing:
    """For each shard in the epoch's order: its index and {reader: units of it} (as compact
    arrays, `ShardSharing`), deterministic in (seed, epoch, readers); see the module
    docstring. Computed once per process (every partition of a rank asks), read-only."""
    return _shard_sharing(spec.seed, epoch, readers, len(spec.shard_paths), spec.shard_tokens)


@functools.lru_cache(maxsize=8)
def _shard_sharing(
    seed: int, epoch: int, readers: int, shards: int, shard_tokens: tuple[int, ...]
) -> ShardSharing:
    order = np.random.default_rng([seed, epoch, STREAM_SHARD_ORDER]).permutation(shards)
    units = max(1, math.ceil(UNITS_PER_READER * readers / max(1, len(order))))
    tokens = shard_tokens or (1,) * len(order)
    loads = np.zeros(readers)
    sharing: dict[int, dict[int, int]] = {}
    for index in order:
        share = sharing.setdefault(int(index), {})
        for _ in range(units):
            reader = int(np.argmin(loads))  # the first of the least loaded
            share[reader] = share.get(reader, 0) + 1
            loads[reader] += tokens[index] / units
    return ShardSharing(list(sharing.items()))


Position = tuple[int, int]  # (index in the epoch's shard order, document index in that shard)


def read_split(
    spec: StreamSpec, epoch: int, reader: int, readers: int, start: Position = (0, 0)
) -> Iterator[tuple[Position, dict]]:
    """(position, document) of `reader`'s (of `readers`) documents in this epoch, in the
    epoch's shard order, from position `start` on: shards before it are not read, blocks
    before it in its shard not decoded (a seek). A shard shared by several readers is split
    document by document (`shard_owners`), and each sharer builds only its own documents."""
    start_order, start_document = start
    table = shard_sharing(spec, epoch, readers)
    mine = [o for o in table.places(reader).tolist() if o >= start_order]
    for place, order in enumerate(mine):
        index, share = table[order]
        first = start_document if order == start_order else 0
        ahead = mine[place + 1 : place + 1 + spec_prefetch(spec)]
        prefetch(spec, epoch, [(o, int(table.order[o])) for o in ahead])
        if spec.storage is not None:  # fetched, checked and held in the node's cache; read whole
            from pretrain.storage import StorageError, hold_shard

            try:
                hold_shard(spec.storage, os.path.basename(spec.shard_paths[index]))
            except StorageError as error:  # a network failure stops the run under any bad_shards:
                raise ShardError(str(error)) from error  # ranks would not agree on what to skip
        if len(share) == 1:
            for number, document in enumerate(shard_documents(spec, index, first), first):
                yield (order, number), document
            continue
        path, sharing = spec.shard_paths[index], tuple(sorted(share.items()))
        wanted = shard_owners(path, sharing, spec.bad_shards) == reader
        numbers = np.flatnonzero(wanted[first:]) + first
        documents = shard_documents(spec, index, first, wanted)
        yield from (((order, int(n)), d) for n, d in zip(numbers, documents, strict=True))


def first_shards(spec: StreamSpec, epoch: int, reader: int, readers: int) -> list[tuple[int, int]]:
    """(place in the epoch's shard order, shard index) of the first shard `reader` (of
    `readers`) reads in this epoch; none when it reads none."""
    places = shard_sharing(spec, epoch, readers).places(reader)
    order = shard_sharing(spec, epoch, readers).order
    return [(int(places[0]), int(order[places[0]]))] if len(places) else []


def spec_prefetch(spec: StreamSpec) -> int:
    """Shards a reader fetches ahead (data.prefetch_shards): 0 for local shards."""
    return spec.storage.prefetch_shards if spec.storage is not None else 0


def prefetch(spec: StreamSpec, epoch: int, upcoming: list[tuple[int, int]]) -> None:
    """Start fetching the shards of `upcoming` ((place in the epoch's shard order, shard
    index) of the reader's next ones) of a remote corpus in the background, the earliest
    in the epoch first whichever reader asks; nothing for local shards."""
    if spec.storage is not None and upcoming:
        from pretrain.storage import prefetcher

        wanted = [((epoch, o), os.path.basename(spec.shard_paths[i])) for o, i in upcoming]
        prefetcher().prefetch(spec.storage, wanted)


@corpus_lru(64)  # a corpus's shards being read now (an owner per document: small)
def shard_owners(path: str, share: tuple[tuple[int, int], ...], bad_shards: str) -> np.ndarray:
    """The reader of each document of a shard shared by the readers of `share` ((reader,
    units) pairs): each document in turn goes to the sharer with the fewest tokens of the
    shard per unit so far (the lowest reader on a tie), from the documents' token counts
    alone, so the sharers of a shard decode only their own documents. Computed once per
    process and shard. A bad shard under data.bad_shards=skip has no documents."""
    try:
        if decoded_in_memory(path):
            counts = [n for b, _ in decoded_shard(path) for n in block_token_counts(b).tolist()]
        else:
            counts = document_token_counts(path).tolist()
    except ShardError:
        if bad_shards == "error":
            raise
        return np.zeros(0, np.int32)  # shard_documents says it is left out
    units = dict(share)
    loads = [(0.0, reader) for reader in sorted(units)]  # a heap of (tokens / units, reader)
    totals = dict.fromkeys(units, 0)
    owners = np.empty(len(counts), np.int32)
    for number, tokens in enumerate(counts):
        _, owner = loads[0]
        owners[number] = owner
        totals[owner] += tokens
        heapq.heapreplace(loads, (totals[owner] / units[owner], owner))
    return owners


def shard_documents(
    spec: StreamSpec, index: int, start_document: int = 0, wanted: np.ndarray | None = None
) -> Iterable[dict]:
    """The documents of shard `index` from `start_document` on (with `wanted`, bool per
    document, only those); under data.bad_shards=skip a shard that fails its checks is left
    out with a warning line naming it (its documents are read and checked whole before any
    is used, so none of a bad shard is ever trained)."""
    path = spec.shard_paths[index]
    if spec.bad_shards == "error":
        return _documents(path, start_document, wanted)
    try:
        return list(_documents(path, start_document, wanted))
    except ShardError as error:
        write_line(f"warning: data.bad_shards=skip: left out {error}")
        return []


def _documents(path: str, start: int, wanted: np.ndarray | None) -> Iterable[dict]:
    """`read_documents`, from the process's decoded copy for a shared shard (`wanted` given)
    of at most SHARED_SHARD_CACHE_BYTES."""
    if wanted is None or not decoded_in_memory(path):
        return read_documents(path, start, wanted=wanted)
    return (
        document
        for block, offset in decoded_shard(path)
        for document in block_documents(
            block, max(0, start - offset), wanted[offset : offset + len(block.docs)]
        )
    )


SHARED_SHARD_CACHE_BYTES = 8 << 20  # the largest shard decoded whole (`decoded_shard`)
DECODED_BYTES_PER_CORPUS = 64 << 20  # decoded shards held a corpus (source) and process


def decoded_in_memory(path: str) -> bool:
    """Whether a shared shard is small enough to be decoded once per process (`decoded_shard`);
    a missing one is not (read_documents says so)."""
    try:
        return os.path.getsize(path) <= SHARED_SHARD_CACHE_BYTES
    except OSError:
        return False


@corpus_lru(DECODED_BYTES_PER_CORPUS, os.path.getsize)
def decoded_shard(path: str) -> tuple[tuple[Any, int], ...]:
    """The checked blocks of a shard shared by several partitions, with the number of each
    block's first document, decoded once per process: its sharers read it at about the same
    time (the partitions advance together), each building only its own documents. Held per
    corpus, the most recent shards of DECODED_BYTES_PER_CORPUS (64 MB) of files at most per
    source and process (`corpus_cache.CorpusLRU`), so a mixture's sources, whose partitions
    read them in turn, and a corpus of many small shared shards keep theirs."""
    return tuple((block, offset) for block, _, offset in checked_blocks(path))


def shuffle_documents(
    documents: Iterable[dict], buffer_size: int, rng: np.random.Generator
) -> Iterator[dict]:
    """A shuffle buffer: hold `buffer_size` documents, emit a random one as each new one arrives."""
    buffer: list[dict] = []
    for document in documents:
        if len(buffer) < buffer_size:
            buffer.append(document)
            continue
        i = int(rng.integers(buffer_size))
        buffer[i], document = document, buffer[i]
        yield document
    rng.shuffle(buffer)
    yield from buffer


def reader_documents(
    spec: StreamSpec, epoch: int, reader: int, readers: int, shuffle_key: tuple[int, int]
) -> Iterator[dict]:
    """`read_split` through the shuffle buffer keyed by (seed, epoch, *shuffle_key)."""
    rng = np.random.default_rng([spec.seed, epoch, STREAM_SHUFFLE, *shuffle_key])
    documents = (document for _, document in read_split(spec, epoch, reader, readers))
    return shuffle_documents(documents, spec.shuffle_buffer_documents, rng)


MIN_PARTITION_DOCUMENTS = 32


def effective_partitions(requested: int, documents: int) -> int:
    """The canonical partitions of a corpus of `documents` training documents: the largest
    divisor of `requested` (data.stream_partitions) that leaves every partition at least
    MIN_PARTITION_DOCUMENTS documents on average (1 at least). A function of the config and
    the corpus only, so the same for any job shape. An epoch ends when its first partition
    runs out, so small partitions, whose lengths vary more, would waste more of each epoch."""
    divisors = [d for d in range(requested, 0, -1) if requested % d == 0]
    return next((d for d in divisors if documents / d >= MIN_PARTITION_DOCUMENTS), 1)


MIN_CHUNK_DOCUMENTS = 64


def chunk_documents(spec: StreamSpec) -> int:
    """Documents per chunk of a partition: its share of data.shuffle_buffer_documents, at
    least MIN_CHUNK_DOCUMENTS (a format starts afresh at each chunk, so a chunk should make
    many sequences)."""
    return max(
        MIN_CHUNK_DOCUMENTS, math.ceil(spec.shuffle_buffer_documents / spec.stream_partitions)
    )


def partition_chunks(
    spec: StreamSpec, epoch: int, partition: int, chunk: int = 0, start: Position = (0, 0)
) -> Iterator[tuple[int, Position, list[dict]]]:
    """(chunk number, position of its first document, its documents shuffled) of canonical
    `partition` (of spec.stream_partitions) in this epoch, from chunk `chunk`, which begins at
    `start`, on. A chunk is `chunk_documents` consecutive documents of the partition's
    token-balanced share (`read_split`), shuffled by (seed, epoch, partition, chunk): a
    resume starts at any chunk without reading the documents before it."""
    documents = read_split(spec, epoch, partition, spec.stream_partitions, start)
    while located := list(islice(documents, chunk_documents(spec))):
        shuffled = [document for _, document in located]
        rng = np.random.default_rng([spec.seed, epoch, STREAM_SHUFFLE, partition, chunk])
        rng.shuffle(shuffled)
        yield chunk, located[0][0], shuffled
        chunk += 1


# Per-token arrays of a collated batch and their dtypes: pad_id past a row's input_ids, 0
# past the others (attention_mask: 1 on a row's tokens); sentence_starts (formats.py) is all
# False in rows without it.
COLLATED = (
    ("input_ids", np.int64),
    ("token_type_ids", np.int64),
    ("attention_mask", np.int64),
    ("word_starts", bool),
    ("phrases", np.uint8),
    ("sentence_starts", bool),
    ("document_ids", np.int64),  # packed rows' documents, with data.document_masks only
)


def collate(
    sequences: list[dict],
    pad_id: int,
    max_seq_length: int | None = None,
    fields: tuple[str, ...] | None = None,
) -> dict:
    """Pad a list of sequences to the longest, rounded up to its sequence bucket (one of a few
    lengths up to `max_seq_length`, `prediction_budget.sequence_width`), as numpy arrays:
    input_ids, token_type_ids, attention_mask, word_starts, phrases, sentence_starts (batch,
    seq), or only those of them named in `fields` (`collated_fields`), which may add the
    packed rows' document_ids (batch, seq; 0 at padding); next_sentence_label
    (batch,); keys (list of str); new_document (batch,) bool for XLNet's memory segments."""
    from pretrain.data.prediction_budget import sequence_width

    lengths = np.fromiter(map(len, (s["input_ids"] for s in sequences)), np.int64, len(sequences))
    length = sequence_width(int(lengths.max()), max_seq_length)
    real = np.arange(length) < lengths[:, None]  # (batch, seq): the rows' tokens, row-major
    batch = {}
    wanted = fields if fields is not None else [n for n, _ in COLLATED if n != "document_ids"]
    for name, dtype in COLLATED:
        if name not in wanted:
            continue
        if name == "attention_mask":
            batch[name] = real.astype(dtype)
            continue
        array = np.zeros(real.shape, dtype)
        if name == "input_ids":
            array.fill(pad_id)
        try:
            array[real] = np.concatenate([s[name] for s in sequences])
        except KeyError:  # sentence_starts, in the sequences of some formats only
            for row, s in enumerate(sequences):
                if name in s:
                    array[row, : len(s[name])] = s[name]
        batch[name] = array
    batch["next_sentence_label"] = np.array([s["next_sentence_label"] for s in sequences], np.int64)
    batch["keys"] = [s["key"] for s in sequences]
    if "new_document" in sequences[0]:  # the slot's memory starts afresh (xlnet_formats.py)
        batch["new_document"] = np.array([s["new_document"] for s in sequences], bool)
    if "mark" in sequences[0]:  # where each came from in its partition (`stream.py`)
        marks = chain.from_iterable(s["mark"] for s in sequences)
        batch[MARKS_KEY] = np.fromiter(marks, np.int64).reshape(len(sequences), -1)
    return batch


def collated_fields(spec: StreamSpec) -> tuple[str, ...]:
    """The per-token arrays (`COLLATED` names) the spec's corruption reads and passes on, as
    its `collated_fields` declares (all of them where it declares none), with the packed
    rows' "document_ids" exactly when `spec.document_masks` asks for them."""
    declared = getattr(spec.corruption, "collated_fields", None)
    names = [name for name, _ in COLLATED] if declared is None else list(declared)
    names = [name for name in names if name != "document_ids"]
    return (*names, "document_ids") if spec.document_masks else tuple(names)


def corrupt_to_tensors(batch: dict, spec: StreamSpec, epoch: int) -> dict:
    """Apply the objective's corruption to a collated batch and convert its arrays to
    tensors (keys stay a list of str). A staged corruption (`objective.stages`) also gets
    each sample's training progress, from its mark (`stages.sample_progress_tokens`)."""
    marks = batch.pop(MARKS_KEY, None)  # not the corruption's business
    if marks is not None and getattr(spec.corruption, "uses_progress", False) and spec.sources:
        from pretrain.data.mixture import mixture_progress  # a mixture's global index

        batch[PROGRESS_KEY] = mixture_progress(spec, marks, epoch)
    elif marks is not None and getattr(spec.corruption, "uses_progress", False):
        batch[PROGRESS_KEY] = sample_progress_tokens(  # objective.stages (`stages.py`)
            marks,
            epoch,
            spec.stream_partitions,
            spec.max_seq_length,
            sum(spec.shard_tokens),
            getattr(spec.corruption, "stage_lengths", None),
        )
    batch = spec.corruption(batch, spec.mask_epoch(epoch))
    if marks is not None:
        batch[MARKS_KEY] = marks
        if spec.sources:  # a mixture: each row's source, for the per-source counts
            from pretrain.data.mixing import SOURCE_KEY, row_sources

            batch[SOURCE_KEY] = row_sources(spec, marks)
    return {k: (v if k == "keys" else torch.from_numpy(v)) for k, v in batch.items()}
