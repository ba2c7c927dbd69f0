"""The stream position as named records (`pretrain.data.positions`): a mark's position,
and every checkpoint format read back."""

import pytest

from pretrain.data.positions import (
    MARK_COLUMNS,
    PartitionPosition,
    StreamMark,
    next_position,
    position_from_saved,
    positions_from_saved,
)


def test_the_position_after_a_mark_continues_after_its_sequence():
    mark = StreamMark(partition=3, number=9, chunk=2, order=5, document=7, in_chunk=4, tokens=640)
    assert next_position(mark) == PartitionPosition(10, 2, 5, 7, 5, 640, 0)
    assert next_position(list(mark)) == next_position(mark)  # a batch array's row
    assert MARK_COLUMNS["number"] == 1 and MARK_COLUMNS["tokens"] == 6
    # a chunk continued in the order made (a format 1-2 resume) stays so in its next position
    assert next_position(mark._replace(made_order=1)).made_order == 1


def test_every_saved_format_reads_back():
    # format 3: seven integers, the chunk's order last (0: shuffled)
    assert position_from_saved([10, 2, 5, 7, 5, 640, 0]) == PartitionPosition(10, 2, 5, 7, 5, 640)
    # format 2: six, the tokens last; its chunks were emitted in the order made
    assert position_from_saved([10, 2, 5, 7, 5, 640]) == PartitionPosition(10, 2, 5, 7, 5, 640, 1)
    # format 1 (checkpoints before the partition's tokens were kept): five, tokens from 0
    old = position_from_saved([10, 2, 5, 7, 5])
    assert old == PartitionPosition(10, 2, 5, 7, 5, 0, 1)
    saved = {"4": [1, 0, 0, 0, 1]}
    assert positions_from_saved(saved) == {4: PartitionPosition(1, 0, 0, 0, 1, 0, 1)}
    assert positions_from_saved(None) is None
    with pytest.raises(ValueError, match="5 to 7 integers"):
        position_from_saved([1, 2, 3])
