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
)

IGNORE_INDEX = -100


def select_exact_fraction(
    uniform: np.ndarray, candidates: np.ndarray, probability: float
) -> np.ndarray:
    """Select round(probability * n) candidates per row (at least 1 when a row has any), the
    ones with the smallest uniforms. Shapes (batch, seq); returns a bool mask (batch, seq)."""
    k = mask_budget(candidates.sum(axis=1), probability)  # (batch,)
    scores = np.where(candidates, uniform, 2.0)
    kth = np.take_along_axis(
        np.sort(scores, axis=1), np.maximum(k - 1, 0)[:, None], axis=1
    )  # (batch, 1)
    return candidates & (scores <= kth) & (k > 0)[:, None]


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
    mask_token_probability: float = 0.8,
    random_token_probability: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
    """Apply the 80/10/10 rule to `selected` tokens, deciding once per masking unit: every
    token takes the decision drawn at `unit_start` (batch, seq), the index of the first token
    of its unit, or None for token-level masking (every token its own unit). Random replacement ids are drawn per
    token. Returns (corrupted input_ids, labels), both (batch, seq) int64."""
    length = input_ids.shape[1]
    action = keyed_uniform(seed, epoch, STREAM_MASK_ACTION, hashes, length)
    if unit_start is not None:  # None: token-level, every token its own unit
        action = np.take_along_axis(action, unit_start, axis=1)
    random_ids = (
        keyed_uniform(seed, epoch, STREAM_MASK_RANDOM_TOKEN, hashes, length) * vocab_size
    ).astype(np.int64)
    return replace_selected(
        input_ids,
        selected,
        action,
        random_ids,
        mask_token_id,
        mask_token_probability,
        random_token_probability,
    )


def mask_tokens(
    input_ids: np.ndarray,
    candidates: np.ndarray,
    hashes: np.ndarray,
    *,
    seed: int,
    epoch: int,
    vocab_size: int,
    mask_token_id: int,
    mlm_probability: float = 0.15,
    mask_token_probability: float = 0.8,
    random_token_probability: float = 0.1,
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


def row_units(unit_first: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first token, length in tokens) of each unit of one row, both (units,) int64. Units
    are runs of candidates from one `unit_first` token to the next (seq,) flags."""
    starts = np.flatnonzero(unit_first)
    unit_of = np.cumsum(unit_first) - 1  # (seq,)
    lengths = np.bincount(unit_of[candidates], minlength=len(starts)).astype(np.int64)
    return starts.astype(np.int64), lengths


def fill_budget(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Accept units in the given order until `budget` tokens are covered; a unit that would
    overshoot is skipped and later (shorter) ones are tried (BERT's create_pretraining_data).
    At least the first unit is accepted when none fits. lengths (units,) in tokens; returns
    (units,) bool."""
    accepted = np.zeros(len(lengths), bool)
    if len(lengths) == 0 or budget <= 0:
        return accepted
    fitting = int(np.searchsorted(np.cumsum(lengths), budget, side="right"))
    accepted[:fitting] = True
    covered = int(lengths[:fitting].sum())
    position = fitting + 1
    while covered < budget and position < len(lengths):  # one step per accepted unit
        fits = np.flatnonzero(lengths[position:] <= budget - covered)
        if len(fits) == 0:
            break
        position += int(fits[0])
        accepted[position] = True
        covered += int(lengths[position])
        position += 1
    if not accepted.any():
        accepted[0] = True
    return accepted


def select_whole_units(
    unit_first: np.ndarray, candidates: np.ndarray, uniform: np.ndarray, probability: float
) -> tuple[np.ndarray, np.ndarray]:
    """Whole-unit selection (whole-word masking, ERNIE's phrase/entity masking): units are
    taken in a random order (ascending `uniform` at their first token) by `fill_budget` up to
    `mask_budget` tokens per row. unit_first, candidates (batch, seq) bool, uniform (batch,
    seq) in [0, 1). Returns (selected (batch, seq) bool, unit_start (batch, seq) int64)."""
    selected = np.zeros(candidates.shape, bool)
    budgets = mask_budget(candidates.sum(axis=1), probability)
    for row in range(candidates.shape[0]):  # per row, vectorised over its units
        starts, lengths = row_units(unit_first[row], candidates[row])
        if len(starts) == 0:
            continue
        order = np.argsort(uniform[row, starts], kind="stable")
        accepted = np.zeros(len(starts), bool)
        accepted[order] = fill_budget(lengths[order], int(budgets[row]))
        unit_of = np.cumsum(unit_first[row]) - 1
        selected[row] = candidates[row] & accepted[np.maximum(unit_of, 0)] & (unit_of >= 0)
    return selected, unit_start_index(unit_first)
