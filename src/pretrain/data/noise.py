"""BART's noise functions (Lewis et al., 2020, §2.2) and MASS's draws (Song et al., 2019),
vectorised over a batch.

A row is `[CLS] body [SEP]` (the packed formats' shape) in a padded (batch, width) array
with its real length; the noise touches the body and keeps [CLS] first and the final [SEP]
last (fairseq keeps <s> and </s>). Every draw is a counter-based keyed uniform
(`keyed_rng.keyed_uniform`) indexed by (seed, epoch, stream, the row's key hash, a counter
that belongs to the row: a sentence, span, slot or token index), so a row's noise depends
on its key only, never on the other rows of its batch, their number or their order.

`apply_noise` composes them in fairseq's order: sentence permutation, token masking, token
deletion, text infilling, document rotation.
"""

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pretrain.data.keyed_rng import keyed_uniform

# keyed_uniform streams of this module (keyed_rng.py holds the pipeline's 1-12)
STREAM_SENTENCE_CHOICE = 60
STREAM_SENTENCE_ORDER = 61
STREAM_TOKEN_MASKING = 62
STREAM_TOKEN_DELETION = 63
STREAM_INFILLING = 64  # span i's length and slot i's sort key from counter i
STREAM_ROTATION = 66  # counter 0: whether to rotate, 1: where
STREAM_MASS_START = 67
STREAM_MASS_ACTION = 68
STREAM_MASS_RANDOM_TOKEN = 69


@dataclass(frozen=True)
class RowDraws:
    """Keyed uniforms of a batch's rows: `uniform(stream, n)` is (batch, n) floats in [0, 1),
    entry (i, t) a function of (seed, epoch, stream, hashes[i], t) only."""

    seed: int
    epoch: int
    hashes: np.ndarray  # (batch,) uint64 key hashes

    def uniform(self, stream: int, n: int) -> np.ndarray:
        return keyed_uniform(self.seed, self.epoch, stream, self.hashes, max(n, 1))


def smallest(values: np.ndarray, count: np.ndarray) -> np.ndarray:
    """(batch, n) bool: each row's `count[i]` smallest `values` (a uniform random subset of
    that size when the values are keyed uniforms; set a value above 1 to exclude it)."""
    order = np.argsort(values, axis=1)  # keyed uniforms: ties have probability ~2**-53
    take = np.arange(values.shape[1]) < count[:, None]
    chosen = np.zeros(values.shape, bool)
    chosen[np.nonzero(take)[0], order[take]] = True
    return chosen


def _body(lengths: np.ndarray, width: int) -> np.ndarray:
    """(batch, width) bool: the body positions 1 .. length - 2 of each row."""
    positions = np.arange(width)
    return (positions >= 1) & (positions < (lengths - 1)[:, None])


def _tokens_by_uniform(
    lengths: np.ndarray, probability: float, stream: int, draws: RowDraws, width: int
) -> np.ndarray:
    """(batch, width) bool: round(probability x body length) uniformly chosen body tokens
    (token t's uniform at counter t - 1)."""
    body = lengths - 2
    u = draws.uniform(stream, width - 1)[:, : width - 1]  # body token t at counter t - 1
    u = np.where(np.arange(width - 1) < body[:, None], u, 2.0)
    chosen = np.zeros((len(lengths), width), bool)
    chosen[:, 1:] = smallest(u, np.rint(probability * body).astype(np.int64))
    return chosen


def mask_tokens(
    ids: np.ndarray, lengths: np.ndarray, probability: float, mask_id: int, draws: RowDraws
) -> tuple[np.ndarray, np.ndarray]:
    """Token masking: round(probability x body length) random body tokens become [MASK].
    Returns (ids, lengths)."""
    chosen = _tokens_by_uniform(lengths, probability, STREAM_TOKEN_MASKING, draws, ids.shape[1])
    return np.where(chosen, mask_id, ids), lengths


