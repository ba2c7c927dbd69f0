"""The streaming pipeline of one epoch: shards -> documents -> shuffle -> input format ->
batch -> corruption, as an IterableDataset of whole batches (the DataLoader runs with
batch_size=None).

Documents are split among readers and shuffled by `reading.py`; the input format
(`input_formats.py`) turns them into batches; the objective's corruption runs on each whole
batch in the data-loader worker. All randomness is keyed by (seed, epoch, ...): the shuffle
buffer by (rank, worker), formats and masks by the sample key. For most formats every
data-loader worker is a reader of its own documents and worker w yields its batches, which
DataLoader returns round-robin (w, w + W, ...): that is how `skip_batches` is shared out on
a resume. Formats whose batches continue each other (XLNet's memory) have every worker build
the rank's batches and keep its share. Where an epoch ends on every rank alike:
`epoch_tail.py`.
"""

import math
from collections.abc import Iterator

import torch

from pretrain.data.input_formats import INPUT_FORMATS
from pretrain.data.reading import (
    Corruption,
    StreamSpec,
    collate,
    corrupt_to_tensors,
    reader_documents,
    worker_role,
)

__all__ = ["Corruption", "EpochStream", "StreamSpec", "training_stream"]


class EpochStream(torch.utils.data.IterableDataset):
    """The batches of one epoch for `spec.rank`, from `skip_batches` on (a resume)."""

    def __init__(self, spec: StreamSpec, epoch: int, skip_batches: int = 0) -> None:
        super().__init__()
        self.spec, self.epoch, self.skip_batches = spec, epoch, skip_batches

    def __iter__(self) -> Iterator[dict]:
        spec, epoch = self.spec, self.epoch
        worker, workers = worker_role(self.skip_batches)
        entry = INPUT_FORMATS[spec.format]
        if entry.workers_share_documents:
            reader, readers, shuffle_key = spec.rank, spec.world_size, (spec.rank, 0)
        else:
            reader, readers = spec.rank * workers + worker, spec.world_size * workers
            shuffle_key = (spec.rank, worker)
        documents = reader_documents(spec, epoch, reader, readers, shuffle_key)
        skip = math.ceil(max(0, self.skip_batches - worker) / workers)
        for n, (sequences, extras) in enumerate(entry.batches(documents, spec, epoch)):
            if entry.workers_share_documents:  # n counts the rank's batches
                if n < self.skip_batches or n % workers != worker:
                    continue
            elif n < skip:  # n counts this worker's batches
                continue
            batch = collate(sequences, spec.vocab.pad) | extras
            yield corrupt_to_tensors(batch, spec, epoch)


def training_stream(spec: StreamSpec, epoch: int, skip_batches: int = 0) -> EpochStream:
    """The pipeline of one epoch, as an IterableDataset of whole batches."""
    return EpochStream(spec, epoch, skip_batches)
