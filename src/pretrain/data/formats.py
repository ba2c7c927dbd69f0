"""Input formats: how a stream of tokenized documents becomes model sequences (RoBERTa §4.2).

A document is {"key", "ids" (n,), "sents" (sentence end offsets), "words" (n,) word starts,
optionally "phrases" (n,) phrase/entity span flags}. A sequence is {"key", "input_ids" (L,),
"token_type_ids" (L,), "word_starts" (L,), "phrases" (L,), "next_sentence_label"} with
[CLS]/[SEP] added; its key names the document and the first sentence it starts at, and seeds
its masks. Loops run per sentence, never per token; a segment is a slice of a document
(`SentencePieces`), copied once into the sequence's arrays.

Pair formats (SEGMENT-PAIR, SENTENCE-PAIR) label the relation of their two segments with a
`pair_task` in "next_sentence_label": "nsp" (BERT: 0 = B continues A, 1 = B from another document), "sop" (ALBERT:
0 = in order, 1 = swapped), "three_way" (StructBERT: 0 = next, 1 = previous, 2 = other
document, a third each), or "none".
"""

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import TypeVar

import numpy as np

from pretrain.data.keyed_rng import STREAM_FORMAT, keyed_generators
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary

PAIR_TASKS = ("nsp", "sop", "three_way", "none")
T = TypeVar("T")


class SentencePieces:
    """A document cut at its sentence ends, a sentence longer than `max_tokens` into pieces
    of at most `max_tokens` tokens: piece i is tokens [starts[i], stops[i]) of the
    document's arrays. Empty sentences make no piece; consecutive pieces are contiguous (a
    piece ends where the next begins), so a run of pieces is one slice of the document."""

    __slots__ = ("ids", "words", "phrases", "starts", "stops")

    def __init__(self, document: dict, max_tokens: int) -> None:
        self.ids, self.words = document["ids"], document["words"]
        self.phrases = document.get("phrases")  # None: no annotations (zeros)
        sents = np.asarray(document["sents"], np.int64)
        starts = np.concatenate(([0], sents[:-1])) if len(sents) else sents
        lengths = sents - starts
        if (lengths <= max_tokens).all():  # the usual case: one piece per non-empty sentence
            keep = lengths > 0
            self.starts, self.stops = starts[keep].tolist(), sents[keep].tolist()
            return
        self.starts, self.stops = [], []
        for start, end in zip(starts.tolist(), sents.tolist(), strict=True):
            for cut in range(start, end, max_tokens):
                self.starts.append(cut)
                self.stops.append(min(cut + max_tokens, end))

    def __len__(self) -> int:
        return len(self.starts)


# A segment: tokens [start, stop) of one document's SentencePieces.
Segment = tuple[SentencePieces, int, int]
Pool = Sequence[tuple]  # (document, its SentencePieces, ...) of other documents


def _fill(out: dict, position: int, segment: Segment) -> int:
    """Copy a segment's ids, word starts and phrase flags into `out`'s arrays at `position`;
    returns the position after it."""
    pieces, start, stop = segment
    end = position + stop - start
    out["input_ids"][position:end] = pieces.ids[start:stop]
    out["word_starts"][position:end] = pieces.words[start:stop]
    if pieces.phrases is not None:
        out["phrases"][position:end] = pieces.phrases[start:stop]
    return end


def _pair_sequence(
    key: str, first: Segment, second: Segment, vocab: Vocabulary, label: int
) -> dict:
    """[CLS] A [SEP] B [SEP]: token types 0 then 1 (from B on), [CLS]/[SEP] word starts, no
    phrase flags on them, `sentence_starts` at each non-empty segment's first token."""
    len_a, len_b = first[2] - first[1], second[2] - second[1]
    length = len_a + len_b + 3
    out = {
        "input_ids": np.empty(length, np.int64),
        "word_starts": np.ones(length, bool),
        "phrases": np.zeros(length, np.uint8),
    }
    out["input_ids"][0] = vocab.cls
    out["input_ids"][_fill(out, 1, first)] = vocab.sep
    out["input_ids"][_fill(out, len_a + 2, second)] = vocab.sep
    token_type_ids = np.zeros(length, np.int64)
    token_type_ids[len_a + 2 :] = 1
    sentence_starts = np.zeros(length, bool)
    sentence_starts[1] = len_a > 0
    sentence_starts[len_a + 2] = len_b > 0
    return {
        "key": key,
        "input_ids": out["input_ids"],
        "token_type_ids": token_type_ids,
        "word_starts": out["word_starts"],
        "phrases": out["phrases"],
        "next_sentence_label": label,
        "sentence_starts": sentence_starts,
    }


