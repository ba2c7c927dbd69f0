"""Statistics and invariants of BART's noise functions and MASS's fragment (data/noise.py),
the sentence starts the packed formats now carry, and determinism by (seed, epoch, key)."""

import math

import numpy as np
import pytest
from test_formats import VOCAB, make_documents

from pretrain.data.formats import make_segment_pairs, pack_sentences
from pretrain.data.noise import (
    NoiseSettings,
    apply_noise,
    delete_tokens,
    infill_text,
    mask_tokens,
    mass_fragment,
    permute_sentences,
    poisson_span_lengths,
    rotate_document,
)
from pretrain.data.reading import collate
from pretrain.objectives.denoising import DenoisingCorruption
from pretrain.objectives.mass import MassCorruption

MASK = VOCAB.mask
# chi-square critical values at p = 0.001 by degrees of freedom (no scipy in the project)
CHI2_999 = {4: 18.47, 9: 27.88, 19: 43.82}


def sequence(body_length: int) -> np.ndarray:
    """[CLS] 100 101 ... [SEP]: body tokens unique, so each tells where it came from."""
    return np.concatenate([[VOCAB.cls], 100 + np.arange(body_length), [VOCAB.sep]])


def chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def test_poisson_span_lengths_follow_poisson_3_and_cover_the_budget():
    rng = np.random.default_rng(0)
    inner = []
    for budget in (1, 7, 30):
        assert poisson_span_lengths(budget, 3.0, rng).sum() == budget
    # a large budget, so that stopping at the budget (which favours a long last span and
    # shortens the ones before it by O(1/spans)) does not bias the sample
    for _ in range(20):
        lengths = poisson_span_lengths(3000, 3.0, rng)
        assert lengths.sum() == 3000 and (lengths >= 0).all()
        inner.append(lengths[:-1])  # the last one is cut to fit the budget
    inner = np.concatenate(inner)
    assert abs(inner.mean() - 3.0) < 0.08 and abs(inner.var() - 3.0) < 0.2
    counts = np.bincount(np.minimum(inner, 9), minlength=10)
    pmf = np.array([math.exp(-3) * 3**k / math.factorial(k) for k in range(9)])
    expected = len(inner) * np.append(pmf, 1 - pmf.sum())  # 0..8, then 9 or more
    assert chi_square(counts, expected) < CHI2_999[9]


def test_text_infilling_masks_30_percent_in_spans_each_one_mask():
    rng = np.random.default_rng(1)
    insertions = 0
    for _ in range(300):
        ids = sequence(100)
        out, lengths = infill_text(ids, 0.3, MASK, rng, poisson_lambda=3.0)
        assert out[0] == VOCAB.cls and out[-1] == VOCAB.sep
        body = out[1:-1]
        kept = body[body != MASK]
        assert (np.diff(kept) > 0).all()  # survivors in their original order
        assert len(kept) == 70  # exactly 30% of the body removed
        assert (body == MASK).sum() == len(lengths)  # one [MASK] per span, zero-length too
        # walk the output: each [MASK] stands for the original tokens skipped before the next
        # survivor; a [MASK] between two originally adjacent tokens is an insertion
        previous = 99
        for i, token in enumerate(body):
            if token == MASK:
                nxt = body[i + 1 :][body[i + 1 :] != MASK]
                following = nxt[0] if len(nxt) else 200
                insertions += following - previous == 1
            else:
                previous = token
    assert insertions > 0  # zero-length spans occur (P(0) = e^-3 ~ 5% of spans)


def test_token_masking_and_deletion_take_exact_shares_in_order():
    rng = np.random.default_rng(2)
    ids = sequence(50)
    masked = mask_tokens(ids, 0.2, MASK, rng)
    assert (masked == MASK).sum() == 10 and len(masked) == len(ids)
    np.testing.assert_array_equal(masked[masked != MASK], ids[masked != MASK])
    deleted = delete_tokens(ids, 0.2, rng)
    assert len(deleted) == 42 and deleted[0] == VOCAB.cls and deleted[-1] == VOCAB.sep
    assert (np.diff(deleted[1:-1]) > 0).all()


