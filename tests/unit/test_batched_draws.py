"""The stream's batched code equals a straightforward per-row reference, draw for draw (issue
14 item 5: the same masks, keyed as before). Each test runs the new code and the per-row
reference it replaced (kept here) on random inputs and asserts equal outputs."""

import numpy as np
import pytest

from pretrain.data import formats
from pretrain.data.keyed_rng import (
    _seed_words,
    keyed_generator,
    keyed_generators,
)
from pretrain.data.masking import (
    IGNORE_INDEX,
    batch_units,
    mask_budget,
    phrase_unit_flags,
    select_whole_units,
    stable_row_order,
    unit_start_index,
    word_start_flags,
)
from pretrain.data.permutation import Permutation, perm_mask_from
from pretrain.data.span_masking import batch_words
from pretrain.data.vocab import Vocabulary

VOCAB = Vocabulary(size=9000, pad=0, unk=1, cls=2, sep=3, mask=4)


def assert_same(a, b) -> None:
    """Equal values, dtypes and (for dicts) keys in the same order."""
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, (tuple, list)) and a and isinstance(a[0], np.ndarray):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b and type(a) is type(b)


# ---------------------------------------------------------------- keyed generators


def test_seed_words_equal_numpys_seed_sequence():
    rng = np.random.default_rng(0)
    for prefix in ([1234, 3, 21], [0, 0, 0], [2**40 + 3, 7, 11], [5, 2**33, 0], [2**64 - 1] * 3):
        widths = rng.choice([0, 1, 20, 32, 33, 63, 64], size=200)
        hashes = [int(rng.integers(0, 2**63)) >> (64 - int(w)) if w else 0 for w in widths]
        hashes += [0, 1, 2**32 - 1, 2**32, 2**64 - 1]
        got = _seed_words(prefix, np.array(hashes, np.uint64))
        want = [np.random.SeedSequence([*prefix, h]).generate_state(4, np.uint64) for h in hashes]
        np.testing.assert_array_equal(got, np.stack(want))


def test_keyed_generators_draw_what_default_rng_draws():
    keys = [f"doc_{i:05d}:{i % 9}" for i in range(150)] + ["", "x", "doc_1:0/backward"]
    for seed, epoch, stream in ((1234, 0, 3), (0, 7, 21), (2**35, 2, 30)):
        generators = keyed_generators(seed, epoch, stream, keys)
        for key, rng in zip(keys, generators, strict=True):
            reference = keyed_generator(seed, epoch, stream, key)
            np.testing.assert_array_equal(rng.random(5), reference.random(5))
            np.testing.assert_array_equal(rng.permutation(17), reference.permutation(17))
            assert rng.poisson(3.0) == reference.poisson(3.0)
    assert keyed_generators(1, 0, 3, []) == []


# ---------------------------------------------------------------- formats


def _reference_pieces(document: dict, max_tokens: int) -> list[tuple]:
    phrases = document.get("phrases")
    pieces = []
    starts = np.concatenate(([0], document["sents"][:-1]))
    for start, end in zip(starts.tolist(), document["sents"].tolist(), strict=True):
        for cut in range(start, end, max_tokens):
            stop = min(cut + max_tokens, end)
            pieces.append(
                (
                    document["ids"][cut:stop],
                    document["words"][cut:stop],
                    np.zeros(stop - cut, np.uint8) if phrases is None else phrases[cut:stop],
                )
            )
    return pieces


def _concat(pieces: list[tuple]) -> tuple:
    return tuple(np.concatenate([p[i] for p in pieces]) for i in range(3))


