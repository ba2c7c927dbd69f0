"""Static prediction budgets: the predicted positions of a batch as a (batch, width) array
whose width comes from a small, fixed set, so the heads see a bounded set of tensor shapes.

Like the reference BERT's `max_predictions_per_seq`, each row lists the positions of its
predicted tokens, left to right, padded with -1 (an ignored slot) up to the width. The width
is the smallest of `prediction_widths(per_row, max_seq_length)` that holds the row with the
most predictions: the base budget ceil(per_row) (the expected predictions per row of a full
sequence, e.g. 0.15 x 128 = 19.2 -> 20), then doubled, up to `max_seq_length`. Objectives
whose selection never exceeds the base (token-level MLM selects round(p x candidates) per
row, XLNet round(candidates / K)) use one width; span, word and n-gram units may overshoot
it by a unit and then take the next width. Computed in the data-loader workers, so the step
reads the width from the array's shape, without a host synchronisation.

A run's documented shape set (`shape_set`, printed on the batch-plan line at start) is, by
axis: the micro-batch (fixed: short batches are held back, `data/loader.py`), the sequence
length (collated to the next of at most `SEQUENCE_BUCKETS` lengths, `sequence_widths`), and
the corruption's own axes (`shape_axes`: prediction widths, decoder lengths, bucketed alike).
`batch_shape` reads those axes off a batch. An encoder run unpadded (model.unpad) adds one
axis inside the model: its row count, one of at most 16 buckets per input shape
(`pretrain/models/unpadding.py`, `unpadded_widths`; named on the same line).
"""

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

SEQUENCE_MULTIPLE = 8  # sequence buckets are multiples of this many tokens
SEQUENCE_BUCKETS = 8  # at most this many sequence lengths per run


@lru_cache(maxsize=64)  # called per batch with a run's few arguments
def prediction_widths(per_row: float, max_seq_length: int) -> tuple[int, ...]:
    """The allowed widths (predicted positions per row): ceil(per_row) (at least 1), doubled
    until `max_seq_length`, which is always the last (no row predicts more tokens than it has)."""
    widths = [min(max_seq_length, max(1, math.ceil(per_row - 1e-9)))]
    while widths[-1] < max_seq_length:
        widths.append(min(2 * widths[-1], max_seq_length))
    return tuple(widths)


def sequence_widths(max_seq_length: int) -> tuple[int, ...]:
    """The sequence lengths (tokens) a collated batch can have: at most `SEQUENCE_BUCKETS`,
    multiples of a step that is itself a multiple of `SEQUENCE_MULTIPLE` (16 for 128 tokens,
    64 for 512; a batch pads at most that many tokens a row past its longest), the last
    `max_seq_length` rounded up to a multiple of `SEQUENCE_MULTIPLE`."""
    last = _round_up(max_seq_length, SEQUENCE_MULTIPLE)
    step = _round_up(math.ceil(last / SEQUENCE_BUCKETS), SEQUENCE_MULTIPLE)
    return (*range(step, last, step), last)


def sequence_width(longest: int, max_seq_length: int | None) -> int:
    """The padded length of a batch whose longest row has `longest` tokens: the smallest of
    `sequence_widths(max_seq_length)` that holds it; a multiple of `SEQUENCE_MULTIPLE` when
    no maximum is given or the row is longer than the maximum (no bucket holds it)."""
    if max_seq_length is None or longest > _round_up(max_seq_length, SEQUENCE_MULTIPLE):
        return _round_up(longest, SEQUENCE_MULTIPLE)
    return width_for(longest, sequence_widths(max_seq_length))


def _round_up(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


def width_for(count: int, widths: Sequence[int]) -> int:
    """The smallest of `widths` that holds `count` predictions; ValueError when none does."""
    for width in widths:
        if width >= count:
            return width
    raise ValueError(f"{count} predictions in a row exceed the largest budget {widths[-1]}")


def prediction_positions(selected: np.ndarray, widths: Sequence[int]) -> np.ndarray:
    """(batch, width) int64: the positions of each row's True entries of `selected` (batch,
    seq) bool, left to right, then -1; width = `width_for` the row with the most."""
    counts = np.count_nonzero(selected, axis=1)
    return listed_positions(np.flatnonzero(selected), counts, selected.shape[1], widths)


def listed_positions(
    flat: np.ndarray, counts: np.ndarray, length: int, widths: Sequence[int]
) -> np.ndarray:
    """`prediction_positions` from the selected entries themselves: `flat` their indices
    row x length + position in a (batch, length) array, increasing (row-major), `counts`
    (batch,) how many each row has. Returns (batch, width) int64, -1 past a row's entries."""
    width = width_for(int(counts.max(initial=0)), widths)
    rows = flat // length
    first = np.cumsum(counts) - counts  # index in `flat` of each row's first entry
    slots = np.arange(len(flat)) - first[rows] + rows * width  # (row, index in the row)
    positions = np.full(len(counts) * width, -1, np.int64)
    positions[slots] = flat - rows * length
    return positions.reshape(len(counts), width)


def shape_set(corruption: object, max_seq_length: int) -> dict[str, tuple[int, ...]]:
    """The sizes each axis of a model input may take, by axis name: `sequence`, then the
    corruption's own axes (its `shape_axes(max_seq_length)`, when it has one)."""
    axes = {"sequence": sequence_widths(max_seq_length)}
    own = getattr(corruption, "shape_axes", None)
    return axes | own(max_seq_length) if own is not None else axes


def batch_shape(batch: dict) -> dict[str, int]:
    """The sizes of a batch's axes (those of `shape_set`, plus `batch`): read from input_ids,
    decoder_input_ids, prediction_positions or XLNet's target_mapping, shuffle_positions."""
    size = {"batch": batch["input_ids"].shape[0], "sequence": batch["input_ids"].shape[1]}
    if "decoder_input_ids" in batch:
        size["decoder"] = batch["decoder_input_ids"].shape[1]
    if "prediction_positions" in batch:
        size["predictions"] = batch["prediction_positions"].shape[1]
    if "target_mapping" in batch:
        size["predictions"] = batch["target_mapping"].shape[1]
    if "shuffle_positions" in batch:
        size["word_order"] = batch["shuffle_positions"].shape[1]
    return size


def _sizes(values: tuple[int, ...]) -> str:
    step = values[1] - values[0] if len(values) > 4 else 0
    if step and values == tuple(range(values[0], values[-1] + 1, step)):
        return f"{values[0]}..{values[-1]} step {step}"
    return ", ".join(str(v) for v in values)


def describe_shape_set(axes: dict[str, tuple[int, ...]], micro_batch_size: int | None) -> str:
    """One line: each axis's sizes and the most distinct input shapes they allow;
    `micro_batch_size` None: token-budget batches, whose row count varies."""
    rows = micro_batch_size or "varying (data.tokens_per_batch)"
    parts = [f"batch {rows}"] + [f"{name} {_sizes(v)}" for name, v in axes.items()]
    most = math.prod(map(len, axes.values()))
    return f"input shapes: {' x '.join(parts)} (at most {most}{'' if micro_batch_size else ' a row count'})"
