"""Statistics and reproducibility of BERT's token masking."""

import hashlib

import numpy as np
import pytest

from pretrain.data.keyed_rng import (
    STREAM_MASK_ACTION,
    STREAM_MASK_RANDOM_TOKEN,
    key_hash,
    key_hashes,
    keyed_uniform,
    keyed_uniform_at,
)
from pretrain.data.masking import (
    IGNORE_INDEX,
    candidate_tokens,
    corrupt_selected,
    mask_tokens,
    replace_selected,
)
from pretrain.objectives.mlm import MaskedLMCorruption

VOCAB, MASK_ID, SPECIAL = 1000, 4, (0, 1, 2, 3, 4)


def make_batch(n_rows: int, length: int, seed: int = 0, vocab: int = VOCAB) -> dict:
    """Random rows of [CLS] tokens [SEP] padding, of random lengths, keyed by row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(n_rows, length))
    lengths = rng.integers(length // 2, length + 1, size=n_rows)
    attention = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    ids[:, 0] = 2  # [CLS]
    ids[np.arange(n_rows), lengths - 1] = 3  # [SEP]
    ids[attention == 0] = 0
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "keys": [f"doc{seed}_{i}:0" for i in range(n_rows)],
    }


def corrupt(batch: dict, epoch: int = 0, **kw) -> dict:
    corruption = MaskedLMCorruption(
        seed=7, vocab_size=VOCAB, mask_token_id=MASK_ID, special_ids=SPECIAL, **kw
    )
    return corruption(
        {k: (v.copy() if isinstance(v, np.ndarray) else list(v)) for k, v in batch.items()}, epoch
    )


def test_keyed_uniform_is_uniform_and_keyed():
    u = keyed_uniform(1, 0, 10, key_hashes([f"k{i}" for i in range(2000)]), 64)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    # deciles equally filled (chi-square, 9 dof; 99.9% quantile is 27.9)
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    expected = u.size / 10
    assert ((counts - expected) ** 2 / expected).sum() < 27.9
    again = keyed_uniform(1, 0, 10, key_hashes(["k5"]), 64)
    np.testing.assert_array_equal(again[0], u[5])
    assert not np.allclose(keyed_uniform(1, 1, 10, key_hashes(["k5"]), 64), again)


def test_selection_budget_and_80_10_10_split():
    batch = make_batch(4000, 128)
    out = corrupt(batch)
    selected = out["labels"] != IGNORE_INDEX
    candidates = (batch["attention_mask"] == 1) & ~np.isin(batch["input_ids"], SPECIAL)
    # never a special token or padding, and labels hold the original ids
    assert not (selected & ~candidates).any()
    np.testing.assert_array_equal(out["labels"][selected], batch["input_ids"][selected])
    # exactly round(15% of candidates) per sequence
    per_row = selected.sum(1)
    np.testing.assert_array_equal(per_row, np.maximum(np.rint(candidates.sum(1) * 0.15), 1))
    n = selected.sum()
    masked = (out["input_ids"] == MASK_ID) & selected
    unchanged = (out["input_ids"] == batch["input_ids"]) & selected
    replaced = selected & ~masked & ~unchanged
    # binomial proportions within 4 standard deviations
    for share, p in (
        (masked.sum(), 0.8),
        (replaced.sum(), 0.1 * (1 - 1 / VOCAB)),
        (unchanged.sum(), 0.1),
    ):
        assert abs(share / n - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-3, (share / n, p)
    # unselected tokens are untouched
    np.testing.assert_array_equal(out["input_ids"][~selected], batch["input_ids"][~selected])
    # random replacements are spread over the vocabulary
    random_ids = out["input_ids"][replaced]
    assert random_ids.min() < VOCAB * 0.1 and random_ids.max() > VOCAB * 0.9


@pytest.mark.parametrize("probs", [(0.3, 0.5, 0.25), (0.05, 1.0, 0.0)])
def test_configurable_probabilities(probs):
    p, p_mask, p_random = probs
    batch = make_batch(2000, 64, seed=1)
    out = corrupt(
        batch, mlm_probability=p, mask_token_probability=p_mask, random_token_probability=p_random
    )
    selected = out["labels"] != IGNORE_INDEX
    candidates = (batch["attention_mask"] == 1) & ~np.isin(batch["input_ids"], SPECIAL)
    assert abs(selected.sum() / candidates.sum() - p) < 0.01
    masked_share = ((out["input_ids"] == MASK_ID) & selected).sum() / selected.sum()
    assert abs(masked_share - p_mask) < 0.02


def test_masks_depend_only_on_seed_epoch_and_key():
    batch = make_batch(64, 48, seed=2)
    out = corrupt(batch, epoch=3)
    # the same rows in another order and another batch composition: the same masks
    order = np.random.default_rng(0).permutation(64)[:40]
    sub = {
        "input_ids": batch["input_ids"][order],
        "attention_mask": batch["attention_mask"][order],
        "keys": [batch["keys"][i] for i in order],
    }
    out_sub = corrupt(sub, epoch=3)
    np.testing.assert_array_equal(out_sub["labels"], out["labels"][order])
    np.testing.assert_array_equal(out_sub["input_ids"], out["input_ids"][order])
    # dynamic masking: another epoch, other masks
    other = corrupt(batch, epoch=4)
    assert (other["labels"] != out["labels"]).mean() > 0.1


@pytest.mark.parametrize("objective", ["mlm_nsp", "bart", "xlnet"])
def test_static_masking_seeds_every_objective_with_the_epochs_copy(prepared_corpus, objective):
    """The stream decides static masking once for every objective: the corruption of epoch e
    is seeded by e % dupe_factor (BERT's dupe_factor copies), by e itself when dynamic."""
    from dataclasses import replace

    from pretrain.config import compose_config
    from pretrain.data.stream import EpochStream
    from pretrain.runtime.run import build_stream

    data = {"mlm_nsp": "segment_pair", "bart": "full_sentences", "xlnet": "xlnet_pair"}[objective]
    overrides = [f"data.shards_dir={prepared_corpus}", f"objective={objective}", f"data={data}"]
    overrides += ["objective.masking=static", "objective.dupe_factor=3", "data.batch_size=2"]
    overrides += ["model=xlnet_tiny"] if objective == "xlnet" else []
    _, spec, _ = build_stream(compose_config(overrides))
    assert [spec.mask_epoch(e) for e in range(6)] == [0, 1, 2, 0, 1, 2]
    assert [replace(spec, masking="dynamic").mask_epoch(e) for e in (0, 4)] == [0, 4]
    seen = []

    def corruption(batch: dict, epoch: int) -> dict:
        seen.append(epoch)
        return spec.corruption(batch, epoch)

    next(iter(EpochStream(replace(spec, corruption=corruption), epoch=4)))
    assert seen == [1]


def test_mask_tokens_handles_rows_without_candidates():
    ids = np.array([[2, 3, 0, 0], [2, 10, 11, 3]])
    candidates = np.array([[False] * 4, [False, True, True, False]])
    out, labels = mask_tokens(
        ids,
        candidates,
        key_hashes(["a", "b"]),
        seed=0,
        epoch=0,
        vocab_size=VOCAB,
        mask_token_id=MASK_ID,
        mlm_probability=0.15,
        mask_token_probability=0.8,
        random_token_probability=0.1,
    )
    assert (labels[0] == IGNORE_INDEX).all()
    assert (labels[1] != IGNORE_INDEX).sum() == 1


def test_keyed_uniform_at_reads_the_keyed_uniform_array():
    hashes = key_hashes([f"k{i}" for i in range(50)])
    full = keyed_uniform(3, 2, 11, hashes, 97)
    rng = np.random.default_rng(0)
    rows, columns = rng.integers(0, 50, 400), rng.integers(0, 97, 400)
    np.testing.assert_array_equal(
        keyed_uniform_at(3, 2, 11, hashes, rows, columns), full[rows, columns]
    )
    assert keyed_uniform_at(3, 2, 11, hashes, rows[:0], columns[:0]).shape == (0,)
    assert not np.array_equal(
        keyed_uniform_at(3, 2, 12, hashes, rows, columns), full[rows, columns]
    )


@pytest.mark.parametrize("special", [SPECIAL, (0, 101, 102, 103, 999), (7,), ()])
def test_candidates_are_real_tokens_that_are_not_special(special):
    batch = make_batch(64, 40, seed=3)
    expected = (batch["attention_mask"] == 1) & ~np.isin(batch["input_ids"], special)
    got = candidate_tokens(batch["input_ids"], batch["attention_mask"], special)
    assert got.dtype == bool
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("units", [False, True])
def test_corruption_reads_its_draws_where_the_dense_80_10_10_rule_does(units):
    """corrupt_selected (draws read at the selected and replaced tokens) equals the rule
    applied to full arrays of draws, per token or per unit (the draw at the unit's start)."""
    batch = make_batch(200, 64, seed=5)
    hashes = key_hashes(batch["keys"])
    rng = np.random.default_rng(1)
    selected = (rng.random((200, 64)) < 0.3) & (batch["attention_mask"] == 1)
    unit_start = None
    if units:
        starts = rng.random((200, 64)) < 0.4
        unit_start = np.maximum.accumulate(np.where(starts, np.arange(64), 0), axis=1)
    draws = dict(seed=7, epoch=2, vocab_size=VOCAB, mask_token_id=MASK_ID)
    rule = dict(mask_token_probability=0.8, random_token_probability=0.1)  # BERT's 80/10/10
    got = corrupt_selected(batch["input_ids"], selected, unit_start, hashes, **draws, **rule)
    action = keyed_uniform(7, 2, STREAM_MASK_ACTION, hashes, 64)
    if units:
        action = np.take_along_axis(action, unit_start, axis=1)
    random_ids = (keyed_uniform(7, 2, STREAM_MASK_RANDOM_TOKEN, hashes, 64) * VOCAB).astype(int)
    expected = replace_selected(batch["input_ids"], selected, action, random_ids, MASK_ID, 0.8, 0.1)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == np.int64
        np.testing.assert_array_equal(a, b)


def test_key_hash_is_the_little_endian_blake2b_digest_of_the_key():
    keys = ["", "doc0_1:0", "shard-000003.tar/000017:2", "é" * 40]
    expected = [
        int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8).digest(), "little") for k in keys
    ]
    assert [key_hash(k) for k in keys] == expected
    assert key_hashes(keys).tolist() == expected
    assert key_hashes(keys).dtype == np.uint64 and key_hashes(keys).flags.writeable
    assert key_hashes([]).shape == (0,)
