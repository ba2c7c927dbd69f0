"""Spans and n-grams drawn from keyed uniforms (`span_masking.select_units`, issue 14 item 5):
a row's units depend only on (seed, epoch, key) and its own tokens, never on the rows it is
batched with; without a budget to cut them, unit lengths follow the law and every word
starts a unit equally often; StructBERT's trigram shuffle likewise."""

import numpy as np
import pytest
from test_unit_masking import CHI2_999

from pretrain.data.keyed_rng import key_hashes, keyed_uniform
from pretrain.data.masking import STREAM_MASK_SPAN, mask_budget, word_start_flags
from pretrain.data.span_masking import (
    ngram_length_probabilities,
    select_ngrams,
    select_spans,
    select_units,
    truncated_geometric_probabilities,
)
from pretrain.objectives.structbert import shuffle_batch_trigrams


def random_rows(rng, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(word_first, candidates) (rows, length): runs of candidates, words of 1+ tokens."""
    candidates = rng.random((rows, length)) < rng.uniform(0.5, 1.0)
    word_starts = rng.random((rows, length)) < rng.uniform(0.3, 1.0)
    return word_start_flags(word_starts, candidates), candidates


def random_batches(seed: int, trials: int, most_rows: int, most_length: int):
    """(trial, word_first, candidates, hashes, probability) of random batches."""
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        rows, length = int(rng.integers(1, most_rows)), int(rng.integers(1, most_length))
        first, candidates = random_rows(rng, rows, length)
        hashes = key_hashes([f"doc_{trial}:{row}" for row in range(rows)])
        yield trial, first, candidates, hashes, float(rng.choice([0.05, 0.15, 0.5]))


@pytest.mark.parametrize("select", [select_spans, select_ngrams])
def test_a_rows_units_do_not_depend_on_its_batch(select):
    rng = np.random.default_rng(0)
    for trial, first, candidates, hashes, probability in random_batches(0, 150, 10, 140):
        rows, length = candidates.shape
        settings = {"seed": 5, "epoch": trial % 3, "probability": probability}
        selected, unit_start = select(first, candidates, hashes, **settings)
        budgets = mask_budget(candidates.sum(axis=1), probability)
        units = (selected & (unit_start == np.arange(length))).sum(axis=1)
        assert ((selected.sum(axis=1) <= budgets) | (units == 1)).all()
        assert ((units > 0) == (budgets > 0)).all()  # at least one unit where any candidate
        # the same rows in another batch: a permuted subset, padded wider
        subset = rng.permutation(rows)[: int(rng.integers(1, rows + 1))]
        pad = ((0, 0), (0, int(rng.integers(0, 30))))
        again, again_start = select(
            np.pad(first[subset], pad), np.pad(candidates[subset], pad), hashes[subset], **settings
        )
        np.testing.assert_array_equal(again[:, :length], selected[subset])
        assert not again[:, length:].any()
        np.testing.assert_array_equal(
            np.where(again[:, :length], again_start[:, :length], -1),
            np.where(selected[subset], unit_start[subset], -1),
        )


def reference_row_units(word_first, candidates, key_hash, law, probability):
    """`select_units` of one row, read plainly: (start, end) token spans of its units."""
    words = np.flatnonzero(word_first).tolist()
    n, budget = len(words), int(mask_budget(candidates.sum(), probability))
    if n == 0:
        return []
    word_of = np.cumsum(word_first) - 1
    tokens = [int((candidates & (word_of == w)).sum()) for w in range(n)]
    run_end = []  # first word of the next run of candidates, per word
    for w in range(n):
        t = words[w]
        while t < len(candidates) and candidates[t]:
            t += 1
        run_end.append(int(word_first[:t].sum()))
    draws = keyed_uniform(5, 2, STREAM_MASK_SPAN, np.array([key_hash], np.uint64), n + 5)[0]
    at_least = [1.0] + [law[k - 1 :].sum() for k in range(1, len(law) + 1)]  # P(L >= k)
    delay = int(np.searchsorted(np.cumsum(at_least) / sum(at_least), draws[0], side="right"))
    tiles, w, i = [], delay % n, 0
    while w < n:  # (first word, end word, rank)
        size = 1 + int(np.searchsorted(np.cumsum(law)[:-1], draws[2 * i + 1], side="right"))
        tiles.append((w, min(w + size, run_end[w]), draws[2 * i + 2]))
        w, i = w + size + 1, i + 1
    tiles.sort(key=lambda tile: tile[2])
    chosen, room, position = [], budget, 0
    while position < len(tiles) and sum(tokens[tiles[position][0] : tiles[position][1]]) <= room:
        first, end, _ = tiles[position]
        chosen.append((first, end))
        room -= sum(tokens[first:end])
        position += 1
    while room > 0:  # the rest: the next unit whose first word fits keeps the words that fit
        later = [k for k in range(position, len(tiles)) if tokens[tiles[k][0]] <= room]
        if not chosen and position == 0:
            later = [0]  # a row's first unit keeps at least a word
        if not later:
            break
        first, end, _ = tiles[later[0]]
        kept = 1
        while first + kept < end and sum(tokens[first : first + kept + 1]) <= room:
            kept += 1
        chosen.append((first, first + kept))
        room -= sum(tokens[first : first + kept])
        position = later[0] + 1
    return sorted((words[a], words[b - 1] + tokens[b - 1]) for a, b in chosen)


@pytest.mark.parametrize(
    "law", [truncated_geometric_probabilities(0.2, 10), ngram_length_probabilities(3)]
)
def test_units_equal_the_plain_per_row_reading(law):
    for trial, first, candidates, hashes, probability in random_batches(6, 120, 6, 100):
        rows, length = candidates.shape
        selected, unit_start = select_units(
            first, candidates, hashes, law, seed=5, epoch=2, stream=STREAM_MASK_SPAN,
            probability=probability,
        )  # fmt: skip
        for row in range(rows):
            spans = reference_row_units(first[row], candidates[row], hashes[row], law, probability)
            starts = np.flatnonzero(selected[row] & (unit_start[row] == np.arange(length)))
            got = [
                (int(s), int(s + (selected[row] & (unit_start[row] == s)).sum())) for s in starts
            ]
            assert got == spans, (trial, row)


def test_units_change_with_the_epoch_and_the_seed():
    first, candidates = random_rows(np.random.default_rng(1), 64, 128)
    hashes = key_hashes([f"r{i}" for i in range(64)])
    base = select_spans(first, candidates, hashes, seed=1, epoch=0, probability=0.15)[0]
    for other in ({"seed": 1, "epoch": 1}, {"seed": 2, "epoch": 0}):
        changed = select_spans(first, candidates, hashes, probability=0.15, **other)[0]
        assert (changed != base).any(axis=1).mean() > 0.9


def unit_runs(selected: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, first token, length) of each maximal run of selected tokens."""
    padded = np.pad(selected, ((0, 0), (1, 1))).astype(np.int8)
    change = np.diff(padded, axis=1)
    rows, starts = np.nonzero(change == 1)
    _, ends = np.nonzero(change == -1)
    return rows, starts, ends - starts


@pytest.mark.parametrize(
    "law",
    [truncated_geometric_probabilities(0.2, 10), ngram_length_probabilities(3)],
    ids=["spanbert", "albert"],
)
def test_without_a_budget_units_follow_the_law_and_start_anywhere_alike(law):
    # probability 1: every unit is kept whole, only the row's end cuts one; one-token words
    rows, length = 400, 200
    candidates = np.ones((rows, length), bool)
    hashes = key_hashes([f"row{i}" for i in range(rows)])
    selected, unit_start = select_units(
        candidates, candidates, hashes, law, seed=4, epoch=0, stream=STREAM_MASK_SPAN,
        probability=1.0,
    )  # fmt: skip
    row, start, size = unit_runs(selected)
    np.testing.assert_array_equal(unit_start[row, start], start)  # a run is one unit
    assert (np.bincount(row, minlength=rows) > 0).all()
    whole = size[start + size < length]  # not cut by the row's end
    counts = np.bincount(whole, minlength=len(law) + 1)[1:]
    assert len(counts) == len(law)
    expected = law * len(whole)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < {2: CHI2_999[2], 9: CHI2_999[9]}[len(law) - 1], counts
    # a unit starts at any word alike (the tiling starts in its stationary state): one in
    # E[n] + 1 words, the gap included, in each tenth of the row
    rate = 1 / ((np.arange(1, len(law) + 1) * law).sum() + 1)
    per_tenth = np.bincount(start * 10 // length, minlength=10)
    expected = rate * rows * length / 10
    assert ((per_tenth - expected) ** 2 / expected).sum() < CHI2_999[9], per_tenth


def test_a_rows_trigram_shuffle_does_not_depend_on_its_batch():
    rng = np.random.default_rng(2)
    for trial in range(150):
        rows, length = int(rng.integers(2, 10)), int(rng.integers(1, 140))
        free = rng.random((rows, length)) < rng.uniform(0.5, 1.0)
        ids = rng.integers(5, 1000, (rows, length))
        hashes = key_hashes([f"doc_{trial}:{row}" for row in range(rows)])
        fraction = float(rng.choice([0.05, 0.2]))
        shuffled, (at_row, at_column) = shuffle_batch_trigrams(ids, free, fraction, hashes, 3, 1)
        moved = np.zeros(ids.shape, bool)
        moved[at_row, at_column] = True
        assert moved.sum() == len(at_row) and free[moved].all()
        wanted = np.rint(fraction * free.sum(axis=1) / 3)
        assert (moved.sum(axis=1) <= 3 * wanted).all()
        subset = rng.permutation(rows)[: int(rng.integers(1, rows + 1))]
        pad = ((0, 0), (0, int(rng.integers(0, 30))))
        again, (again_row, again_column) = shuffle_batch_trigrams(
            np.pad(ids[subset], pad), np.pad(free[subset], pad), fraction, hashes[subset], 3, 1
        )
        np.testing.assert_array_equal(again[:, :length], shuffled[subset])
        again_moved = np.zeros(again.shape, bool)
        again_moved[again_row, again_column] = True
        np.testing.assert_array_equal(again_moved[:, :length], moved[subset])


def test_trigram_shuffles_fill_their_rate_and_start_anywhere_alike():
    rows, length, fraction = 2000, 128, 0.05
    free = np.random.default_rng(3).random((rows, length)) < 0.85
    ids = np.arange(rows * length).reshape(rows, length)
    hashes = key_hashes([f"row{i}" for i in range(rows)])
    _, (at_row, at_column) = shuffle_batch_trigrams(ids, free, fraction, hashes, 3, 0)
    wanted = np.rint(fraction * free.sum(axis=1) / 3).astype(int)
    np.testing.assert_array_equal(np.bincount(at_row, minlength=rows), 3 * wanted)
    starts = at_column[::3]  # each trigram's first position
    in_run = free[:, :-2] & free[:, 1:-1] & free[:, 2:]
    # starts are spread over the row like the trigrams that fit (tenths of the row)
    per_tenth = np.bincount(starts * 10 // (length - 2), minlength=10)
    room = in_run.sum(axis=0)
    expected = np.bincount(np.arange(length - 2) * 10 // (length - 2), weights=room, minlength=10)
    expected = expected / expected.sum() * len(starts)
    assert ((per_tenth - expected) ** 2 / expected).sum() < CHI2_999[9], per_tenth
