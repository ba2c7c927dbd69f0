"""Writing tokenized documents as shards of format 2 (described in `pretrain.data.shard_format`,
which reads them): WebDataset tars whose samples are blocks of consecutive documents.

Documents arrive one at a time (`TokenizedDocument`) or as batches (`DocumentBatch`, what
the tokenizing processes return); either way a block closes after the document that brings it
to `tokens_per_block` tokens, and a shard after `docs_per_shard` documents, so the bytes
depend on the documents and these two settings only, never on how they were batched. Tar
members carry a fixed mtime, owner and mode; each shard is hashed as it is written. (Written
by hand with `tarfile` headers: importing webdataset would import torch in every worker.)
"""

import hashlib
import os
import sys
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pretrain.data.shard_blocks import BLOCK_KEY, block_sha256, encode_keys

SHARD_PATTERN = "shard-{:06d}.tar"
TOKENS_PER_BLOCK = 1 << 20  # ids of 2 MB at uint16


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


@dataclass(frozen=True)
class DocumentBatch:
    """Consecutive non-empty documents as concatenated arrays: `keys` (d,), `ids` (n,) in the
    corpus dtype, `token_ends` int64 (d,) each document's end in ids, `sents` int64 (s,)
    sentence ends in ids, `sentence_ends` int64 (d,) each document's end in sents, `words`
    uint8 (n,) word-start flags, `phrases` uint8 (n,) span flags or None."""

    keys: list[str]
    ids: np.ndarray
    token_ends: np.ndarray
    sents: np.ndarray
    sentence_ends: np.ndarray
    words: np.ndarray
    phrases: np.ndarray | None = None

    @classmethod
    def of(cls, document: TokenizedDocument) -> "DocumentBatch":
        """A batch of one non-empty document."""
        return cls(
            [document.key],
            document.ids,
            np.array([len(document.ids)], np.int64),
            document.sents.astype(np.int64),
            np.array([len(document.sents)], np.int64),
            np.asarray(document.words, np.uint8),
            document.phrases,
        )

    def __len__(self) -> int:
        return len(self.keys)

    def slice(self, start: int, stop: int) -> "DocumentBatch":
        """Documents start .. stop - 1 of this batch (offsets rebased to 0)."""
        t0 = int(self.token_ends[start - 1]) if start else 0
        s0 = int(self.sentence_ends[start - 1]) if start else 0
        t1, s1 = int(self.token_ends[stop - 1]), int(self.sentence_ends[stop - 1])
        return DocumentBatch(
            self.keys[start:stop],
            self.ids[t0:t1],
            self.token_ends[start:stop] - t0,
            self.sents[s0:s1] - t0,
            self.sentence_ends[start:stop] - s0,
            self.words[t0:t1],
            None if self.phrases is None else self.phrases[t0:t1],
        )


def npy_bytes(array: np.ndarray) -> bytes:
    """`array` as the bytes of a .npy file (version 1 header)."""
    array = np.ascontiguousarray(array)
    header = np.lib.format.header_data_from_array_1_0(array)
    buffer = bytearray()

    class _Sink:
        def write(self, data: bytes) -> None:
            buffer.extend(data)

    np.lib.format.write_array_header_1_0(_Sink(), header)
    return bytes(buffer) + array.tobytes()


def block_members(key: str, parts: list[DocumentBatch]) -> list[tuple[str, bytes]]:
    """The tar members of one block holding the documents of `parts`, in order."""
    ids = np.concatenate([p.ids for p in parts])
    starts = np.cumsum([0] + [len(p.ids) for p in parts[:-1]])
    sents = np.concatenate([p.sents + start for p, start in zip(parts, starts, strict=True)])
    sentence_counts = np.concatenate([np.diff(p.sentence_ends, prepend=0) for p in parts])
    words = np.concatenate([p.words for p in parts])
    members = [
        ("docs.npy", npy_bytes(sentence_counts.astype(np.int32))),
        ("sents.npy", npy_bytes(sents.astype(np.int32))),
        ("ids.npy", npy_bytes(ids)),
        ("words.npy", npy_bytes(np.packbits(words.astype(bool)))),
        ("keys.txt", encode_keys([k for p in parts for k in p.keys]).encode("utf-8")),
    ]
    if any(p.phrases is not None for p in parts):
        phrases = [
            p.phrases if p.phrases is not None else np.zeros(len(p.ids), np.uint8) for p in parts
        ]
        members.append(("phrases.npy", npy_bytes(np.concatenate(phrases).astype(np.uint8))))
    return [(f"{key}.{ext}", data) for ext, data in members]


