"""Token masking primitives (BERT's MLM corruption), vectorised over a batch, and the
whole-unit selection of whole-word (BERT-wwm) and phrase/entity (ERNIE 1.0) masking; word
n-grams and SpanBERT spans are in `span_masking.py`.

Each row's draws come from `keyed_uniform`, so a sequence's mask depends only on
(seed, epoch, sequence key): dynamic masking draws a new one each epoch; static masking
passes `epoch % dupe_factor` as the epoch (BERT's `dupe_factor` copies).
"""

import numpy as np

from pretrain.data.keyed_rng import (
    STREAM_MASK_ACTION,
    STREAM_MASK_RANDOM_TOKEN,
    STREAM_MASK_SELECT,
    keyed_uniform,
    keyed_uniform_at,
)

IGNORE_INDEX = -100


def select_exact_fraction(
    uniform: np.ndarray, candidates: np.ndarray, probability: float
) -> np.ndarray:
    """Select round(probability * n) candidates per row (at least 1 when a row has any), the
    ones with the smallest uniforms. Shapes (batch, seq); returns a bool mask (batch, seq)."""
    k = mask_budget(np.count_nonzero(candidates, axis=1), probability)  # (batch,)
    scores = np.where(candidates, uniform, 2.0)
    kth = np.sort(scores, axis=1)[np.arange(len(k)), np.maximum(k - 1, 0)]
    return scores <= np.where(k > 0, np.minimum(kth, 1.0), -1.0)[:, None]  # no 2.0 taken


