"""The streaming pipeline of one epoch: shards -> documents -> shuffle -> input format ->
batch -> corruption, as an IterableDataset of whole batches (the DataLoader runs with
batch_size=None).

Elastic order: an epoch's documents are split into `data.stream_partitions` canonical
partitions (token-balanced, `reading.py`), each cut into chunks of consecutive documents,
shuffled and formatted into sequences chunk by chunk, and each chunk's sequences shuffled
(`shuffled_sequences`; not XLNet's memory slots), as its own stream keyed by (seed, epoch,
partition, chunk). The global sample order interleaves them
(sample i is the next sequence of partition i mod P), so it depends on the seed and P only:
the same global batches, samples and masks (keyed by the sample's key) for any number of
nodes, ranks and data-loader workers. Rank r of R trains global samples r, r + R, ... of each
global batch; a checkpoint stores how many global samples of the epoch were consumed, so a
run resumes at the next unseen sample with another number of ranks, workers, micro-batch
size or accumulation. With it the checkpoint stores every partition's position (its chunk,
where the chunk's first document lies, the sequences of the chunk trained), so a resume
seeks: it reads from each partition's current chunk on, whatever the position in the epoch.
Any number of ranks works: when R does not divide P, a partition is shared by R / gcd(P, R)
ranks, each making all of its sequences and keeping its own. Under a `StepAlignedLoader`
each data-loader worker w of W builds only micro-batches w, w + W, ... of the rank, reading
only the partitions they draw from (`worker_batches`: one worker per partition when the
micro-batch's samples x W divide P / R), and the loader puts them back in order; elsewhere
every worker formats all of the rank's sequences and corrupts every W-th micro-batch. XLNet's memory format streams the same way,
with one partition per memory slot of the global batch (P = the global batch size, half of
it with bi_data; `partitions.memory_partitions`): a partition's sequences are one slot's
consecutive segments, so step t's global batch holds segment t of every slot, and rank r's
micro-batch m of every step holds the same slots (`memory_rows`), whatever the shape.
With bi_data a sample is two rows, the slot read forward and backward: a micro-batch's
first half forward, its second half the same slots backward. Where an epoch ends on every
rank alike: `data/loader.py`.
"""

import math
from collections.abc import Callable, Iterator
from functools import partial
from itertools import count, islice

import numpy as np
import torch

from pretrain.data.input_formats import INPUT_FORMATS
from pretrain.data.keyed_rng import STREAM_SEQUENCE_ORDER
from pretrain.data.loader import STREAM_BATCH_KEY, data_error_batch
from pretrain.data.positions import PartitionPosition, StreamMark
from pretrain.data.reading import (
    StreamSpec,
    collate,
    collated_fields,
    corrupt_to_tensors,
    first_shards,
    partition_chunks,
    prefetch,
    spec_prefetch,
    worker_role,
)
from pretrain.data.shard_format import ShardError
from pretrain.errors import ConfigError


