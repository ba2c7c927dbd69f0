"""Input formats: how a stream of tokenized documents becomes model sequences (RoBERTa §4.2).

A document is {"key", "ids" (n,), "sents" (sentence end offsets), "words" (n,) word starts,
optionally "phrases" (n,) phrase/entity span flags}. A sequence is {"key", "input_ids" (L,),
"token_type_ids" (L,), "word_starts" (L,), "phrases" (L,), "next_sentence_label"} with
[CLS]/[SEP] added; its key names the document and the first sentence it starts at, and seeds
its masks. Loops run per sentence, never per token.

Pair formats (SEGMENT-PAIR, SENTENCE-PAIR) label the relation of their two segments with a
`pair_task` in "next_sentence_label": "nsp" (BERT: 0 = B continues A, 1 = B from another document), "sop" (ALBERT:
0 = in order, 1 = swapped), "three_way" (StructBERT: 0 = next, 1 = previous, 2 = other
document, a third each), or "none".
"""

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TypeVar

import numpy as np

from pretrain.data.keyed_rng import STREAM_FORMAT, keyed_generator
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary

PAIR_TASKS = ("nsp", "sop", "three_way", "none")
T = TypeVar("T")

# (token ids, word-start flags, phrase flags) of one sentence or part of one
Piece = tuple[np.ndarray, np.ndarray, np.ndarray]
Pool = Sequence[tuple[dict, list[Piece]]]  # (document, its sentence pieces) of other documents


def _piece_slice(document: dict, start: int, stop: int) -> Piece:
    phrases = document.get("phrases")
    return (
        document["ids"][start:stop],
        document["words"][start:stop],
        np.zeros(stop - start, np.uint8) if phrases is None else phrases[start:stop],
    )


def sentence_pieces(document: dict, max_tokens: int) -> list[Piece]:
    """Split a document at its sentence ends; a sentence longer than `max_tokens` is cut into
    pieces of at most `max_tokens` tokens."""
    pieces = []
    starts = np.concatenate(([0], document["sents"][:-1]))
    for start, end in zip(starts.tolist(), document["sents"].tolist(), strict=True):
        for cut in range(start, end, max_tokens):
            pieces.append(_piece_slice(document, cut, min(cut + max_tokens, end)))
    return pieces


def _concat(pieces: list[Piece]) -> Piece:
    return tuple(np.concatenate([p[i] for p in pieces]) for i in range(3))


def _cut(piece: Piece, start: int, stop: int) -> Piece:
    return tuple(a[start:stop] for a in piece)


def _sequence(
    key: str,
    segments: list[Piece],
    vocab: Vocabulary,
    label: int = IGNORE_INDEX,
    sentence_lengths: list[int] | None = None,
) -> dict:
    """[CLS] seg0 [SEP] (seg1 [SEP]); token type i for segment i. `sentence_starts` flags the
    first token of each sentence (of each segment, or of each of `sentence_lengths` (tokens)
    when the one segment's sentences are known); [CLS] and [SEP] are never flagged."""
    ids, types = [np.array([vocab.cls])], [np.zeros(1, np.int64)]
    words, phrases = [np.ones(1, bool)], [np.zeros(1, np.uint8)]
    for segment_id, (seg_ids, seg_words, seg_phrases) in enumerate(segments):
        ids += [seg_ids.astype(np.int64), np.array([vocab.sep])]
        types.append(np.full(len(seg_ids) + 1, segment_id, np.int64))
        words += [seg_words.astype(bool), np.ones(1, bool)]
        phrases += [seg_phrases.astype(np.uint8), np.zeros(1, np.uint8)]
    return {
        "key": key,
        "input_ids": np.concatenate(ids),
        "token_type_ids": np.concatenate(types),
        "word_starts": np.concatenate(words),
        "phrases": np.concatenate(phrases),
        "next_sentence_label": label,
        "sentence_starts": _sentence_starts(segments, sentence_lengths),
    }


