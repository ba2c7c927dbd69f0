"""The reading steps every input format shares: which documents a reader (a rank, or a
data-loader worker of a rank) reads in an epoch, the shuffle buffer, collation of sequences
into a padded batch and the conversion of a corrupted batch to tensors.

How an epoch's documents are split among R readers: shard order is shuffled per epoch
(keyed by (seed, epoch)); every shard counts as `units` = ceil(UNITS_PER_READER x R / shards)
units of equal tokens, and units are dealt in the epoch's order to the reader with the fewest
tokens so far (the manifest's token counts), so readers' planned shares differ by at most one
unit. A shard dealt to several readers is read by each of them and split document by
document in proportion to their units (`read_split`). Shares thus differ by about a unit plus
a document per shared shard, whatever the shard sizes, which keeps the tail an epoch drops
at its end small (`epoch_tail.py`). With one reader, every document is read in the epoch's
shard order. When there are fewer shards than UNITS_PER_READER x R, shards are read by
several readers: prepare a large corpus with enough shards to avoid that.
"""

import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from pretrain.data.keyed_rng import STREAM_SHARD_ORDER, STREAM_SHUFFLE
from pretrain.data.shard_format import ShardError, read_documents
from pretrain.data.vocab import Vocabulary

Corruption = Callable[[dict, int], dict]
UNITS_PER_READER = 32


@dataclass(frozen=True)
class StreamSpec:
    """Everything a data-loader worker needs to rebuild the stream (picklable).
    `shard_tokens`: tokens per shard (manifest), used to balance readers; empty = equal."""

    shard_paths: tuple[str, ...]
    vocab: Vocabulary
    corruption: Corruption
    format: str = "segment_pair"
    max_seq_length: int = 128
    batch_size: int = 32
    seed: int = 1234
    short_seq_probability: float = 0.1
    nsp_random_probability: float = 0.5
    pair_task: str = "nsp"
    shuffle_buffer_documents: int = 1000
    random_document_pool: int = 100
    rank: int = 0
    world_size: int = 1
    shard_tokens: tuple[int, ...] = ()
    stream_partitions: int = 64
    masking: str = "dynamic"  # the objective's: static = dupe_factor copies of the masks
    dupe_factor: int = 10
    bad_shards: str = "error"  # error | skip (data.bad_shards)

    def mask_epoch(self, epoch: int) -> int:
        """The epoch that seeds the corruption's draws: the epoch itself (dynamic masking) or
        its copy among dupe_factor (static, BERT's dupe_factor copies of the data)."""
        return epoch % self.dupe_factor if self.masking == "static" else epoch


