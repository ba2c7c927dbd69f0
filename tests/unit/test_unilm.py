"""UniLM: the four attention-mask kinds in the paper's proportions, drawn from the sequence
key; each kind's mask exactly as the paper draws it (Dong et al., 2019, Figure 1); cloze
selection (15%, 80/10/10; under seq2seq the target only); the loss as a hand-computed cross
entropy; seq2seq generation's step."""

import math

import numpy as np
import pytest
import torch
from conftest import tiny_module_config

from pretrain.config import ConfigError, run_config
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.lm_kinds import (
    BIDIRECTIONAL,
    LEFT_TO_RIGHT,
    RIGHT_TO_LEFT,
    SEQ2SEQ,
    draw_lm_kinds,
    lm_kind_shares,
)
from pretrain.data.masking import IGNORE_INDEX, mask_budget
from pretrain.data.vocab import Vocabulary
from pretrain.models.generation import greedy_search
from pretrain.objectives.unilm import UniLM, unilm_attention_mask

VOCAB = Vocabulary(size=300, pad=0, unk=1, cls=2, sep=3, mask=4)
PAPER_SHARES = {BIDIRECTIONAL: 1 / 3, LEFT_TO_RIGHT: 1 / 6, RIGHT_TO_LEFT: 1 / 6, SEQ2SEQ: 1 / 3}