def _sentence_starts(segments: list[Piece], sentence_lengths: list[int] | None) -> np.ndarray:
    """(L,) bool: True at the first token of each sentence of `_sequence`'s output."""
    starts = np.zeros(1 + sum(len(s[0]) + 1 for s in segments), bool)
    offsets = np.cumsum([1] + [len(s[0]) + 1 for s in segments[:-1]])
    starts[offsets] = [len(s[0]) > 0 for s in segments]
    if sentence_lengths is not None and len(segments) == 1:
        within = np.cumsum([0, *sentence_lengths[:-1]])
        starts[1 + within[np.asarray(sentence_lengths) > 0]] = True
    return starts


def pack_sentences(
    documents: Iterable[dict], max_seq_length: int, vocab: Vocabulary, *, cross_documents: bool
) -> Iterator[dict]:
    """FULL-SENTENCES (cross_documents=True: documents joined by an extra [SEP]) or
    DOC-SENTENCES (False: a sequence never spans two documents, so the last one of a document
    may be short). Whole sentences are packed until the next would exceed max_seq_length."""
    budget = max_seq_length - 2  # [CLS] ... [SEP]
    separator = (np.array([vocab.sep]), np.ones(1, bool), np.zeros(1, np.uint8))
    pieces: list[Piece] = []
    used, key = 0, ""
    for document in documents:
        for index, piece in enumerate(sentence_pieces(document, budget)):
            if pieces and used + len(piece[0]) > budget:
                yield _packed(key, pieces, separator, vocab)
                pieces, used = [], 0
            if not pieces:
                key = f"{document['key']}:{index}"
            pieces.append(piece)
            used += len(piece[0])
        if not cross_documents and pieces:
            yield _packed(key, pieces, separator, vocab)
            pieces, used = [], 0
        elif pieces and used + 1 <= budget:
            pieces.append(separator)
            used += 1
    if pieces:
        yield _packed(key, pieces, separator, vocab)


def _packed(key: str, pieces: list[Piece], separator: Piece, vocab: Vocabulary) -> dict:
    """One single-segment sequence; a document separator at the very end is dropped."""
    if pieces[-1] is separator:
        pieces = pieces[:-1]
    return _sequence(key, [_concat(pieces)], vocab, sentence_lengths=[len(p[0]) for p in pieces])


