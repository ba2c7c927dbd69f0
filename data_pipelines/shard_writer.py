"""Tokenizing documents and writing them as WebDataset shards (the format is described in
`pretrain.data.shard_format`, which reads them).

Documents are cleaned, split into sentences and tokenized sentence by sentence (no special
tokens) in worker processes; results come back in input order, so the same input always gives
the same shards. With a segmenter (`segmenter=jieba`) the word starts of Chinese text come
from word segmentation (see `data_pipelines.chinese`). Shards are plain tar files in WebDataset's layout (`<key>.<ext>` members,
a sample's members adjacent); members carry a fixed mtime, owner and mode, so the bytes depend
on the content only. (Written with `tarfile`: importing webdataset would import torch in
every worker process.)
"""

import hashlib
import io
import os
import tarfile
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from data_pipelines.chinese import JiebaSegmenter, make_segmenter, segmented_word_starts
from data_pipelines.sources import RawDocument
from data_pipelines.text import normalize, split_sentences
from pretrain.data.shard_format import file_sha256

SHARD_PATTERN = "shard-{:06d}.tar"


@dataclass(frozen=True)
class TokenizedDocument:
    """One document ready for a shard; `ids` (n,) in the corpus dtype, `sents` (s,) int32
    sentence end offsets, `words` (n,) uint8 word-start flags, `phrases` (n,) uint8 span
    flags or None (no annotations). Empty when `ids` is empty."""

    key: str
    source: str
    ids: np.ndarray
    sents: np.ndarray
    words: np.ndarray
    phrases: np.ndarray | None = None


def document_key(source: str, index: int) -> str:
    """Stable, unique sample key: 8 hex digits of sha1(source name) and the document's index
    in its source. Has no dots, as WebDataset keys must not."""
    return f"{hashlib.sha1(source.encode('utf-8')).hexdigest()[:8]}_{index:08d}"


def encode_sentences(
    tokenizer: Tokenizer,
    sentences: list[str],
    dtype: str,
    segmenter: JiebaSegmenter | None = None,
) -> tuple[np.ndarray, ...]:
    """Token ids (n,) as `dtype`, sentence end offsets (s,) int32 and word-start flags (n,)
    uint8 of `sentences`, each encoded without special tokens. A token starts a word when its
    word id differs from the previous token's; a sentence's first token always does. With a
    `segmenter`, tokens that begin with a CJK character start a word where the segmenter's
    words start instead. Sentences that give no token are left out."""
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
    words = np.ones(n, dtype=np.uint8)
    words[1:] = word_ids[1:] != word_ids[:-1]
    words[ends[:-1]] = 1  # a sentence's first token starts a word
    if segmenter is not None:
        starts = np.concatenate(([0], ends[:-1])).tolist()
        for (sentence, encoding), start, end in zip(pairs, starts, ends.tolist(), strict=True):
            words[start:end] = segmented_word_starts(
                sentence, encoding.offsets, words[start:end], segmenter
            )
    return ids, ends.astype(np.int32), words


def tokenize_document(
    document: RawDocument,
    tokenizer: Tokenizer,
    dtype: str,
    segmenter: JiebaSegmenter | None = None,
) -> TokenizedDocument:
    """Clean, sentence-split and tokenize one raw document (word starts from `segmenter` for
    Chinese text, when given)."""
    ids, sents, words = encode_sentences(
        tokenizer, split_sentences(normalize(document.text)), dtype, segmenter
    )
    return TokenizedDocument(
        document_key(document.source, document.index), document.source, ids, sents, words
    )


_worker_tokenizer: Tokenizer | None = None
_worker_segmenter: JiebaSegmenter | None = None


def _init_worker(tokenizer_json: str, segmenter: str) -> None:
    global _worker_tokenizer, _worker_segmenter
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # processes give the parallelism
    _worker_tokenizer = Tokenizer.from_str(tokenizer_json)
    _worker_segmenter = make_segmenter(segmenter)


def _tokenize_chunk(documents: list[RawDocument], dtype: str) -> list[TokenizedDocument]:
    assert _worker_tokenizer is not None, "worker not initialised"
    return [
        tokenize_document(document, _worker_tokenizer, dtype, _worker_segmenter)
        for document in documents
    ]