def sentence_sequence(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    ids = sequence(sum(lengths))
    starts = np.zeros(len(ids), bool)
    starts[1 + np.cumsum([0, *lengths[:-1]])] = True
    return ids, starts


def test_sentence_permutation_keeps_tokens_and_sentences_and_is_uniform():
    lengths = [3, 5, 2, 4, 6]
    ids, starts = sentence_sequence(lengths)
    sentences = np.split(ids[1:-1], np.cumsum(lengths)[:-1])
    firsts = np.zeros(5)
    rng = np.random.default_rng(3)
    for _ in range(1000):
        out = permute_sentences(ids, starts, 1.0, rng)
        assert sorted(out.tolist()) == sorted(ids.tolist())  # same multiset
        assert out[0] == VOCAB.cls and out[-1] == VOCAB.sep
        first = next(i for i, s in enumerate(sentences) if s[0] == out[1])
        np.testing.assert_array_equal(out[1 : 1 + lengths[first]], sentences[first])
        firsts[first] += 1
    assert chi_square(firsts, np.full(5, 200.0)) < CHI2_999[4]


def test_partial_sentence_permutation_moves_only_its_share():
    ids, starts = sentence_sequence([2] * 10)
    rng = np.random.default_rng(4)
    for _ in range(50):
        out = permute_sentences(ids, starts, 0.3, rng)
        moved = (out[1:-1:2] != ids[1:-1:2]).sum()  # sentences not in their own place
        assert moved <= 3


def test_document_rotation_keeps_tokens_and_starts_uniformly():
    ids = sequence(20)
    rng = np.random.default_rng(5)
    offsets = np.zeros(20)
    for _ in range(2000):
        out = rotate_document(ids, rng)
        assert sorted(out.tolist()) == sorted(ids.tolist())
        offset = out[1] - 100
        np.testing.assert_array_equal(out[1:-1], np.roll(ids[1:-1], -offset))
        offsets[offset] += 1
    assert chi_square(offsets, np.full(20, 100.0)) < CHI2_999[19]


def test_all_noise_composed_keeps_the_ends_and_respects_the_budgets():
    settings = NoiseSettings(
        token_masking=0.1,
        token_deletion=0.1,
        text_infilling=0.3,
        sentence_permutation=1.0,
        document_rotation=1.0,
    )
    ids, starts = sentence_sequence([10] * 10)
    out = apply_noise(ids, starts, settings, MASK, np.random.default_rng(6))
    assert out[0] == VOCAB.cls and out[-1] == VOCAB.sep
    survivors = out[1:-1][out[1:-1] != MASK]
    assert len(set(survivors.tolist())) == len(survivors)
    assert set(survivors.tolist()) <= set(ids[1:-1].tolist())
    # 100 tokens: 10 masked, 9 of the other 90 deleted, 30% of the 91 left infilled
    assert len(survivors) <= 100 - 10 - 9 - round(0.3 * 91) + 10


def test_mass_fragment_is_contiguous_half_and_decoder_is_shifted():
    rng = np.random.default_rng(7)
    starts = []
    for _ in range(500):
        ids = sequence(41)
        encoder, decoder, fragment = mass_fragment(ids, 0.5, MASK, rng)
        where = np.flatnonzero(fragment)
        assert len(where) == round(0.5 * 41) and (np.diff(where) == 1).all()
        assert 1 <= where[0] and where[-1] <= 41  # inside the body
        np.testing.assert_array_equal(encoder == MASK, fragment)
        np.testing.assert_array_equal(encoder[~fragment], ids[~fragment])
        assert decoder[where[0]] == MASK  # the fragment starts from [MASK]
        np.testing.assert_array_equal(decoder[where[1:]], ids[where[:-1]])  # shifted right
        assert (decoder[~fragment] == MASK).all()
        starts.append(where[0])
    # start uniform over the 41 - 20 + 1 = 22 possible positions: mean 1 + 21/2
    assert abs(np.mean(starts) - 11.5) < 0.7


def test_packed_sequences_flag_sentence_starts():
    docs = make_documents(10, max_len=20)
    doc_starts = set()
    for d in docs:
        doc_starts |= {int(d["ids"][0])} | {int(d["ids"][s]) for s in d["sents"][:-1]}
    for s in pack_sentences(docs, 64, VOCAB, cross_documents=True):
        ids, flags = s["input_ids"], s["sentence_starts"]
        assert len(flags) == len(ids) and not flags[0] and not flags[-1]
        assert flags[1]
        for token, flag in zip(ids[1:-1], flags[1:-1], strict=True):
            if token == VOCAB.sep:
                assert flag  # the document separator is a unit of its own
            else:
                assert flag == (int(token) in doc_starts)
    pair = next(make_segment_pairs(docs, 64, VOCAB, seed=0, epoch=0))
    b_start = int(np.flatnonzero(pair["input_ids"] == VOCAB.sep)[0]) + 1
    assert np.flatnonzero(pair["sentence_starts"]).tolist() == [1, b_start]


def collated(seed: int = 0) -> dict:
    docs = make_documents(12, seed=seed, max_len=20)
    return collate(list(pack_sentences(docs, 64, VOCAB, cross_documents=True))[:6], VOCAB.pad)


@pytest.mark.parametrize("kind", ["bart", "mass"])
def test_corruption_is_keyed_by_seed_epoch_and_sample(kind):
    if kind == "bart":
        corruption = DenoisingCorruption(
            seed=1, pad_id=0, mask_id=MASK, start_id=VOCAB.sep, max_length=64
        )
    else:
        corruption = MassCorruption(seed=1, pad_id=0, mask_id=MASK, vocab_size=VOCAB.size)
    a = corruption(collated(), epoch=0)
    b = corruption(collated(), epoch=0)
    for key in ("input_ids", "decoder_input_ids", "labels"):
        np.testing.assert_array_equal(a[key], b[key])
        assert a[key].shape[1] % 8 == 0
    assert not np.array_equal(a["input_ids"], corruption(collated(), epoch=1)["input_ids"])
    # a row's noise depends on its key, not on its batch: the last row alone is the same
    full = collated()
    single = {k: (v[-1:] if k != "keys" else v[-1:]) for k, v in full.items()}
    alone = corruption(single, epoch=0)
    n = int(alone["attention_mask"][0].sum())
    np.testing.assert_array_equal(alone["input_ids"][0, :n], a["input_ids"][-1, :n])


def test_denoising_batch_targets_are_the_original_shifted():
    batch = collated()
    original = batch["input_ids"].copy()
    out = DenoisingCorruption(seed=0, pad_id=0, mask_id=MASK, start_id=VOCAB.sep, max_length=64)(
        batch, epoch=0
    )
    for row in range(len(original)):
        n = int((original[row] != 0).sum())
        np.testing.assert_array_equal(out["labels"][row, :n], original[row, :n])
        assert (out["labels"][row, n:] == -100).all()
        assert out["decoder_input_ids"][row, 0] == VOCAB.sep
        np.testing.assert_array_equal(out["decoder_input_ids"][row, 1:n], original[row, : n - 1])
        assert out["decoder_attention_mask"][row].sum() == n
        encoder = out["input_ids"][row, : out["attention_mask"][row].sum()]
        assert (encoder == MASK).any() and len(encoder) < n  # infilling shortened it