def worker_role(skip_batches: int = 0) -> tuple[int, int]:
    """(role of this data-loader worker, number of workers). DataLoader asks workers for
    batches round-robin from worker 0; on a resume that skips `skip_batches` batches, the
    worker asked first plays the role of the worker that would have served the next one."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 0, 1
    return (info.id + skip_batches) % info.num_workers, info.num_workers


def shard_sharing(spec: StreamSpec, epoch: int, readers: int) -> list[dict[int, int]]:
    """For each shard in the epoch's order: {reader: units of it}, deterministic in (seed,
    epoch, readers); see the module docstring."""
    order = np.random.default_rng([spec.seed, epoch, STREAM_SHARD_ORDER]).permutation(
        len(spec.shard_paths)
    )
    units = max(1, math.ceil(UNITS_PER_READER * readers / max(1, len(order))))
    tokens = spec.shard_tokens or (1,) * len(order)
    loads = np.zeros(readers)
    sharing: dict[int, dict[int, int]] = {}
    for index in order:
        share = sharing.setdefault(int(index), {})
        for _ in range(units):
            reader = int(np.argmin(loads))  # the first of the least loaded
            share[reader] = share.get(reader, 0) + 1
            loads[reader] += tokens[index] / units
    return list(sharing.items())


def read_split(spec: StreamSpec, epoch: int, reader: int, readers: int) -> Iterator[dict]:
    """Documents of `reader` (of `readers`) in this epoch, in the epoch's shard order. A
    shard shared by several readers is split document by document: each goes to the sharer
    with the fewest tokens of that shard per unit so far, which every sharer computes alike."""
    for index, share in shard_sharing(spec, epoch, readers):
        if reader not in share:
            continue
        documents = shard_documents(spec, index)
        if len(share) == 1:
            yield from documents
            continue
        sharers = sorted(share)
        loads = dict.fromkeys(sharers, 0)
        for document in documents:
            owner = min(sharers, key=lambda r: loads[r] / share[r])
            loads[owner] += len(document["ids"])
            if owner == reader:
                yield document


def shard_documents(spec: StreamSpec, index: int) -> Iterable[dict]:
    """The documents of shard `index`; under data.bad_shards=skip a shard that fails its
    checks is left out with a warning line naming it (its documents are read and checked
    whole before any is used, so none of a bad shard is ever trained)."""
    path = spec.shard_paths[index]
    if spec.bad_shards == "error":
        return read_documents(path)
    try:
        return list(read_documents(path))
    except ShardError as error:
        print(f"warning: data.bad_shards=skip: left out {error}", file=sys.stderr, flush=True)
        return []


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
    return shuffle_documents(
        read_split(spec, epoch, reader, readers), spec.shuffle_buffer_documents, rng
    )


MIN_PARTITION_DOCUMENTS = 32


def effective_partitions(requested: int, documents: int) -> int:
    """The canonical partitions of a corpus of `documents` training documents: the largest
    divisor of `requested` (data.stream_partitions) that leaves every partition at least
    MIN_PARTITION_DOCUMENTS documents on average (1 at least). A function of the config and
    the corpus only, so the same for any job shape. An epoch ends when its first partition
    runs out, so small partitions, whose lengths vary more, would waste more of each epoch."""
    divisors = [d for d in range(requested, 0, -1) if requested % d == 0]
    return next((d for d in divisors if documents / d >= MIN_PARTITION_DOCUMENTS), 1)


def partition_documents(spec: StreamSpec, epoch: int, partition: int) -> Iterator[dict]:
    """Documents of canonical `partition` (of spec.stream_partitions) in this epoch: its
    token-balanced share (`read_split`) through its own shuffle buffer, keyed by (seed, epoch,
    partition) and holding ceil(shuffle_buffer_documents / partitions) documents."""
    partitions = spec.stream_partitions
    rng = np.random.default_rng([spec.seed, epoch, STREAM_SHUFFLE, partition])
    buffer = math.ceil(spec.shuffle_buffer_documents / partitions)
    return shuffle_documents(read_split(spec, epoch, partition, partitions), buffer, rng)


def collate(sequences: list[dict], pad_id: int, multiple_of: int = 8) -> dict:
    """Pad a list of sequences to the longest (rounded up to `multiple_of`) as numpy arrays:
    input_ids, token_type_ids, attention_mask, word_starts, phrases, sentence_starts (batch,
    seq); next_sentence_label (batch,); keys (list of str)."""
    length = max(len(s["input_ids"]) for s in sequences)
    length = math.ceil(length / multiple_of) * multiple_of
    batch = {
        "input_ids": np.full((len(sequences), length), pad_id, np.int64),
        "token_type_ids": np.zeros((len(sequences), length), np.int64),
        "attention_mask": np.zeros((len(sequences), length), np.int64),
        "word_starts": np.zeros((len(sequences), length), bool),
        "phrases": np.zeros((len(sequences), length), np.uint8),
        "sentence_starts": np.zeros((len(sequences), length), bool),
    }
    for row, s in enumerate(sequences):
        n = len(s["input_ids"])
        batch["input_ids"][row, :n] = s["input_ids"]
        batch["token_type_ids"][row, :n] = s["token_type_ids"]
        batch["attention_mask"][row, :n] = 1
        batch["word_starts"][row, :n] = s["word_starts"]
        batch["phrases"][row, :n] = s["phrases"]
        if "sentence_starts" in s:  # first token of each sentence (formats.py)
            batch["sentence_starts"][row, :n] = s["sentence_starts"]
    batch["next_sentence_label"] = np.array([s["next_sentence_label"] for s in sequences], np.int64)
    batch["keys"] = [s["key"] for s in sequences]
    return batch


def corrupt_to_tensors(batch: dict, spec: StreamSpec, epoch: int) -> dict:
    """Apply the objective's corruption to a collated batch and convert its arrays to
    tensors (keys stay a list of str)."""
    batch = spec.corruption(batch, spec.mask_epoch(epoch))
    return {k: (v if k == "keys" else torch.from_numpy(v)) for k, v in batch.items()}
