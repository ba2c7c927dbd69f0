"""Static prediction budgets: the widths a run allows and the padded positions of a batch."""

import numpy as np
import pytest

from pretrain.data.prediction_budget import (
    describe_shape_set,
    listed_positions,
    prediction_positions,
    prediction_widths,
    sequence_width,
    sequence_widths,
    width_for,
)


def test_widths_start_at_the_expected_predictions_and_end_at_the_sequence():
    assert prediction_widths(0.15 * 128, 128) == (20, 40, 80, 128)  # BERT: 20 per 128 tokens
    assert prediction_widths(0.15 * 512, 512) == (77, 154, 308, 512)
    assert prediction_widths(64 / 6, 64) == (11, 22, 44, 64)
    assert prediction_widths(0.0, 16) == (1, 2, 4, 8, 16)
    assert prediction_widths(200.0, 64) == (64,)
    assert sequence_widths(64) == tuple(range(8, 65, 8)) and sequence_widths(60)[-1] == 64


def test_sequences_pad_to_at_most_eight_buckets():
    assert sequence_widths(128) == (16, 32, 48, 64, 80, 96, 112, 128)
    assert sequence_widths(512) == tuple(range(64, 513, 64))
    assert sequence_widths(100) == (16, 32, 48, 64, 80, 96, 104)  # the last: 100 rounded to 8
    assert sequence_widths(12) == (8, 16)
    assert [sequence_width(n, 128) for n in (1, 16, 17, 70, 128)] == [16, 16, 32, 80, 128]
    assert sequence_width(130, 128) == 136  # longer than the maximum: a multiple of 8
    assert sequence_width(17, None) == 24  # no maximum: a multiple of 8


def test_positions_are_left_to_right_padded_with_minus_one_to_a_width_of_the_set():
    selected = np.zeros((3, 16), bool)
    selected[0, [2, 5, 9]] = True
    selected[2, [0, 15]] = True
    positions = prediction_positions(selected, (4, 8, 16))
    np.testing.assert_array_equal(positions, [[2, 5, 9, -1], [-1, -1, -1, -1], [0, 15, -1, -1]])
    selected[1, :6] = True  # 6 predictions: the next width
    assert prediction_positions(selected, (4, 8, 16)).shape == (3, 8)
    assert width_for(0, (4, 8)) == 4
    with pytest.raises(ValueError, match="exceed the largest budget 8"):
        width_for(9, (4, 8))


def test_the_shape_line_names_every_axis_and_the_bound():
    line = describe_shape_set({"sequence": sequence_widths(64), "predictions": (10, 20)}, 8)
    assert line == (
        "input shapes: batch 8 x sequence 8..64 step 8 x predictions 10, 20 (at most 16)"
    )


def test_positions_from_listed_entries_equal_the_positions_of_the_mask():
    rng = np.random.default_rng(0)
    selected = rng.random((50, 40)) < rng.random((50, 1)) * 0.5
    selected[3] = False  # a row without predictions
    flat = np.flatnonzero(selected)
    expected = [sorted(np.flatnonzero(row)) for row in selected]
    positions = listed_positions(flat, selected.sum(axis=1), 40, (8, 16, 32, 40))
    assert positions.shape[1] == width_for(max(map(len, expected)), (8, 16, 32, 40))
    for row, columns in zip(positions, expected, strict=True):
        assert list(row[: len(columns)]) == columns and (row[len(columns) :] == -1).all()
    np.testing.assert_array_equal(prediction_positions(selected, (8, 16, 32, 40)), positions)
