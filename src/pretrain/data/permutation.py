"""Factorization orders for XLNet's permutation language modelling, with partial prediction.

Per sequence, a factorization order of its real tokens is drawn, keyed by (seed, epoch,
sample key). Partial prediction (XLNet §2.3): only the last 1/K of the order is predicted,
round(n / K) of the n candidate tokens (non-special, non-padding), at least one. As in the
paper's implementation, the tokens before the cut (the context) form one group that sees
itself bidirectionally and never sees a target; a target sees the context and the targets
before it in the order. `order="uniform"`: the order is a uniform random permutation, so the
targets are a uniform random subset. `order="span"` (the released code / HF's
DataCollatorForPermutationLanguageModeling): the targets are spans of 1..max_span_length
tokens, the order among them uniform.

`perm_mask[b, i, j] = True` means token i may NOT see token j (HF's convention; the query
stream uses it as is, the content stream also lets a token see itself).
"""

from dataclasses import dataclass

import numpy as np

from pretrain.data.keyed_rng import key_hashes, keyed_uniform
from pretrain.data.masking import IGNORE_INDEX

STREAM_PERMUTATION = 30  # keyed_rng stream of the factorization orders
STREAM_PERMUTATION_SPANS = 31
STREAM_PERMUTATION_TOPUP = 32
ORDERS = ("uniform", "span")
CONTEXT_RANK = -1


@dataclass(frozen=True)
class Permutation:
    """rank (batch, seq) int64: position of each token in the factorization order, CONTEXT_RANK
    for the context and padding; targets (batch, seq) bool."""

    rank: np.ndarray
    targets: np.ndarray


def num_targets(candidates: np.ndarray, k: float) -> np.ndarray:
    """(batch,) number of targets per row: round(candidates / K), at least 1 when any."""
    count = candidates.sum(axis=1)
    return np.where(count > 0, np.maximum(1, np.rint(count / k)), 0).astype(np.int64)


def uniform_order(
    candidates: np.ndarray, hashes: np.ndarray, *, seed: int, epoch: int, k: float, reuse: int = 0
) -> Permutation:
    """A uniform random order of each row's candidates (its last 1/K are the targets),
    vectorised: the order sorts keyed uniforms (a uniform random permutation). With `reuse`
    (XLNet's memory layout), the first `reuse` positions and the rest are ordered as two
    parts, the first part wholly before the second, each with its own last 1/K as targets."""
    seq = candidates.shape[1]
    uniform = keyed_uniform(seed, epoch, STREAM_PERMUTATION, hashes, seq)
    first = np.arange(seq) < reuse  # (seq,)
    if reuse:
        uniform = uniform + 2.0 * ~first  # the second part after the first
    uniform = np.where(candidates, uniform, -1.0)  # non-candidates sort first
    order = np.argsort(uniform, axis=1)  # (batch, seq) positions by rank (ties: only at -1)
    rank = np.empty_like(order)  # its inverse, by one flat scatter
    rank.ravel()[order + np.arange(0, order.size, seq)[:, None]] = np.arange(seq)
    if not reuse:
        return _last_kth(rank, candidates, k)
    tail = _last_kth(rank, candidates & ~first, k)
    end = seq - (candidates & ~first).sum(axis=1)  # (batch,) rank after the first part
    head = _last_kth(rank, candidates & first, k, end)
    targets = head.targets | tail.targets
    return Permutation(np.where(targets, rank, CONTEXT_RANK), targets)


def _last_kth(rank: np.ndarray, part: np.ndarray, k: float, end=None) -> Permutation:
    """The targets of a `part` (batch, seq) bool whose candidates hold the ranks just below
    `end` (batch,) (default: the last ranks of the row): its last round(n / K) of them."""
    end = rank.shape[1] if end is None else end[:, None]
    targets = part & (rank >= end - num_targets(part, k)[:, None])
    return Permutation(np.where(targets, rank, CONTEXT_RANK), targets)