def replace_selected(
    input_ids: np.ndarray,
    selected: np.ndarray,
    action: np.ndarray,
    random_ids: np.ndarray,
    mask_token_id: int,
    mask_token_probability: float,
    random_token_probability: float,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's 80/10/10 rule: a selected token becomes [MASK] when action < p_mask, a random
    token when p_mask <= action < p_mask + p_random, else stays. Returns (corrupted ids,
    labels with IGNORE_INDEX where nothing is predicted); all arrays (batch, seq)."""
    labels = np.where(selected, input_ids, IGNORE_INDEX)
    corrupted = input_ids.copy()
    to_mask = selected & (action < mask_token_probability)
    to_random = selected & ~to_mask & (action < mask_token_probability + random_token_probability)
    corrupted[to_mask] = mask_token_id
    corrupted[to_random] = random_ids[to_random]
    return corrupted, labels


def candidate_tokens(
    input_ids: np.ndarray, attention_mask: np.ndarray, special_ids: tuple[int, ...]
) -> np.ndarray:
    """Tokens that may be selected for prediction: real (attention_mask 1) and not special,
    (batch, seq) bool; input_ids (batch, seq) non-negative. `np.isin` by a lookup table over
    the special ids (ids past the largest read its last, non-special entry)."""
    top = max(special_ids, default=-1) + 1
    plain = np.ones(top + 1, bool)
    plain[list(special_ids)] = False
    return attention_mask.astype(bool) & plain[np.minimum(input_ids, top)]


def corrupt_selected(
    input_ids: np.ndarray,
    selected: np.ndarray,
    unit_start: np.ndarray | None,
    hashes: np.ndarray,
    *,
    seed: int,
    epoch: int,
    vocab_size: int,
    mask_token_id: int,
    mask_token_probability: float,
    random_token_probability: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Apply BERT's rule to `selected` tokens (mask_token_probability of them become the mask
    id, random_token_probability a random id, the rest stay: 80/10/10 in BERT, the
    objective's settings, so no default here), deciding once per masking unit: every
    token takes the decision drawn at `unit_start` (batch, seq), the index of the first token
    of its unit, or None for token-level masking (every token its own unit). Random replacement ids are drawn per
    token. Returns (corrupted input_ids, labels), both (batch, seq) int64."""
    length = input_ids.shape[1]
    flat = np.flatnonzero(selected)  # the draws are keyed, so taken where they are read
    rows, columns = np.divmod(flat, length)
    drawn_at = columns if unit_start is None else unit_start.ravel()[flat]
    action = keyed_uniform_at(seed, epoch, STREAM_MASK_ACTION, hashes, rows, drawn_at)
    to_mask = action < mask_token_probability
    to_random = ~to_mask & (action < mask_token_probability + random_token_probability)
    labels = np.full(input_ids.shape, IGNORE_INDEX, input_ids.dtype)
    labels.ravel()[flat] = input_ids.ravel()[flat]
    corrupted = input_ids.copy()
    corrupted.ravel()[flat[to_mask]] = mask_token_id
    random = keyed_uniform_at(
        seed, epoch, STREAM_MASK_RANDOM_TOKEN, hashes, rows[to_random], columns[to_random]
    )
    corrupted.ravel()[flat[to_random]] = (random * vocab_size).astype(np.int64)
    return corrupted, labels


def mask_tokens(
    input_ids: np.ndarray,
    candidates: np.ndarray,
    hashes: np.ndarray,
    *,
    seed: int,
    epoch: int,
    vocab_size: int,
    mask_token_id: int,
    mlm_probability: float,
    mask_token_probability: float,
    random_token_probability: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Token-level MLM corruption of a padded batch.

    input_ids (batch, seq) int64; candidates (batch, seq) bool: tokens that may be selected
    (not special, not padding); hashes (batch,) uint64 keys of the rows.
    Returns (corrupted input_ids, labels), both (batch, seq) int64.
    """
    select = keyed_uniform(seed, epoch, STREAM_MASK_SELECT, hashes, input_ids.shape[1])
    selected = select_exact_fraction(select, candidates, mlm_probability)
    return corrupt_selected(
        input_ids,
        selected,
        None,
        hashes,
        seed=seed,
        epoch=epoch,
        vocab_size=vocab_size,
        mask_token_id=mask_token_id,
        mask_token_probability=mask_token_probability,
        random_token_probability=random_token_probability,
    )


# Streams of the unit-level strategies (keyed_rng.py holds the shared ones, below 20).
STREAM_MASK_UNIT_ORDER = 20
STREAM_MASK_NGRAM = 21
STREAM_MASK_SPAN = 22

# Values of the per-token `phrases` flags (see pretrain.data.shard_format).
PHRASE_START, ENTITY_START, INSIDE_SPAN = 1, 2, 3


def mask_budget(n_candidates: np.ndarray | int, probability: float) -> np.ndarray:
    """Tokens to select per row: round(probability * candidates), at least 1 when a row has
    any candidate (BERT's `num_to_predict`). Same shape as `n_candidates`, int64."""
    n = np.asarray(n_candidates)
    return np.where(n > 0, np.maximum(np.rint(n * probability), 1), 0).astype(np.int64)


def previous(flags: np.ndarray, fill: bool | int = False) -> np.ndarray:
    """`flags` shifted one position right along the sequence axis (what the previous token
    had), `fill` at position 0. Shape (batch, seq) kept."""
    shifted = np.empty_like(flags)
    shifted[:, 0] = fill
    shifted[:, 1:] = flags[:, :-1]
    return shifted


def word_start_flags(word_starts: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """First tokens of the words made of candidate tokens, (batch, seq) bool. A word is a
    word-start token and the non-start tokens after it; a candidate after a non-candidate
    (e.g. a segment cut inside a word) starts a word too, so a word never spans a special
    token or padding."""
    return candidates & (word_starts.astype(bool) | ~previous(candidates))


def phrase_unit_flags(
    phrases: np.ndarray, word_starts: np.ndarray, candidates: np.ndarray
) -> np.ndarray:
    """First tokens of ERNIE's masking units, (batch, seq) bool: an annotated phrase or entity
    (its token flagged PHRASE_START or ENTITY_START and the INSIDE_SPAN tokens after it) is
    one unit; outside annotations, every word is one. An INSIDE_SPAN token whose span start
    was cut off starts a unit of its own."""
    in_span = phrases != 0
    prev_in_span = previous(in_span)
    starts = (
        (phrases == PHRASE_START)
        | (phrases == ENTITY_START)
        | (~in_span & (word_starts.astype(bool) | prev_in_span))
        | ((phrases == INSIDE_SPAN) & ~prev_in_span)
    )
    return candidates & (starts | ~previous(candidates))


def unit_start_index(unit_first: np.ndarray) -> np.ndarray:
    """For every token, the index of the closest unit start at or before it, (batch, seq)
    int64 (0 before the first start): the `unit_start` that `corrupt_selected` reads."""
    positions = np.arange(unit_first.shape[1], dtype=np.int64)
    return np.maximum.accumulate(np.where(unit_first, positions, 0), axis=1)


def stable_row_order(keys: np.ndarray) -> np.ndarray:
    """`np.argsort(keys, axis=1, kind="stable")` of keys (batch, n) in [0, 1]. When every
    key is a multiple of 2**-53 (`keyed_uniform`'s, numpy's `random()`) and n < 1024, the
    keys become the distinct integers key x 2**53 x n + column, which the faster unstable
    sort puts in the same order."""
    width = keys.shape[1]
    scaled = keys * float(1 << 53)
    if width >= 1024 or not np.array_equal(scaled, np.floor(scaled)):
        return np.argsort(keys, axis=1, kind="stable")
    unique = scaled.astype(np.int64) * width + np.arange(width)
    return np.argsort(unique, axis=1)


def batch_units(
    unit_first: np.ndarray, candidates: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The units of every row: runs of candidates from one `unit_first` token to the next,
    unit_first and candidates (batch, seq) bool. Returns (first token (batch, U) int64,
    length in candidate tokens (batch, U) int64, units per row (batch,) int64, unit of each
    token (batch, seq) int64, -1 before the row's first unit), U the most units of any row;
    slots past a row's units hold first token 0 and length 0."""
    batch = unit_first.shape[0]
    unit_of = np.cumsum(unit_first, axis=1, dtype=np.int64) - 1
    counts = unit_of[:, -1] + 1 if unit_first.shape[1] else np.zeros(batch, np.int64)
    width = int(counts.max(initial=0))
    starts = np.zeros((batch, width), np.int64)
    rows, columns = np.nonzero(unit_first)
    starts[rows, unit_of[rows, columns]] = columns
    counted = candidates & (unit_of >= 0)
    flat = (np.arange(batch)[:, None] * width + unit_of)[counted]
    lengths = np.bincount(flat, minlength=batch * width).reshape(batch, width)
    return starts, lengths.astype(np.int64), counts, unit_of


def batch_fill_budget(lengths: np.ndarray, counts: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """Accept each row's units in the given order until its budget (tokens) is covered; a
    unit that would overshoot is skipped and later (shorter) ones are tried (BERT's
    create_pretraining_data); at least the first unit is accepted when none fits. lengths
    (batch, U) in tokens of each row's units in the order they are tried (the first
    counts[row] of a row are its units), budgets (batch,); returns (batch, U) bool. The
    part of a row that fits before its first overshoot is taken at once; then each pass
    accepts, in every row still short of its budget, the next unit that fits (passes: the
    most such units of any row)."""
    batch, width = lengths.shape
    columns = np.arange(width)
    real = columns < counts[:, None]
    sizes = np.where(real, lengths, np.int64(1) << 40)  # past a row's units: never fits
    total = np.cumsum(sizes, axis=1)
    fitting = (total <= budgets[:, None]).sum(axis=1)  # units accepted before an overshoot
    accepted = columns < fitting[:, None]
    rows = np.arange(batch)
    covered = np.where(fitting > 0, total[rows, np.maximum(fitting - 1, 0)], 0)
    position = fitting + 1  # the overshooting unit is skipped
    active = (covered < budgets) & (position < counts) & (budgets > 0)
    while active.any():
        fits = (columns >= position[:, None]) & (sizes <= (budgets - covered)[:, None])
        first = np.argmax(fits, axis=1)
        active &= fits[rows, first]
        take = rows[active]
        accepted[take, first[take]] = True
        covered[take] += sizes[take, first[take]]
        position[take] = first[take] + 1
        active &= (covered < budgets) & (position < counts)
    none = (counts > 0) & (budgets > 0) & ~accepted.any(axis=1)
    accepted[none, 0] = True  # at least the first unit when none fits
    return accepted


def select_whole_units(
    unit_first: np.ndarray, candidates: np.ndarray, uniform: np.ndarray, probability: float
) -> tuple[np.ndarray, np.ndarray]:
    """Whole-unit selection (whole-word masking, ERNIE's phrase/entity masking): units are
    taken in a random order (ascending `uniform` at their first token) by `batch_fill_budget`
    up to `mask_budget` tokens per row.
    unit_first, candidates (batch, seq) bool, uniform (batch, seq) in [0, 1). Returns
    (selected (batch, seq) bool, unit_start (batch, seq) int64)."""
    budgets = mask_budget(candidates.sum(axis=1), probability)
    starts, lengths, counts, unit_of = batch_units(unit_first, candidates)
    if starts.shape[1] == 0:  # no unit in any row
        return np.zeros(candidates.shape, bool), unit_start_index(unit_first)
    real = np.arange(starts.shape[1]) < counts[:, None]
    keys = np.where(real, np.take_along_axis(uniform, starts, axis=1), 1.0)  # padding last
    order = stable_row_order(keys)
    accepted = np.zeros(starts.shape, bool)
    np.put_along_axis(
        accepted,
        order,
        batch_fill_budget(np.take_along_axis(lengths, order, axis=1), counts, budgets),
        axis=1,
    )
    chosen = np.take_along_axis(accepted, np.maximum(unit_of, 0), axis=1)
    selected = candidates & (unit_of >= 0) & chosen
    return selected, unit_start_index(unit_first)