def _reference_sequence(key, segments, vocab, label=IGNORE_INDEX, sentence_lengths=None):
    ids, types = [np.array([vocab.cls])], [np.zeros(1, np.int64)]
    words, phrases = [np.ones(1, bool)], [np.zeros(1, np.uint8)]
    for segment_id, (seg_ids, seg_words, seg_phrases) in enumerate(segments):
        ids += [seg_ids.astype(np.int64), np.array([vocab.sep])]
        types.append(np.full(len(seg_ids) + 1, segment_id, np.int64))
        words += [seg_words.astype(bool), np.ones(1, bool)]
        phrases += [seg_phrases.astype(np.uint8), np.zeros(1, np.uint8)]
    starts = np.zeros(1 + sum(len(s[0]) + 1 for s in segments), bool)
    offsets = np.cumsum([1] + [len(s[0]) + 1 for s in segments[:-1]])
    starts[offsets] = [len(s[0]) > 0 for s in segments]
    if sentence_lengths is not None and len(segments) == 1:
        within = np.cumsum([0, *sentence_lengths[:-1]])
        starts[1 + within[np.asarray(sentence_lengths) > 0]] = True
    return {
        "key": key,
        "input_ids": np.concatenate(ids),
        "token_type_ids": np.concatenate(types),
        "word_starts": np.concatenate(words),
        "phrases": np.concatenate(phrases),
        "next_sentence_label": label,
        "sentence_starts": starts,
    }


def reference_pack_sentences(documents, max_seq_length, vocab, *, cross_documents):
    budget = max_seq_length - 2
    separator = (np.array([vocab.sep]), np.ones(1, bool), np.zeros(1, np.uint8))

    def packed(key, pieces):
        if pieces[-1] is separator:
            pieces = pieces[:-1]
        lengths = [len(p[0]) for p in pieces]
        return _reference_sequence(key, [_concat(pieces)], vocab, sentence_lengths=lengths)

    pieces, used, key = [], 0, ""
    for document in documents:
        for index, piece in enumerate(_reference_pieces(document, budget)):
            if pieces and used + len(piece[0]) > budget:
                yield packed(key, pieces)
                pieces, used = [], 0
            if not pieces:
                key = f"{document['key']}:{index}"
            pieces.append(piece)
            used += len(piece[0])
        if not cross_documents and pieces:
            yield packed(key, pieces)
            pieces, used = [], 0
        elif pieces and used + 1 <= budget:
            pieces.append(separator)
            used += 1
    if pieces:
        yield packed(key, pieces)


def reference_segment_pairs(
    documents, max_seq_length, vocab, *, seed, epoch, pair_task, single_sentences,
    short_seq_probability, random_probability, pool_size,
):  # fmt: skip
    max_tokens = max_seq_length - 3

    def random_segment(pool, rng, min_tokens):
        other = pool[int(rng.integers(len(pool)))][1]
        start = int(rng.integers(len(other)))
        lengths = np.cumsum([len(p[0]) for p in other[start:]])
        stop = start + int(np.searchsorted(lengths, max(min_tokens, 1))) + 1
        return _concat(other[start:stop])

    def labelled_pair(chunk, target, pool, rng):
        if len(chunk) >= 2:
            a_end = int(rng.integers(1, len(chunk)))
            a, b = _concat(chunk[:a_end]), _concat(chunk[a_end:])
        elif len(chunk[0][0]) >= 2:
            a_end = 1
            cut = int(rng.integers(1, len(chunk[0][0])))
            a, b = tuple(x[:cut] for x in chunk[0]), tuple(x[cut:] for x in chunk[0])
        else:
            return None, 0
        b_tokens = 1 if target is None else target - len(a[0])
        draw = rng.random()
        if pair_task == "sop":
            return ((b, a, 1) if draw < 0.5 else (a, b, 0)), 0
        if pair_task == "three_way":
            if draw < 1 / 3:
                return (a, b, 0), 0
            if draw < 2 / 3:
                return (b, a, 1), 0
            if pool:
                return (a, random_segment(pool, rng, b_tokens), 2), len(chunk) - a_end
            return (a, b, 0), 0
        if pair_task == "nsp" and pool and draw < random_probability:
            return (a, random_segment(pool, rng, b_tokens), 1), len(chunk) - a_end
        return (a, b, 0 if pair_task == "nsp" else IGNORE_INDEX), 0

    def truncate(piece, keep, rng):
        surplus = len(piece[0]) - keep
        if surplus <= 0:
            return piece
        front = int(rng.binomial(surplus, 0.5))
        return tuple(x[front : front + keep] for x in piece)

    split = ((d, _reference_pieces(d, max_tokens)) for d in documents)
    for (document, sentences), pool in formats.random_document_pools(split, pool_size):
        rng = keyed_generator(seed, epoch, formats.STREAM_FORMAT, document["key"])
        short = rng.random() < short_seq_probability
        target = int(rng.integers(2, max_tokens + 1)) if short else max_tokens
        chunk_start, used, i = 0, 0, 0
        while i < len(sentences):
            used += len(sentences[i][0])
            if i == len(sentences) - 1 or used >= target or (single_sentences and i > chunk_start):
                b_target = None if single_sentences else target
                pair, unused = labelled_pair(sentences[chunk_start : i + 1], b_target, pool, rng)
                if pair is not None:
                    first, second, label = pair
                    keep_a, keep_b = formats.truncated_lengths(
                        len(first[0]), len(second[0]), max_tokens
                    )
                    segments = [truncate(first, keep_a, rng), truncate(second, keep_b, rng)]
                    yield _reference_sequence(
                        f"{document['key']}:{chunk_start}", segments, vocab, label
                    )
                i -= unused
                chunk_start, used = i + 1, 0
            i += 1