def delete_tokens(
    ids: np.ndarray, lengths: np.ndarray, probability: float, draws: RowDraws
) -> tuple[np.ndarray, np.ndarray]:
    """Token deletion: round(probability x body length) random body tokens are removed.
    Returns (ids, lengths) with the survivors moved left."""
    deleted = _tokens_by_uniform(lengths, probability, STREAM_TOKEN_DELETION, draws, ids.shape[1])
    keep = (np.arange(ids.shape[1]) < lengths[:, None]) & ~deleted
    new_lengths = keep.sum(axis=1)
    out = np.zeros_like(ids)
    out[np.arange(ids.shape[1]) < new_lengths[:, None]] = ids[keep]  # row-major compaction
    return out, new_lengths


@lru_cache(maxsize=8)
def poisson_cdf(poisson_lambda: float) -> np.ndarray:
    """P(X <= k) of Poisson(poisson_lambda) for k = 0, 1, ... until it reaches 1 in float64
    (the last entry set to 1): the inverse-CDF table of `poisson_lengths`."""
    pmf, k, cdf = math.exp(-poisson_lambda), 0, []
    total = 0.0
    while total < 1.0 - 1e-16 and k < 1000:
        total += pmf
        cdf.append(total)
        k += 1
        pmf *= poisson_lambda / k
    cdf[-1] = 1.0
    return np.array(cdf)


def poisson_lengths(u: np.ndarray, poisson_lambda: float) -> np.ndarray:
    """Poisson(poisson_lambda) draws by inverse CDF of uniforms `u` (any shape), int64."""
    lengths = np.searchsorted(poisson_cdf(poisson_lambda), u, side="right")
    return lengths.astype(np.int64, copy=False)


