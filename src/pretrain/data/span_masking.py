"""Span masking primitives: ALBERT's n-grams and SpanBERT's geometric spans, at word level.

Both work on the words of each row (see `masking.word_start_flags`): a unit is a run of
consecutive whole words inside one run of candidate tokens (never across [SEP] or padding),
units never overlap, and units are added until `mask_budget` tokens are covered
(`select_units`). Every draw is a `keyed_uniform` of (seed, epoch, stream, sequence key,
counter), made for the whole batch at once, so a sequence's mask depends only on (seed,
epoch, sequence key), never on the other rows of its batch; the placement is vectorised over
the batch (a renewal tiling of each row's words, then a random order cut at the budget).
"""

from functools import lru_cache

import numpy as np

from pretrain.data.keyed_rng import keyed_uniform
from pretrain.data.masking import (
    STREAM_MASK_NGRAM,
    STREAM_MASK_SPAN,
    batch_units,
    mask_budget,
    stable_row_order,
    unit_start_index,
)


def ngram_length_probabilities(max_ngram: int) -> np.ndarray:
    """ALBERT's n-gram length distribution: p(n) proportional to 1/n for n = 1..max_ngram.
    Returns (max_ngram,) float64; entry n-1 is p(n)."""
    weights = 1.0 / np.arange(1, max_ngram + 1)
    return weights / weights.sum()


def truncated_geometric_probabilities(p: float, max_length: int) -> np.ndarray:
    """SpanBERT's span-length law: Geometric(p) on 1, 2, ... truncated to 1..max_length and
    renormalised, p(k) = p (1-p)^(k-1) / sum_{j=1}^{max_length} p (1-p)^(j-1) (SpanBERT's
    `PairWithSpanMaskingScheme.len_distrib`; draws above max_length are not moved to it).
    Returns (max_length,) float64; entry k-1 is p(k)."""
    k = np.arange(1, max_length + 1)
    weights = p * (1 - p) ** (k - 1)
    return weights / weights.sum()


def sample_lengths(uniform: np.ndarray, law: np.ndarray) -> np.ndarray:
    """Unit lengths by inverse transform: n with probability law[n-1], n = 1..len(law).
    uniform any shape in [0, 1); returns int64 of its shape."""
    return 1 + np.searchsorted(np.cumsum(law)[:-1], uniform, side="right")


@lru_cache(maxsize=32)
def _delay_cdf(law: tuple[float, ...]) -> np.ndarray:
    """CDF (without its last entry) of the stationary delay of tiles of L ~ `law` words plus
    one word of gap: P(D = k) = P(L >= k) / (E[L] + 1), k = 0..len(law)."""
    law_array = np.array(law)
    at_least = np.concatenate(([1.0], law_array[::-1].cumsum()[::-1]))  # P(L >= k), k = 0..m
    return np.cumsum(at_least / at_least.sum())[:-1]


