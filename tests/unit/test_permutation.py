"""Statistics of XLNet's factorization orders: valid orderings, 1/K targets, uniform targets,
perm_mask consistent with the order, target_mapping consistent with the targets, keyed."""

import numpy as np
import pytest

from pretrain.data.keyed_rng import key_hashes
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.permutation import (
    CONTEXT_RANK,
    num_targets,
    perm_mask_from,
    span_order,
    target_mapping_from,
    uniform_order,
)


def _rows(batch=400, seq=48, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(12, seq + 1, batch)
    candidates = np.arange(seq)[None, :] < lengths[:, None]
    candidates[:, 0] = False  # a special token
    keys = [f"doc{i}:0" for i in range(batch)]
    return candidates, keys


def _draw(order, candidates, keys, epoch=0, k=6.0):
    if order == "uniform":
        return uniform_order(candidates, key_hashes(keys), seed=7, epoch=epoch, k=k)
    return span_order(candidates, keys, seed=7, epoch=epoch, k=k)


@pytest.mark.parametrize("order", ["uniform", "span"])
def test_targets_are_one_kth_and_ranks_a_permutation(order):
    candidates, keys = _rows()
    perm = _draw(order, candidates, keys)
    expected = np.maximum(1, np.rint(candidates.sum(1) / 6))
    np.testing.assert_array_equal(perm.targets.sum(1), expected)
    assert not (perm.targets & ~candidates).any(), "only candidates are targets"
    for row in range(len(keys)):
        ranks = perm.rank[row][perm.targets[row]]
        assert sorted(np.argsort(ranks).tolist()) == list(range(len(ranks)))
        assert len(set(ranks.tolist())) == len(ranks), "a valid ordering of the targets"
        assert (perm.rank[row][~perm.targets[row]] == CONTEXT_RANK).all()


def test_num_targets_rounding():
    candidates = np.zeros((4, 20), bool)
    for row, n in enumerate([0, 1, 9, 20]):
        candidates[row, :n] = True
    assert num_targets(candidates, 6.0).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("order", ["uniform", "span"])
def test_perm_mask_follows_the_order(order):
    candidates, keys = _rows(batch=50)
    perm = _draw(order, candidates, keys)
    mask = perm_mask_from(perm)  # True = i may not see j
    rank, targets = perm.rank, perm.targets
    for row in range(5):
        for i in range(candidates.shape[1]):
            for j in range(candidates.shape[1]):
                # j precedes i in the order "context (as one group), then targets by rank"
                visible = (not targets[row, j]) or (targets[row, i] and rank[row, j] < rank[row, i])
                assert mask[row, i, j] == (not visible)
    # no target sees itself (query stream), so nothing leaks the token it predicts
    assert all(mask[b, i, i] for b, i in zip(*np.nonzero(targets), strict=True))


def test_uniform_targets_are_uniform_over_positions():
    """Each candidate position is a target with probability round(n/K)/n: chi-square over
    positions of equal-length rows."""
    batch, seq = 3000, 24
    candidates = np.ones((batch, seq), bool)
    keys = [f"d{i}" for i in range(batch)]
    perm = _draw("uniform", candidates, keys)
    counts = perm.targets.sum(0)
    expected = batch * 4 / seq  # round(24 / 6) = 4 targets per row
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 49.7, f"chi-square {chi2:.1f} over 23 degrees of freedom (p < 0.002)"
    # and the order among the targets: the leftmost target is first in the order 1/4 of the time
    first = [perm.rank[b][perm.targets[b]].argmin() == 0 for b in range(batch)]
    assert abs(np.mean(first) - 0.25) < 4 * np.sqrt(0.25 * 0.75 / batch)


def test_span_targets_are_contiguous_runs():
    candidates = np.ones((300, 120), bool)
    keys = [f"d{i}" for i in range(300)]
    perm = _draw("span", candidates, keys)
    starts = perm.targets & ~np.pad(perm.targets, ((0, 0), (1, 0)))[:, :-1]
    mean_run = perm.targets.sum() / starts.sum()
    assert 2.0 < mean_run <= 5.0, mean_run  # lengths U{1..5}: mean 3, a few runs merge or cut


@pytest.mark.parametrize("order", ["uniform", "span"])
def test_keyed_and_redrawn_each_epoch(order):
    candidates, keys = _rows(batch=20)
    a = _draw(order, candidates, keys, epoch=0)
    b = _draw(order, candidates[::-1].copy(), keys[::-1], epoch=0)
    np.testing.assert_array_equal(a.rank, b.rank[::-1])  # independent of batch order
    wider = np.pad(candidates[3:4], ((0, 0), (0, 16)))  # alone, in a wider batch
    alone = _draw(order, wider, keys[3:4], epoch=0)
    np.testing.assert_array_equal(alone.targets[0, :48], a.targets[3])
    np.testing.assert_array_equal(  # the targets in the same order
        np.argsort(alone.rank[0, :48][a.targets[3]]), np.argsort(a.rank[3][a.targets[3]])
    )
    c = _draw(order, candidates, keys, epoch=1)
    assert not np.array_equal(a.targets, c.targets)


def test_span_order_on_short_and_empty_rows():
    """Rows too short for their budget's spans are topped up to round(n / K) targets; a batch
    without candidates has no targets."""
    candidates = np.zeros((300, 10), bool)
    candidates[:, 2:5] = True  # 3 candidates, budget 1 at K = 2
    perm = span_order(candidates, [f"d{i}" for i in range(300)], seed=1, epoch=0, k=2.0)
    assert (perm.targets.sum(1) == 2).all() and not (perm.targets & ~candidates).any()
    empty = span_order(np.zeros((2, 6), bool), ["a", "b"], seed=1, epoch=0, k=6.0)
    assert not empty.targets.any() and (empty.rank == CONTEXT_RANK).all()


def test_target_mapping_and_labels():
    candidates, keys = _rows(batch=30)
    ids = np.random.default_rng(1).integers(5, 100, candidates.shape)
    perm = _draw("uniform", candidates, keys)
    mapping, labels, positions = target_mapping_from(perm, ids)
    assert mapping.shape[1] == perm.targets.sum(1).max()
    np.testing.assert_array_equal(mapping.sum(1) > 0, perm.targets)
    assert (mapping.sum(2) <= 1).all()
    used = labels != IGNORE_INDEX
    np.testing.assert_array_equal(used.sum(1), perm.targets.sum(1))
    rows, slots = np.nonzero(used)
    np.testing.assert_array_equal(labels[rows, slots], ids[rows, positions[rows, slots]])
    np.testing.assert_array_equal(mapping[rows, slots, positions[rows, slots]], 1.0)


def test_two_part_order_gives_each_part_its_own_uniform_kth():
    """XLNet's memory layout (`reuse`): the first part wholly before the second in the order,
    each part with round(n / K) targets uniform over its positions, and a row's order the
    same alone as in its batch."""
    batch, seq, reuse = 3000, 24, 10
    candidates = np.ones((batch, seq), bool)
    candidates[:, 0] = False
    hashes = key_hashes([f"d{i}" for i in range(batch)])
    perm = uniform_order(candidates, hashes, seed=7, epoch=0, k=3.0, reuse=reuse)
    head, tail = perm.targets[:, :reuse], perm.targets[:, reuse:]
    assert (head.sum(1) == 3).all() and (tail.sum(1) == 5).all()  # 9 / 3, 14 / 3 rounded
    assert (perm.rank[:, :reuse].max(1) < perm.rank[:, reuse:][tail].reshape(batch, 5).min(1)).all()
    for counts, positions in ((head.sum(0)[1:], 9), (tail.sum(0), 14)):
        expected = counts.sum() / positions
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 3.5 * positions, chi2  # ~p < 0.001 at 8-13 degrees of freedom
    alone = uniform_order(candidates[7:8], hashes[7:8], seed=7, epoch=0, k=3.0, reuse=reuse)
    np.testing.assert_array_equal(alone.rank[0], perm.rank[7])


def test_scalar_keyed_uniform_equals_keyed_uniform():
    from pretrain.data.keyed_rng import key_hash, keyed_uniform, scalar_keyed_uniform

    for seed, epoch, stream, key in [
        (0, 0, 3, "a"),
        (1234, 7, 3, "doc@64"),
        (2**40 + 7, 2, 9, "x"),
    ]:
        expected = keyed_uniform(seed, epoch, stream, np.array([key_hash(key)], np.uint64), 6)
        np.testing.assert_array_equal(
            scalar_keyed_uniform(seed, epoch, stream, key, 6), expected[0]
        )
