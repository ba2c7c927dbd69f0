"""Span masking primitives: ALBERT's n-grams and SpanBERT's geometric spans, at word level.

Both work on the words of each row (see `masking.word_start_flags`): a unit is a run of
consecutive whole words inside one run of candidate tokens (never across [SEP] or padding),
units never overlap, and units are added until `mask_budget` tokens are covered. Each row's
draws come from `keyed_generator(seed, epoch, stream, key)`, so a sequence's mask depends
only on (seed, epoch, sequence key). The words of every row, the lengths drawn and the
masks are computed for the whole batch at once; what stays per row is its generator's draws
and the greedy placement of its units (`_fill_ngrams`, `_fill_spans`), a loop per unit.
"""

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from pretrain.data.keyed_rng import keyed_generators
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


@lru_cache(maxsize=32)
def _ngram_cdf(top: int) -> np.ndarray:
    return np.cumsum(ngram_length_probabilities(top))[:-1]  # (top - 1,)


def sample_ngram_lengths(uniform: np.ndarray, available: np.ndarray, max_ngram: int) -> np.ndarray:
    """N-gram lengths in words by inverse transform: p(n) proportional to 1/n over
    n = 1..min(max_ngram, available) (ALBERT renormalises over the n-grams that fit before the
    sequence ends). uniform (k,) in [0, 1), available (k,) >= 1 words; returns (k,) int64.
    Elementwise: the draws of many rows may be given at once."""
    lengths = np.ones(len(uniform), np.int64)
    tops = np.minimum(available, max_ngram)
    for top in range(2, max_ngram + 1):
        rows = tops == top
        if rows.any():
            lengths[rows] = 1 + np.searchsorted(_ngram_cdf(top), uniform[rows], side="right")
    return lengths


def truncated_geometric_probabilities(p: float, max_length: int) -> np.ndarray:
    """SpanBERT's span-length law: Geometric(p) on 1, 2, ... truncated to 1..max_length and
    renormalised, p(k) = p (1-p)^(k-1) / sum_{j=1}^{max_length} p (1-p)^(j-1) (SpanBERT's
    `PairWithSpanMaskingScheme.len_distrib`; draws above max_length are not moved to it).
    Returns (max_length,) float64; entry k-1 is p(k)."""
    k = np.arange(1, max_length + 1)
    weights = p * (1 - p) ** (k - 1)
    return weights / weights.sum()


def sample_span_lengths(
    rng: np.random.Generator, size: int, p: float, max_length: int
) -> np.ndarray:
    """SpanBERT span lengths in words, by inverse transform from
    `truncated_geometric_probabilities(p, max_length)`. Returns (size,) int64 in 1..max_length."""
    cdf = np.cumsum(truncated_geometric_probabilities(p, max_length))[:-1]  # (max_length - 1,)
    return 1 + np.searchsorted(cdf, rng.random(size), side="right").astype(np.int64)


