"""Where the stream is: the records that cross module borders and go into checkpoints.

A `StreamMark` travels with every sequence from the partition that made it
(`stream.partition_sequences`) through the workers, as one row of a batch's (batch, 7) int64
array (`reading.MARKS_KEY`, column `MARK_COLUMNS[field]`), to the loader, which turns the
last trained one of each partition into a `PartitionPosition`: where a resume of that
partition continues. Checkpoints hold {partition: position} as plain lists of ints under the
data module's "partitions", with "position_format" = `POSITION_FORMAT`; `position_from_saved`
reads every format written so far. Imports nothing of ours.
"""

from typing import NamedTuple

# 1: [samples, chunk, order, document, in_chunk] (no "position_format" key in the state)
# 2: the same and the partition's tokens up to the position (`PartitionPosition`)
POSITION_FORMAT = 2


class StreamMark(NamedTuple):
    """Where a sequence came from in its canonical partition, in this epoch."""

    partition: int
    number: int  # its number n in the partition (the partition's samples before it)
    chunk: int  # the chunk of the partition it was made from (`reading.partition_chunks`)
    order: int  # the chunk's first document: its shard's index in the epoch's shard order,
    document: int  # and its index in that shard
    in_chunk: int  # its number among the chunk's sequences
    tokens: int  # the partition's tokens up to and including it


MARK_COLUMNS = {name: column for column, name in enumerate(StreamMark._fields)}


class PartitionPosition(NamedTuple):
    """Where a partition's sequences continue after a resume: a seek that reads from the
    chunk's first document only (`stream.partition_sequences`)."""

    samples: int = 0  # the partition's sequences before it
    chunk: int = 0
    order: int = 0  # the chunk's first document (as in `StreamMark`)
    document: int = 0
    in_chunk: int = 0  # the chunk's sequences before it
    tokens: int = 0  # the partition's tokens before it


def next_position(mark: StreamMark | list[int]) -> PartitionPosition:
    """The position that continues after the sequence whose mark is `mark`."""
    mark = StreamMark(*mark)
    return PartitionPosition(
        mark.number + 1, mark.chunk, mark.order, mark.document, mark.in_chunk + 1, mark.tokens
    )


def position_from_saved(saved: list[int] | tuple[int, ...]) -> PartitionPosition:
    """A checkpoint's position of a partition, of any format: format 1 lacks the tokens
    (they restart at 0 there, as that version's stream did). ValueError for anything else."""
    values = [int(value) for value in saved]
    if len(values) not in (5, 6):
        raise ValueError(f"a stream position has 5 or 6 integers, not {len(values)}: {saved!r}")
    return PartitionPosition(*values)


def positions_from_saved(saved: dict | None) -> dict[int, PartitionPosition] | None:
    """{partition: position} of a checkpoint's data module state ("partitions")."""
    if saved is None:
        return None
    return {int(partition): position_from_saved(p) for partition, p in saved.items()}
