"""Statistics and invariants of BART's noise functions and MASS's draws (data/noise.py), the
sentence starts the packed formats carry, and keying: a row's noise is a function of (seed,
epoch, its key) only, whatever else is in its batch. Statistics are measured over many keys
at once (each row of a batch is an independent draw)."""

import math

import numpy as np
import pytest
from conftest import assert_corrupts_like_the_full_batch
from test_formats import VOCAB, make_documents

from pretrain.data.formats import make_segment_pairs, pack_sentences
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.noise import (
    NoiseSettings,
    RowDraws,
    apply_noise,
    delete_tokens,
    infill_text,
    mask_tokens,
    permute_sentences,
    poisson_lengths,
    rotate_document,
    smallest,
)
from pretrain.data.reading import COLLATED, collate
from pretrain.objectives.denoising import DenoisingCorruption
from pretrain.objectives.mass import MassCorruption

MASK = VOCAB.mask
# chi-square critical values at p = 0.001 by degrees of freedom (no scipy in the project)
CHI2_999 = {2: 13.82, 4: 18.47, 9: 27.88, 19: 43.82, 21: 46.80}


def sequences(rows: int, body_length: int) -> tuple[np.ndarray, np.ndarray]:
    """`rows` copies of [CLS] 100 101 ... [SEP] (body tokens unique, so each tells where it
    came from) and their lengths."""
    ids = np.concatenate([[VOCAB.cls], 100 + np.arange(body_length), [VOCAB.sep]])
    return np.tile(ids, (rows, 1)), np.full(rows, body_length + 2)


def draws_for(rows: int, seed: int = 0, epoch: int = 0) -> RowDraws:
    return RowDraws(seed, epoch, key_hashes([f"doc_{i}" for i in range(rows)]))


def chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def poisson_pmf(lam: float, last: int) -> np.ndarray:
    """P(X = 0), ..., P(X = last - 1), P(X >= last)."""
    pmf = np.array([math.exp(-lam) * lam**k / math.factorial(k) for k in range(last)])
    return np.append(pmf, 1 - pmf.sum())


@pytest.mark.parametrize("lam", [3.0, 0.5])
def test_poisson_lengths_by_inverse_cdf_follow_poisson(lam):
    u = draws_for(400).uniform(64, 500)  # 200,000 keyed uniforms
    lengths = poisson_lengths(u, lam).ravel()
    assert abs(lengths.mean() - lam) < 0.02 and abs(lengths.var() - lam) < 0.05
    counts = np.bincount(np.minimum(lengths, 9), minlength=10)
    assert chi_square(counts, len(lengths) * poisson_pmf(lam, 9)) < CHI2_999[9]


def test_smallest_takes_a_uniform_subset():
    u = np.where(np.arange(12) < 10, draws_for(4000).uniform(1, 12), 2.0)
    chosen = smallest(u, np.full(4000, 3))
    assert (chosen.sum(axis=1) == 3).all() and not chosen[:, 10:].any()
    assert chi_square(chosen.sum(axis=0)[:10], np.full(10, 1200.0)) < CHI2_999[9]


def hidden_by_runs(row: np.ndarray, body_length: int) -> tuple[np.ndarray, np.ndarray]:
    """A noised [CLS] 100 101 ... [SEP] row read back: for each run of adjacent [MASK]s, (its
    number of [MASK]s, the original tokens it hides: those skipped between the survivors
    around it)."""
    body = row[1:-1]
    is_mask = body == MASK
    index = np.where(is_mask, -1, body - 100)  # original position of a survivor
    before = np.maximum.accumulate(index)  # the last survivor so far (-1: none)
    after = np.minimum.accumulate(np.where(is_mask, body_length, index)[::-1])[::-1]
    starts = np.flatnonzero(is_mask & ~np.r_[False, is_mask[:-1]])
    ends = np.flatnonzero(is_mask & ~np.r_[is_mask[1:], False])
    return ends - starts + 1, after[starts] - before[starts] - 1