def batch_words(
    word_first: np.ndarray, candidates: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The words of every row (see `masking.word_start_flags`): (first token, length in
    tokens, how many words from it on stay inside its run of candidates, itself included),
    each (batch, W) int64 with W the most words of any row, and the words per row (batch,);
    slots past a row's words hold 0."""
    starts, lengths, counts, _ = batch_units(word_first, candidates)
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
    return starts, lengths, left.astype(np.int64), counts


def _spans_to_mask(
    shape: tuple[int, int], rows: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(selected, unit_start) of non-overlapping token spans [starts, ends) of rows `rows`,
    all (spans,) int64."""
    batch, length = shape
    edges = np.zeros((batch, length + 1), np.int64)
    np.add.at(edges, (rows, starts), 1)
    np.add.at(edges, (rows, ends), -1)
    selected = np.cumsum(edges[:, :-1], axis=1) > 0
    first = np.zeros(shape, bool)
    first[rows, starts] = True
    return selected, unit_start_index(first)


def _spans_arrays(rows_spans: Sequence[list[tuple[int, int]]]) -> tuple[np.ndarray, ...]:
    """(rows, starts, ends) (spans,) int64 of per-row lists of (start, end) spans."""
    rows = [row for row, spans in enumerate(rows_spans) for _ in spans]
    flat = [span for spans in rows_spans for span in spans]
    bounds = np.array(flat, np.int64).reshape(-1, 2)
    return np.array(rows, np.int64), bounds[:, 0], bounds[:, 1]


def select_ngrams(
    word_first: np.ndarray,
    candidates: np.ndarray,
    keys: Sequence[str],
    *,
    seed: int,
    epoch: int,
    probability: float,
    max_ngram: int = 3,
) -> tuple[np.ndarray, np.ndarray]:
    """ALBERT's n-gram masking. Start words are visited in a uniformly random order; each
    draws n by `sample_ngram_lengths`; an n-gram that would overshoot the row's budget is
    shortened word by word (ALBERT), one that still overshoots or overlaps a chosen n-gram is
    skipped; at least one unit per row. word_first, candidates (batch, seq) bool; keys
    (batch,). Returns (selected (batch, seq) bool, unit_start (batch, seq) int64)."""
    budgets = mask_budget(candidates.sum(axis=1), probability).tolist()
    starts, lengths, left, counts = batch_words(word_first, candidates)
    counts = counts.tolist()
    generators = keyed_generators(seed, epoch, STREAM_MASK_NGRAM, list(keys))
    orders, uniforms = [], []
    for rng, n in zip(generators, counts, strict=True):  # each row's draws, in their order
        orders.append(rng.permutation(n).tolist())
        uniforms.append(rng.random(n))
    real = np.arange(starts.shape[1]) < np.array(counts)[:, None]
    ngram = np.zeros(starts.shape, np.int64)
    if real.any():
        ngram[real] = sample_ngram_lengths(np.concatenate(uniforms), left[real], max_ngram)
    rows_spans = [
        _fill_ngrams(s[:n], w[:n], order, g[:n], budget)
        for s, w, order, g, n, budget in zip(
            starts.tolist(), lengths.tolist(), orders, ngram.tolist(), counts, budgets, strict=True
        )
    ]
    return _spans_to_mask(candidates.shape, *_spans_arrays(rows_spans))


def _fill_ngrams(
    starts: list, lengths: list, order: list, ngram: list, budget: int
) -> list[tuple[int, int]]:
    covered = [False] * len(starts)
    spans, remaining = [], budget
    for w in order:
        if remaining <= 0:
            break
        n = ngram[w]
        tokens = sum(lengths[w : w + n])
        while n > 1 and tokens > remaining:
            n -= 1
            tokens -= lengths[w + n]
        if (tokens > remaining and spans) or any(covered[w : w + n]):
            continue
        covered[w : w + n] = [True] * n
        spans.append((starts[w], starts[w] + tokens))
        remaining -= tokens
    return spans


def select_spans(
    word_first: np.ndarray,
    candidates: np.ndarray,
    keys: Sequence[str],
    *,
    seed: int,
    epoch: int,
    probability: float,
    geometric_p: float = 0.2,
    max_span_words: int = 10,
) -> tuple[np.ndarray, np.ndarray]:
    """SpanBERT's span masking. Each span draws a length in words from
    `sample_span_lengths` and a start word uniformly among the row's words (redrawn when the
    word is already masked); it then extends over whole words until its length, the end of
    its run of candidates, an already masked word or the row's budget stops it (SpanBERT
    also cuts the last span at the budget, there at any token). Spans are added until the
    budget is covered; at least one per row. word_first, candidates (batch, seq) bool; keys
    (batch,). Returns (selected (batch, seq) bool, unit_start (batch, seq) int64), unit_start
    being the first token of each token's span."""
    budgets = mask_budget(candidates.sum(axis=1), probability).tolist()
    starts, lengths, left, counts = batch_words(word_first, candidates)
    counts = counts.tolist()
    generators = keyed_generators(seed, epoch, STREAM_MASK_SPAN, list(keys))
    uniforms, first_words = [], []
    for rng, n in zip(generators, counts, strict=True):  # each row's draws, in their order
        draws = 2 * n + 8  # attempts; the budget is usually met after a handful
        uniforms.append(rng.random(draws))
        first_words.append(rng.integers(max(n, 1), size=draws).tolist())
    cdf = np.cumsum(truncated_geometric_probabilities(geometric_p, max_span_words))[:-1]
    span_words = 1 + np.searchsorted(cdf, np.concatenate(uniforms), side="right")
    span_words = span_words.tolist()
    rows_spans, offset = [], 0
    rows = zip(starts.tolist(), lengths.tolist(), left.tolist(), counts, budgets, strict=True)
    for row, (s, w, words_left, n, budget) in enumerate(rows):
        draws = 2 * n + 8
        spans = []
        if n:
            attempts = zip(first_words[row], span_words[offset : offset + draws], strict=True)
            spans = _fill_spans(s[:n], w[:n], words_left[:n], attempts, budget)
        rows_spans.append(spans)
        offset += draws
    return _spans_to_mask(candidates.shape, *_spans_arrays(rows_spans))


def _fill_spans(
    starts: list, lengths: list, left: list, draws, budget: int
) -> list[tuple[int, int]]:
    covered = [False] * len(starts)
    spans, remaining = [], budget
    for w, n_words in draws:
        if remaining <= 0:
            break
        if covered[w] or (lengths[w] > remaining and spans):
            continue
        end, tokens = w + 1, lengths[w]  # end: first word after the span
        limit = w + min(n_words, left[w])
        while end < limit and not covered[end] and tokens + lengths[end] <= remaining:
            tokens += lengths[end]
            end += 1
        covered[w:end] = [True] * (end - w)
        spans.append((starts[w], starts[w] + tokens))
        remaining -= tokens
    return spans


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