def _chunks(documents: Iterable[RawDocument], size: int) -> Iterator[list[RawDocument]]:
    chunk: list[RawDocument] = []
    for document in documents:
        chunk.append(document)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def tokenize_documents(
    documents: Iterable[RawDocument],
    tokenizer: Tokenizer,
    dtype: str,
    workers: int = 1,
    chunk_documents: int = 16,
    progress: bool | None = None,
    segmenter: str = "none",
) -> Iterator[TokenizedDocument]:
    """Tokenized `documents` in input order, word starts from the `segmenter` named (`none`
    or `jieba`). With `workers` > 1 a process pool of that many spawned workers does the
    work, `chunk_documents` documents per task, at most 4 tasks per worker in flight (memory
    stays bounded on any corpus); 1 works in this process. A tqdm bar counts documents
    (`progress` None: shown only on a terminal)."""
    bar = tqdm(desc="tokenize", unit="doc", disable=None if progress is None else not progress)
    try:
        if workers <= 1:
            word_segmenter = make_segmenter(segmenter)
            for document in documents:
                yield tokenize_document(document, tokenizer, dtype, word_segmenter)
                bar.update()
            return
        # spawn: the parent's tokenizers threads must not be forked. A worker that dies raises
        # BrokenProcessPool here instead of hanging the run.
        with ProcessPoolExecutor(
            workers,
            mp_context=get_context("spawn"),
            initializer=_init_worker,
            initargs=(tokenizer.to_str(), segmenter),
        ) as pool:
            pending: deque = deque()
            for chunk in _chunks(documents, chunk_documents):
                pending.append(pool.submit(_tokenize_chunk, chunk, dtype))
                if len(pending) >= 4 * workers:
                    results = pending.popleft().result()
                    yield from results
                    bar.update(len(results))
            while pending:
                results = pending.popleft().result()
                yield from results
                bar.update(len(results))
    finally:
        bar.close()


class ShardWriter:
    """Writes documents into `out_dir/shard-NNNNNN.tar`, `docs_per_shard` documents each,
    and records per shard its name, documents, tokens, bytes and sha256."""

    def __init__(self, out_dir: str | Path, docs_per_shard: int):
        self.out_dir = Path(out_dir)
        self.docs_per_shard = docs_per_shard
        self.shards: list[dict] = []
        self._tar: tarfile.TarFile | None = None
        self._documents = self._tokens = 0

    def write(self, document: TokenizedDocument) -> None:
        """Append one non-empty document, starting a new shard when the current one is full."""
        if self._tar is None:
            name = SHARD_PATTERN.format(len(self.shards))
            self._tar = tarfile.open(self.out_dir / name, "w", format=tarfile.USTAR_FORMAT)
            self.shards.append({"name": name})
        write_sample(self._tar, document)
        self._documents += 1
        self._tokens += len(document.ids)
        if self._documents == self.docs_per_shard:
            self._finish_shard()

    def _finish_shard(self) -> None:
        assert self._tar is not None
        self._tar.close()
        self._tar = None
        shard = self.shards[-1]
        path = self.out_dir / shard["name"]
        shard.update(
            documents=self._documents,
            tokens=self._tokens,
            bytes=path.stat().st_size,
            sha256=file_sha256(path),
        )
        self._documents = self._tokens = 0

    def close(self) -> list[dict]:
        """Finish the last shard; returns the shard records."""
        if self._tar is not None:
            self._finish_shard()
        return self.shards

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rewrite_shard(path: str | Path, documents: Iterable[TokenizedDocument]) -> dict:
    """Replace the shard at `path` with `documents` (which may be read from it as they come:
    the new shard is written beside it and renamed over it once complete). Returns its new
    {"documents", "tokens", "bytes", "sha256"}."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    record = {"documents": 0, "tokens": 0}
    try:
        with tarfile.open(partial, "w", format=tarfile.USTAR_FORMAT) as tar:
            for document in documents:
                write_sample(tar, document)
                record["documents"] += 1
                record["tokens"] += len(document.ids)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return {**record, "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def write_sample(tar: tarfile.TarFile, document: TokenizedDocument) -> None:
    """Append the members of one document to `tar`: ids, sents, words and, when the document
    has them, phrases (the order `pretrain.data.shard_format` documents)."""
    members = [("ids.npy", document.ids), ("sents.npy", document.sents)]
    members.append(("words.npy", document.words))
    if document.phrases is not None:
        members.append(("phrases.npy", document.phrases))
    for ext, array in members:
        _add_member(tar, f"{document.key}.{ext}", _npy_bytes(array))


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add a read-only member owned by nobody, dated 1970: the bytes depend on `data` only."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o444, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()