def truncated_lengths(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    """Lengths after BERT's `truncate_seq_pair`: remove one token at a time from the longer
    segment (from B on a tie) until both fit in max_tokens; computed in O(1)."""
    excess = len_a + len_b - max_tokens
    if excess <= 0:
        return len_a, len_b
    gap = min(excess, abs(len_a - len_b))
    if len_a > len_b:
        len_a -= gap
    else:
        len_b -= gap
    excess -= gap
    return len_a - excess // 2, len_b - (excess + 1) // 2


def _truncate(piece: Piece, keep: int, rng: np.random.Generator) -> Piece:
    """Keep `keep` tokens, removing each surplus token from the front or the back at random."""
    surplus = len(piece[0]) - keep
    if surplus <= 0:
        return piece
    front = int(rng.binomial(surplus, 0.5))
    return _cut(piece, front, front + keep)


def make_segment_pairs(
    documents: Iterable[dict],
    max_seq_length: int,
    vocab: Vocabulary,
    *,
    seed: int,
    epoch: int,
    pair_task: str = "nsp",
    single_sentences: bool = False,
    short_seq_probability: float = 0.1,
    random_probability: float = 0.5,
    pool_size: int = 100,
) -> Iterator[dict]:
    """SEGMENT-PAIR (BERT's `create_instances_from_document`: runs of sentences cut into A and
    B) or, with `single_sentences`, SENTENCE-PAIR (A and B are single sentences), labelled by
    `pair_task` (see the module docstring). NSP replaces B by sentences of another recent
    document with `random_probability`. A one-sentence chunk is split inside the sentence so
    that every label stays possible. Draws are keyed by (seed, epoch, document key); the other
    document comes from the pool of `random_document_pools`."""
    max_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    split = ((d, sentence_pieces(d, max_tokens)) for d in documents)
    for (document, sentences), pool in random_document_pools(split, pool_size):
        rng = keyed_generator(seed, epoch, STREAM_FORMAT, document["key"])
        short = rng.random() < short_seq_probability
        target = int(rng.integers(2, max_tokens + 1)) if short else max_tokens
        chunk_start, used, i = 0, 0, 0
        while i < len(sentences):
            used += len(sentences[i][0])
            if i == len(sentences) - 1 or used >= target or (single_sentences and i > chunk_start):
                chunk = sentences[chunk_start : i + 1]
                b_target = None if single_sentences else target
                pair, unused = _labelled_pair(
                    chunk, b_target, pool, rng, pair_task, random_probability
                )
                if pair is not None:
                    first, second, label = pair
                    keep_a, keep_b = truncated_lengths(len(first[0]), len(second[0]), max_tokens)
                    segments = [_truncate(first, keep_a, rng), _truncate(second, keep_b, rng)]
                    yield _sequence(f"{document['key']}:{chunk_start}", segments, vocab, label)
                i -= unused  # sentences not used by a random B start the next chunk
                chunk_start, used = i + 1, 0
            i += 1


def random_document_pools(items: Iterable[T], pool_size: int) -> Iterator[tuple[T, Sequence[T]]]:
    """Each item of a document stream with the pool its random segments come from: the
    `pool_size` items before it, and for the first pool_size items (which have fewer before
    them) the other items of the stream's first pool_size + 1. So the first document of a
    stream (a partition's chunk) can receive a random B as often as any other, whenever the
    stream has two documents; a function of the stream alone, reproducible wherever it is
    read. The pool excludes the item itself."""
    stream = iter(items)
    head = list(islice(stream, pool_size + 1))
    for index, item in enumerate(head):
        yield item, head[:index] + head[index + 1 :]
    window = deque(head, maxlen=pool_size)
    for item in stream:
        yield item, tuple(window)
        window.append(item)


def _labelled_pair(
    chunk: list[Piece],
    target: int | None,
    pool: Pool,
    rng: np.random.Generator,
    pair_task: str,
    random_probability: float,
) -> tuple[tuple[Piece, Piece, int] | None, int]:
    """((first, second, label) or None, number of chunk sentences left unused). A random
    second segment fills A up to `target` tokens (None: a single sentence)."""
    if len(chunk) >= 2:
        a_end = int(rng.integers(1, len(chunk)))
        a, b = _concat(chunk[:a_end]), _concat(chunk[a_end:])
    elif len(chunk[0][0]) >= 2:
        a_end = 1
        cut = int(rng.integers(1, len(chunk[0][0])))
        a, b = _cut(chunk[0], 0, cut), _cut(chunk[0], cut, len(chunk[0][0]))
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
            return (a, _random_segment(pool, rng, b_tokens), 2), len(chunk) - a_end
        return (a, b, 0), 0
    if pair_task == "nsp" and pool and draw < random_probability:
        return (a, _random_segment(pool, rng, b_tokens), 1), len(chunk) - a_end
    return (a, b, 0 if pair_task == "nsp" else IGNORE_INDEX), 0


def _random_segment(pool: Pool, rng: np.random.Generator, min_tokens: int) -> Piece:
    """Contiguous sentences of a random pooled document, from a random sentence, until at
    least `min_tokens` tokens (or the document's end)."""
    other = pool[int(rng.integers(len(pool)))][1]
    start = int(rng.integers(len(other)))
    lengths = np.cumsum([len(p[0]) for p in other[start:]])
    stop = start + int(np.searchsorted(lengths, max(min_tokens, 1))) + 1
    return _concat(other[start:stop])