def batch_words(
    word_first: np.ndarray, candidates: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The words of every row (see `masking.word_start_flags`): (first token, length in
    tokens, how many words from it on stay inside its run of candidates, itself included),
    each (batch, W) int64 with W the most words of any row, and the words per row (batch,);
    slots past a row's words hold 0."""
    return _batch_words(word_first, candidates)[:4]


def _batch_words(word_first: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, ...]:
    """`batch_words` and the word of each token (batch, seq), -1 before a row's first."""
    starts, lengths, counts, word_of = batch_units(word_first, candidates)
    width = starts.shape[1]
    columns = np.arange(width)
    # word w+1 follows word w in the same run of candidates (never past a row's words)
    joined = np.zeros(starts.shape, bool)
    joined[:, :-1] = (starts[:, :-1] + lengths[:, :-1] == starts[:, 1:]) & (
        columns[1:] < counts[:, None]
    )
    # the last word of each word's run: the first w' >= w that is not joined to the next
    run_last = np.where(joined, width, columns)
    run_last = np.minimum.accumulate(run_last[:, ::-1], axis=1)[:, ::-1]
    left = np.where(columns < counts[:, None], run_last - columns + 1, 0)
    return starts, lengths, left, counts, word_of


def select_units(
    word_first: np.ndarray,
    candidates: np.ndarray,
    hashes: np.ndarray,
    law: np.ndarray,
    *,
    seed: int,
    epoch: int,
    stream: int,
    probability: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Units of whole words (n-grams, spans) of lengths drawn from `law` (entry n-1: p(n)
    words), `mask_budget(probability)` candidate tokens per row, keyed per row.

    Each row's words are tiled, from a random first word, by units of n ~ law words each
    followed by one free word (a renewal process started in its stationary state, so every
    word starts a unit equally often); a unit stops at the end of its run of candidates.
    The units are then taken in a random order while they fit the row's budget; the first
    that would overshoot keeps the whole words that fit (at least one word when it is the
    row's first unit), and later units whose first word fits the room left are taken the
    same way until the budget is covered. Units never overlap nor touch, and their lengths
    follow `law` but for the cuts at run ends and at the budget (as in SpanBERT and ALBERT).
    Draws: `keyed_uniform(seed, epoch, stream, hashes)`, counter 0 for the first word,
    2i+1 for unit i's length and 2i+2 for its rank, so a row's units depend only on its own
    key and words, never on the rest of the batch. word_first, candidates (batch, seq) bool,
    hashes (batch,) uint64. Returns (selected (batch, seq) bool, unit_start (batch, seq)
    int64: the first token of each token's unit)."""
    batch, length = candidates.shape
    words_before = np.zeros((batch, length + 1), np.int64)  # word starts before each token
    np.cumsum(word_first, axis=1, out=words_before[:, 1:])
    counts = words_before[:, -1]
    width = int(counts.max(initial=0))
    if width == 0:
        return np.zeros(candidates.shape, bool), np.zeros(candidates.shape, np.int64)
    word_of = words_before[:, 1:] - 1  # (batch, seq), -1 before a row's first word
    at = np.flatnonzero(word_first)  # word starts, row-major
    starts = np.full((batch, width + 1), length)  # first token of each word, then `length`
    starts.ravel()[at // length * (width + 1) + word_of.ravel()[at]] = at % length
    tokens_before = np.zeros((batch, length + 1), np.int64)  # candidates before each token
    np.cumsum(candidates, axis=1, out=tokens_before[:, 1:])
    run_end = np.full((batch, length + 1), length)  # first non-candidate at or after a token
    run_end[:, :-1] = np.where(candidates, length, np.arange(length))
    run_end = np.minimum.accumulate(run_end[:, ::-1], axis=1)[:, ::-1]

    size, rank, first = _tiles(law, counts, hashes, seed=seed, epoch=epoch, stream=stream)
    start_token = _gather(starts, first)
    last = np.minimum(first + size, _gather(words_before, _gather(run_end, start_token)))
    before = _gather(tokens_before, start_token)
    cost = _gather(tokens_before, _gather(starts, last)) - before  # (batch, tiles) tokens
    valid = first < counts[:, None]
    cost[~valid] = 0
    budgets = mask_budget(tokens_before[:, -1], probability)

    # units in ascending rank while they fit; then the overshooting one and later ones cut
    order = stable_row_order(np.where(valid, rank, 1.0))
    taken = np.cumsum(_gather(cost, order), axis=1)
    accepted_sorted = (taken <= budgets[:, None]) & _gather(valid, order)
    accepted = np.zeros(valid.shape, bool)
    accepted.ravel()[order + np.arange(batch)[:, None] * order.shape[1]] = accepted_sorted
    position = accepted_sorted.sum(axis=1)
    room = budgets - np.where(position > 0, _gather(taken, np.maximum(position - 1, 0)), 0)
    first_cost = _gather(tokens_before, _gather(starts, np.minimum(first + 1, width))) - before
    first_cost = _gather(np.where(valid, first_cost, 1 << 40), order)
    first_cost[position == 0, 0] = 0  # a row's first unit keeps at least a word
    _fill_room(
        room,
        position,
        first_cost,
        order,
        first,
        last,
        before,
        accepted,
        starts,
        tokens_before,
        len(law),
    )
    return _units_to_mask(candidates, starts, word_of, first, last, accepted)


def _gather(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """table[r, index[r, ...]] for each row r: table (batch, n), index (batch, ...) int."""
    rows = np.arange(len(table)).reshape((-1,) + (1,) * (index.ndim - 1))
    return table.ravel()[index + rows * table.shape[1]]


def _tiles(law, counts, hashes, *, seed, epoch, stream):
    """Each row's tiling: (size in words, rank, first word), each (batch, tiles), tiles
    enough for every row's words (the first `tiles` of a row's draws: drawn again with the
    most tiles any row could need when a row is not covered)."""
    mean_cycle = float((np.arange(1, len(law) + 1) * law).sum()) + 1
    width = int(counts.max())
    most = width // 2 + 2  # a tile is at least 2 words, gap included
    for tiles in (min(int(1.25 * width / mean_cycle) + 8, most), most):
        uniform = keyed_uniform(seed, epoch, stream, hashes, 2 * tiles + 1)
        size = np.ones((len(counts), tiles), np.int64)
        for bound in np.cumsum(law)[:-1]:  # inverse transform of law
            size += uniform[:, 1::2] >= bound
        delay = np.searchsorted(_delay_cdf(tuple(law)), uniform[:, 0], side="right")
        first = np.cumsum(size + 1, axis=1) - size - 1 + (delay % np.maximum(counts, 1))[:, None]
        if (first[:, -1] + size[:, -1] + 1 >= counts).all():
            break
    used = max(int((first < counts[:, None]).sum(axis=1).max()), 1)  # valid tiles come first
    return size[:, :used], uniform[:, 2 : 2 * used + 2 : 2], np.minimum(first[:, :used], width)


def _fill_room(
    room, position, first_cost, order, first, last, before, accepted, starts, tokens_before, longest
):
    """Take, row by row in rank order from `position`, the units whose first word fits the
    room left, each keeping the whole words that fit, until no room or no such unit is left
    (updates room, position, last and accepted in place; arrays as in `select_units`)."""
    tiles = order.shape[1]
    columns = np.arange(tiles)
    steps = np.arange(1, longest + 1)
    words_in = (last - first).ravel()
    active = np.flatnonzero(room > 0)
    while len(active):
        fits = (columns >= position[active, None]) & (first_cost[active] <= room[active, None])
        pick = np.argmax(fits, axis=1)
        found = fits.ravel()[np.arange(len(active)) * tiles + pick]
        active, pick = active[found], pick[found]
        tile = order.ravel()[active * tiles + pick] + active * tiles  # flat (batch, tiles)
        start = first.ravel()[tile]
        ends = np.minimum(start[:, None] + steps, starts.shape[1] - 1)  # (active, longest)
        reach = _gather(tokens_before[active], _gather(starts[active], ends))
        reach -= before.ravel()[tile][:, None]
        words = (reach <= room[active, None]) & (steps <= words_in[tile][:, None])
        kept = np.maximum(words.sum(axis=1), 1)
        last.ravel()[tile] = start + kept
        accepted.ravel()[tile] = True
        room[active] -= reach[np.arange(len(active)), kept - 1]
        position[active] = pick + 1
        active = active[room[active] > 0]


def _units_to_mask(candidates, starts, word_of, first, last, accepted):
    """(selected, unit_start) (batch, seq) of the accepted units of words [first, last)
    ((batch, tiles) each); units neither overlap nor touch, so their edges are distinct."""
    batch, width = starts.shape
    rows = (np.arange(batch)[:, None] * width + np.zeros_like(first))[accepted]  # flat row base
    edges = np.zeros(batch * width, np.int8)
    edges[rows + first[accepted]] = 1
    edges[rows + last[accepted]] = -1
    covered = np.cumsum(edges.reshape(batch, width), axis=1, dtype=np.int8) > 0
    # the last column (no word) is never covered: tokens before a row's first word read it
    selected = candidates & _gather(covered, word_of)
    unit_first = np.zeros(candidates.size, bool)
    unit_first[rows // width * candidates.shape[1] + starts.ravel()[rows + first[accepted]]] = True
    return selected, unit_start_index(unit_first.reshape(candidates.shape))


def select_ngrams(
    word_first: np.ndarray,
    candidates: np.ndarray,
    hashes: np.ndarray,
    *,
    seed: int,
    epoch: int,
    probability: float,
    max_ngram: int = 3,
) -> tuple[np.ndarray, np.ndarray]:
    """ALBERT's n-gram masking: `select_units` with p(n) proportional to 1/n, n = 1..max_ngram
    words (`ngram_length_probabilities`); like ALBERT, the n-gram that would overshoot the
    budget is shortened word by word. word_first, candidates (batch, seq) bool; hashes
    (batch,) uint64 (`key_hashes`). Returns (selected (batch, seq) bool, unit_start
    (batch, seq) int64)."""
    return select_units(
        word_first, candidates, hashes, ngram_length_probabilities(max_ngram),
        seed=seed, epoch=epoch, stream=STREAM_MASK_NGRAM, probability=probability,
    )  # fmt: skip


def select_spans(
    word_first: np.ndarray,
    candidates: np.ndarray,
    hashes: np.ndarray,
    *,
    seed: int,
    epoch: int,
    probability: float,
    geometric_p: float = 0.2,
    max_span_words: int = 10,
) -> tuple[np.ndarray, np.ndarray]:
    """SpanBERT's span masking: `select_units` with lengths in words from
    `truncated_geometric_probabilities(geometric_p, max_span_words)`; like SpanBERT, the
    span that reaches the budget is cut there (at a word's end). word_first, candidates
    (batch, seq) bool; hashes (batch,) uint64 (`key_hashes`). Returns (selected (batch,
    seq) bool, unit_start (batch, seq) int64, the first token of each token's span)."""
    return select_units(
        word_first, candidates, hashes, truncated_geometric_probabilities(geometric_p, max_span_words),
        seed=seed, epoch=epoch, stream=STREAM_MASK_SPAN, probability=probability,
    )  # fmt: skip


def span_boundaries(
    selected: np.ndarray, unit_start: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SpanBERT's span-boundary targets. For each selected token i of the span s..e (token
    indices; a span = consecutive selected tokens sharing `unit_start`): the left boundary
    s-1, the right boundary e+1 and the position i-s inside the span (0 at s). Inputs and the
    three outputs (batch, seq); outputs int64, 0 where nothing is selected."""
    length = selected.shape[1]
    positions = np.arange(length, dtype=np.int64)
    same_next = np.zeros_like(selected)
    same_next[:, :-1] = selected[:, 1:] & (unit_start[:, 1:] == unit_start[:, :-1])
    last = selected & ~same_next  # (batch, seq): the last token of a span
    # span end per token: the next `last` at or after it (reverse running minimum)
    end = np.where(last, positions, length)[:, ::-1]
    end = np.minimum.accumulate(end, axis=1)[:, ::-1]
    left = np.where(selected, unit_start - 1, 0)
    right = np.where(selected, end + 1, 0)
    position = np.where(selected, positions - unit_start, 0)
    return tuple(a.astype(np.int64, copy=False) for a in (left, right, position))
