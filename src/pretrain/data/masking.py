"""Token masking primitives (BERT's MLM corruption), vectorised over a batch.

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
    n = candidates.sum(axis=1)  # (batch,)
    k = np.where(n > 0, np.maximum(np.rint(n * probability), 1), 0).astype(np.int64)
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
    unit_start: np.ndarray,
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
    of its unit (its own index for token-level masking). Random replacement ids are drawn per
    token. Returns (corrupted input_ids, labels), both (batch, seq) int64."""
    length = input_ids.shape[1]
    action = keyed_uniform(seed, epoch, STREAM_MASK_ACTION, hashes, length)
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


def token_units(shape: tuple[int, int]) -> np.ndarray:
    """`unit_start` of token-level masking: every token is its own unit. (batch, seq) int64."""
    return np.broadcast_to(np.arange(shape[1], dtype=np.int64), shape).copy()


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
        token_units(input_ids.shape),
        hashes,
        seed=seed,
        epoch=epoch,
        vocab_size=vocab_size,
        mask_token_id=mask_token_id,
        mask_token_probability=mask_token_probability,
        random_token_probability=random_token_probability,
    )
