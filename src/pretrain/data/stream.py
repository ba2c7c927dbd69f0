"""The streaming pipeline: shards -> documents -> shuffle -> input format -> batch -> corruption.

One `StreamSpec` describes a stream; `training_stream(spec, epoch)` builds the WebDataset
pipeline of one epoch. Shard order is shuffled per epoch, then split by node (rank) and by
data-loader worker; when there are fewer shards than readers, every reader walks its shards
and keeps one document in n instead. All randomness is keyed by (seed, epoch, ...): the
shuffle buffer by (rank, worker), formats and masks by the sample key. Batches are yielded
whole, so the DataLoader runs with batch_size=None; worker w yields global batches
w, w + W, ... in DataLoader's round-robin order, which is how `skip_batches` is shared out on
resume.
"""

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import webdataset as wds

from pretrain.data.formats import make_segment_pairs, pack_sentences
from pretrain.data.keyed_rng import STREAM_SHARD_ORDER, STREAM_SHUFFLE
from pretrain.data.shard_format import read_documents
from pretrain.data.vocab import Vocabulary

Corruption = Callable[[dict, int], dict]


@dataclass(frozen=True)
class StreamSpec:
    """Everything a data-loader worker needs to rebuild the stream (picklable)."""

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
    masking: str = "dynamic"  # the objective's: static = dupe_factor copies of the masks
    dupe_factor: int = 10

    def mask_epoch(self, epoch: int) -> int:
        """The epoch that seeds the corruption's draws: the epoch itself (dynamic masking) or
        its copy among dupe_factor (static, BERT's dupe_factor copies of the data)."""
        return epoch % self.dupe_factor if self.masking == "static" else epoch


def worker_role(skip_batches: int = 0) -> tuple[int, int]:
    """(role of this data-loader worker, number of workers); see the module docstring."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 0, 1
    return (info.id + skip_batches) % info.num_workers, info.num_workers


def read_split(spec: StreamSpec, epoch: int, skip_batches: int = 0) -> Iterator[dict]:
    """Documents of this rank and worker, shards in the epoch's shuffled order."""
    worker, workers = worker_role(skip_batches)
    order = np.random.default_rng([spec.seed, epoch, STREAM_SHARD_ORDER]).permutation(
        len(spec.shard_paths)
    )
    readers, reader = spec.world_size * workers, spec.rank * workers + worker
    if len(order) >= readers:
        for index in order[spec.rank :: spec.world_size][worker::workers]:
            yield from read_documents(spec.shard_paths[index])
        return
    for index in order:  # fewer shards than readers: split by document
        for n, document in enumerate(read_documents(spec.shard_paths[index])):
            if n % readers == reader:
                yield document


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


def format_documents(documents: Iterable[dict], spec: StreamSpec, epoch: int) -> Iterator[dict]:
    """Apply the input format named by `spec.format`."""
    if spec.format == "xlnet_pair":  # A [SEP] B [SEP] [CLS] (xlnet_format.py)
        from pretrain.data.xlnet_format import make_xlnet_pairs

        return make_xlnet_pairs(
            documents,
            spec.max_seq_length,
            spec.vocab,
            seed=spec.seed,
            epoch=epoch,
            short_seq_probability=spec.short_seq_probability,
            random_probability=spec.nsp_random_probability,
            pool_size=spec.random_document_pool,
        )
    if spec.format in ("segment_pair", "sentence_pair"):
        return make_segment_pairs(
            documents,
            spec.max_seq_length,
            spec.vocab,
            seed=spec.seed,
            epoch=epoch,
            pair_task=spec.pair_task,
            single_sentences=spec.format == "sentence_pair",
            short_seq_probability=spec.short_seq_probability,
            random_probability=spec.nsp_random_probability,
            pool_size=spec.random_document_pool,
        )
    cross = spec.format == "full_sentences"
    return pack_sentences(documents, spec.max_seq_length, spec.vocab, cross_documents=cross)


def collate(sequences: list[dict], pad_id: int, multiple_of: int = 8) -> dict:
    """Pad a list of sequences to the longest (rounded up to `multiple_of`) as numpy arrays:
    input_ids, token_type_ids, attention_mask, word_starts, phrases, sentence_starts (batch, seq); next_sentence_label
    (batch,); keys (list of str)."""
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


def batch_sequences(
    sequences: Iterable[dict], spec: StreamSpec, skip_batches: int
) -> Iterator[list[dict]]:
    """Group sequences into lists of batch_size (the last one may be short), dropping this
    worker's share of the first `skip_batches` global batches."""
    worker, workers = worker_role(skip_batches)
    skip = max(0, math.ceil((skip_batches - worker) / workers))
    for n, batch in enumerate(
        wds.filters._batched(sequences, spec.batch_size, collation_fn=None, partial=True)
    ):
        if n >= skip:
            yield batch


def to_model_batch(batches: Iterable[list[dict]], spec: StreamSpec, epoch: int) -> Iterator[dict]:
    """Collate, corrupt and convert to tensors (keys stay a list of str)."""
    for sequences in batches:
        batch = spec.corruption(collate(sequences, spec.vocab.pad), spec.mask_epoch(epoch))
        yield {k: (v if k == "keys" else torch.from_numpy(v)) for k, v in batch.items()}


def training_stream(spec: StreamSpec, epoch: int, skip_batches: int = 0) -> wds.DataPipeline:
    """The pipeline of one epoch, as an IterableDataset of whole batches."""
    if spec.format == "xlnet_memory":  # per-slot consecutive segments (xlnet_format.py)
        from pretrain.data.xlnet_format import MemoryStream

        return MemoryStream(spec, epoch, skip_batches)
    return wds.DataPipeline(
        partial(read_split, spec, epoch, skip_batches),
        partial(_shuffle_stage, spec=spec, epoch=epoch, skip_batches=skip_batches),
        partial(format_documents, spec=spec, epoch=epoch),
        partial(batch_sequences, spec=spec, skip_batches=skip_batches),
        partial(to_model_batch, spec=spec, epoch=epoch),
    )


def _shuffle_stage(
    documents: Iterable[dict], spec: StreamSpec, epoch: int, skip_batches: int
) -> Iterator[dict]:
    worker, _ = worker_role(skip_batches)
    rng = np.random.default_rng([spec.seed, epoch, STREAM_SHUFFLE, spec.rank, worker])
    return shuffle_documents(documents, spec.shuffle_buffer_documents, rng)
