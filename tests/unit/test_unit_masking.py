"""Unit-level masking: whole words (BERT-wwm), word n-grams (ALBERT), phrases and entities
(ERNIE 1.0); their invariants, statistics and keyed reproducibility."""

import numpy as np
import pytest
from conftest import assert_corrupts_like_the_full_batch, prepare_small_corpus

from data_pipelines.prepare_config import PhraseSettings
from pretrain.config import compose_config
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.masking import IGNORE_INDEX, word_start_flags
from pretrain.data.span_masking import ngram_length_probabilities, sample_lengths
from pretrain.data.stream import EpochStream
from pretrain.objectives.ernie import ErnieCorruption
from pretrain.objectives.mlm import MaskedLMCorruption
from pretrain.objectives.ngram import NgramCorruption
from pretrain.objectives.span import SpanCorruption
from pretrain.objectives.structbert import StructBertCorruption
from pretrain.objectives.whole_word import WholeWordCorruption
from pretrain.runtime.run import build_stream

VOCAB, PAD, CLS, SEP, MASK_ID = 1000, 0, 2, 3, 4
SPECIAL = (0, 1, 2, 3, 4)
# chi-square 99.9% quantiles by degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 9: 27.88}


def make_word_batch(
    n_rows: int,
    length: int,
    seed: int = 0,
    *,
    pair: bool = False,
    annotate: bool = False,
    word_start_probability: float = 0.6,
    vocab: int = VOCAB,
) -> dict:
    """A padded batch as the stream gives it: [CLS] A [SEP] (B [SEP]) padding, random ids,
    random word starts (the token after a special starts a word), and with `annotate` random
    phrase/entity spans of 2 to 4 whole words inside one segment."""
    rng = np.random.default_rng(seed)
    rows = np.arange(n_rows)
    ids = rng.integers(5, vocab, size=(n_rows, length))
    lengths = rng.integers(max(length // 2, 8), length + 1, size=n_rows)
    attention = np.arange(length)[None, :] < lengths[:, None]
    ids[:, 0] = CLS
    ids[rows, lengths - 1] = SEP
    types = np.zeros((n_rows, length), np.int64)
    if pair:
        middle = rng.integers(3, lengths - 3)
        ids[rows, middle] = SEP
        types = ((np.arange(length)[None, :] > middle[:, None]) & attention).astype(np.int64)
    ids[~attention] = PAD
    special = np.isin(ids, SPECIAL)
    after_special = np.zeros_like(special)
    after_special[:, 1:] = special[:, :-1]
    word_starts = (rng.random(ids.shape) < word_start_probability) | special | after_special
    word_starts &= attention
    phrases = np.zeros(ids.shape, np.uint8)
    if annotate:
        for row in range(n_rows):
            _annotate_row(phrases[row], word_starts[row], attention[row] & ~special[row], rng)
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": attention.astype(np.int64),
        "word_starts": word_starts,
        "phrases": phrases,
        "next_sentence_label": np.zeros(n_rows, np.int64),
        "keys": [f"doc{seed}_{i}:0" for i in range(n_rows)],
    }


def _annotate_row(phrases, word_starts, candidates, rng) -> None:
    starts = np.flatnonzero(word_starts & candidates).tolist()
    ends = [*starts[1:], len(word_starts)]
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        inside = candidates[start:end]  # a word also ends at the next special token
        ends[i] = end if inside.all() else start + int(np.argmin(inside))
    w = 0
    while w < len(starts):
        k = int(rng.integers(2, 5))
        inside = w + k <= len(starts) and all(ends[j] == starts[j + 1] for j in range(w, w + k - 1))
        if rng.random() < 0.3 and inside:
            phrases[starts[w]] = rng.choice([1, 2])
            phrases[starts[w] + 1 : ends[w + k - 1]] = 3
            w += k
        else:
            w += 1


def candidates_of(batch: dict) -> np.ndarray:
    return batch["attention_mask"].astype(bool) & ~np.isin(batch["input_ids"], SPECIAL)


def corrupt(corruption_class, batch: dict, epoch: int = 0, **kw) -> dict:
    corruption = corruption_class(
        seed=7, vocab_size=VOCAB, mask_token_id=MASK_ID, special_ids=SPECIAL, **kw
    )
    return corruption(
        {k: (v.copy() if isinstance(v, np.ndarray) else list(v)) for k, v in batch.items()}, epoch
    )


def group_ids(starts: np.ndarray) -> np.ndarray:
    """Global id of the group (word, annotated unit) of every token, from flags marking the
    first token of each group; (batch, seq) -> (batch * seq,). Every row starts with [CLS],
    a group start, so rows never share a group."""
    return np.cumsum(starts.ravel()) - 1


def whole_groups(selected: np.ndarray, groups: np.ndarray, members: np.ndarray) -> tuple:
    """(selected tokens per group, tokens per group) over the `members` tokens."""
    keep = members.ravel()
    size = np.bincount(groups[keep], minlength=groups[-1] + 1)
    chosen = np.bincount(groups[keep], weights=selected.ravel()[keep], minlength=len(size))
    return chosen, size


def assert_80_10_10_per_unit(batch: dict, out: dict, groups: np.ndarray) -> None:
    """All tokens of a selected unit share one decision; decisions split 80/10/10."""
    selected = (out["labels"] != IGNORE_INDEX).ravel()
    masked = (out["input_ids"].ravel() == MASK_ID) & selected
    kept = (out["input_ids"].ravel() == batch["input_ids"].ravel()) & selected
    n_masked, size = whole_groups(masked, groups, selected.reshape(out["labels"].shape))
    n_kept, _ = whole_groups(kept, groups, selected.reshape(out["labels"].shape))
    units = size > 0
    # all tokens [MASK] or none; a random replacement that happens to be [MASK] (1/VOCAB per
    # token) is the only way to mix, where token-level decisions would mix most units
    mixed = ((n_masked[units] > 0) & (n_masked[units] < size[units])).sum()
    assert mixed <= 0.002 * units.sum()
    n = units.sum()
    all_masked = (n_masked[units] == size[units]).sum()
    all_kept = (n_kept[units] == size[units]).sum()  # a random id equal to the original: 1/VOCAB
    for count, p in ((all_masked, 0.8), (all_kept, 0.1), (n - all_masked - all_kept, 0.1)):
        assert abs(count / n - p) < 4 * np.sqrt(p * (1 - p) / n) + 2e-3, (count / n, p)


def assert_budget_filled(selected, candidates, groups, probability=0.15) -> None:
    """Per row: no more than round(p * n) tokens unless a single unit was taken, and every
    unit left out is longer than what was left of the budget (whole units filled greedily)."""
    budget = np.maximum(np.rint(candidates.sum(1) * probability), 1)
    taken = selected.sum(1)
    chosen, size = whole_groups(selected, groups, candidates)
    row_of_group = np.zeros(len(size), np.int64)
    row_of_group[groups[candidates.ravel()]] = np.nonzero(candidates)[0]
    units_per_row = np.bincount(row_of_group[chosen > 0], minlength=len(budget))
    assert ((taken <= budget) | (units_per_row == 1)).all()
    left_out = (chosen == 0) & (size > 0)
    remaining = (budget - taken)[row_of_group]
    assert (size[left_out] > remaining[left_out]).all()


def test_whole_words_are_masked_whole_with_one_decision_per_word():
    batch = make_word_batch(2000, 128, seed=1, pair=True)
    out = corrupt(WholeWordCorruption, batch)
    selected = out["labels"] != IGNORE_INDEX
    candidates = candidates_of(batch)
    words = group_ids(batch["word_starts"])
    chosen, size = whole_groups(selected, words, candidates)
    assert ((chosen == 0) | (chosen == size)).all()  # never a partial word
    assert not (selected & ~candidates).any()
    np.testing.assert_array_equal(out["labels"][selected], batch["input_ids"][selected])
    np.testing.assert_array_equal(out["input_ids"][~selected], batch["input_ids"][~selected])
    assert (size[chosen > 0] > 1).mean() > 0.2  # multi-token words do get masked
    assert_80_10_10_per_unit(batch, out, words)
    assert_budget_filled(selected, candidates, words)
    assert selected.sum() / candidates.sum() == pytest.approx(0.15, abs=0.005)


def test_whole_words_are_chosen_uniformly_over_positions():
    batch = make_word_batch(3000, 64, seed=2, word_start_probability=1.0)  # one-token words
    selected = corrupt(WholeWordCorruption, batch)["labels"] != IGNORE_INDEX
    candidates = candidates_of(batch)
    # the selection rate of positions 1..30 (candidates in every row) is the same everywhere
    counts = selected[:, 1:31].reshape(-1, 10, 3).sum(axis=(0, 2))  # 10 bins of 3 positions
    expected = counts.sum() / 10
    assert ((counts - expected) ** 2 / expected).sum() < CHI2_999[9]
    assert selected.sum() / candidates.sum() == pytest.approx(0.15, abs=0.003)


@pytest.mark.parametrize("max_ngram", [3, 2, 1])
def test_ngram_lengths_follow_inverse_n(max_ngram):
    uniform = np.random.default_rng(max_ngram).random(60_000)
    law = ngram_length_probabilities(max_ngram)
    lengths = sample_lengths(uniform, law)
    # p(n) proportional to 1/n, n = 1..max_ngram
    expected = 1 / np.arange(1, max_ngram + 1)
    expected = expected / expected.sum() * len(uniform)
    counts = np.bincount(lengths, minlength=max_ngram + 1)[1:]
    assert len(counts) == max_ngram
    if max_ngram > 1:
        assert ((counts - expected) ** 2 / expected).sum() < CHI2_999[max_ngram - 1]
    else:
        assert (lengths == 1).all()
    np.testing.assert_allclose(ngram_length_probabilities(3), [6 / 11, 3 / 11, 2 / 11])


def test_ngrams_are_whole_words_within_a_segment_and_fill_the_budget():
    batch = make_word_batch(2000, 128, seed=3, pair=True)
    out = corrupt(NgramCorruption, batch, max_ngram=3)
    selected = out["labels"] != IGNORE_INDEX
    candidates = candidates_of(batch)
    words = group_ids(batch["word_starts"])
    chosen, size = whole_groups(selected, words, candidates)
    assert ((chosen == 0) | (chosen == size)).all()
    # the n-grams, as `select` reports them: a unit = the tokens sharing a unit start
    corruption = NgramCorruption(
        seed=7, vocab_size=VOCAB, mask_token_id=MASK_ID, special_ids=SPECIAL, max_ngram=3
    )
    again, unit_start = corruption.select(batch, candidates, key_hashes(batch["keys"]), 0)
    np.testing.assert_array_equal(again, selected)
    first = selected & (unit_start == np.arange(128))
    assert batch["word_starts"][first].all()  # n-grams start at word starts
    # a unit is one contiguous run of selected tokens (so never across [SEP]) from its start
    units = group_ids(first | ~selected)
    run_start = np.flatnonzero((first | ~selected).ravel()) % 128
    np.testing.assert_array_equal(unit_start[selected], run_start[units[selected.ravel()]])
    unit_words = np.bincount(units[selected.ravel()], weights=batch["word_starts"][selected])
    unit_words = unit_words[np.bincount(units[selected.ravel()]) > 0].astype(int)
    assert unit_words.min() >= 1 and unit_words.max() <= 3
    frequency = np.bincount(unit_words, minlength=4)[1:]
    assert frequency[0] > frequency[1] > frequency[2] > 0  # shorter n-grams more frequent
    assert_80_10_10_per_unit(batch, out, units)
    assert selected.sum() / candidates.sum() == pytest.approx(0.15, abs=0.005)
    budget = np.maximum(np.rint(candidates.sum(1) * 0.15), 1)
    assert ((selected.sum(1) <= budget) | (first.sum(1) == 1)).all()


def test_ernie_masks_annotated_units_whole_and_mixes_phrases_with_words():
    batch = make_word_batch(2000, 128, seed=4, pair=True, annotate=True)
    phrases = batch["phrases"]
    assert (phrases == 1).any() and (phrases == 2).any()
    out = corrupt(ErnieCorruption, batch)
    selected = out["labels"] != IGNORE_INDEX
    candidates = candidates_of(batch)
    # units: an annotated span (first token flagged 1/2, then 3s), else a word
    unit_first = (phrases == 1) | (phrases == 2) | ((phrases == 0) & batch["word_starts"])
    units = group_ids(unit_first | ~candidates)
    chosen, size = whole_groups(selected, units, candidates)
    assert ((chosen == 0) | (chosen == size)).all()
    annotated = np.bincount(units, weights=(phrases != 0).ravel(), minlength=len(size)) > 0
    picked = chosen > 0
    assert (picked & annotated).sum() > 1000 and (picked & ~annotated).sum() > 1000
    # units are drawn in random order, one draw per unit whatever its length: annotated units
    # (2 to 4 words) get a share of the picks close to their share of the units, a little
    # lower as long units are the ones skipped at the budget's edge
    share_picked = (picked & annotated).sum() / picked.sum()
    share_units = (annotated & (size > 0)).sum() / (size > 0).sum()
    assert 0.6 * share_units < share_picked < share_units
    assert_80_10_10_per_unit(batch, out, units)
    assert_budget_filled(selected, candidates, units)
    assert selected.sum() / candidates.sum() == pytest.approx(0.15, abs=0.005)


def test_ernie_without_annotations_is_whole_word_masking():
    batch = make_word_batch(300, 96, seed=5, pair=True)
    assert not batch["phrases"].any()
    ernie, wwm = corrupt(ErnieCorruption, batch), corrupt(WholeWordCorruption, batch)
    np.testing.assert_array_equal(ernie["labels"], wwm["labels"])
    np.testing.assert_array_equal(ernie["input_ids"], wwm["input_ids"])


CORRUPTIONS = [WholeWordCorruption, NgramCorruption, ErnieCorruption, SpanCorruption]


@pytest.mark.parametrize("corruption_class", CORRUPTIONS, ids=lambda c: c.__name__)
def test_masks_depend_only_on_seed_epoch_and_key(corruption_class):
    batch = make_word_batch(64, 64, seed=6, annotate=True)
    out = corrupt(corruption_class, batch, epoch=3)
    # the same rows in another order, another batch, with more padding: the same masks
    order = np.random.default_rng(0).permutation(64)[:40]
    sub = {
        k: (
            [v[i] for i in order]
            if k == "keys"
            else np.pad(v[order], ((0, 0), (0, 16)))
            if v.ndim == 2
            else v[order]
        )
        for k, v in batch.items()
    }
    out_sub = corrupt(corruption_class, sub, epoch=3)
    for name in ("labels", "input_ids"):
        np.testing.assert_array_equal(out_sub[name][:, :64], out[name][order])
    assert (out_sub["labels"][:, 64:] == IGNORE_INDEX).all()
    other = corrupt(corruption_class, batch, epoch=4)
    assert (other["labels"] != out["labels"]).mean() > 0.05  # dynamic: another epoch, other masks


@pytest.mark.parametrize(
    "corruption_class",
    [MaskedLMCorruption, StructBertCorruption, *CORRUPTIONS],
    ids=lambda c: c.__name__,
)
def test_corruption_of_its_collated_fields_only_is_the_same(corruption_class):
    """The stream collates only the arrays a corruption declares it reads (`collated_fields`):
    the corruption of that batch equals the one of the full batch, array for array, less the
    per-token arrays not collated; the MLM family reads words (and ERNIE phrases) only where
    its units are made of them."""
    batch = make_word_batch(48, 64, seed=3, pair=True, annotate=True)
    got = assert_corrupts_like_the_full_batch(
        lambda b: corrupt(corruption_class, b, epoch=2), batch, corruption_class.collated_fields
    )
    assert {"input_ids", "token_type_ids", "attention_mask"} <= set(got)  # the encoder's


def masked_batches(cfg, n_batches: int, epoch: int = 0):
    """The first batches of `epoch` of the real stream of `cfg`, as numpy, each with its
    selected positions and its candidates (non-special, non-padding tokens before corruption)."""
    _, spec, _ = build_stream(cfg)
    for index, batch in enumerate(EpochStream(spec, epoch=epoch)):
        if index == n_batches:
            return
        batch = {k: (v if k == "keys" else v.numpy()) for k, v in batch.items()}
        selected = batch["labels"] != IGNORE_INDEX
        original = np.where(selected, batch["labels"], batch["input_ids"])
        candidates = batch["attention_mask"].astype(bool) & ~np.isin(
            original, spec.vocab.special_ids
        )
        yield batch, selected, candidates


@pytest.mark.parametrize(
    ("objective", "data"),
    [
        ("wwm", "segment_pair"),
        ("ngram", "segment_pair"),
        ("ernie", "segment_pair"),
        ("span", "full_sentences"),
    ],
)
def test_real_corpus_batches_mask_whole_words(prepared_corpus, objective, data):
    cfg = compose_config(
        [
            f"data.shards_dir={prepared_corpus}",
            f"objective={objective}",
            f"data={data}",
            "data.max_seq_length=64",
            "data.batch_size=16",
        ]
    )
    n_selected = n_candidates = multi_piece_masked = 0
    for batch, selected, candidates in masked_batches(cfg, 4):
        words = group_ids(word_start_flags(batch["word_starts"], candidates) | ~candidates)
        chosen, size = whole_groups(selected, words, candidates)
        assert ((chosen == 0) | (chosen == size)).all()
        multi_piece_masked += int((size[chosen > 0] > 1).sum())
        n_selected += selected.sum()
        n_candidates += candidates.sum()
    assert multi_piece_masked > 0  # sub-word pieces exist and are masked together
    assert 0.12 < n_selected / n_candidates <= 0.16


def test_ernie_masks_annotated_phrases_of_a_real_corpus_whole(tmp_path):
    shards = prepare_small_corpus(tmp_path, phrases=PhraseSettings(enabled=True))
    cfg = compose_config([f"data.shards_dir={shards}", "objective=ernie", "data.max_seq_length=64"])
    phrase_tokens = whole_phrases = 0
    for batch, selected, candidates in masked_batches(cfg, 6):
        phrases = batch["phrases"]
        starts = (phrases == 1) | (phrases == 2)
        units = group_ids(starts | (phrases == 0) | ~candidates)  # a span, or a single token
        chosen, size = whole_groups(selected, units, candidates)
        in_span = np.bincount(units, weights=starts.ravel(), minlength=len(size)) > 0
        assert ((chosen[in_span] == 0) | (chosen[in_span] == size[in_span])).all()
        phrase_tokens += int(chosen[in_span].sum())
        whole_phrases += int(((chosen == size) & in_span & (size > 1)).sum())
    assert whole_phrases > 5 and phrase_tokens > 10
