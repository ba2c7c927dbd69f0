"""BART's noise functions (Lewis et al., 2020, §2.2) and MASS's fragment masking (Song et
al., 2019), on one sequence at a time.

A sequence is `[CLS] body [SEP]` (the packed formats' shape, real tokens only); the noise
touches the body and keeps [CLS] first and the final [SEP] last (fairseq keeps <s> and </s>).
Every function takes a numpy Generator; the objectives key it by (seed, epoch, stream, sample
key) (`keyed_rng`), so noise is reproducible and independent of workers, ranks and batch order.
Within a sequence the work is vectorised numpy; batches loop over rows, their generators
seeded for the whole batch at once (`keyed_rng.keyed_generators`).

`apply_noise` composes them in fairseq's order: sentence permutation, token masking, token
deletion, text infilling, document rotation.
"""

import math
from dataclasses import dataclass

import numpy as np

# keyed_rng streams of this module (keyed_rng.py holds the pipeline's 1-12)
STREAM_NOISE = 20
STREAM_MASS = 21


def _split(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first token, body, last token) of a [CLS] body [SEP] sequence."""
    return ids[:1], ids[1:-1], ids[-1:]


def mask_tokens(
    ids: np.ndarray, probability: float, mask_id: int, rng: np.random.Generator
) -> np.ndarray:
    """Token masking: round(probability x body length) random body tokens become [MASK]."""
    out = ids.copy()
    body = len(ids) - 2
    count = round(probability * body)
    if count > 0:
        out[1 + rng.choice(body, size=count, replace=False)] = mask_id
    return out


def delete_tokens(ids: np.ndarray, probability: float, rng: np.random.Generator) -> np.ndarray:
    """Token deletion: round(probability x body length) random body tokens are removed."""
    body = len(ids) - 2
    count = round(probability * body)
    if count == 0:
        return ids.copy()
    keep = np.ones(len(ids), bool)
    keep[1 + rng.choice(body, size=count, replace=False)] = False
    return ids[keep]


def poisson_span_lengths(
    budget: int, poisson_lambda: float, rng: np.random.Generator
) -> np.ndarray:
    """Span lengths (tokens) drawn from Poisson(poisson_lambda) until they cover `budget`
    tokens; the last one is cut so that they sum to exactly `budget`. Zero-length spans are
    kept (each becomes an inserted [MASK]). Returns an int64 array (empty when budget is 0)."""
    if budget <= 0:
        return np.zeros(0, np.int64)
    draws = max(8, int(2 * budget / max(poisson_lambda, 1e-3)) + 8)
    lengths = rng.poisson(poisson_lambda, size=draws)
    while lengths.sum() < budget:  # rare: draw more
        lengths = np.concatenate([lengths, rng.poisson(poisson_lambda, size=draws)])
    total = np.cumsum(lengths)
    last = int(np.searchsorted(total, budget))  # first index with cumulative sum >= budget
    lengths = lengths[: last + 1].copy()
    lengths[-1] -= total[last] - budget
    return lengths.astype(np.int64)


def infill_text(
    ids: np.ndarray,
    probability: float,
    mask_id: int,
    rng: np.random.Generator,
    poisson_lambda: float = 3.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Text infilling: spans with Poisson(poisson_lambda) lengths covering round(probability x
    body length) body tokens are each replaced by ONE [MASK]; a zero-length span inserts a
    [MASK]. Spans do not overlap; their order and the gaps between them are uniformly random.
    Returns (noised ids, the span lengths in body order)."""
    body = len(ids) - 2
    budget = round(probability * body)
    lengths = poisson_span_lengths(budget, poisson_lambda, rng)
    if len(lengths) == 0:
        return ids.copy(), lengths
    spans = len(lengths)
    slots = body - budget + spans
    # Lay out the kept body tokens and the spans in a random order (stars and bars):
    # slot i of kept + spans is a span when it is among the chosen ones.
    is_span = np.zeros(slots, bool)
    is_span[rng.choice(slots, size=spans, replace=False)] = True
    # each slot's length in body tokens: 1 for a kept token, the span's length for a span
    slot_lengths = np.ones(slots, np.int64)
    slot_lengths[is_span] = lengths
    slot_starts = np.cumsum(slot_lengths) - slot_lengths
    out = np.empty(slots + 2, ids.dtype)
    out[0], out[-1] = ids[0], ids[-1]
    out[1:-1] = ids[1:-1][np.minimum(slot_starts, body - 1)]
    out[1:-1][is_span] = mask_id
    return out, lengths