class TarWriter:
    """One tar written member by member, hashed on the way; no record padding at the end."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "wb")
        self._sha256 = hashlib.sha256()
        self.bytes = 0

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._sha256.update(data)
        self.bytes += len(data)

    def add(self, name: str, data: bytes) -> None:
        """Append a read-only member owned by nobody, dated 1970: the bytes depend on `data`."""
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o444, 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        self._write(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
        self._write(data)
        self._write(b"\0" * (-len(data) % tarfile.BLOCKSIZE))

    def close(self) -> str:
        """Write the end-of-archive marker and close; returns the hex sha256."""
        self._write(b"\0" * (2 * tarfile.BLOCKSIZE))
        self._file.close()
        return self._sha256.hexdigest()


class ShardWriter:
    """Writes documents into `out_dir/<shard_name(i)>` (default `shard-NNNNNN.tar`),
    `docs_per_shard` documents each in blocks of about `tokens_per_block` tokens, and records
    per shard its name, documents, tokens, bytes, sha256 and blocks."""

    def __init__(
        self,
        out_dir: str | Path,
        docs_per_shard: int,
        tokens_per_block: int = TOKENS_PER_BLOCK,
        shard_name: Callable[[int], str] = SHARD_PATTERN.format,
    ):
        self.out_dir = Path(out_dir)
        self.docs_per_shard, self.tokens_per_block = docs_per_shard, tokens_per_block
        self.shard_name = shard_name
        self.shards: list[dict] = []
        self._tar: TarWriter | None = None
        self._block: list[DocumentBatch] = []
        self._block_tokens = 0

    def write(self, document: TokenizedDocument) -> None:
        """Append one non-empty document."""
        self.write_batch(DocumentBatch.of(document))

    def write_batch(self, batch: DocumentBatch) -> None:
        """Append the documents of `batch`, closing blocks and shards where they fill up."""
        start = 0
        while start < len(batch):
            if self._tar is None:
                name = self.shard_name(len(self.shards))
                self._tar = TarWriter(self.out_dir / name)
                self.shards.append({"name": name, "documents": 0, "tokens": 0, "blocks": []})
            shard = self.shards[-1]
            ends = batch.token_ends[start:] - (batch.token_ends[start - 1] if start else 0)
            crossing = int(np.searchsorted(ends, self.tokens_per_block - self._block_tokens))
            take = min(crossing + 1, self.docs_per_shard - shard["documents"], len(batch) - start)
            part = batch.slice(start, start + take)
            self._block.append(part)
            self._block_tokens += len(part.ids)
            shard["documents"] += take
            start += take
            if self._block_tokens >= self.tokens_per_block:
                self._flush_block()
            if shard["documents"] == self.docs_per_shard:
                self._finish_shard()

    def _flush_block(self) -> None:
        if not self._block:
            return
        assert self._tar is not None
        blocks = self.shards[-1]["blocks"]
        key = BLOCK_KEY.format(len(blocks))
        members = block_members(key, self._block)
        for name, data in members:
            self._tar.add(name, data)
        blocks.append(
            {
                "documents": sum(len(p) for p in self._block),
                "tokens": self._block_tokens,
                "sha256": block_sha256([(name[len(key) + 1 :], data) for name, data in members]),
            }
        )
        self.shards[-1]["tokens"] += self._block_tokens
        self._block, self._block_tokens = [], 0

    def _finish_shard(self) -> None:
        self._flush_block()
        assert self._tar is not None
        sha256 = self._tar.close()
        shard = self.shards[-1]
        blocks = shard.pop("blocks")
        shard.update(bytes=self._tar.bytes, sha256=sha256, blocks=blocks)
        self._tar = None

    def close(self) -> list[dict]:
        """Finish the last shard; returns the shard records."""
        if self._tar is not None:
            self._finish_shard()
        return self.shards

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rewrite_shard(
    path: str | Path,
    documents: Iterable[TokenizedDocument],
    tokens_per_block: int = TOKENS_PER_BLOCK,
) -> dict:
    """Replace the shard at `path` with `documents` (which may be read from it as they come:
    the new shard is written beside it and renamed over it once complete). Returns its new
    {"documents", "tokens", "bytes", "sha256", "blocks"}."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        writer = ShardWriter(
            path.parent, sys.maxsize, tokens_per_block, shard_name=lambda _: partial.name
        )
        for document in documents:
            writer.write(document)
        records = writer.close()
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    if not records:
        raise ValueError(f"{path}: no document to write")
    record = records[0]
    record.pop("name")
    return record