def within_binomial(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def make_module(**objective) -> UniLM:
    config = tiny_module_config(
        {"_target_": "pretrain.objectives.unilm.UniLM", **objective},
        data={"format": "segment_pair", "max_seq_length": 64},
    )
    torch.manual_seed(0)
    return UniLM(config, VOCAB).eval()


def pair_batch(rows: int, length: int = 40, seed: int = 0) -> dict:
    """Rows [CLS] A [SEP] B [SEP] + padding with random plain tokens, A and B of random
    lengths; keys doc-<i>."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((rows, length), np.int64)
    types = np.zeros((rows, length), np.int64)
    real = np.zeros((rows, length), np.int64)
    for row in range(rows):
        len_a = int(rng.integers(3, min(15, length - 8)))
        len_b = int(rng.integers(3, length - len_a - 3 + 1))
        a = rng.integers(5, VOCAB.size, len_a)
        b = rng.integers(5, VOCAB.size, len_b)
        tokens = [VOCAB.cls, *a, VOCAB.sep, *b, VOCAB.sep]
        ids[row, : len(tokens)] = tokens
        types[row, len_a + 2 : len(tokens)] = 1
        real[row, : len(tokens)] = 1
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": real,
        "keys": [f"doc-{row}" for row in range(rows)],
    }


def corrupt(batch: dict, epoch: int = 0, **settings) -> dict:
    corruption = UniLM.build_corruption(
        run_config(
            tiny_module_config(
                {"_target_": "pretrain.objectives.unilm.UniLM", **settings},
                data={"format": "segment_pair", "max_seq_length": batch["input_ids"].shape[1]},
            )
        ),
        VOCAB,
    )
    return corruption(
        {key: np.copy(value) if key != "keys" else value for key, value in batch.items()}, epoch
    )


# The kinds' statistics


def test_kinds_follow_the_papers_shares_within_binomial_bounds():
    hashes = key_hashes([f"sequence-{i}" for i in range(60_000)])
    kinds = draw_lm_kinds(1234, 0, hashes, lm_kind_shares((2, 1, 1, 2)))
    assert kinds.dtype == np.int64 and set(np.unique(kinds)) == set(PAPER_SHARES)
    for code, share in PAPER_SHARES.items():
        count = int((kinds == code).sum())
        assert within_binomial(count, len(kinds), share), (code, count)


def test_kinds_change_with_the_epoch_and_not_with_the_batching():
    keys = [f"sequence-{i}" for i in range(20_000)]
    shares = lm_kind_shares((2, 1, 1, 2))
    first = draw_lm_kinds(7, 0, key_hashes(keys), shares)
    second = draw_lm_kinds(7, 1, key_hashes(keys), shares)
    same = int((first == second).sum())  # independent draws agree with p = sum of squares
    assert within_binomial(same, len(keys), sum(p * p for p in PAPER_SHARES.values()))
    halves = [draw_lm_kinds(7, 0, key_hashes(part), shares) for part in (keys[::2], keys[1::2])]
    np.testing.assert_array_equal(halves[0], first[::2])  # a row's kind is its key's alone
    np.testing.assert_array_equal(halves[1], first[1::2])


def test_a_zero_weight_never_draws_its_kind_and_bad_weights_name_their_key():
    kinds = draw_lm_kinds(
        1, 0, key_hashes([str(i) for i in range(5000)]), lm_kind_shares((0, 1, 0, 1))
    )
    assert set(np.unique(kinds)) == {LEFT_TO_RIGHT, SEQ2SEQ}
    with pytest.raises(ConfigError, match="objective.seq2seq_weight"):
        make_module(seq2seq_weight=-1.0)
    with pytest.raises(ConfigError, match="objective.pair_task"):
        make_module(pair_task="nsp")


# Each kind's mask, against the paper's definitions written out per (query, key)


def reference_mask(kind: int, types: list[int], real: list[int]) -> np.ndarray:
    length = len(types)
    mask = np.zeros((length, length), bool)
    for i in range(length):
        for j in range(length):
            if not real[j]:
                continue
            if not real[i]:  # padding queries see every real key
                mask[i, j] = True
            elif kind == BIDIRECTIONAL:
                mask[i, j] = True
            elif kind == LEFT_TO_RIGHT:
                mask[i, j] = j <= i
            elif kind == RIGHT_TO_LEFT:
                mask[i, j] = j >= i
            elif types[i] == 0:  # seq2seq, a source query: the whole source
                mask[i, j] = types[j] == 0
            else:  # a target query: the source and the target up to itself
                mask[i, j] = types[j] == 0 or j <= i
    return mask


def test_each_kinds_mask_is_exactly_the_papers():
    types = [0, 0, 0, 0, 1, 1, 1, 0, 0]  # [CLS] a a [SEP] b b [SEP] + 2 padding
    real = [1, 1, 1, 1, 1, 1, 1, 0, 0]
    kinds = [BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ]
    got = unilm_attention_mask(
        torch.tensor(kinds), torch.tensor([types] * 4), torch.tensor([real] * 4)
    )
    assert got.shape == (4, 9, 9) and got.dtype == torch.bool
    for row, kind in enumerate(kinds):
        np.testing.assert_array_equal(
            got[row].numpy(), reference_mask(kind, types, real), err_msg=str(kind)
        )
    # the shapes the paper draws, on the 7 real tokens
    square = got[:, :7, :7]
    assert square[0].all()
    assert torch.equal(square[1], torch.ones(7, 7, dtype=torch.bool).tril())
    assert torch.equal(square[2], torch.ones(7, 7, dtype=torch.bool).triu())
    assert not square[3][:4, 4:].any() and square[3][:4, :4].all()  # source: source only
    assert square[3][4:, :4].all() and torch.equal(
        square[3][4:, 4:], torch.ones(3, 3).tril().bool()
    )


def test_masks_of_random_batches_match_the_reference():
    batch = pair_batch(24, length=20, seed=3)
    kinds = torch.arange(24) % 4
    got = unilm_attention_mask(
        kinds, torch.from_numpy(batch["token_type_ids"]), torch.from_numpy(batch["attention_mask"])
    )
    for row in range(24):
        want = reference_mask(
            int(kinds[row]),
            batch["token_type_ids"][row].tolist(),
            batch["attention_mask"][row].tolist(),
        )
        np.testing.assert_array_equal(got[row].numpy(), want)


def test_the_encoder_under_a_left_to_right_mask_ignores_later_tokens():
    module = make_module()
    batch = pair_batch(4, length=16, seed=5)
    ids = torch.from_numpy(batch["input_ids"])
    types, real = (
        torch.from_numpy(batch["token_type_ids"]),
        torch.from_numpy(batch["attention_mask"]),
    )
    changed = ids.clone()
    changed[:, 6:] = 7  # every token from position 6 on
    for kind, unchanged in ((LEFT_TO_RIGHT, True), (BIDIRECTIONAL, False)):
        mask = unilm_attention_mask(torch.full((4,), kind), types, real)
        with torch.no_grad():
            before = module.encoder(ids, types, mask)[:, :6]
            after = module.encoder(changed, types, mask)[:, :6]
        assert torch.allclose(before, after, atol=1e-6) == unchanged, kind


# Cloze targets


def test_selection_rates_and_seq2seq_targets_only():
    batch = pair_batch(3000, seed=1)
    out = corrupt(batch, epoch=2)
    kinds = out["lm_kind"]
    np.testing.assert_array_equal(
        kinds, draw_lm_kinds(0, 2, key_hashes(batch["keys"]), lm_kind_shares((2, 1, 1, 2)))
    )
    ids, types, real = (
        batch["input_ids"],
        batch["token_type_ids"],
        batch["attention_mask"].astype(bool),
    )
    selected = out["labels"] != IGNORE_INDEX
    np.testing.assert_array_equal(out["labels"][selected], ids[selected])  # targets: originals
    plain = real & (ids >= 5)
    target = real & (types == 1)
    seq2seq = kinds == SEQ2SEQ
    candidates = np.where(seq2seq[:, None], target, plain)  # seq2seq: B and its closing [SEP]
    assert not (selected & ~candidates).any()
    np.testing.assert_array_equal(selected.sum(1), mask_budget(candidates.sum(1), 0.15))
    closing_sep = selected & (ids == VOCAB.sep)
    assert closing_sep[seq2seq].any() and not closing_sep[~seq2seq].any()
    # 80/10/10 over every selected token
    n = int(selected.sum())
    masked = int((out["input_ids"][selected] == VOCAB.mask).sum())
    kept = int((out["input_ids"][selected] == ids[selected]).sum())
    assert within_binomial(masked, n, 0.8)
    assert within_binomial(kept, n, 0.1 + 0.1 / VOCAB.size)  # a random token may be the same
    assert (out["input_ids"][~selected] == ids[~selected]).all()
    # the cloze positions: each row's selected positions in the static budget
    positions = out["prediction_positions"]
    assert (
        positions.shape == (3000, positions.shape[1])
        and positions.shape[1] >= selected.sum(1).max()
    )
    for row in range(0, 3000, 97):
        assert sorted(p for p in positions[row] if p >= 0) == list(np.flatnonzero(selected[row]))


def test_masks_are_drawn_again_each_epoch():
    batch = pair_batch(400, seed=2)
    first, second = corrupt(batch, epoch=0), corrupt(batch, epoch=1)
    assert (first["lm_kind"] != second["lm_kind"]).any()
    assert ((first["labels"] != IGNORE_INDEX) != (second["labels"] != IGNORE_INDEX)).any()
    again = corrupt(batch, epoch=0)
    np.testing.assert_array_equal(again["input_ids"], first["input_ids"])


# The loss and generation


def test_loss_is_the_hand_computed_cross_entropy_under_each_rows_mask():
    module = make_module()
    batch = {
        key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for key, value in corrupt(pair_batch(4, length=24, seed=4)).items()
    }
    batch["lm_kind"] = torch.tensor([BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ])
    with torch.no_grad():
        losses = module(batch)
        log_terms = []
        for row in range(4):  # one row at a time, its mask from the reference
            types = batch["token_type_ids"][row]
            real = batch["attention_mask"][row]
            mask = reference_mask(int(batch["lm_kind"][row]), types.tolist(), real.tolist())
            hidden = module.encoder(
                batch["input_ids"][row : row + 1], types[None], torch.from_numpy(mask)[None]
            )
            for position in torch.nonzero(batch["labels"][row] != IGNORE_INDEX)[:, 0]:
                logits = module.mlm_head(hidden[0, position]).double()
                target = batch["labels"][row, position]
                log_terms.append(logits[target] - torch.logsumexp(logits, dim=0))
    want = -torch.stack(log_terms).mean()
    torch.testing.assert_close(losses.loss.double(), want, rtol=1e-5, atol=1e-6)
    assert losses["mlm_loss"] is losses.metrics["mlm_loss"] and len(log_terms) >= 4


def test_generation_step_predicts_the_appended_mask_under_the_seq2seq_mask():
    module = make_module()
    source = torch.tensor([[10, 11, 12]])
    setup = module.prepare_generation(source)
    assert setup.prefix.tolist() == [[VOCAB.cls, 10, 11, 12, VOCAB.sep]]
    assert setup.eos_id == VOCAB.sep and setup.max_length == 64
    sequence = torch.tensor([[VOCAB.cls, 10, 11, 12, VOCAB.sep, 20, 21]])
    with torch.no_grad():
        logits = setup.step(sequence)
        inputs = torch.tensor([[*sequence[0].tolist(), VOCAB.mask]])
        types = [0] * 5 + [1] * 3
        mask = torch.from_numpy(reference_mask(SEQ2SEQ, types, [1] * 8))[None]
        hidden = module.encoder(inputs, torch.tensor([types]), mask)
        want = module.mlm_head(hidden[:, -1])
    banned = [VOCAB.pad, VOCAB.cls, VOCAB.mask, VOCAB.unk]
    keep = [i for i in range(VOCAB.size) if i not in banned]
    torch.testing.assert_close(logits[:, keep], want[:, keep], rtol=0, atol=1e-5)
    assert torch.isinf(logits[:, banned]).all()
    out = greedy_search(setup.step, setup.prefix, 6, setup.eos_id)
    assert out.shape[0] == 1 and 5 < out.shape[1] <= 11
    assert not set(out[0, 5:].tolist()) & set(banned)
