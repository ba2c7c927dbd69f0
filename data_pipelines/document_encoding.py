"""Raw documents -> token ids, sentence ends and word starts, in `num_proc` processes.

A document is cleaned (`normalize`), split into sentences (`split_sentences`) and every
sentence is encoded on its own, without special tokens; sentences that give no token are left
out, and a document with none is empty. A token starts a word when its word id differs from
the previous token's, and a sentence's first token always does; with a segmenter
(`segmenter=jieba`) the word starts of Chinese text come from word segmentation (see
`data_pipelines.chinese`).

`encode_documents` does this for many documents at once, with one `encode_batch` call for all
their sentences: the same ids, sentence ends and word starts as `tokenize_document` gives one
document at a time (the reference, kept for tests), at the tokenizer's batch speed.
`encode_corpus` runs it over a corpus in spawned processes, about `CHUNK_BYTES` of text a
task, results in input order, with at most 4 tasks per process in flight (memory stays flat
in the corpus size) and a progress bar in MB of text per second with the time left, documents and documents per second.
"""

import json
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain
from multiprocessing import get_context

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data_pipelines.chinese import JiebaSegmenter, make_segmenter, segmented_word_starts
from data_pipelines.shard_writer import DocumentBatch, TokenizedDocument
from data_pipelines.sources import RawDocument, document_key  # noqa: F401 (re-exported)
from data_pipelines.text import documents_sentences, normalize, split_sentences

CHUNK_BYTES = 1 << 19  # text per task: 512 kB


def _word_starts(word_ids: np.ndarray, sentence_starts: np.ndarray) -> np.ndarray:
    """uint8 (n,) flags: 1 where the word id changes, and at every sentence start."""
    words = np.ones(len(word_ids), dtype=np.uint8)
    words[1:] = word_ids[1:] != word_ids[:-1]
    words[sentence_starts] = 1
    return words


def _segment(words, sentences, encodings, starts, ends, segmenter) -> None:
    for sentence, encoding, start, end in zip(sentences, encodings, starts, ends, strict=True):
        words[start:end] = segmented_word_starts(
            sentence, encoding.offsets, words[start:end], segmenter
        )


def encode_sentences(
    tokenizer: Tokenizer,
    sentences: list[str],
    dtype: str,
    segmenter: JiebaSegmenter | None = None,
) -> tuple[np.ndarray, ...]:
    """Token ids (n,) as `dtype`, sentence end offsets (s,) int32 and word-start flags (n,)
    uint8 of `sentences`, each encoded without special tokens. With a `segmenter`, tokens
    that begin with a CJK character start a word where the segmenter's words start instead.
    Sentences that give no token are left out."""
    pairs = (
        [
            (s, e)
            for s, e in zip(
                sentences,
                tokenizer.encode_batch(sentences, add_special_tokens=False),
                strict=True,
            )
            if e.ids
        ]
        if sentences
        else []
    )
    encodings = [e for _, e in pairs]
    ends = np.cumsum([len(e.ids) for e in encodings], dtype=np.int64)
    n = int(ends[-1]) if len(ends) else 0
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=dtype, count=n)
    word_ids = np.fromiter(
        chain.from_iterable(e.word_ids for e in encodings), dtype=np.int64, count=n
    )
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64) if n else ends
    words = _word_starts(word_ids, starts)
    if segmenter is not None:
        _segment(words, [s for s, _ in pairs], encodings, starts.tolist(), ends.tolist(), segmenter)
    return ids, ends.astype(np.int32), words


def tokenize_document(
    document: RawDocument,
    tokenizer: Tokenizer,
    dtype: str,
    segmenter: JiebaSegmenter | None = None,
) -> TokenizedDocument:
    """Clean, sentence-split and tokenize one raw document (word starts from `segmenter` for
    Chinese text, when given): the reference that `encode_documents` equals."""
    ids, sents, words = encode_sentences(
        tokenizer, split_sentences(normalize(document.text)), dtype, segmenter
    )
    return TokenizedDocument(document.key, document.source, ids, sents, words)