def pack_sentences(
    documents: Iterable[dict],
    max_seq_length: int,
    vocab: Vocabulary,
    *,
    cross_documents: bool,
    fill: str | None = None,
    document_ids: bool = False,
    length_of: Callable[[int], int] | None = None,
) -> Iterator[dict]:
    """FULL-SENTENCES (cross_documents=True: documents joined by an extra [SEP]) or
    DOC-SENTENCES (False: a sequence never spans two documents, so the last one of a document
    may be short). Whole sentences are packed until the next would exceed max_seq_length.
    `fill` fills every row but the last to max_seq_length tokens (one less where a document
    ends at the row's last token: the row's [SEP] separates it) by cutting the sentence that
    does not fit where the row is full: "carry" (TOKEN-BLOCKS, run_mlm.py's group_texts) goes
    on with the rest of it in the next row, which is keyed by the sentence and the offset
    (`<document>:<sentence>+<offset>`); "restart" (FILLED-SENTENCES) starts the next row with
    the whole sentence again, so every row starts at a sentence and the cut heads are read
    twice (about a fifth more tokens than the documents hold, at 64-token rows).
    With `document_ids` each sequence also has "document_ids" (L,) int64: the documents of
    its row numbered 0, 1, ... along it ([CLS] with the first, a separator with the
    document before it), for attention that never crosses a document (`data.document_masks`).
    With `length_of` (a context-extension stage) the n-th sequence (n = 0, 1, ...) is packed up
    to length_of(n) >= max_seq_length tokens; sentences are cut to fit max_seq_length."""
    pieces_budget = max_seq_length - 2  # [CLS] ... [SEP]
    budget, made = (pieces_budget if length_of is None else length_of(0) - 2), 0

    def next_budget() -> int:
        return budget if length_of is None else length_of(made) - 2

    segments: list[Segment | None] = []  # None: a document separator ([SEP])
    used, key = 0, ""
    for document in documents:
        pieces = SentencePieces(document, pieces_budget)
        for index, (start, stop) in enumerate(zip(pieces.starts, pieces.stops, strict=True)):
            offset = start
            while fill == "carry" and used + stop - offset > budget:
                cut = offset + budget - used
                if cut > offset:
                    if not segments:
                        key = _row_key(document, index, offset - start)
                    segments.append((pieces, offset, cut))
                yield _packed(key, segments, budget, vocab, document_ids)
                segments, used, made, offset = [], 0, made + 1, cut
                budget = next_budget()
            if segments and used + stop - offset > budget:
                if fill == "restart" and budget > used:  # the row's end: the piece's head
                    segments.append((pieces, offset, offset + budget - used))
                    used = budget
                yield _packed(key, segments, used, vocab, document_ids)
                segments, used, made = [], 0, made + 1
                budget = next_budget()
            if not segments:
                key = _row_key(document, index, offset - start)
            segments.append((pieces, offset, stop))
            used += stop - offset
        if not cross_documents and segments:
            yield _packed(key, segments, used, vocab, document_ids)
            segments, used, made = [], 0, made + 1
            budget = next_budget()
        elif segments and used + 1 <= budget:
            segments.append(None)
            used += 1
    if segments:
        yield _packed(key, segments, used, vocab, document_ids)


def _row_key(document: dict, sentence: int, offset: int) -> str:
    """A packed row's key: its document and the sentence piece it starts at, with the offset
    into the piece where it starts inside one (TOKEN-BLOCKS)."""
    return f"{document['key']}:{sentence}" + (f"+{offset}" if offset else "")


def _packed(
    key: str,
    segments: list[Segment | None],
    used: int,
    vocab: Vocabulary,
    document_ids: bool = False,
) -> dict:
    """One single-segment sequence [CLS] body [SEP] of sentence pieces and separators (a
    separator at the very end is dropped); `sentence_starts` at the first token of every
    piece and separator. Runs of contiguous pieces of one document are copied as one slice.
    With `document_ids`, "document_ids" numbers the row's documents (`pack_sentences`)."""
    if segments[-1] is None:
        segments, used = segments[:-1], used - 1
    length = used + 2
    out = {
        "input_ids": np.empty(length, np.int64),
        "word_starts": np.ones(length, bool),
        "phrases": np.zeros(length, np.uint8),
    }
    out["input_ids"][0], out["input_ids"][-1] = vocab.cls, vocab.sep
    sentence_starts = np.zeros(length, bool)
    firsts = []  # first position of each piece and separator
    position, run = 1, None  # run: the contiguous slice not yet copied
    for segment in segments:
        firsts.append(position + (0 if run is None else run[2] - run[1]))
        if (
            run is not None
            and segment is not None
            and segment[0] is run[0]
            and segment[1] == run[2]
        ):
            run = (run[0], run[1], segment[2])
            continue
        if run is not None:
            position = _fill(out, position, run)
        if segment is None:
            out["input_ids"][position] = vocab.sep  # word start, no phrase flag
            position, run = position + 1, None
        else:
            run = segment
    if run is not None:
        _fill(out, position, run)
    sentence_starts[firsts] = True
    sequence = {
        "key": key,
        "input_ids": out["input_ids"],
        "token_type_ids": np.zeros(length, np.int64),
        "word_starts": out["word_starts"],
        "phrases": out["phrases"],
        "next_sentence_label": IGNORE_INDEX,
        "sentence_starts": sentence_starts,
    }
    if document_ids:
        sequence["document_ids"] = _document_ids(segments, firsts, length)
    return sequence


