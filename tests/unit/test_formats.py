"""Invariants of the input formats: lengths, separators, document boundaries, NSP labels."""

import numpy as np
import pytest

from pretrain.data.formats import (
    SentencePieces,
    make_segment_pairs,
    pack_sentences,
    truncated_lengths,
)
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary

VOCAB = Vocabulary(size=100_000, pad=0, unk=1, cls=2, sep=3, mask=4)


def make_documents(
    n_docs: int, seed: int = 0, max_sentences: int = 12, max_len: int = 40
) -> list[dict]:
    """Documents whose token ids are unique and increasing (doc d owns ids from 1000*(d+1)), so
    every token tells which document and position it came from."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        lengths = rng.integers(1, max_len, size=rng.integers(1, max_sentences))
        n = int(lengths.sum())
        ids = np.arange(n, dtype=np.int64) + 1000 * (d + 1)
        docs.append(
            {
                "key": f"doc_{d:05d}",
                "ids": ids,
                "sents": np.cumsum(lengths).astype(np.int32),
                "words": rng.random(n) < 0.7,
            }
        )
    return docs


def content(seq: dict) -> np.ndarray:
    ids = seq["input_ids"]
    return ids[~np.isin(ids, (VOCAB.cls, VOCAB.sep))]


@pytest.mark.parametrize("max_len", [16, 64])
def test_full_sentences_keeps_every_token_in_order_and_separates_documents(max_len):
    docs = make_documents(30, max_len=30)
    seqs = list(pack_sentences(docs, max_len, VOCAB, cross_documents=True))
    for s in seqs:
        assert len(s["input_ids"]) <= max_len
        assert s["input_ids"][0] == VOCAB.cls and s["input_ids"][-1] == VOCAB.sep
        assert (s["token_type_ids"] == 0).all() and s["next_sentence_label"] == IGNORE_INDEX
        assert len(s["word_starts"]) == len(s["input_ids"])
    np.testing.assert_array_equal(
        np.concatenate([content(s) for s in seqs]), np.concatenate([d["ids"] for d in docs])
    )
    # a document change inside a sequence is marked by an extra [SEP]
    crossings = 0
    for s in seqs:
        body = s["input_ids"][1:-1]
        owners = body // 1000
        for i in np.flatnonzero(body == VOCAB.sep):
            assert owners[i - 1] != owners[i + 1]
            crossings += 1
        real = owners[body != VOCAB.sep]
        assert (np.diff(real) >= 0).all()
        assert len(np.unique(real)) - 1 == (body == VOCAB.sep).sum()
    assert crossings > 0
    # sequences are filled: all but the last leave less room than the next sentence needs
    assert np.mean([len(s["input_ids"]) for s in seqs[:-1]]) > 0.7 * max_len


@pytest.mark.parametrize("max_len", [16, 64])
def test_token_blocks_fill_every_row_and_keep_every_token_in_order(max_len):
    """TOKEN-BLOCKS (run_mlm.py's group_texts): rows are max_len tokens (the last shorter), the
    rows' bodies are the documents end to end with a [SEP] between documents (where a row has
    room for it), and a row that starts inside a sentence is keyed by it and the offset."""
    docs = make_documents(30, max_len=30)
    seqs = list(pack_sentences(docs, max_len, VOCAB, cross_documents=True, fill="carry"))
    # full rows, or one short where a document ends at the row's last token (its separator
    # is the row's own [SEP])
    short = [s for s in seqs[:-1] if len(s["input_ids"]) != max_len]
    assert all(len(s["input_ids"]) == max_len - 1 for s in short)
    assert len(short) < len(docs) / 2
    assert 0 < len(seqs[-1]["input_ids"]) <= max_len
    np.testing.assert_array_equal(
        np.concatenate([content(s) for s in seqs]), np.concatenate([d["ids"] for d in docs])
    )
    keys = [s["key"] for s in seqs]
    assert len(set(keys)) == len(keys)
    pieces = {d["key"]: SentencePieces(d, max_len - 2).starts for d in docs}
    ids = {d["key"]: d["ids"] for d in docs}
    split = 0
    for s in seqs:
        piece, _, offset = s["key"].partition("+")  # a piece of a document, maybe an offset
        document, index = piece.split(":")
        start = pieces[document][int(index)] + int(offset or 0)
        assert int(content(s)[0]) == int(ids[document][start])
        split += bool(offset)
    assert split > len(seqs) // 2  # most rows start inside a sentence
    # fewer rows than FULL-SENTENCES for the same tokens
    assert len(seqs) < len(list(pack_sentences(docs, max_len, VOCAB, cross_documents=True)))


@pytest.mark.parametrize("max_len", [16, 64])
def test_filled_sentences_start_at_a_sentence_and_fill_every_row(max_len):
    """FILLED-SENTENCES: rows are max_len tokens (the last shorter, one less where a document
    ends at the row's end), each starts at a sentence piece (keyed by it) and is a run of the
    documents' tokens end to end; a row that ends inside a piece has the next row start with
    that piece whole, so every token is in a row and only cut heads are read twice."""
    docs = make_documents(30, max_len=30)
    seqs = list(pack_sentences(docs, max_len, VOCAB, cross_documents=True, fill="restart"))
    short = [s for s in seqs[:-1] if len(s["input_ids"]) != max_len]
    assert all(len(s["input_ids"]) == max_len - 1 for s in short)
    assert len(short) < len(docs) / 2
    stream = np.concatenate([d["ids"] for d in docs])
    where = {int(token): i for i, token in enumerate(stream)}
    pieces = {d["key"]: SentencePieces(d, max_len - 2).starts for d in docs}
    ids = {d["key"]: d["ids"] for d in docs}
    covered, cut_heads, previous_end = np.zeros(len(stream), bool), 0, -1
    for s in seqs:
        body = [where[int(t)] for t in content(s)]
        assert body == list(range(body[0], body[0] + len(body)))  # a run of the stream
        document, index = s["key"].split(":")
        assert int(content(s)[0]) == int(ids[document][pieces[document][int(index)]])
        assert body[0] <= previous_end + 1  # nothing skipped
        cut_heads += body[0] <= previous_end
        covered[body] = True
        previous_end = body[-1]
    assert covered.all()
    assert cut_heads > len(seqs) // 3  # most rows are filled by cutting their last sentence
    # as many rows as FULL-SENTENCES makes, each full
    assert len(seqs) == len(list(pack_sentences(docs, max_len, VOCAB, cross_documents=True)))


def test_doc_sentences_never_crosses_documents():
    docs = make_documents(30, seed=1)
    seqs = list(pack_sentences(docs, 48, VOCAB, cross_documents=False))
    for s in seqs:
        assert len(s["input_ids"]) <= 48
        owners = content(s) // 1000
        assert (owners == owners[0]).all()
        assert s["key"].startswith(f"doc_{owners[0] - 1:05d}:")
    np.testing.assert_array_equal(
        np.concatenate([content(s) for s in seqs]), np.concatenate([d["ids"] for d in docs])
    )
    # shorter sequences at document ends: there are more sequences than with crossing
    assert len(seqs) > len(list(pack_sentences(docs, 48, VOCAB, cross_documents=True)))


def test_sentences_split_at_sentence_ends():
    docs = make_documents(10, seed=2, max_len=10)
    ends = {
        int(d["ids"][0] + e) for d in docs for e in d["sents"]
    }  # first token id after each sentence
    for s in pack_sentences(docs, 64, VOCAB, cross_documents=False):
        body = content(s)
        assert int(body[-1]) + 1 in ends  # every sequence ends at a sentence end


def brute_force_truncate(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    while len_a + len_b > max_tokens:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def test_truncated_lengths_equal_berts_loop():
    for a in range(0, 40):
        for b in range(0, 40):
            for m in (5, 17, 30, 80):
                assert truncated_lengths(a, b, m) == brute_force_truncate(a, b, m)


def test_segment_pairs_labels_lengths_and_continuations():
    docs = make_documents(400, seed=3)
    seqs = list(make_segment_pairs(docs, 64, VOCAB, seed=5, epoch=0))
    labels = np.array([s["next_sentence_label"] for s in seqs])
    assert set(labels) == {0, 1}
    n = len(labels)
    assert abs(labels.mean() - 0.5) < 4 * np.sqrt(0.25 / n), (labels.mean(), n)
    for s in seqs:
        ids, types = s["input_ids"], s["token_type_ids"]
        assert len(ids) <= 64
        seps = np.flatnonzero(ids == VOCAB.sep)
        assert ids[0] == VOCAB.cls and len(seps) == 2 and seps[1] == len(ids) - 1
        np.testing.assert_array_equal(
            types, np.r_[np.zeros(seps[0] + 1), np.ones(len(ids) - seps[0] - 1)]
        )
        a, b = ids[1 : seps[0]], ids[seps[0] + 1 : -1]
        assert len(a) >= 1 and len(b) >= 1
        doc_a = s["key"].split(":")[0]
        assert (a // 1000 == int(doc_a[4:]) + 1).all()
        if s["next_sentence_label"] == 0:
            assert (b // 1000 == a[0] // 1000).all() and b[0] > a[-1]  # same document, after A
        else:
            assert (b // 1000 != a[0] // 1000).all()  # another document
            assert (np.diff(b) == 1).all()  # contiguous sentences of it
    # reproducible from (seed, epoch, key); another epoch draws other pairs
    again = list(make_segment_pairs(docs, 64, VOCAB, seed=5, epoch=0))
    assert all((x["input_ids"] == y["input_ids"]).all() for x, y in zip(seqs, again, strict=True))
    other = list(make_segment_pairs(docs, 64, VOCAB, seed=5, epoch=1))
    assert [s["key"] for s in other] != [s["key"] for s in seqs] or any(
        len(x["input_ids"]) != len(y["input_ids"]) for x, y in zip(seqs, other, strict=False)
    )


def test_segment_pair_true_continuations_are_contiguous_when_not_truncated():
    docs = make_documents(200, seed=4, max_len=8, max_sentences=30)
    for s in make_segment_pairs(docs, 128, VOCAB, seed=1, epoch=0, short_seq_probability=0.0):
        body = content(s)
        if s["next_sentence_label"] == 0 and len(body) < 128 - 3:  # not truncated
            assert (np.diff(body) == 1).all()  # A then B with nothing missing between


@pytest.mark.parametrize("task", ["sop", "three_way"])
def test_sentence_order_tasks_are_balanced_and_correct(task):
    docs = make_documents(600, seed=6)
    seqs = list(make_segment_pairs(docs, 64, VOCAB, seed=2, epoch=0, pair_task=task))
    labels = np.array([s["next_sentence_label"] for s in seqs])
    classes = 2 if task == "sop" else 3
    assert sorted(set(labels.tolist())) == list(range(classes))
    for c in range(classes):  # each class 1/classes of the pairs, within 4 standard deviations
        p = 1 / classes
        assert abs((labels == c).mean() - p) < 4 * np.sqrt(p * (1 - p) / len(labels)) + 0.01
    for s in seqs:
        ids = s["input_ids"]
        seps = np.flatnonzero(ids == VOCAB.sep)
        a, b = ids[1 : seps[0]], ids[seps[0] + 1 : -1]
        same_doc = (a[0] // 1000) == (b[0] // 1000)
        label = s["next_sentence_label"]
        if label == 0:  # in order: B after A in the same document
            assert same_doc and b[0] > a[-1]
        elif label == 1:  # swapped (SOP) / previous (StructBERT): B comes before A
            assert same_doc and b[-1] < a[0]
        else:  # StructBERT's third class: another document
            assert not same_doc


def test_sentence_pair_uses_single_sentences():
    docs = make_documents(300, seed=7, max_len=12)
    sentence_ends = {int(d["ids"][0] + e) for d in docs for e in d["sents"]}
    sentence_starts = {int(d["ids"][0] + e) for d in docs for e in np.r_[0, d["sents"][:-1]]}
    seqs = list(make_segment_pairs(docs, 128, VOCAB, seed=1, epoch=0, single_sentences=True))
    labels = np.array([s["next_sentence_label"] for s in seqs])
    assert abs(labels.mean() - 0.5) < 4 * np.sqrt(0.25 / len(labels)) + 0.02
    whole = 0
    for s in seqs:
        ids = s["input_ids"]
        seps = np.flatnonzero(ids == VOCAB.sep)
        for segment in (ids[1 : seps[0]], ids[seps[0] + 1 : -1]):
            # a segment is one sentence (or a cut of a document's only sentence)
            if int(segment[0]) in sentence_starts and int(segment[-1]) + 1 in sentence_ends:
                whole += 1
                assert not any(int(t) + 1 in sentence_ends for t in segment[:-1])
    assert whole > 1.5 * len(seqs)