def random_documents(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    documents = []
    for d in range(n):
        lengths = rng.integers(0, 90, size=rng.integers(1, 15))  # empty and long sentences too
        tokens = int(lengths.sum())
        if tokens == 0:
            continue
        document = {
            "key": f"doc_{d}",
            "ids": rng.integers(5, VOCAB.size, tokens),
            "sents": np.cumsum(lengths).astype(np.int32),
            "words": rng.random(tokens) < 0.7,
        }
        if d % 2:
            document["phrases"] = rng.integers(0, 4, tokens).astype(np.uint8)
        documents.append(document)
    return documents


@pytest.mark.parametrize("max_seq_length", [16, 64, 128])
def test_formats_equal_the_per_piece_reference(max_seq_length):
    documents = random_documents(15 if max_seq_length < 64 else 40, seed=max_seq_length)
    for cross in (True, False):
        new = list(formats.pack_sentences(documents, max_seq_length, VOCAB, cross_documents=cross))
        old = list(
            reference_pack_sentences(documents, max_seq_length, VOCAB, cross_documents=cross)
        )
        assert len(new) == len(old)
        for a, b in zip(new, old, strict=True):
            assert_same(a, b)
    for pair_task in ("nsp", "sop", "three_way", "none"):
        for single, short, pool in ((False, 0.1, 100), (True, 0.5, 3), (False, 0.9, 1)):
            settings = {
                "seed": 7,
                "epoch": 2,
                "pair_task": pair_task,
                "single_sentences": single,
                "short_seq_probability": short,
                "random_probability": 0.5,
                "pool_size": pool,
            }
            new = list(formats.make_segment_pairs(documents, max_seq_length, VOCAB, **settings))
            old = list(reference_segment_pairs(documents, max_seq_length, VOCAB, **settings))
            assert len(new) == len(old)
            for a, b in zip(new, old, strict=True):
                assert_same(a, b)


# ---------------------------------------------------------------- unit selection


def reference_row_units(unit_first, candidates):
    starts = np.flatnonzero(unit_first)
    unit_of = np.cumsum(unit_first) - 1
    lengths = np.bincount(unit_of[candidates], minlength=len(starts)).astype(np.int64)
    return starts.astype(np.int64), lengths


def reference_fill_budget(lengths, budget):
    accepted = np.zeros(len(lengths), bool)
    if len(lengths) == 0 or budget <= 0:
        return accepted
    fitting = int(np.searchsorted(np.cumsum(lengths), budget, side="right"))
    accepted[:fitting] = True
    covered = int(lengths[:fitting].sum())
    position = fitting + 1
    while covered < budget and position < len(lengths):
        fits = np.flatnonzero(lengths[position:] <= budget - covered)
        if len(fits) == 0:
            break
        position += int(fits[0])
        accepted[position] = True
        covered += int(lengths[position])
        position += 1
    if not accepted.any():
        accepted[0] = True
    return accepted


def reference_whole_units(unit_first, candidates, uniform, probability):
    selected = np.zeros(candidates.shape, bool)
    budgets = mask_budget(candidates.sum(axis=1), probability)
    for row in range(candidates.shape[0]):
        starts, lengths = reference_row_units(unit_first[row], candidates[row])
        if len(starts) == 0:
            continue
        order = np.argsort(uniform[row, starts], kind="stable")
        accepted = np.zeros(len(starts), bool)
        accepted[order] = reference_fill_budget(lengths[order], int(budgets[row]))
        unit_of = np.cumsum(unit_first[row]) - 1
        selected[row] = candidates[row] & accepted[np.maximum(unit_of, 0)] & (unit_of >= 0)
    return selected, unit_start_index(unit_first)


def random_rows(rng, rows=None, length=None):
    batch = int(rng.integers(1, 10)) if rows is None else rows
    length = int(rng.integers(1, 80)) if length is None else length
    candidates = rng.random((batch, length)) < rng.uniform(0.2, 1.0)
    if rng.random() < 0.2:
        candidates[0] = False
    word_starts = rng.random((batch, length)) < rng.uniform(0.05, 1.0)
    return candidates, word_starts


def test_whole_unit_selection_equals_the_per_row_reference():
    rng = np.random.default_rng(0)
    for trial in range(600):
        candidates, word_starts = random_rows(rng)
        if trial % 2:
            phrases = rng.integers(0, 4, candidates.shape).astype(np.uint8)
            phrases *= rng.random(candidates.shape) < 0.3
            first = phrase_unit_flags(phrases, word_starts, candidates)
        else:
            first = word_start_flags(word_starts, candidates)
        uniform = rng.random(candidates.shape)
        if trial % 3 == 0:  # ties between units: the order stays the stable sort's
            uniform = rng.integers(0, 4, candidates.shape) / 4
        probability = float(rng.choice([0.01, 0.15, 0.5, 1.0]))
        assert_same(
            list(select_whole_units(first, candidates, uniform, probability)),
            list(reference_whole_units(first, candidates, uniform, probability)),
        )


def test_stable_row_order_is_the_stable_argsort():
    rng = np.random.default_rng(1)
    for keys in (
        rng.random((8, 50)),
        rng.integers(0, 3, (8, 50)) / 2,  # ties
        np.round(rng.random((8, 50)), 2),  # not multiples of 2**-53: the stable sort itself
        rng.random((2, 1100)),  # too wide for the unique keys
    ):
        np.testing.assert_array_equal(
            stable_row_order(keys), np.argsort(keys, axis=1, kind="stable")
        )


# ---------------------------------------------------------------- n-grams and spans


def reference_row_words(word_first, candidates):
    starts, lengths = reference_row_units(word_first, candidates)
    if len(starts) == 0:
        return [], [], []
    joined = np.append(starts[:-1] + lengths[:-1] == starts[1:], False)
    run_last = np.flatnonzero(~joined)
    run_of = np.cumsum(np.concatenate(([0], ~joined[:-1])))
    left = run_last[run_of] - np.arange(len(starts)) + 1
    return starts.tolist(), lengths.tolist(), left.tolist()


def test_batch_words_equal_the_per_row_words():
    rng = np.random.default_rng(2)
    for _ in range(300):
        candidates, word_starts = random_rows(rng)
        first = word_start_flags(word_starts, candidates)
        starts, lengths, left, counts = batch_words(first, candidates)
        for row in range(len(candidates)):
            n = int(counts[row])
            got = (starts[row, :n].tolist(), lengths[row, :n].tolist(), left[row, :n].tolist())
            assert got == reference_row_words(first[row], candidates[row])
        units = batch_units(first, candidates)
        np.testing.assert_array_equal(units[2], counts)


# ---------------------------------------------------------------- XLNet


def test_perm_mask_equals_the_broadcast_definition():
    rng = np.random.default_rng(5)
    for _ in range(200):
        batch, length = int(rng.integers(1, 6)), int(rng.integers(1, 70))
        rank = rng.integers(-3, length, (batch, length))
        targets = rng.random((batch, length)) < 0.3
        permutation = Permutation(rank, targets)
        reference = targets[:, None, :] & (rank[:, None, :] >= rank[:, :, None])
        assert_same(perm_mask_from(permutation), reference)
        cut = int(rng.integers(0, length + 1))
        head, tail = slice(None, cut), slice(cut, None)
        assert_same(perm_mask_from(permutation, head, tail), reference[:, head, tail])
        assert_same(perm_mask_from(permutation, tail, tail), reference[:, tail, tail])