@dataclass(frozen=True)
class EncodedChunk:
    """The result of `encode_documents`: `batch` holds the non-empty documents; `tokens`
    int64 (d,) and `sentences` int64 (d,) count every input document's tokens and
    sentences (0 for an empty one), in input order."""

    batch: DocumentBatch
    tokens: np.ndarray
    sentences: np.ndarray


_CONTINUATION_TABLES: dict[int, tuple[Tokenizer, np.ndarray | None]] = {}


def continuation_table(tokenizer: Tokenizer) -> np.ndarray | None:
    """bool (vocab,): which ids are WordPiece continuations (`##x`), for a tokenizer whose
    words come from BertPreTokenizer and WordPiece (kinds `wordpiece` and `chinese`); None
    for other tokenizers. There a token starts a word iff it is no continuation: WordPiece
    gives a word's first piece without the prefix and every later piece with it, and "#" is
    punctuation, a word of its own, so no word's first piece begins with "##"."""
    cached = _CONTINUATION_TABLES.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    state = json.loads(tokenizer.to_str())
    model, pre = state.get("model") or {}, state.get("pre_tokenizer") or {}
    table = None
    if (
        model.get("type") == "WordPiece"
        and pre.get("type") == "BertPreTokenizer"
        and hasattr(tokenizer, "encode_batch_fast")
    ):
        prefix = model.get("continuing_subword_prefix") or "##"
        table = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), bool)
        for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
            table[index] = token.startswith(prefix)
    _CONTINUATION_TABLES[id(tokenizer)] = (tokenizer, table)
    return table


def encode_documents(
    documents: list[RawDocument],
    tokenizer: Tokenizer,
    dtype: str,
    segmenter: JiebaSegmenter | None = None,
) -> EncodedChunk:
    """`tokenize_document` for every document of `documents`, with one `encode_batch` call
    for all their sentences; empty documents are counted, not kept."""
    keys = [d.key for d in documents]
    return encode_texts([d.text for d in documents], keys, tokenizer, dtype, segmenter)


def encode_texts(
    texts: list[str],
    keys: list[str],
    tokenizer: Tokenizer,
    dtype: str,
    segmenter: JiebaSegmenter | None = None,
) -> EncodedChunk:
    """`encode_documents` of the documents of raw `texts` and `keys`."""
    sentences, sentence_counts = documents_sentences(texts)
    # Without a segmenter, WordPiece word starts follow from the ids alone, so the encoder may
    # skip word ids and offsets (about 15% faster); the result is the same.
    continuations = continuation_table(tokenizer) if segmenter is None else None
    encode = tokenizer.encode_batch if continuations is None else tokenizer.encode_batch_fast
    encodings = encode(sentences, add_special_tokens=False) if sentences else []
    lengths = np.fromiter((len(e) for e in encodings), np.int64, count=len(encodings))
    owner = np.repeat(np.arange(len(texts)), sentence_counts)
    kept = lengths > 0
    if not kept.all():
        keep = np.flatnonzero(kept).tolist()
        encodings = [encodings[i] for i in keep]
        sentences = [sentences[i] for i in keep]
        lengths, owner = lengths[kept], owner[kept]
    ends = np.cumsum(lengths)
    n = int(ends[-1]) if len(ends) else 0
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=dtype, count=n)
    starts = ends - lengths
    if continuations is not None:
        words = (~continuations[ids]).astype(np.uint8)
        words[starts] = 1
    else:
        word_ids = np.fromiter(
            chain.from_iterable(e.word_ids for e in encodings), dtype=np.int64, count=n
        )
        words = _word_starts(word_ids, starts)
    if segmenter is not None:
        _segment(words, sentences, encodings, starts.tolist(), ends.tolist(), segmenter)
    tokens = np.bincount(owner, weights=lengths, minlength=len(texts)).astype(np.int64)
    counts = np.bincount(owner, minlength=len(texts)).astype(np.int64)
    nonempty = np.flatnonzero(tokens > 0)
    batch = DocumentBatch(
        [keys[i] for i in nonempty.tolist()],
        ids,
        np.cumsum(tokens[nonempty]),
        ends,
        np.cumsum(counts[nonempty]),
        words,
    )
    return EncodedChunk(batch, tokens, counts)


