"""The blocks of a shard (format 2, see `pretrain.data.shard_format`): their tar members, the
document keys stored as runs, and reading them back with every check.

Read forward only, one member at a time: a block is decoded once its members are read, and a
block wholly before the first document wanted is skipped after its `docs.npy` (seeking over
the rest), never decoded.
"""

import hashlib
import io
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

BLOCK_MEMBERS = ("docs.npy", "sents.npy", "ids.npy", "words.npy", "keys.txt")
OPTIONAL_MEMBERS = ("phrases.npy",)
IDS_DTYPES = ("uint8", "uint16", "uint32")
# Values of the per-token `phrases` flags.
OUTSIDE_SPAN, PHRASE_START, ENTITY_START, INSIDE_SPAN = 0, 1, 2, 3
BLOCK_KEY = "{:06d}"
_BLOCK = tarfile.BLOCKSIZE
PREPARE_HINT = "re-run `pretrain-data prepare` for this directory"
_KEY_DIGITS = re.compile(r"^(.*?)(\d*)$", re.DOTALL)


class ShardError(ValueError):
    """Shards or their manifest are missing, damaged or do not match; the message names the
    file and says what to do."""


def upgrade_hint(shards_dir: str | Path) -> str:
    """The one line that tells a user how to convert format-1 shards in `shards_dir`."""
    return f"convert them with `pretrain-data upgrade {shards_dir}`"


def encode_keys(keys: list[str]) -> str:
    """The `keys.txt` text of a block's document `keys` (runs of consecutive numbers)."""
    lines: list[str] = []
    run: list = []  # [prefix, first digits, count]
    for key in keys:
        if "\t" in key or "\n" in key:
            raise ValueError(f"document key {key!r} holds a tab or line break")
        prefix, digits = _KEY_DIGITS.match(key).groups()
        if run and run[0] == prefix and run[1] and _run_key(run, run[2]) == key:
            run[2] += 1
            continue
        if run:
            lines.append(f"{run[0]}\t{run[1]}\t{run[2]}")
        run = [prefix, digits, 1]
    if run:
        lines.append(f"{run[0]}\t{run[1]}\t{run[2]}")
    return "\n".join(lines) + "\n" if lines else ""


def _run_key(run: list, i: int) -> str:
    return f"{run[0]}{str(int(run[1]) + i).zfill(len(run[1]))}"


def decode_keys(text: str) -> list[str]:
    """Document keys of a block from its `keys.txt` text. Raises ValueError when malformed."""
    keys: list[str] = []
    for line in text.splitlines():
        prefix, first, count = line.split("\t")
        if not first:
            if count != "1":
                raise ValueError(f"run {line!r} without a number holds more than one key")
            keys.append(prefix)
            continue
        start, width = int(first), len(first)
        keys.extend(f"{prefix}{str(start + i).zfill(width)}" for i in range(int(count)))
    return keys


class ForwardReader:
    """A file read forward only, counting the bytes read or skipped (`offset`)."""

    def __init__(self, f: BinaryIO):
        self.f, self.offset = f, 0

    def read(self, size: int) -> bytes:
        data = self.f.read(size)
        self.offset += len(data)
        return data

    def skip(self, size: int) -> None:
        self.f.seek(size, io.SEEK_CUR)
        self.offset += size


def _damaged(path: Path, what: str) -> ShardError:
    return ShardError(f"{path}: {what} (truncated or damaged); {PREPARE_HINT}")


def _members(path: Path, reader: ForwardReader) -> Iterator[tuple[str, int]]:
    """(name, size) of each member, positioned at its data; the caller reads or skips the
    data (padding is skipped here). Ends at the end-of-archive marker, which must end the
    file (up to zero padding)."""
    while True:
        header = reader.read(_BLOCK)
        if len(header) < _BLOCK:
            raise _damaged(path, f"ends inside a tar header at byte {reader.offset - len(header)}")
        if header == b"\0" * _BLOCK:
            rest = reader.read(1 << 20)
            if len(rest) < _BLOCK or rest.strip(b"\0") or reader.f.read(1):
                raise _damaged(path, f"no clean end-of-archive marker at byte {reader.offset}")
            return
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.TarError as error:
            raise _damaged(
                path, f"bad tar header at byte {reader.offset - _BLOCK} ({error})"
            ) from error
        if not info.isfile():
            raise _damaged(path, f"member {info.name!r} is not a regular file")
        start = reader.offset
        yield info.name, info.size
        if reader.offset != start + info.size:
            raise AssertionError("member data not consumed")
        reader.skip(-info.size % _BLOCK)