class EpochStream(torch.utils.data.IterableDataset):
    """The batches of one epoch for `spec.rank`: from global sample `start_sample` on (a
    resume, seeking to `positions`, see `rank_sequences`). A shard that fails its checks
    raises ShardError, or with `errors_as_batches` ends the batches with a
    `data_error_batch`, which stops training on every rank alike."""

    def __init__(
        self,
        spec: StreamSpec,
        epoch: int,
        start_sample: int = 0,
        errors_as_batches: bool = False,
        positions: dict[int, PartitionPosition] | None = None,
        worker_shares: bool = False,
    ) -> None:
        super().__init__()
        self.spec, self.epoch = spec, epoch
        self.start_sample = start_sample
        self.errors_as_batches = errors_as_batches
        self.positions = positions
        self.worker_shares = worker_shares
        self._batch = 0  # the stream batch being built (`worker_batches`)

    def __iter__(self) -> Iterator[dict]:
        try:
            yield from self._batches()
        except ShardError as error:
            if not self.errors_as_batches:
                raise
            batch = data_error_batch(f"epoch {self.epoch}, rank {self.spec.rank}: {error}")
            if self._shares():
                batch[STREAM_BATCH_KEY] = (self._batch, True)
            yield batch

    def _shares(self) -> bool:
        """Whether this worker builds only its share (`worker_batches`): asked for, several
        workers, and batches of a fixed number of samples."""
        return self.worker_shares and worker_role()[1] > 1 and not self.spec.tokens_per_batch

    def _batches(self) -> Iterator[dict]:
        spec, epoch = self.spec, self.epoch
        worker, workers = worker_role()
        fields = collated_fields(spec)  # only the arrays the corruption reads
        if self._shares():
            samples = spec.batch_size // rows_per_sample(spec)
            shares = worker_batches(
                spec, epoch, samples, worker, workers, self.start_sample, self.positions
            )
            for number, sequences, last in shares:
                self._batch = number
                rows = with_backward_rows(sequences)
                batch = collate(rows, spec.vocab.pad, spec.max_seq_length, fields)
                batch = corrupt_to_tensors(batch, spec, epoch)
                yield batch | {STREAM_BATCH_KEY: (number, last)}
            return
        if spec.tokens_per_batch:
            batches = token_budget_batches(spec, epoch, self.positions)
        else:
            sequences = rank_sequences(spec, epoch, self.start_sample, self.positions)
            batches = _chunks(sequences, spec.batch_size // rows_per_sample(spec))
        for n, sequences in enumerate(batches):
            if n % workers == worker:
                rows = with_backward_rows(sequences)
                batch = collate(rows, spec.vocab.pad, spec.max_seq_length, fields)
                yield corrupt_to_tensors(batch, spec, epoch)


def rows_per_sample(spec: StreamSpec) -> int:
    """Rows of a batch per sample of the global order: 2 for XLNet's memory with bi_data (the
    slot read forward and backward), else 1."""
    memory = INPUT_FORMATS[spec.format].memory
    return 2 if memory and getattr(spec.corruption, "bi_data", False) else 1


def with_backward_rows(sequences: list[dict]) -> list[dict]:
    """`sequences`, then their "backward" mirrors (XLNet's bi_data) with the same marks."""
    backward = [s["backward"] | {"mark": s["mark"]} for s in sequences if "backward" in s]
    return sequences + backward


def memory_rows(
    rank: int, ranks: int, accumulation: int, batch_size: int, bi_data: bool = False
) -> np.ndarray:
    """(accumulation, batch_size) int: the global memory row of each row of rank `rank`'s
    micro-batches in every optimizer step of XLNet's memory stream (P = batch_size x
    accumulation x ranks slots, halved with bi_data). Row s < P is slot s read forward, row
    P + s the slot read backward. In a step, rank r's k-th sample is global sample r + k x
    ranks of the step, i.e. slot r + k x ranks (`rank_sequences`), so this is fixed by the
    shape and a memory saved by global row moves to any other shape."""
    samples = batch_size // 2 if bi_data else batch_size
    slots = rank + ranks * np.arange(accumulation * samples).reshape(accumulation, samples)
    if bi_data:
        slots = np.concatenate([slots, slots + samples * accumulation * ranks], axis=1)
    return slots


def partition_sequences(
    spec: StreamSpec,
    epoch: int,
    partition: int,
    resume: PartitionPosition | None = None,
    mark_partition: int | None = None,
    sequence_length: Callable[[int], int] | None = None,
) -> Iterator[dict]:
    """The sequences of canonical `partition` in this epoch, each with its "mark" (a
    `StreamMark`: where it came from in the partition, whose number there is `mark_partition`,
    by default `partition`: a mixture's source numbers its partitions after the previous
    sources'). Under a context-extension stage the partition's n-th sequence has
    `sequence_length(n)` tokens, by default its stage's as global sample n P + p (a mixture
    passes its own, by its schedule). The format
    starts afresh at every chunk (`partition_chunks`), so `resume` = `next_position(mark)` of
    the last sequence trained continues after it by reading from that chunk's first document
    only: a seek that costs at most a chunk."""
    n, first_chunk, order, document, offset, tokens, made_order = resume or PartitionPosition()
    entry = INPUT_FORMATS[spec.format]
    lengths = getattr(spec.corruption, "stage_lengths", None)
    if lengths is not None and sequence_length is None:  # the partition's n-th: sample n P + p
        tokens_of_epoch, partitions = sum(spec.shard_tokens), spec.stream_partitions
        sequence_length = partial(
            _sample_length, lengths, epoch, tokens_of_epoch, partitions, partition
        )
    marked = partition if mark_partition is None else mark_partition
    for chunk, start, documents in partition_chunks(
        spec, epoch, partition, first_chunk, (order, document)
    ):
        length_of = None
        if sequence_length is None:
            sequences = entry.sequences(documents, spec, epoch)
        else:  # a context-extension stage: the chunk's first sequence is number n - offset
            length_of = partial(_chunk_length, sequence_length, n - offset)
            sequences = entry.sequences(documents, spec, epoch, length_of)
        made = made_order and chunk == first_chunk
        if not (entry.memory or made):
            rng = np.random.default_rng([spec.seed, epoch, STREAM_SEQUENCE_ORDER, partition, chunk])
            sequences = shuffled_sequences(list(sequences), rng, length_of)
        for number, sequence in enumerate(sequences):
            if number >= offset:
                tokens += len(sequence["input_ids"])
                mark = StreamMark(marked, n, chunk, *start, number, tokens, int(made))
                yield sequence | {"mark": mark}
                n += 1
        offset = 0


def shuffled_sequences(
    sequences: list[dict], rng: np.random.Generator, length_of: Callable[[int], int] | None
) -> list[dict]:
    """A chunk's sequences in a random order. A format makes a document's sequences one after
    another, and a partition gives a global batch consecutive sequences, so unshuffled a batch
    holds pieces of a few documents: correlated samples, a noisier gradient (BERT's and
    run_mlm.py's data shuffle their instances, not their documents; benchmarks/RESULTS.md,
    issue 57). Under a context-extension stage (`length_of`: the chunk's n-th sequence's
    length) only sequences of one length trade places, so the n-th keeps its length."""
    order, start = [], 0
    lengths = [0 if length_of is None else length_of(i) for i in range(len(sequences))]
    for end in range(1, len(sequences) + 1):
        if end == len(sequences) or lengths[end] != lengths[start]:
            order.extend((start + rng.permutation(end - start)).tolist())
            start = end
    return [sequences[i] for i in order]


def _sample_length(
    lengths, epoch: int, epoch_tokens: int, partitions: int, partition: int, number: int
) -> int:
    """Tokens of the partition's `number`-th sequence: its stage's length (`StageLengths`)."""
    return lengths.length_of(number * partitions + partition, epoch, epoch_tokens)


def _chunk_length(sequence_length: Callable[[int], int], first: int, number: int) -> int:
    """Tokens of a chunk's `number`-th sequence, the chunk's first being the partition's
    `first`-th."""
    return sequence_length(first + number)


def rank_sequences(
    spec: StreamSpec,
    epoch: int,
    start_sample: int = 0,
    resume: dict[int, PartitionPosition] | None = None,
) -> Iterator[dict]:
    """This rank's share of the epoch's global sample order, from global sample
    `start_sample` on. Global sample i is sequence i // P of canonical partition i mod P
    (P = spec.stream_partitions); rank r of R takes samples start_sample + r,
    start_sample + r + R, ..., so it reads only the partitions p with p = start_sample + r
    (mod gcd(P, R)): all of their sequences when R divides P, else every (R / gcd)-th, the
    others made and dropped (any number of ranks works, at that cost). `resume` holds
    {partition: its `partition_sequences` resume} at `start_sample` (a checkpoint's); a
    partition without one that agrees is read from the epoch's start and its samples before
    `start_sample` skipped (slow; checkpoints without positions). Stops at the first sample
    whose partition is used up: all samples before it exist, so every rank stops at the same
    global position."""
    take = _sample_taker(spec, epoch, start_sample, resume)
    for i in count(start_sample + spec.rank, spec.world_size):
        sequence = take(i)
        if sequence is None:
            return
        yield sequence


def _sample_taker(
    spec: StreamSpec,
    epoch: int,
    start_sample: int,
    resume: dict[int, PartitionPosition] | None,
    wanted: set[int] | None = None,
) -> Callable[[int], dict | None]:
    """take(i): global sample i (>= start_sample, rising) of the rank's partitions (those in
    `wanted` only, when given), None when its partition is used up; nothing is read before a
    sample is asked for but the first shards of a remote corpus (prefetched)."""
    if spec.sources:  # a mixture (data.sources): each partition opened when first wanted
        from pretrain.data.mixture import mixture_taker

        return mixture_taker(spec, epoch, start_sample, resume, partition_sequences)
    partitions, ranks = spec.stream_partitions, spec.world_size
    shared = math.gcd(partitions, ranks)
    mine = range((start_sample + spec.rank) % shared, partitions, shared)
    mine = [p for p in mine if wanted is None or p in wanted]
    streams, numbers = {}, {}
    for p in mine:
        used = max(0, -(-(start_sample - p) // partitions))  # samples of p before start_sample
        position = (resume or {}).get(p)
        if position is not None and position.samples == used:
            streams[p] = partition_sequences(spec, epoch, p, position)
        else:  # from the epoch's start (fast when nothing is skipped)
            streams[p] = islice(partition_sequences(spec, epoch, p), used, None)
        numbers[p] = used  # the number of the stream's next sequence in its partition
    if start_sample == 0 and spec_prefetch(spec):  # a remote corpus: every partition's first
        # shard at once, not each only when its partition's first sample is asked for
        for p in mine:
            prefetch(spec, epoch, first_shards(spec, epoch, p, partitions))

    def take(i: int) -> dict | None:
        p = i % partitions
        skip = i // partitions - numbers[p]  # its samples of other ranks' or workers' batches
        numbers[p] += skip + 1
        return next(islice(streams[p], skip, None), None)

    return take


def worker_partitions(
    spec: StreamSpec, start_sample: int, samples: int, worker: int, workers: int
) -> set[int]:
    """The canonical partitions whose sequences the batches of data-loader `worker` (of
    `workers`) hold: its batches are the rank's stream batches worker, worker + workers, ...
    (DataLoader's round-robin) of `samples` samples each, and the rank's j-th sample (from
    `start_sample`) is global sample start_sample + rank + j R, of partition (that) mod P.
    The pattern repeats every lcm(P / gcd(P, R), samples x workers) samples. When samples x
    workers divides P / R, the workers' sets are disjoint: every sequence is read by one."""
    partitions, ranks = spec.stream_partitions, spec.world_size
    first = start_sample + spec.rank
    period = math.lcm(partitions // math.gcd(partitions, ranks), samples * workers)
    return {
        (first + j * ranks) % partitions
        for j in range(period)
        if (j // samples) % workers == worker
    }


def worker_batches(
    spec: StreamSpec,
    epoch: int,
    samples: int,
    worker: int,
    workers: int,
    start_sample: int = 0,
    resume: dict[int, PartitionPosition] | None = None,
) -> Iterator[tuple[int, list[dict], bool]]:
    """(stream batch number, its sequences, whether the stream ends there) of data-loader
    `worker`'s (of `workers`) batches of `samples` samples: the rank's batches worker,
    worker + workers, ... exactly as `rank_sequences` cut in batches holds them, reading only
    the partitions they draw from (`worker_partitions`): a sequence of a partition this
    worker shares with another one but that lies in another's batch is made and dropped.
    A worker stops at the first sample whose partition is used up; the rank's stream ended
    there or earlier (`loader.in_stream_order` keeps the batches up to the rank's end)."""
    wanted = worker_partitions(spec, start_sample, samples, worker, workers)
    take = _sample_taker(spec, epoch, start_sample, resume, wanted)
    first, ranks = start_sample + spec.rank, spec.world_size
    for number in count(worker, workers):
        batch: list[dict] = []
        for j in range(number * samples, (number + 1) * samples):
            sequence = take(first + j * ranks)
            if sequence is None:
                if batch:
                    yield number, batch, True
                return
            batch.append(sequence)
        yield number, batch, False


def check_world_size(spec: StreamSpec) -> None:
    """Token-budget batches (data.tokens_per_batch) deal whole partitions to ranks, so the
    ranks must divide them: ConfigError naming the key otherwise. Any number of ranks reads
    batches of a fixed size (`rank_sequences`)."""
    if spec.tokens_per_batch and spec.stream_partitions % spec.world_size:
        raise ConfigError(
            f"data.stream_partitions: this corpus is cut into {spec.stream_partitions} "
            f"canonical partitions, which the {spec.world_size} ranks (trainer.devices x "
            "trainer.num_nodes) do not divide, as data.tokens_per_batch needs; set "
            "data.stream_partitions to a multiple of the ranks, or use a larger corpus"
        )


def token_budget_batches(
    spec: StreamSpec, epoch: int, resume: dict[int, PartitionPosition] | None = None
) -> Iterator[list[dict]]:
    """This rank's micro-batches under a token budget (`data.tokens_per_batch` tokens per
    optimizer step, all ranks together, RoBERTa's batches of ~constant tokens). Each canonical
    partition p contributes to micro-step m its sequences whose cumulative token count C (the
    partition's tokens up to and including the sequence, `partition_sequences`) satisfies
    (C - 1) x P x A // tokens_per_batch = m (P partitions, A accumulated micro-batches): a
    window of tokens_per_batch / (P x A) tokens of each partition. Optimizer step t thus holds
    the sequences with (C - 1) x P // tokens_per_batch = t, whatever the ranks, workers or
    accumulation; rank r serves partitions r, r + R, ... and its micro-batch is the union of
    theirs (a varying number of rows). Since the window is at least one max_seq_length
    (checked), every partition has a sequence in every micro-step, so a resume (`resume`, the
    checkpoint's positions, taken at a step's end) starts at the step its partitions agree on.
    Ends before the first micro-step some partition cannot fill (the epoch's end)."""
    check_world_size(spec)
    partitions, ranks, accumulation = spec.stream_partitions, spec.world_size, spec.accumulation
    streams = [
        partition_sequences(spec, epoch, p, (resume or {}).get(p))
        for p in range(spec.rank, partitions, ranks)
    ]

    def micro_step(sequence: dict) -> int:
        return (sequence["mark"].tokens - 1) * partitions * accumulation // spec.tokens_per_batch

    heads = [next(stream, None) for stream in streams]
    if None in heads:
        return
    step = min(micro_step(head) for head in heads)
    while True:
        batch = []
        for i, stream in enumerate(streams):
            while heads[i] is not None and micro_step(heads[i]) == step:
                batch.append(heads[i])
                heads[i] = next(stream, None)
            if heads[i] is None:  # partition used up: this micro-step is not whole
                return
        yield batch
        step += 1


def _chunks(items: Iterator[dict], size: int) -> Iterator[list[dict]]:
    while chunk := list(islice(items, size)):
        yield chunk
