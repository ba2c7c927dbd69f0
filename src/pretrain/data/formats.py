"""Input formats: how a stream of tokenized documents becomes model sequences (RoBERTa §4.2).

A document is {"key", "ids" (n,), "sents" (sentence end offsets), "words" (n,) word starts}.
A sequence is {"key", "input_ids" (L,), "token_type_ids" (L,), "word_starts" (L,),
"next_sentence_label"} with [CLS]/[SEP] added; its key names the document and the first
sentence it starts at, and seeds its masks. Loops run per sentence, never per token.
"""

from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from pretrain.data.keyed_rng import STREAM_FORMAT, keyed_generator
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary

Piece = tuple[
    np.ndarray, np.ndarray
]  # (token ids, word-start flags) of one sentence or part of one


def sentence_pieces(document: dict, max_tokens: int) -> list[Piece]:
    """Split a document at its sentence ends; a sentence longer than `max_tokens` is cut into
    pieces of at most `max_tokens` tokens."""
    pieces = []
    starts = np.concatenate(([0], document["sents"][:-1]))
    for start, end in zip(starts.tolist(), document["sents"].tolist(), strict=True):
        for cut in range(start, end, max_tokens):
            stop = min(cut + max_tokens, end)
            pieces.append((document["ids"][cut:stop], document["words"][cut:stop]))
    return pieces


def _concat(pieces: list[Piece]) -> Piece:
    if not pieces:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


def _sequence(
    key: str, segments: list[Piece], vocab: Vocabulary, nsp_label: int = IGNORE_INDEX
) -> dict:
    """[CLS] seg0 [SEP] (seg1 [SEP]); token type i for segment i."""
    ids, types, words = [np.array([vocab.cls])], [np.zeros(1, np.int64)], [np.ones(1, bool)]
    for segment_id, (seg_ids, seg_words) in enumerate(segments):
        ids += [seg_ids.astype(np.int64), np.array([vocab.sep])]
        types.append(np.full(len(seg_ids) + 1, segment_id, np.int64))
        words += [seg_words.astype(bool), np.ones(1, bool)]
    return {
        "key": key,
        "input_ids": np.concatenate(ids),
        "token_type_ids": np.concatenate(types),
        "word_starts": np.concatenate(words),
        "next_sentence_label": nsp_label,
    }


def pack_sentences(
    documents: Iterable[dict], max_seq_length: int, vocab: Vocabulary, *, cross_documents: bool
) -> Iterator[dict]:
    """FULL-SENTENCES (cross_documents=True: documents joined by an extra [SEP]) or
    DOC-SENTENCES (False: a sequence never spans two documents, so the last one of a document
    may be short). Whole sentences are packed until the next would exceed max_seq_length."""
    budget = max_seq_length - 2  # [CLS] ... [SEP]
    separator = (np.array([vocab.sep]), np.ones(1, bool))
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
    return _sequence(key, [_concat(pieces)], vocab)


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
    return piece[0][front : front + keep], piece[1][front : front + keep]


def make_segment_pairs(
    documents: Iterable[dict],
    max_seq_length: int,
    vocab: Vocabulary,
    *,
    seed: int,
    epoch: int,
    short_seq_probability: float = 0.1,
    random_probability: float = 0.5,
    pool_size: int = 100,
) -> Iterator[dict]:
    """SEGMENT-PAIR with NSP (BERT's `create_instances_from_document`): runs of sentences are
    cut into A and B; with `random_probability` B is replaced by sentences from another recent
    document (label 1), else B is A's true continuation (label 0). A one-sentence chunk is split
    inside the sentence so that both labels stay possible. Draws are keyed by (seed, epoch,
    document key); the other document comes from a pool of the last `pool_size` documents."""
    max_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    pool: deque[tuple[str, list[Piece]]] = deque(maxlen=pool_size)
    for document in documents:
        rng = keyed_generator(seed, epoch, STREAM_FORMAT, document["key"])
        sentences = sentence_pieces(document, max_tokens)
        target = (
            max_tokens
            if rng.random() >= short_seq_probability
            else int(rng.integers(2, max_tokens + 1))
        )
        chunk_start, used, i = 0, 0, 0
        while i < len(sentences):
            used += len(sentences[i][0])
            if i == len(sentences) - 1 or used >= target:
                chunk = sentences[chunk_start : i + 1]
                pair, unused = _pair_from_chunk(chunk, target, pool, rng, random_probability)
                if pair is not None:
                    a, b, label = pair
                    keep_a, keep_b = truncated_lengths(len(a[0]), len(b[0]), max_tokens)
                    segments = [_truncate(a, keep_a, rng), _truncate(b, keep_b, rng)]
                    yield _sequence(f"{document['key']}:{chunk_start}", segments, vocab, label)
                i -= unused  # sentences not used by a random B start the next chunk
                chunk_start, used = i + 1, 0
            i += 1
        pool.append((document["key"], sentences))


def _pair_from_chunk(
    chunk: list[Piece],
    target: int,
    pool: deque,
    rng: np.random.Generator,
    random_probability: float,
) -> tuple[tuple[Piece, Piece, int] | None, int]:
    """Returns ((A, B, nsp_label) or None, number of chunk sentences left unused)."""
    if len(chunk) >= 2:
        a_end = int(rng.integers(1, len(chunk)))
        a, b = _concat(chunk[:a_end]), _concat(chunk[a_end:])
    elif len(chunk[0][0]) >= 2:
        cut = int(rng.integers(1, len(chunk[0][0])))
        a_end = 1
        a, b = (chunk[0][0][:cut], chunk[0][1][:cut]), (chunk[0][0][cut:], chunk[0][1][cut:])
    else:
        return None, 0
    if pool and rng.random() < random_probability:
        _, other = pool[int(rng.integers(len(pool)))]
        start = int(rng.integers(len(other)))
        lengths = np.cumsum([len(p[0]) for p in other[start:]])
        stop = start + int(np.searchsorted(lengths, max(target - len(a[0]), 1))) + 1
        return (a, _concat(other[start:stop]), 1), len(chunk) - a_end
    return (a, b, 0), 0
