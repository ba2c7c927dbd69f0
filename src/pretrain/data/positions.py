"""Where the stream is: the records that cross module borders and go into checkpoints.

A `StreamMark` travels with every sequence from the partition that made it
(`stream.partition_sequences`) through the workers, as one row of a batch's (batch, 8) int64
array (`reading.MARKS_KEY`, column `MARK_COLUMNS[field]`), to the loader, which turns the
last trained one of each partition into a `PartitionPosition`: where a resume of that
partition continues. Checkpoints hold {partition: position} as plain lists of ints under the
data module's "partitions", with "position_format" = `POSITION_FORMAT`; `position_from_saved`
reads every format written so far. Imports nothing of ours.
"""

from typing import NamedTuple

# 1: [samples, chunk, order, document, in_chunk] (no "position_format" key in the state)
# 2: the same and the partition's tokens up to the position (`PartitionPosition`)
# 3: the same and `made_order` (a chunk's sequences were emitted in the order made up to format
#    2, shuffled since: a format 1 or 2 position continues its chunk in the made order)
POSITION_FORMAT = 3


class StreamMark(NamedTuple):
    """Where a sequence came from in its canonical partition, in this epoch."""

    partition: int
    number: int  # its number n in the partition (the partition's samples before it)
    chunk: int  # the chunk of the partition it was made from (`reading.partition_chunks`)
    order: int  # the chunk's first document: its shard's index in the epoch's shard order,
    document: int  # and its index in that shard
    in_chunk: int  # its number among the chunk's sequences (as emitted)
    tokens: int  # the partition's tokens up to and including it
    made_order: int = 0  # 1: its chunk is emitted in the order made (a format 1-2 resume)


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
    made_order: int = 0  # 1: the chunk continues in the order made, not shuffled (format 1-2)


def next_position(mark: StreamMark | list[int]) -> PartitionPosition:
    """The position that continues after the sequence whose mark is `mark`."""
    mark = StreamMark(*mark)
    return PartitionPosition(
        mark.number + 1,
        mark.chunk,
        mark.order,
        mark.document,
        mark.in_chunk + 1,
        mark.tokens,
        mark.made_order,
    )


def position_from_saved(saved: list[int] | tuple[int, ...]) -> PartitionPosition:
    """A checkpoint's position of a partition, of any format: format 1 lacks the tokens
    (they restart at 0 there, as that version's stream did); formats 1 and 2 emitted a chunk's
    sequences in the order made, so their chunk continues so. ValueError for anything else."""
    values = [int(value) for value in saved]
    if len(values) not in (5, 6, 7):
        raise ValueError(f"a stream position has 5 to 7 integers, not {len(values)}: {saved!r}")
    if len(values) < 7:
        values = [*values, 0][:6] + [1]
    return PartitionPosition(*values)


def positions_from_saved(saved: dict | None) -> dict[int, PartitionPosition] | None:
    """{partition: position} of a checkpoint's data module state ("partitions")."""
    if saved is None:
        return None
    return {int(partition): position_from_saved(p) for partition, p in saved.items()}