def gather(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """values[i, index[i, j]] for every (i, j): `np.take_along_axis` on axis 1, flat."""
    offsets = np.arange(0, values.size, values.shape[1])[:, None]
    return np.ascontiguousarray(values).ravel()[index + offsets]


def span_draws(budgets: np.ndarray, body: np.ndarray, poisson_lambda: float, draws: RowDraws):
    """The keyed uniforms of text infilling, counter i holding both span i's length (its low
    27 bits, by inverse CDF) and slot i's sort key (the uniform itself): (uniforms (batch, n),
    span lengths (batch, n) int64, spans (batch,)). Span lengths are Poisson(poisson_lambda)
    draws until they cover the row's budget, the last one cut so that they sum to exactly
    the budget; zero-length spans are kept (each becomes an inserted [MASK]); a row's first
    `spans` entries are its spans (0 where the budget is 0). n covers every row's slots
    (kept tokens + spans) and one more."""
    # k draws sum to Poisson(lambda k), 5 standard deviations above the largest budget
    needed = int(((5 + math.sqrt(25 + 4 * budgets.max(initial=0))) / 2) ** 2 / poisson_lambda) + 2
    while True:  # a row's draws do not depend on how many are made: make more if short
        u = draws.uniform(STREAM_INFILLING, int((body - budgets).max(initial=0)) + needed + 1)
        low_bits = u[:, :needed] * (1 << 26)  # x - floor(x): x % 1.0 exactly, 10x faster
        lengths = poisson_lengths(low_bits - np.floor(low_bits), poisson_lambda)
        total = np.cumsum(lengths, axis=1)
        if (total[:, -1] >= budgets).all():
            break
        needed *= 2
    last = np.argmax(total >= budgets[:, None], axis=1)  # first span reaching the budget
    spans = np.where(budgets > 0, last + 1, 0)
    batch = np.arange(len(budgets))
    lengths[batch, last] -= total[batch, last] - budgets  # (a row without spans: unread)
    return u, lengths, spans


def infill_text(
    ids: np.ndarray,
    lengths: np.ndarray,
    probability: float,
    mask_id: int,
    draws: RowDraws,
    poisson_lambda: float = 3.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Text infilling: spans with Poisson(poisson_lambda) lengths covering round(probability x
    body length) body tokens are each replaced by ONE [MASK]; a zero-length span inserts a
    [MASK]. Spans do not overlap; their order and the gaps between them are uniformly random
    (the spans take a uniform subset of the slots of kept tokens + spans, `span_draws`).
    Returns (ids, lengths, span lengths (batch, n): a row's first `spans` entries, in body
    order)."""
    body = lengths - 2
    budgets = np.rint(probability * body).astype(np.int64)
    u, span_lengths, spans = span_draws(budgets, body, poisson_lambda, draws)
    slots = body - budgets + spans  # (batch,) kept tokens + spans
    width = int(slots.max(initial=0)) + 1  # the last slot holds the final token
    u = np.where(np.arange(width) < slots[:, None], u[:, :width], 2.0)
    threshold = gather(np.sort(u, axis=1), np.maximum(spans - 1, 0)[:, None])
    is_span = (u <= threshold) & (spans > 0)[:, None]  # each row's `spans` smallest uniforms
    spans_so_far = np.cumsum(is_span, axis=1)  # (batch, width) up to each slot, included
    hidden = np.zeros((len(ids), span_lengths.shape[1] + 1), np.int64)  # by the first j spans
    np.cumsum(span_lengths, axis=1, out=hidden[:, 1:])
    # a kept slot reads the body token after the kept tokens and spans before it; past the
    # row's slots that is its final token, then padding (a span slot's source is not read)
    kept_so_far = np.arange(1, width + 1) - spans_so_far
    source = np.minimum(kept_so_far + gather(hidden, spans_so_far), ids.shape[1] - 1)
    out = np.empty((len(ids), width + 1), ids.dtype)
    out[:, 0] = ids[:, 0]
    out[:, 1:] = np.where(is_span, mask_id, gather(ids, source))
    return out, slots + 2, span_lengths


def permute_sentences(
    ids: np.ndarray,
    lengths: np.ndarray,
    sentence_starts: np.ndarray,
    fraction: float,
    draws: RowDraws,
) -> tuple[np.ndarray, np.ndarray]:
    """Sentence permutation: each row's body sentences (split where `sentence_starts` is
    True; the body's first token always starts one) are shuffled; ceil(fraction x count) of
    them, a uniform subset (sentence s's uniform at counter s), take part in a uniform order
    (likewise), the rest keep their place. Keeps the token multiset. Returns (ids, lengths)."""
    batch, width = ids.shape
    ends = lengths - 1  # (batch,) the final token's position, where the body ends
    starts = sentence_starts & (np.arange(width) < ends[:, None])
    starts[:, 0] = False
    starts[:, 1] |= ends > 1  # the body's first token starts a sentence
    at, position = np.divmod(np.flatnonzero(starts), width)  # row-major: rows' sentences
    count = np.bincount(at, minlength=batch)  # (batch,) body sentences
    most = int(count.max(initial=0))
    if most == 0:
        return ids.copy(), lengths
    valid = np.arange(most) < count[:, None]  # (batch, most): the row's sentences
    chosen = valid
    if fraction < 1:
        u = np.where(valid, draws.uniform(STREAM_SENTENCE_CHOICE, most), 2.0)
        chosen = smallest(u, np.ceil(fraction * count).astype(np.int64))
    # the chosen places, left to right, get the chosen sentences in the order of their
    # uniforms: order[p] is the sentence at place p
    u = np.where(chosen, draws.uniform(STREAM_SENTENCE_ORDER, most), 2.0)
    order = np.argsort(u, axis=1)  # the chosen first (all of a row's sentences: done)
    if fraction < 1:
        contents = order[np.arange(most) < chosen.sum(axis=1)[:, None]]
        order = np.broadcast_to(np.arange(most), u.shape).copy()
        order[chosen] = contents
    # sentence s's first position (batch, most + 1), the body's end past the row's sentences
    bounds = np.repeat(ends[:, None], most + 1, axis=1)
    bounds[at, np.arange(len(at)) - (np.cumsum(count) - count)[at]] = position
    old_start, size = bounds[:, :-1], np.diff(bounds, axis=1)  # size 0 past the sentences
    moved = gather(size, order)
    new_start = np.empty_like(old_start)
    np.put_along_axis(new_start, order, 1 + np.cumsum(moved, axis=1) - moved, axis=1)
    # runs of tokens that move together, row after row: [CLS], the sentences, the rest
    runs = np.empty((batch, most + 2), np.int64)
    runs[:, 0], runs[:, 1:-1], runs[:, -1] = 1, size, width - ends
    shift = np.zeros((batch, most + 2), np.int64)
    shift[:, 1:-1] = new_start - old_start
    destination = np.arange(ids.size) + np.repeat(shift.ravel(), runs.ravel())
    out = np.empty(ids.shape, ids.dtype)
    out.ravel()[destination] = ids.ravel()
    return out, lengths


def rotate_document(
    ids: np.ndarray, lengths: np.ndarray, probability: float, draws: RowDraws
) -> tuple[np.ndarray, np.ndarray]:
    """Document rotation: with `probability`, a row's body is rotated to begin at a uniformly
    chosen body token. Returns (ids, lengths)."""
    body = lengths - 2
    u = draws.uniform(STREAM_ROTATION, 2)
    offset = np.where(u[:, 0] < probability, np.floor(u[:, 1] * body).astype(np.int64), 0)
    positions = np.arange(ids.shape[1])
    inside = _body(lengths, ids.shape[1])
    rotated = 1 + (positions - 1 + offset[:, None]) % np.maximum(body, 1)[:, None]
    source = np.where(inside, rotated, positions)
    return np.take_along_axis(ids, source, axis=1), lengths


@dataclass(frozen=True)
class NoiseSettings:
    """Which noise to apply and how much: token masking / deletion / infilling as fractions
    of the body's tokens, sentence permutation as the fraction of sentences shuffled, document
    rotation as the probability of rotating. Default: BART's infilling 30% + permutation."""

    token_masking: float = 0.0
    token_deletion: float = 0.0
    text_infilling: float = 0.3
    poisson_lambda: float = 3.0
    sentence_permutation: float = 1.0
    document_rotation: float = 0.0


def apply_noise(
    ids: np.ndarray,
    lengths: np.ndarray,
    sentence_starts: np.ndarray,
    settings: NoiseSettings,
    mask_id: int,
    draws: RowDraws,
) -> tuple[np.ndarray, np.ndarray]:
    """Padded rows (batch, width) of real `lengths` -> their noised versions (ids (batch,
    width'), lengths (batch,)), the enabled noise functions applied in fairseq's order.
    Every row holds at least [CLS] and [SEP]; one without a body is left as it is."""
    if settings.sentence_permutation > 0:
        ids, lengths = permute_sentences(
            ids, lengths, sentence_starts, settings.sentence_permutation, draws
        )
    if settings.token_masking > 0:
        ids, lengths = mask_tokens(ids, lengths, settings.token_masking, mask_id, draws)
    if settings.token_deletion > 0:
        ids, lengths = delete_tokens(ids, lengths, settings.token_deletion, draws)
    if settings.text_infilling > 0:
        ids, lengths, _ = infill_text(
            ids, lengths, settings.text_infilling, mask_id, draws, settings.poisson_lambda
        )
    if settings.document_rotation > 0:
        ids, lengths = rotate_document(ids, lengths, settings.document_rotation, draws)
    return ids, lengths


def mass_draws(
    lengths: np.ndarray, fragments: np.ndarray, vocab_size: int, draws: RowDraws, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MASS's draws for rows of `lengths` tokens whose fragments are `fragments` body tokens
    long: (fragment starts (batch,), uniform in 1 .. length - 1 - fragment; action (batch,
    width) uniforms for the 80/10/10 rule; random ids (batch, width) uniform in
    [0, vocab_size)), token t's at counter t."""
    start_u = draws.uniform(STREAM_MASS_START, 1)[:, 0]
    starts = 1 + np.floor(start_u * (lengths - 1 - fragments)).astype(np.int64)
    action = draws.uniform(STREAM_MASS_ACTION, width)
    random_u = draws.uniform(STREAM_MASS_RANDOM_TOKEN, width)
    return starts, action, np.floor(random_u * vocab_size).astype(np.int64)
