"""StructBERT's word structural objective: shuffled trigrams are true permutations."""

from collections import Counter

import numpy as np
import pytest
from test_masking import make_batch

from pretrain.data.keyed_rng import STREAM_MASK_SELECT, key_hashes, keyed_uniform
from pretrain.data.masking import IGNORE_INDEX
from pretrain.objectives.structbert import (
    RANKS_KEY,
    StructBertCorruption,
    shuffle_batch_trigrams,
)

SPECIAL = (0, 1, 2, 3, 4)


def corrupt(batch: dict, epoch: int = 0, **kw) -> dict:
    corruption = StructBertCorruption(
        seed=3, vocab_size=5000, mask_token_id=4, special_ids=SPECIAL, **kw
    )
    return corruption(
        {k: (v.copy() if isinstance(v, np.ndarray) else list(v)) for k, v in batch.items()}, epoch
    )


def test_trigrams_are_permuted_in_place():
    rng = np.random.default_rng(0)
    ids = np.arange(100, 400)
    free = rng.random(300) < 0.9
    shuffled, (_, positions) = shuffle_batch_trigrams(
        ids[None], free[None], 0.1, key_hashes(["row"]), seed=1, epoch=0
    )
    shuffled = shuffled[0]
    assert len(positions) == 3 * round(0.1 * free.sum() / 3)  # exactly the wanted trigrams
    triples = positions.reshape(-1, 3)
    assert (np.diff(triples, axis=1) == 1).all() and len(set(positions.tolist())) == len(positions)
    assert free[positions].all()
    for t in triples:  # a true permutation of the three tokens, never the identity
        assert sorted(shuffled[t]) == sorted(ids[t]) and (shuffled[t] != ids[t]).any()
    untouched = np.setdiff1d(np.arange(300), positions)
    np.testing.assert_array_equal(shuffled[untouched], ids[untouched])


def test_word_order_labels_budget_and_reproducibility():
    batch = make_batch(1500, 128, seed=4, vocab=5000)
    out = corrupt(batch)
    shuffled = out["shuffle_labels"] != IGNORE_INDEX
    masked = out["labels"] != IGNORE_INDEX
    assert not (shuffled & masked).any()
    assert not np.isin(batch["input_ids"][shuffled], SPECIAL).any()
    np.testing.assert_array_equal(out["shuffle_labels"][shuffled], batch["input_ids"][shuffled])
    for row in range(50):  # the multiset of each row's tokens outside masks is unchanged
        keep = ~masked[row]
        assert Counter(out["input_ids"][row][keep].tolist()) == Counter(
            batch["input_ids"][row][keep].tolist()
        )
    candidates = (batch["attention_mask"] == 1) & ~np.isin(batch["input_ids"], SPECIAL)
    assert shuffled.sum() / candidates.sum() == pytest.approx(0.05, abs=0.01)
    again = corrupt(batch)
    np.testing.assert_array_equal(again["input_ids"], out["input_ids"])
    assert (corrupt(batch, epoch=1)["shuffle_labels"] != out["shuffle_labels"]).any()


def test_trigram_starts_rank_by_the_mlm_selection_uniforms():
    batch = make_batch(40, 128, seed=5, vocab=5000)
    out = corrupt(batch, epoch=2)
    assert RANKS_KEY not in out
    hashes = key_hashes(batch["keys"])
    candidates = (batch["attention_mask"] == 1) & ~np.isin(batch["input_ids"], SPECIAL)
    free = candidates & (out["labels"] == IGNORE_INDEX)
    ranks = keyed_uniform(3, 2, STREAM_MASK_SELECT, hashes, 128)
    _, (rows, columns) = shuffle_batch_trigrams(
        batch["input_ids"], free, 0.05, hashes, 3, 2, ranks=ranks
    )
    assert len(rows) > 0
    shuffled = np.flatnonzero(out["shuffle_labels"] != IGNORE_INDEX)
    np.testing.assert_array_equal(shuffled, rows * 128 + columns)