def _read_data(path: Path, reader: ForwardReader, name: str, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise _damaged(path, f"member {name} ends after {len(data)} of {size} bytes")
    return data


@dataclass
class _Block:
    """The arrays of one block as read (see the module docstring)."""

    name: str
    docs: np.ndarray
    sents: np.ndarray
    ids: np.ndarray
    words: np.ndarray
    keys: list[str]
    phrases: np.ndarray | None
    sha256: str | None = None  # of its members' contents (`block_sha256`), when asked for


def block_sha256(members: list[tuple[str, bytes]]) -> str:
    """Hex sha256 of one block's content: each member's extension (`docs.npy`, ...), length
    and bytes, in order; the block's key (its place in the shard) is left out, so the same
    documents (keys included) give the same hash in any shard at any place."""
    digest = hashlib.sha256()
    for ext, data in members:
        digest.update(f"{ext}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def block_index(path: Path, reader: ForwardReader) -> list[tuple[int, int]]:
    """(documents, tokens) of each block of a shard, from its `docs.npy` and the last sentence
    end of its `sents.npy` only (the ids and the rest are skipped): the cheap check of a
    manifest's counts. Raises ShardError when the shard's members are not blocks."""
    index: list[tuple[int, int]] = []
    for name, size in _members(path, reader):
        key, _, ext = name.partition(".")
        if ext in ("docs.npy", "sents.npy"):
            array = _load_array(path, name, _read_data(path, reader, name, size))
            if ext == "docs.npy":
                if key != BLOCK_KEY.format(len(index)):
                    raise ShardError(
                        f"{path}: member {name} where block {BLOCK_KEY.format(len(index))} was "
                        f"expected; {PREPARE_HINT}"
                    )
                index.append((len(array), 0))
            elif index:
                index[-1] = (index[-1][0], int(array[-1]) if len(array) else 0)
        else:
            reader.skip(size)
    return index


def _load_array(path: Path, name: str, data: bytes) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ShardError(f"{path}: member {name} is not a valid .npy array ({error})") from error
    if array.ndim != 1:
        raise ShardError(f"{path}: member {name} has shape {array.shape}, expected 1-d")
    return array


def _check_block(path: Path, block: _Block, dtype: str | None, vocab_size: int | None) -> None:
    """Raise ShardError naming the shard and member when the block's arrays disagree."""

    def fail(ext: str, what: str) -> None:
        raise ShardError(
            f"{path}: member {block.name}.{ext}: {what} (not a prepared shard, or damaged); "
            f"{PREPARE_HINT}"
        )

    docs, sents, ids, words = block.docs, block.sents, block.ids, block.words
    expected = {"docs.npy": (docs, "int32"), "sents.npy": (sents, "int32")}
    expected["words.npy"] = (words, "uint8")
    expected["ids.npy"] = (ids, dtype or ids.dtype.name)
    for ext, (array, wanted) in expected.items():
        if array.dtype.name != wanted or (ext == "ids.npy" and wanted not in IDS_DTYPES):
            fail(ext, f"dtype {array.dtype}, expected {wanted}")
    if len(docs) == 0 or docs.min() <= 0 or int(docs.sum(dtype=np.int64)) != len(sents):
        fail("docs.npy", f"{len(docs)} documents whose sentences do not add up to {len(sents)}")
    if sents[0] <= 0 or int(sents[-1]) != len(ids) or not np.all(sents[1:] > sents[:-1]):
        fail("sents.npy", f"sentence ends are not increasing up to the {len(ids)} ids")
    if vocab_size is not None and len(ids) and int(ids.max()) >= vocab_size:
        fail("ids.npy", f"id {int(ids.max())} outside the vocabulary of {vocab_size}")
    if len(words) != (len(ids) + 7) // 8:
        fail("words.npy", f"{len(words)} bytes of bits for {len(ids)} tokens")
    if len(block.keys) != len(docs):
        fail("keys.txt", f"{len(block.keys)} keys for {len(docs)} documents")
    phrases = block.phrases
    if phrases is not None and (
        phrases.dtype != np.uint8 or len(phrases) != len(ids) or int(phrases.max()) > INSIDE_SPAN
    ):
        fail("phrases.npy", f"{phrases.dtype} {phrases.shape}, expected uint8 flags 0..3 per token")


def read_blocks(
    path: Path,
    reader: ForwardReader,
    dtype: str | None,
    skip_documents: int,
    vocab_size: int | None = None,
    hash_blocks: bool = False,
) -> Iterator[tuple[_Block, int]]:
    """(block, its first document to yield) for the blocks of the shard in order; blocks
    wholly inside the first `skip_documents` documents are skipped after reading their
    `docs.npy` only. With `hash_blocks`, each block's `sha256` (`block_sha256`)."""
    members = _members(path, reader)
    pending: tuple[str, int] | None = next(members, None)
    number = 0
    while pending is not None:
        key = BLOCK_KEY.format(number)
        arrays: dict[str, bytes] = {}
        skipping = False
        while pending is not None and pending[0].startswith(key + "."):
            name, size = pending
            ext = name[len(key) + 1 :]
            position = len(arrays)
            wanted = (BLOCK_MEMBERS + OPTIONAL_MEMBERS)[position] if position < 6 else None
            if ext != wanted:
                raise ShardError(
                    f"{path}: member {name} where {key}.{wanted} was expected; {PREPARE_HINT}"
                )
            if skipping:
                reader.skip(size)
                arrays[ext] = b""
            else:
                arrays[ext] = _read_data(path, reader, name, size)
                if ext == "docs.npy":
                    count = len(_load_array(path, name, arrays[ext]))
                    if count <= skip_documents:
                        skipping, skip_documents = True, skip_documents - count
            pending = next(members, None)
        if not arrays:
            name = pending[0]
            if name.endswith((".ids.npy", ".sents.npy", ".words.npy")) and number == 0:
                raise ShardError(
                    f"{path}: a format-1 shard (one sample per document, member {name}); "
                    f"{upgrade_hint(path.parent)}"
                )
            raise ShardError(
                f"{path}: member {name} where block {key} was expected; {PREPARE_HINT}"
            )
        if len(arrays) < len(BLOCK_MEMBERS):
            raise _damaged(path, f"block {key} lacks {BLOCK_MEMBERS[len(arrays)]}")
        number += 1
        if skipping:
            continue
        block = _Block(
            key,
            *(_load_array(path, f"{key}.{e}", arrays[e]) for e in BLOCK_MEMBERS[:4]),
            keys=[],
            phrases=(
                _load_array(path, f"{key}.phrases.npy", arrays["phrases.npy"])
                if "phrases.npy" in arrays
                else None
            ),
        )
        try:
            block.keys = decode_keys(arrays["keys.txt"].decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise ShardError(f"{path}: member {key}.keys.txt is malformed ({error})") from error
        _check_block(path, block, dtype, vocab_size)
        if hash_blocks:
            block.sha256 = block_sha256(list(arrays.items()))
        yield block, skip_documents
        skip_documents = 0


def block_documents(block: _Block, first: int, keep: np.ndarray | None = None) -> Iterator[dict]:
    """The documents of a checked block from document `first` on, as the reader yields them
    (with `keep`, bool per document of the block, only those it keeps). Every array is a
    document's own copy: a document held in a shuffle buffer keeps its tokens alive, never
    its whole block."""
    words = np.unpackbits(block.words, count=len(block.ids)).view(bool)
    sentence_ends = np.cumsum(block.docs)
    token_ends = block.sents[sentence_ends - 1].tolist()
    sentence_ends, counts = sentence_ends.tolist(), block.docs.tolist()
    for i in range(first, len(counts)):
        if keep is not None and not keep[i]:
            continue
        start = token_ends[i - 1] if i else 0
        end = token_ends[i]
        yield {
            "key": block.keys[i],
            "ids": block.ids[start:end].astype(np.int64),
            "sents": block.sents[sentence_ends[i] - counts[i] : sentence_ends[i]] - np.int32(start),
            "words": words[start:end].copy(),
            "phrases": (
                np.zeros(end - start, np.uint8)
                if block.phrases is None
                else block.phrases[start:end].copy()
            ),
        }