def permute_sentences(
    ids: np.ndarray, sentence_starts: np.ndarray, fraction: float, rng: np.random.Generator
) -> np.ndarray:
    """Sentence permutation: the body's sentences (split where `sentence_starts` is True;
    the body's first token always starts one) are shuffled; `fraction` of them
    (ceil(fraction x count)) take part, the rest keep their place. Keeps the token multiset."""
    body = len(ids) - 2
    if body <= 0 or fraction <= 0:
        return ids.copy()
    starts = np.flatnonzero(sentence_starts[1:-1])
    if len(starts) == 0 or starts[0] != 0:
        starts = np.concatenate(([0], starts))
    count = len(starts)
    chosen = np.sort(rng.choice(count, size=math.ceil(fraction * count), replace=False))
    order = np.arange(count)
    order[chosen] = chosen[rng.permutation(len(chosen))]
    lengths = np.empty(count, np.int64)  # each sentence's length, then in the new order
    lengths[:-1] = starts[1:] - starts[:-1]
    lengths[-1] = body - starts[-1]
    lengths = lengths[order]
    # token t of the output body: its sentence's old start + its offset in the sentence
    shift = np.repeat(starts[order] - (np.cumsum(lengths) - lengths), lengths)
    out = ids.copy()
    out[1:-1] = ids[1:-1][shift + np.arange(body)]
    return out


def rotate_document(ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Document rotation: the body is rotated to begin at a uniformly chosen body token."""
    first, body, last = _split(ids)
    if len(body) == 0:
        return ids.copy()
    return np.concatenate([first, np.roll(body, -int(rng.integers(len(body)))), last])


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
    sentence_starts: np.ndarray,
    settings: NoiseSettings,
    mask_id: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """One [CLS] body [SEP] sequence -> its noised version (length may change), applying the
    enabled noise functions in fairseq's order."""
    if len(ids) < 3:
        return ids.copy()
    if settings.sentence_permutation > 0:
        ids = permute_sentences(ids, sentence_starts, settings.sentence_permutation, rng)
    if settings.token_masking > 0:
        ids = mask_tokens(ids, settings.token_masking, mask_id, rng)
    if settings.token_deletion > 0:
        ids = delete_tokens(ids, settings.token_deletion, rng)
    if settings.text_infilling > 0:
        ids, _ = infill_text(ids, settings.text_infilling, mask_id, rng, settings.poisson_lambda)
    if settings.document_rotation > 0 and rng.random() < settings.document_rotation:
        ids = rotate_document(ids, rng)
    return ids


def mass_fragment(
    ids: np.ndarray,
    fraction: float,
    mask_id: int,
    rng: np.random.Generator,
    start_id: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MASS: a contiguous fragment of round(fraction x body length) body tokens (at least 1),
    at a uniform start. Returns (encoder ids: the fragment replaced by [MASK]; decoder ids:
    the fragment shifted right (at its first position `start_id`, by default [MASK] as in the
    paper's figure 1) with [MASK] elsewhere; a bool mask of the fragment, the positions that
    are predicted). All three have the input's length."""
    body = len(ids) - 2
    length = min(body, max(1, round(fraction * body)))
    start = 1 + int(rng.integers(body - length + 1))
    fragment = np.zeros(len(ids), bool)
    fragment[start : start + length] = True
    encoder = np.where(fragment, mask_id, ids)
    previous = np.concatenate([[mask_id], ids[:-1]])  # token t - 1 at position t
    decoder = np.where(fragment, previous, mask_id)
    decoder[start] = mask_id if start_id is None else start_id
    return encoder.astype(ids.dtype), decoder.astype(ids.dtype), fragment