def _document_ids(segments: list[Segment | None], firsts: list[int], length: int) -> np.ndarray:
    """(length,) int64: 0 from [CLS] on, one more from the first token of each piece of a
    document other than the previous piece's (a separator keeps the document before it)."""
    ids = np.zeros(length, np.int64)
    previous = None
    for segment, first in zip(segments, firsts, strict=True):
        if segment is None:
            continue
        if previous is not None and segment[0] is not previous:
            ids[first:] += 1
        previous = segment[0]
    return ids


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


def _truncate(segment: Segment, keep: int, rng: np.random.Generator) -> Segment:
    """Keep `keep` tokens, removing each surplus token from the front or the back at random."""
    pieces, start, stop = segment
    surplus = stop - start - keep
    if surplus <= 0:
        return segment
    front = int(rng.binomial(surplus, 0.5))
    return pieces, start + front, start + front + keep


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
    split = (
        (d, SentencePieces(d, max_tokens), rng)
        for d, rng in _keyed_documents(documents, seed, epoch, STREAM_FORMAT)
    )
    for (document, pieces, rng), pool in random_document_pools(split, pool_size):
        short = rng.random() < short_seq_probability
        target = int(rng.integers(2, max_tokens + 1)) if short else max_tokens
        starts, stops = pieces.starts, pieces.stops
        chunk_start, used, i = 0, 0, 0
        while i < len(starts):
            used += stops[i] - starts[i]
            if i == len(starts) - 1 or used >= target or (single_sentences and i > chunk_start):
                b_target = None if single_sentences else target
                pair, unused = _labelled_pair(
                    pieces, chunk_start, i + 1, b_target, pool, rng, pair_task, random_probability
                )
                if pair is not None:
                    first, second, label = pair
                    keep_a, keep_b = truncated_lengths(
                        first[2] - first[1], second[2] - second[1], max_tokens
                    )
                    yield _pair_sequence(
                        f"{document['key']}:{chunk_start}",
                        _truncate(first, keep_a, rng),
                        _truncate(second, keep_b, rng),
                        vocab,
                        label,
                    )
                i -= unused  # sentences not used by a random B start the next chunk
                chunk_start, used = i + 1, 0
            i += 1


def _keyed_documents(
    documents: Iterable[dict], seed: int, epoch: int, stream: int, block: int = 64
) -> Iterator[tuple[dict, np.random.Generator]]:
    """Each document with its `keyed_generator(seed, epoch, stream, key)`, the generators
    seeded `block` documents at a time (`keyed_generators`)."""
    documents = iter(documents)
    while chunk := list(islice(documents, block)):
        keys = [document["key"] for document in chunk]
        yield from zip(chunk, keyed_generators(seed, epoch, stream, keys), strict=True)


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
    pieces: SentencePieces,
    chunk_start: int,
    chunk_stop: int,
    target: int | None,
    pool: Pool,
    rng: np.random.Generator,
    pair_task: str,
    random_probability: float,
) -> tuple[tuple[Segment, Segment, int] | None, int]:
    """((first, second, label) or None, number of chunk sentences left unused) of the chunk
    of pieces [chunk_start, chunk_stop). A random second segment fills A up to `target`
    tokens (None: a single sentence)."""
    starts, stops = pieces.starts, pieces.stops
    count = chunk_stop - chunk_start
    if count >= 2:
        a_end = int(rng.integers(1, count))
        split = chunk_start + a_end
        a = (pieces, starts[chunk_start], stops[split - 1])
        b = (pieces, starts[split], stops[chunk_stop - 1])
    elif stops[chunk_start] - starts[chunk_start] >= 2:
        a_end = 1
        start, stop = starts[chunk_start], stops[chunk_start]
        cut = start + int(rng.integers(1, stop - start))
        a, b = (pieces, start, cut), (pieces, cut, stop)
    else:
        return None, 0
    b_tokens = 1 if target is None else target - (a[2] - a[1])
    draw = rng.random()
    if pair_task == "sop":
        return ((b, a, 1) if draw < 0.5 else (a, b, 0)), 0
    if pair_task == "three_way":
        if draw < 1 / 3:
            return (a, b, 0), 0
        if draw < 2 / 3:
            return (b, a, 1), 0
        if pool:
            return (a, _random_segment(pool, rng, b_tokens), 2), count - a_end
        return (a, b, 0), 0
    if pair_task == "nsp" and pool and draw < random_probability:
        return (a, _random_segment(pool, rng, b_tokens), 1), count - a_end
    return (a, b, 0 if pair_task == "nsp" else IGNORE_INDEX), 0


def _random_segment(pool: Pool, rng: np.random.Generator, min_tokens: int) -> Segment:
    """Contiguous sentences of a random pooled document, from a random sentence, until at
    least `min_tokens` tokens (or the document's end)."""
    other = pool[int(rng.integers(len(pool)))][1]
    start = int(rng.integers(len(other)))
    first = other.starts[start]
    # the first piece from `start` on whose end reaches min_tokens (pieces are contiguous)
    last = bisect_left(other.stops, first + max(min_tokens, 1), lo=start)
    return other, first, other.stops[min(last, len(other) - 1)]