def test_text_infilling_masks_30_percent_in_spans_each_one_mask():
    ids, lengths = sequences(300, 100)
    out, out_lengths, span_lengths = infill_text(ids, lengths, 0.3, MASK, draws_for(300))
    insertions = 0
    for row, n, spans in zip(out, out_lengths, span_lengths, strict=True):
        row = row[:n]
        assert row[0] == VOCAB.cls and row[-1] == VOCAB.sep
        body = row[1:-1]
        kept = body[body != MASK]
        assert (np.diff(kept) > 0).all()  # survivors in their original order
        assert len(kept) == 70  # exactly 30% of the body removed
        count = int((body == MASK).sum())  # one [MASK] per span, zero-length too
        assert spans[:count].sum() == 30 and (spans[:count] >= 0).all()
        runs, hidden = hidden_by_runs(row, 100)
        insertions += int((hidden == 0).sum())  # a [MASK] between adjacent originals
    assert insertions > 0  # zero-length spans occur (P(0) = e^-3 ~ 5% of spans)


def test_infilled_span_lengths_are_poisson_3_and_placed_uniformly():
    """Long bodies (budget 3,000), so that stopping at the budget (which favours a long last
    span) does not bias the spans before the last; the spans read back from the output are
    the drawn ones, and a span is as likely at the start of the body as at its end."""
    ids, lengths = sequences(8, 10_000)
    out, out_lengths, span_lengths = infill_text(ids, lengths, 0.3, MASK, draws_for(8))
    inner, where = [], []
    for row, n, drawn in zip(out, out_lengths, span_lengths, strict=True):
        runs, hidden = hidden_by_runs(row[:n], 10_000)
        spans = int(runs.sum())
        assert hidden.sum() == 3000 and drawn[:spans].sum() == 3000
        ends = np.cumsum(runs)  # the drawn spans, in order, are what each run hides
        np.testing.assert_array_equal(np.diff(np.r_[0, np.cumsum(drawn[:spans])[ends - 1]]), hidden)
        inner.append(drawn[: spans - 1])  # the last one is cut to fit the budget
        masks = np.flatnonzero(row[1 : n - 1] == MASK)
        where.append((masks * 10) // (n - 2))  # decile of the output
    inner = np.concatenate(inner)
    assert abs(inner.mean() - 3.0) < 0.08 and abs(inner.var() - 3.0) < 0.2
    counts = np.bincount(np.minimum(inner, 9), minlength=10)
    assert chi_square(counts, len(inner) * poisson_pmf(3.0, 9)) < CHI2_999[9]
    deciles = np.bincount(np.concatenate(where), minlength=10)
    assert chi_square(deciles, np.full(10, deciles.sum() / 10)) < CHI2_999[9]


def test_token_masking_and_deletion_take_exact_shares_in_order():
    ids, lengths = sequences(200, 50)
    masked, same = mask_tokens(ids, lengths, 0.2, MASK, draws_for(200))
    assert (same == lengths).all() and ((masked == MASK).sum(axis=1) == 10).all()
    np.testing.assert_array_equal(masked[masked != MASK], ids[masked != MASK])
    where = (masked[:, 1:-1] == MASK).sum(axis=0)  # each body token masked alike
    assert chi_square(where, np.full(50, where.mean())) < 2 * CHI2_999[19]
    deleted, shorter = delete_tokens(ids, lengths, 0.2, draws_for(200))
    assert (shorter == 42).all()
    assert (deleted[:, 0] == VOCAB.cls).all() and (deleted[:, 41] == VOCAB.sep).all()
    assert (np.diff(deleted[:, 1:41], axis=1) > 0).all()


def sentence_rows(rows: int, lengths: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids, n = sequences(rows, sum(lengths))
    starts = np.zeros(ids.shape, bool)
    starts[:, 1 + np.cumsum([0, *lengths[:-1]])] = True
    return ids, n, starts


def test_sentence_permutation_keeps_tokens_and_sentences_and_is_uniform():
    lengths = [3, 5, 2, 4, 6]
    ids, n, starts = sentence_rows(1000, lengths)
    sentences = np.split(ids[0, 1:-1], np.cumsum(lengths)[:-1])
    out, same = permute_sentences(ids, n, starts, 1.0, draws_for(1000))
    assert (same == n).all()
    firsts, pairs = np.zeros(5), np.zeros((5, 5))
    for row in out:
        assert sorted(row.tolist()) == sorted(ids[0].tolist())  # same multiset
        assert row[0] == VOCAB.cls and row[-1] == VOCAB.sep
        order = []
        position = 1
        while position < len(row) - 1:  # each sentence whole, one after another
            s = next(i for i, s in enumerate(sentences) if s[0] == row[position])
            np.testing.assert_array_equal(row[position : position + lengths[s]], sentences[s])
            order.append(s)
            position += lengths[s]
        firsts[order[0]] += 1
        pairs[order[0], order[1]] += 1
    assert chi_square(firsts, np.full(5, 200.0)) < CHI2_999[4]
    second = pairs[~np.eye(5, dtype=bool)]  # the second sentence uniform given the first
    assert chi_square(second, np.full(20, 50.0)) < CHI2_999[19]


def test_partial_sentence_permutation_moves_only_its_share():
    ids, n, starts = sentence_rows(500, [2] * 10)
    out, _ = permute_sentences(ids, n, starts, 0.3, draws_for(500))
    moved = (out[:, 1:-1:2] != ids[:, 1:-1:2]).sum(axis=1)  # sentences out of their place
    assert (moved <= 3).all() and (moved > 0).mean() > 0.6  # 3 chosen: 5/6 move some
    assert (
        chi_square((out[:, 1:-1:2] != ids[:, 1:-1:2]).sum(axis=0), np.full(10, moved.sum() / 10))
        < CHI2_999[9]
    )


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_sentence_permutation_of_padded_rows_equals_each_row_alone(fraction):
    """Ragged rows (one without a body) with sentence marks outside their bodies ([CLS], the
    final token, padding): each row is permuted as it is alone, unpadded and unmarked there;
    what is outside the body stays."""
    rng = np.random.default_rng(0)
    lengths = np.array([40, 2, 3, 17, 33, 40, 9])
    ids = np.full((len(lengths), 40), VOCAB.pad)
    starts = rng.random(ids.shape) < 0.2
    for row, length in enumerate(lengths):
        ids[row, :length] = [VOCAB.cls, *rng.integers(100, 200, length - 2), VOCAB.sep]
    draws = draws_for(len(lengths))
    out, same = permute_sentences(ids, lengths, starts, fraction, draws)
    assert (same == lengths).all()
    for row, length in enumerate(lengths):
        alone_starts = starts[row : row + 1, :length].copy()
        alone_starts[0, [0, length - 1]] = False
        alone, _ = permute_sentences(
            ids[row : row + 1, :length],
            lengths[row : row + 1],
            alone_starts,
            fraction,
            RowDraws(0, 0, draws.hashes[row : row + 1]),
        )
        np.testing.assert_array_equal(out[row, :length], alone[0])
        np.testing.assert_array_equal(out[row, length:], VOCAB.pad)
    assert (out[:, 1:-1] != ids[:, 1:-1]).any()  # something moved


def test_document_rotation_keeps_tokens_and_starts_uniformly():
    ids, n = sequences(2000, 20)
    out, _ = rotate_document(ids, n, 1.0, draws_for(2000))
    offsets = out[:, 1] - 100
    for row, offset in zip(out, offsets, strict=True):
        np.testing.assert_array_equal(row[1:-1], np.roll(ids[0, 1:-1], -offset))
    assert chi_square(np.bincount(offsets, minlength=20), np.full(20, 100.0)) < CHI2_999[19]
    half, _ = rotate_document(ids, n, 0.5, draws_for(2000))
    assert abs((half[:, 1] != 100).mean() - 0.5 * 19 / 20) < 0.05


def test_all_noise_composed_keeps_the_ends_and_respects_the_budgets():
    settings = NoiseSettings(
        token_masking=0.1,
        token_deletion=0.1,
        text_infilling=0.3,
        sentence_permutation=1.0,
        document_rotation=1.0,
    )
    ids, n, starts = sentence_rows(50, [10] * 10)
    out, out_lengths = apply_noise(ids, n, starts, settings, MASK, draws_for(50))
    for row, length in zip(out, out_lengths, strict=True):
        row = row[:length]
        assert row[0] == VOCAB.cls and row[-1] == VOCAB.sep
        survivors = row[1:-1][row[1:-1] != MASK]
        assert len(set(survivors.tolist())) == len(survivors)
        assert set(survivors.tolist()) <= set(ids[0, 1:-1].tolist())
        # 100 tokens: 10 deleted, 30% of the 90 left infilled, 10 of the first 100 masked
        assert len(survivors) <= 100 - 10 - round(0.3 * 90)


def random_batch(rng: np.random.Generator, rows: int, width: int):
    lengths = rng.integers(2, width + 1, rows)
    ids = np.zeros((rows, width), np.int64)
    starts = np.zeros((rows, width), bool)
    for row, n in enumerate(lengths):
        ids[row, :n] = np.r_[VOCAB.cls, rng.integers(5, 9000, n - 2), VOCAB.sep]
        starts[row, 1 : n - 1] = rng.random(n - 2) < 0.15
    return ids, lengths, starts, [f"key_{rng.integers(1 << 40)}" for _ in range(rows)]


@pytest.mark.parametrize(
    "settings",
    [
        NoiseSettings(),
        NoiseSettings(0.1, 0.1, 0.3, 3.0, 0.5, 0.5),
        NoiseSettings(text_infilling=0.9, poisson_lambda=0.5, sentence_permutation=0.3),
    ],
)
def test_a_rows_noise_does_not_depend_on_the_rest_of_its_batch(settings):
    """Each row noised alone, in its batch and in another batch (other rows, another order,
    another width) is the same."""
    rng = np.random.default_rng(9)
    ids, lengths, starts, keys = random_batch(rng, 24, 64)
    out, out_lengths = apply_noise(
        ids, lengths, starts, settings, MASK, RowDraws(3, 1, key_hashes(keys))
    )
    other_ids, other_lengths, other_starts, other_keys = random_batch(rng, 24, 128)
    for row in range(24):
        n = lengths[row]
        alone, alone_length = apply_noise(
            ids[row : row + 1, :n], lengths[row : row + 1], starts[row : row + 1, :n],
            settings, MASK, RowDraws(3, 1, key_hashes(keys[row : row + 1])),
        )  # fmt: skip
        assert alone_length[0] == out_lengths[row]
        np.testing.assert_array_equal(alone[0, : alone_length[0]], out[row, : out_lengths[row]])
        mixed_ids, mixed_starts = other_ids.copy(), other_starts.copy()
        mixed_ids[5], mixed_starts[5] = 0, False
        mixed_ids[5, :n], mixed_starts[5, :n] = ids[row, :n], starts[row, :n]
        mixed_lengths = other_lengths.copy()
        mixed_lengths[5] = n
        mixed_keys = [*other_keys[:5], keys[row], *other_keys[6:]]
        mixed, mixed_out_lengths = apply_noise(
            mixed_ids,
            mixed_lengths,
            mixed_starts,
            settings,
            MASK,
            RowDraws(3, 1, key_hashes(mixed_keys)),
        )
        assert mixed_out_lengths[5] == out_lengths[row]
        np.testing.assert_array_equal(mixed[5, : out_lengths[row]], out[row, : out_lengths[row]])


def test_mass_fragment_is_contiguous_half_with_80_10_10_and_shifted_decoder():
    rows, body = 2000, 41
    ids, n = sequences(rows, body)
    batch = {
        "input_ids": np.pad(ids, ((0, 0), (0, 5))),
        "attention_mask": np.pad(np.ones_like(ids), ((0, 0), (0, 5))),
        "next_sentence_label": np.full(rows, -100),
        "keys": [f"doc_{i}" for i in range(rows)],
    }
    out = MassCorruption(seed=0, pad_id=0, mask_id=MASK, vocab_size=VOCAB.size)(batch, epoch=0)
    starts, kinds = [], np.zeros(3)
    for row in range(rows):
        where = out["prediction_positions"][row][out["prediction_positions"][row] >= 0]
        assert len(where) == round(0.5 * body) and (np.diff(where) == 1).all()
        assert 1 <= where[0] and where[-1] <= body  # inside the body
        fragment = np.zeros(out["input_ids"].shape[1], bool)
        fragment[where] = True
        encoder, decoder = out["input_ids"][row], out["decoder_input_ids"][row]
        np.testing.assert_array_equal(
            encoder[: n[row]][~fragment[: n[row]]], ids[row][~fragment[: n[row]]]
        )
        np.testing.assert_array_equal(out["labels"][row][where], ids[row][where])
        assert decoder[where[0]] == MASK  # the fragment starts from [MASK]
        np.testing.assert_array_equal(decoder[where[1:]], ids[row][where[:-1]])  # shifted right
        assert (decoder[: n[row]][~fragment[: n[row]]] == MASK).all()
        kinds += [(encoder[where] == MASK).sum(), (encoder[where] == ids[row][where]).sum(), 0]
        kinds[2] += (
            len(where) - (encoder[where] == MASK).sum() - (encoder[where] == ids[row][where]).sum()
        )
        starts.append(where[0])
    # start uniform over the 41 - 20 + 1 = 22 possible positions; [MASK] 80%, unchanged 10%
    # (plus the random ids that happen to equal the token: ~0), random 10%
    assert chi_square(np.bincount(starts, minlength=23)[1:], np.full(22, rows / 22)) < CHI2_999[21]
    assert chi_square(kinds, kinds.sum() * np.array([0.8, 0.1, 0.1])) < CHI2_999[2]


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


def seq2seq_corruption(kind: str) -> DenoisingCorruption | MassCorruption:
    """BART's ("bart") or MASS's ("mass") corruption, seed 1, for batches of up to 64 tokens."""
    if kind == "bart":
        return DenoisingCorruption(
            seed=1, pad_id=0, mask_id=MASK, start_id=VOCAB.sep, max_length=64
        )
    return MassCorruption(seed=1, pad_id=0, mask_id=MASK, vocab_size=VOCAB.size)


@pytest.mark.parametrize("kind", ["bart", "mass"])
def test_corruption_is_keyed_by_seed_epoch_and_sample(kind):
    corruption = seq2seq_corruption(kind)
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


@pytest.mark.parametrize("kind", ["bart", "mass"])
def test_corruption_of_its_collated_fields_only_is_the_same(kind):
    """collate builds only the declared `collated_fields`, each as it builds it among all;
    the corruption of that batch equals the one of the full batch, array for array."""
    corruption = seq2seq_corruption(kind)
    sequences = list(
        pack_sentences(make_documents(12, max_len=20), 64, VOCAB, cross_documents=True)
    )[:6]
    full = collate(sequences, VOCAB.pad, 64)
    few = collate(sequences, VOCAB.pad, 64, fields=corruption.collated_fields)
    per_token = {name for name, _ in COLLATED}
    assert set(few) == set(full) - per_token | set(corruption.collated_fields)
    for name in corruption.collated_fields:
        assert few[name].dtype == full[name].dtype
        np.testing.assert_array_equal(few[name], full[name])
    assert_corrupts_like_the_full_batch(
        lambda b: corruption(b, epoch=3), full, corruption.collated_fields
    )