def span_order(
    candidates: np.ndarray,
    keys: list[str],
    *,
    seed: int,
    epoch: int,
    k: float,
    max_span_length: int = 5,
) -> Permutation:
    """Targets in spans (HF's collator): a span of L ~ U{1..max_span_length} tokens starts at
    a uniform offset of a window of round(L * K) tokens, windows tiling the row's
    candidates, until round(n / K) candidates are targets (the last span cut there; a row
    too short for its budget is topped up with uniform other candidates); the order among
    the targets is uniform. Window j's draws are keyed uniforms 2j (length) and 2j + 1
    (offset), so a row's order is a function of its key only; vectorised over the batch."""
    count = candidates.sum(axis=1)  # (batch,) candidates n
    most = int(count.max(initial=0))
    if most == 0:
        return Permutation(np.full(candidates.shape, CONTEXT_RANK), np.zeros_like(candidates))
    hashes = key_hashes(keys)
    budgets = num_targets(candidates, k)
    windows = most // max(1, int(np.rint(k))) + 1  # enough to tile the longest row
    u = keyed_uniform(seed, epoch, STREAM_PERMUTATION_SPANS, hashes, 2 * windows)
    length = 1 + (u[:, 0::2] * max_span_length).astype(np.int64)  # (batch, windows)
    window = np.maximum(length, np.rint(length * k).astype(np.int64))
    start = np.cumsum(window, axis=1) - window + (u[:, 1::2] * (window - length + 1)).astype(int)
    room = np.clip(count[:, None] - start, 0, length)  # cut at the row's end
    taken = np.clip(budgets[:, None] - (np.cumsum(room, axis=1) - room), 0, room)  # the budget
    # spans -> candidate indices (batch, most + 1) by +1 at each start, -1 at each end
    rows, spans = np.nonzero(taken)
    flat = rows * (most + 1)
    size = len(count) * (most + 1)
    edges = np.bincount(flat + start[rows, spans], minlength=size)
    edges -= np.bincount(flat + start[rows, spans] + taken[rows, spans], minlength=size)
    chosen = np.cumsum(edges.reshape(len(count), most + 1), axis=1)[:, :most] > 0
    missing = budgets - chosen.sum(axis=1)  # a short row: top up with other candidates
    if missing.any():
        u = keyed_uniform(seed, epoch, STREAM_PERMUTATION_TOPUP, hashes, most)
        scores = np.where(~chosen & (np.arange(most) < count[:, None]), u, 2.0)
        kth = np.sort(scores, axis=1)[np.arange(len(count)), np.maximum(missing - 1, 0)]
        chosen |= (scores <= kth[:, None]) & (missing > 0)[:, None]
    u = np.where(chosen, keyed_uniform(seed, epoch, STREAM_PERMUTATION, hashes, most), 2.0)
    order = np.argsort(u, axis=1)  # the targets first, in a uniform order
    rank = np.empty_like(order)
    rank.ravel()[order + np.arange(0, order.size, most)[:, None]] = np.arange(most)
    index = np.maximum(np.cumsum(candidates, axis=1) - 1, 0)  # (batch, seq) candidate index
    targets = candidates & np.take_along_axis(chosen, index, axis=1)
    rank = np.take_along_axis(rank, index, axis=1)
    return Permutation(np.where(targets, rank, CONTEXT_RANK), targets)


def perm_mask_from(
    permutation: Permutation, rows: slice = slice(None), columns: slice = slice(None)
) -> np.ndarray:
    """(batch, seq, seq) bool, True = token i may not see token j: j is a target not before i.
    Context tokens (rank CONTEXT_RANK) see each other and no target; padding is left to the
    attention mask. Computed as rank'[j] >= rank[i] with rank' = rank at targets and, at
    non-targets, a value below every rank (never blocked), in the narrowest integer type
    (int8 up to 128 tokens).
    `rows`, `columns`: only that block of it (i in rows, j in columns)."""
    rank, targets = permutation.rank, permutation.targets
    below = min(int(rank.min(initial=0)), CONTEXT_RANK) - 1
    top = int(rank.max(initial=0))
    dtype = next(
        t
        for t in (np.int8, np.int16, np.int64)
        if np.iinfo(t).min <= below and top <= np.iinfo(t).max
    )
    blocking = np.where(targets[:, columns], rank[:, columns], below).astype(dtype)
    return blocking[:, None, :] >= rank[:, rows].astype(dtype)[:, :, None]


def target_mapping_from(
    permutation: Permutation, input_ids: np.ndarray, num_predict: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target_mapping (batch, num_predict, seq) bool one-hot rows (the model casts it to its
    dtype; a quarter of float32's bytes to zero, fill and move), target_labels (batch,
    num_predict) int64 (IGNORE_INDEX for unused rows), target_positions (batch, num_predict)
    int64, -1 for unused). Targets are listed left to right; num_predict defaults to the most
    targets of any row."""
    targets = permutation.targets
    counts = targets.sum(axis=1)
    width = int(counts.max(initial=0)) if num_predict is None else num_predict
    if counts.max(initial=0) > width:
        raise ValueError(f"a row has {counts.max()} targets but num_predict = {width}")
    batch, seq = targets.shape
    mapping = np.zeros((batch, width, seq), bool)
    labels = np.full((batch, width), IGNORE_INDEX, np.int64)
    positions = np.full((batch, width), -1, np.int64)
    rows, cols = np.nonzero(targets)  # row-major: left to right within each row
    slot = np.arange(len(rows)) - np.searchsorted(rows, rows)  # index among the row's targets
    mapping[rows, slot, cols] = True
    labels[rows, slot] = input_ids[rows, cols]
    positions[rows, slot] = cols
    return mapping, labels, positions