_worker_tokenizer: Tokenizer | None = None
_worker_segmenter: JiebaSegmenter | None = None


def _init_worker(tokenizer_json: str, segmenter: str) -> None:
    global _worker_tokenizer, _worker_segmenter
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # processes give the parallelism
    _worker_tokenizer = Tokenizer.from_str(tokenizer_json)
    _worker_segmenter = make_segmenter(segmenter)


def _encode_in_worker(texts: list[str], keys: list[str], dtype: str) -> EncodedChunk:
    assert _worker_tokenizer is not None, "worker not initialised"
    return encode_texts(texts, keys, _worker_tokenizer, dtype, _worker_segmenter)


def _chunks(
    documents: Iterable[RawDocument], size_bytes: int
) -> Iterator[tuple[list[RawDocument], int]]:
    """Runs of consecutive documents of about `size_bytes` of text, with their size."""
    chunk: list[RawDocument] = []
    size = 0
    for document in documents:
        chunk.append(document)
        size += len(document.text.encode("utf-8"))
        if size >= size_bytes:
            yield chunk, size
            chunk, size = [], 0
    if chunk:
        yield chunk, size


def default_num_proc() -> int:
    """The cores this process may run on (the SLURM allocation, not the whole node)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def encode_corpus(
    documents: Iterable[RawDocument],
    tokenizer: Tokenizer,
    dtype: str,
    num_proc: int | None = None,
    segmenter: str = "none",
    total_bytes: int | None = None,
    progress: bool | None = None,
    chunk_bytes: int | None = None,
) -> Iterator[tuple[list[RawDocument], EncodedChunk]]:
    """(documents, their EncodedChunk) for consecutive runs of `documents`, in input order,
    word starts from the `segmenter` named (`none` or `jieba`). `num_proc` spawned processes
    (None: every core this process may use; 1: this process) do the work, `chunk_bytes` of
    text a task (None: CHUNK_BYTES). A tqdm bar counts
    MB of text against `total_bytes` (`progress` None: shown only on a terminal)."""
    num_proc = num_proc or default_num_proc()
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    bar = tqdm(
        desc="prepare",
        total=total_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        disable=None if progress is None else not progress,
    )
    try:
        if num_proc <= 1:
            word_segmenter = make_segmenter(segmenter)
            for chunk, size in _chunks(documents, chunk_bytes):
                yield chunk, encode_documents(chunk, tokenizer, dtype, word_segmenter)
                _advance(bar, size, len(chunk))
            _complete(bar)
            return
        # spawn: the parent's tokenizers threads must not be forked. A worker that dies raises
        # BrokenProcessPool here instead of hanging the run.
        with ProcessPoolExecutor(
            num_proc,
            mp_context=get_context("spawn"),
            initializer=_init_worker,
            initargs=(tokenizer.to_str(), segmenter),
        ) as pool:
            pending: deque = deque()
            for chunk, size in _chunks(documents, chunk_bytes):
                texts, keys = [d.text for d in chunk], [d.key for d in chunk]
                pending.append((chunk, size, pool.submit(_encode_in_worker, texts, keys, dtype)))
                if len(pending) >= 4 * num_proc:
                    chunk, size, future = pending.popleft()
                    yield chunk, future.result()
                    _advance(bar, size, len(chunk))
            while pending:
                chunk, size, future = pending.popleft()
                yield chunk, future.result()
                _advance(bar, size, len(chunk))
        _complete(bar)
    finally:
        bar.close()


def _advance(bar: tqdm, size: int, documents: int) -> None:
    """Move the bar by `size` bytes of text and show documents done and documents/s."""
    bar.update(size)
    done = getattr(bar, "documents_done", 0) + documents
    bar.documents_done = done
    elapsed = bar.format_dict.get("elapsed") or 0.0
    if not bar.disable:
        bar.set_postfix_str(
            f"{done:,} docs, {done / max(elapsed, 1e-9):,.0f} docs/s", refresh=False
        )


def _complete(bar: tqdm) -> None:
    """Fill the bar: its total counts the blank lines between documents too."""
    if bar.total:
        bar.update(max(0, bar.total - bar.n))
