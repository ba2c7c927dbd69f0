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
    rows = np.arange(batch)[:, None]
    words_before = np.zeros((batch, length + 1), np.int64)  # word starts before each token
    np.cumsum(word_first, axis=1, out=words_before[:, 1:])
    counts = words_before[:, -1]
    width = int(counts.max(initial=0))
    if width == 0:
        return np.zeros(candidates.shape, bool), np.zeros(candidates.shape, np.int64)
    word_of = words_before[:, 1:] - 1  # (batch, seq), -1 before a row's first word
    starts = np.full((batch, width + 1), length)  # first token of each word, then `length`
    at_row, at_token = np.nonzero(word_first)
    starts[at_row, word_of[at_row, at_token]] = at_token
    tokens_before = np.zeros((batch, length + 1), np.int64)  # candidates before each token
    np.cumsum(candidates, axis=1, out=tokens_before[:, 1:])
    positions = np.arange(length)
    run_end = np.minimum.accumulate(np.where(candidates, length, positions)[:, ::-1], axis=1)
    run_end = np.append(run_end[:, ::-1], np.full((batch, 1), length), axis=1)  # (batch, seq+1)

    tiles = width // 2 + 2  # enough for any row: a tile is at least 2 words, gap included
    uniform = keyed_uniform(seed, epoch, stream, hashes, 2 * tiles + 1)
    size = sample_lengths(uniform[:, 1::2], law)  # (batch, tiles) words
    delay = np.searchsorted(_delay_cdf(tuple(law)), uniform[:, 0], side="right")
    first = np.cumsum(size + 1, axis=1) - (size + 1) + (delay % np.maximum(counts, 1))[:, None]
    valid = first < counts[:, None]
    first = np.minimum(first, width)
    start_token = starts[rows, first]
    last = np.minimum(first + size, words_before[rows, run_end[rows, start_token]])  # run's end
    before = tokens_before[rows, start_token]
    cost = np.where(valid, tokens_before[rows, starts[rows, last]] - before, 0)
    budgets = mask_budget(tokens_before[:, -1], probability)

    # units in ascending rank while they fit; then the overshooting one and later ones cut
    order = np.argsort(np.where(valid, uniform[:, 2::2], 2.0), axis=1, kind="stable")
    taken = np.cumsum(cost[rows, order], axis=1)
    accepted_sorted = (taken <= budgets[:, None]) & valid[rows, order]
    accepted = np.zeros(valid.shape, bool)
    accepted[rows, order] = accepted_sorted
    position = accepted_sorted.sum(axis=1)
    room = budgets - np.where(position > 0, taken[rows[:, 0], position - 1], 0)
    first_cost = np.where(
        valid, tokens_before[rows, starts[rows, np.minimum(first + 1, width)]] - before, 1 << 40
    )
    first_cost = first_cost[rows, order]
    first_cost[:, 0] = np.where(
        position == 0, 0, first_cost[:, 0]
    )  # the row's first: at least a word
    columns = np.arange(tiles)
    steps = np.arange(1, len(law) + 1)
    words_in = last - first  # (batch, tiles)
    active = room > 0
    while active.any():
        fits = (columns >= position[:, None]) & (first_cost <= room[:, None])
        pick = np.argmax(fits, axis=1)
        active &= fits[rows[:, 0], pick]
        at = np.flatnonzero(active)
        tile = order[at, pick[at]]
        reach = tokens_before[
            at[:, None], starts[at[:, None], np.minimum(first[at, tile, None] + steps, width)]
        ]
        words = (reach - before[at, tile, None] <= room[at, None]) & (
            steps <= words_in[at, tile, None]
        )
        kept = np.maximum(words.sum(axis=1), 1)
        last[at, tile] = first[at, tile] + kept
        accepted[at, tile] = True
        room[at] -= reach[np.arange(len(at)), kept - 1] - before[at, tile]
        position[at] = pick[at] + 1
        active &= room > 0
    return _units_to_mask(candidates, starts, word_of, first, last, accepted)


def _units_to_mask(candidates, starts, word_of, first, last, accepted):
    """(selected, unit_start) (batch, seq) of the accepted units of words [first, last)
    ((batch, tiles) each); units neither overlap nor touch, so their edges are distinct."""
    batch, width = starts.shape
    at_row = np.broadcast_to(np.arange(batch)[:, None], first.shape)[accepted]
    edges = np.zeros((batch, width), np.int8)
    edges[at_row, first[accepted]] = 1
    edges[at_row, last[accepted]] = -1
    covered = np.cumsum(edges, axis=1, dtype=np.int8) > 0  # (batch, W + 1), last column False
    selected = candidates & covered[np.arange(batch)[:, None], word_of]
    unit_first = np.zeros(candidates.shape, bool)
    unit_first[at_row, starts[at_row, first[accepted]]] = True
    return selected, unit_start_index(unit_first)


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
    return left.astype(np.int64), right.astype(np.int64), position.astype(np.int64)
