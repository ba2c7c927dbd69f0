"""The shard format (version 2) and its reader: the manifest, its checks, and the documents
of one shard, one at a time.

A shards directory (written by `pretrain-data prepare`) holds
- `manifest.json`: `format_version` (2), tokenizer (dir, sha256, vocab_size, lowercase), ids
  `dtype`, counts, sources, per shard its `name`, `documents`, `tokens`, `bytes`, `sha256` and
  `blocks` (per block {"documents", "tokens"}, in order), `annotations` (null, or
  {"phrases", "entities", "phrase_spans", "entity_spans"} counts) and the settings;
- `tokenizer/`: the tokenizer the shards were made with; `phrases.txt` / `entities.txt` when
  annotated;
- `shard-NNNNNN.tar`: a WebDataset tar whose samples are *blocks* of consecutive documents
  (up to `tokens_per_block` tokens each, a few MB), keys `000000`, `000001`, ... in order, each
  with these members, in this order:
  - `<block>.docs.npy`: int32 (d,) sentences per document, every one > 0;
  - `<block>.sents.npy`: int32 (s,) sentence end offsets into the block's ids, exclusive,
    strictly increasing, the last equal to len(ids); document i ends where its last
    sentence ends;
  - `<block>.ids.npy`: token ids (n,), the manifest dtype;
  - `<block>.words.npy`: uint8 (ceil(n / 8),), `np.packbits` of the word starts (1 where a
    token starts a word; for Chinese with `segmenter=jieba`, a jieba word);
  - `<block>.keys.txt`: the documents' keys as runs, a line `prefix<TAB>first<TAB>count`
    per run: keys prefix + str(int(first) + i) zero-padded to len(first), i < count (first
    is empty for a key without trailing digits, count then 1);
  - `<block>.phrases.npy` (annotated shards only): uint8 (n,) span flags: 0 outside any span,
    1 first token of a phrase, 2 first token of an entity, 3 later token of a phrase or
    entity; spans start and end at word starts or sentence ends, never overlap nor cross a
    sentence end.
  Members carry a fixed mtime, owner and mode; the tar has no record padding after its
  end-of-archive marker, so a shard is about the size of its content.

Shards are read as a stream, a block at a time, never whole. Every block is checked as it is
read (member names and order, dtypes, lengths, offsets, key count), and a shard read from its
start is hashed on the way and compared with the manifest's sha256 (when a manifest lies
beside it) once its last byte is read: sha256 runs at about 1 GB/s, far above the stream's
MB/s, so the check costs about 1% (benchmarks/RESULTS.md). `pretrain-data verify` checks every
shard of a directory in full without training.
"""

import functools
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

FORMAT_VERSION = 2
MANIFEST_FILE = "manifest.json"
BLOCK_MEMBERS = ("docs.npy", "sents.npy", "ids.npy", "words.npy", "keys.txt")
OPTIONAL_MEMBERS = ("phrases.npy",)
IDS_DTYPES = ("uint8", "uint16", "uint32")
# Values of the per-token `phrases` flags.
OUTSIDE_SPAN, PHRASE_START, ENTITY_START, INSIDE_SPAN = 0, 1, 2, 3
BLOCK_KEY = "{:06d}"
_BLOCK = tarfile.BLOCKSIZE
_PREPARE_HINT = "re-run `pretrain-data prepare` for this directory"
_KEY_DIGITS = re.compile(r"^(.*?)(\d*)$", re.DOTALL)


class ShardError(ValueError):
    """Shards or their manifest are missing, damaged or do not match; the message names the
    file and says what to do."""


def upgrade_hint(shards_dir: str | Path) -> str:
    """The one line that tells a user how to convert format-1 shards in `shards_dir`."""
    return f"convert them with `pretrain-data upgrade {shards_dir}`"


@dataclass(frozen=True)
class Manifest:
    """The parsed `manifest.json` of a shards directory (`root`, absolute)."""

    root: Path
    format_version: int
    tokenizer_sha256: str
    vocab_size: int
    dtype: str
    shards: list[dict]
    counts: dict
    raw: dict

    @property
    def tokenizer_dir(self) -> Path:
        """The tokenizer stored beside the shards."""
        return self.root / self.raw["tokenizer"]["dir"]

    @property
    def annotations(self) -> dict | None:
        """Phrase/entity annotation counts, or None when the shards hold none."""
        return self.raw.get("annotations")

    @property
    def shard_paths(self) -> list[Path]:
        """Paths of the shards, in manifest order."""
        return [self.root / shard["name"] for shard in self.shards]

    @property
    def shard_documents(self) -> list[int]:
        """Documents per shard, in manifest order."""
        return [int(shard["documents"]) for shard in self.shards]

    def block_documents(self, shard: int) -> list[int]:
        """Documents per block of shard number `shard`, in order."""
        return [int(block["documents"]) for block in self.shards[shard]["blocks"]]

    def locate_document(self, index: int) -> tuple[int, int]:
        """(shard number, document number in that shard) of document `index` of the corpus
        in manifest order; `read_documents(shard_paths[s], start_document=d)` starts there.
        Raises IndexError outside 0 .. documents - 1."""
        ends = np.cumsum(self.shard_documents)
        if not 0 <= index < (int(ends[-1]) if len(ends) else 0):
            raise IndexError(f"document {index} of a corpus of {ends[-1]} documents")
        shard = int(np.searchsorted(ends, index, side="right"))
        return shard, index - (int(ends[shard - 1]) if shard else 0)


def file_sha256(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks of `chunk_bytes`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def ids_dtype(vocab_size: int) -> str:
    """The smallest unsigned numpy dtype that holds ids 0 .. vocab_size - 1."""
    for dtype in IDS_DTYPES:
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return dtype
    raise ValueError(f"vocab_size {vocab_size} does not fit in uint32")


def read_manifest_json(shards_dir: str | Path) -> tuple[Path, dict]:
    """(path, parsed object) of `<shards_dir>/manifest.json`, whatever its format version.
    Raises ShardError naming the file when it is missing or not a JSON object."""
    path = Path(shards_dir).resolve() / MANIFEST_FILE
    if not path.is_file():
        raise ShardError(
            f"{path}: no manifest; {_PREPARE_HINT} (or point at the out_dir of a prepare run)"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ShardError(f"{path}: not valid JSON ({error}); {_PREPARE_HINT}") from error
    if not isinstance(raw, dict):
        raise ShardError(f"{path}: not a JSON object; {_PREPARE_HINT}")
    return path, raw


def load_manifest(shards_dir: str | Path) -> Manifest:
    """Parse `<shards_dir>/manifest.json`. Raises ShardError naming the file when it is
    missing, not JSON, of another format version (format 1: with the upgrade command) or
    lacks a key."""
    path, raw = read_manifest_json(shards_dir)
    version = raw.get("format_version")
    if version == 1:
        raise ShardError(
            f"{path.parent}: shards of format 1 (one tar sample per document), this code reads "
            f"format {FORMAT_VERSION}; {upgrade_hint(path.parent)}"
        )
    if version != FORMAT_VERSION:
        raise ShardError(
            f"{path}: format_version is {version!r}, this code reads {FORMAT_VERSION}; {_PREPARE_HINT}"
        )
    try:
        manifest = Manifest(
            root=path.parent,
            format_version=version,
            tokenizer_sha256=str(raw["tokenizer"]["sha256"]),
            vocab_size=int(raw["tokenizer"]["vocab_size"]),
            dtype=str(raw["dtype"]),
            shards=list(raw["shards"]),
            counts=dict(raw["counts"]),
            raw=raw,
        )
        for shard in manifest.shards:
            shard["name"], shard["bytes"], shard["sha256"]  # noqa: B018 (presence check)
            if sum(int(b["documents"]) for b in shard["blocks"]) != shard["documents"]:
                raise TypeError(f"blocks of {shard['name']} do not add up to its documents")
        raw["tokenizer"]["dir"]  # noqa: B018
    except (KeyError, TypeError) as error:
        raise ShardError(f"{path}: missing or malformed key {error}; {_PREPARE_HINT}") from error
    if manifest.dtype not in IDS_DTYPES:
        raise ShardError(f"{path}: dtype {manifest.dtype!r} is not one of {IDS_DTYPES}")
    return manifest


def check_shards(manifest: Manifest, verify_sha256: bool = False) -> None:
    """Check that every shard of the manifest exists with its recorded size in bytes (and,
    with `verify_sha256`, its recorded hash, which reads every byte). Raises ShardError
    naming the first shard at fault."""
    if not manifest.shards:
        raise ShardError(
            f"{manifest.root / MANIFEST_FILE}: lists no shards; {_PREPARE_HINT} with inputs that hold text"
        )
    for shard, path in zip(manifest.shards, manifest.shard_paths, strict=True):
        if not path.is_file():
            raise ShardError(
                f"{path}: shard listed in {manifest.root / MANIFEST_FILE} is missing; {_PREPARE_HINT}"
            )
        size = path.stat().st_size
        if size != shard["bytes"]:
            raise ShardError(
                f"{path}: {size} bytes, the manifest says {shard['bytes']} "
                f"(truncated or rewritten?); {_PREPARE_HINT}"
            )
        if verify_sha256 and file_sha256(path) != shard.get("sha256"):
            raise ShardError(
                f"{path}: sha256 differs from the manifest's (corrupt?); {_PREPARE_HINT}"
            )


def check_tokenizer(manifest: Manifest, tokenizer_dir: str | Path) -> None:
    """Check that `tokenizer_dir/tokenizer.json` is the tokenizer the shards were made with
    (same sha256). Raises ShardError naming both the manifest and the tokenizer."""
    path = Path(tokenizer_dir).resolve() / "tokenizer.json"
    manifest_path = manifest.root / MANIFEST_FILE
    if not path.is_file():
        raise ShardError(
            f"{path}: no tokenizer.json; use the tokenizer the shards of {manifest_path} "
            f"were made with ({manifest.tokenizer_dir})"
        )
    sha = file_sha256(path)
    if sha != manifest.tokenizer_sha256:
        raise ShardError(
            f"the tokenizer {path} (sha256 {sha[:12]}) is not the one the shards of {manifest_path} "
            f"were made with (sha256 {manifest.tokenizer_sha256[:12]}, stored in {manifest.tokenizer_dir}); "
            "use that tokenizer, or prepare the shards again with tokenizer.path pointing at yours"
        )


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


@functools.lru_cache(maxsize=64)
def _manifest_shards(root: str, mtime_ns: int) -> dict[str, dict]:
    """{shard name: record} of the format-2 manifest in `root` ({} when unreadable)."""
    try:
        raw = json.loads((Path(root) / MANIFEST_FILE).read_text(encoding="utf-8"))
        if raw.get("format_version") != FORMAT_VERSION:
            return {}
        return {s["name"]: {**s, "dtype": raw["dtype"]} for s in raw["shards"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _recorded_shard(path: Path) -> dict | None:
    """The manifest's record of the shard at `path`, when a manifest lies beside it."""
    manifest = path.parent / MANIFEST_FILE
    try:
        mtime = manifest.stat().st_mtime_ns
    except OSError:
        return None
    return _manifest_shards(str(path.parent.resolve()), mtime).get(path.name)


class _HashingReader:
    """A file read forward only, hashing what it reads (when `digest` is given)."""

    def __init__(self, f: BinaryIO, digest):
        self.f, self.digest, self.offset = f, digest, 0

    def read(self, size: int) -> bytes:
        data = self.f.read(size)
        if self.digest is not None:
            self.digest.update(data)
        self.offset += len(data)
        return data

    def skip(self, size: int) -> None:
        if self.digest is not None:
            self.read(size)
            return
        self.f.seek(size, io.SEEK_CUR)
        self.offset += size


def _damaged(path: Path, what: str) -> ShardError:
    return ShardError(f"{path}: {what} (truncated or damaged); {_PREPARE_HINT}")


def _members(path: Path, reader: _HashingReader) -> Iterator[tuple[str, int]]:
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


def _read_data(path: Path, reader: _HashingReader, name: str, size: int) -> bytes:
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


def _load_array(path: Path, name: str, data: bytes) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ShardError(f"{path}: member {name} is not a valid .npy array ({error})") from error
    if array.ndim != 1:
        raise ShardError(f"{path}: member {name} has shape {array.shape}, expected 1-d")
    return array


def _check_block(path: Path, block: _Block, dtype: str | None) -> None:
    """Raise ShardError naming the shard and member when the block's arrays disagree."""

    def fail(ext: str, what: str) -> None:
        raise ShardError(
            f"{path}: member {block.name}.{ext}: {what} (not a prepared shard, or damaged); "
            f"{_PREPARE_HINT}"
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
    if len(words) != (len(ids) + 7) // 8:
        fail("words.npy", f"{len(words)} bytes of bits for {len(ids)} tokens")
    if len(block.keys) != len(docs):
        fail("keys.txt", f"{len(block.keys)} keys for {len(docs)} documents")
    phrases = block.phrases
    if phrases is not None and (
        phrases.dtype != np.uint8 or len(phrases) != len(ids) or int(phrases.max()) > INSIDE_SPAN
    ):
        fail("phrases.npy", f"{phrases.dtype} {phrases.shape}, expected uint8 flags 0..3 per token")


def _blocks(
    path: Path, reader: _HashingReader, dtype: str | None, skip_documents: int
) -> Iterator[tuple[_Block, int]]:
    """(block, its first document to yield) for the blocks of the shard in order; blocks
    wholly inside the first `skip_documents` documents are skipped after reading their
    `docs.npy` only."""
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
                    f"{path}: member {name} where {key}.{wanted} was expected; {_PREPARE_HINT}"
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
                f"{path}: member {name} where block {key} was expected; {_PREPARE_HINT}"
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
        _check_block(path, block, dtype)
        yield block, skip_documents
        skip_documents = 0


def _documents(block: _Block, first: int) -> Iterator[dict]:
    """The documents of a checked block from document `first` on, as the reader yields them."""
    ids = block.ids.astype(np.int64)
    words = np.unpackbits(block.words, count=len(ids)).view(bool)
    phrases = block.phrases if block.phrases is not None else np.zeros(len(ids), np.uint8)
    sentence_ends = np.cumsum(block.docs)
    token_ends = block.sents[sentence_ends - 1]
    for i in range(first, len(block.docs)):
        start = int(token_ends[i - 1]) if i else 0
        end = int(token_ends[i])
        sents = block.sents[sentence_ends[i] - block.docs[i] : sentence_ends[i]] - np.int32(start)
        yield {
            "key": block.keys[i],
            "ids": ids[start:end],
            "sents": sents,
            "words": words[start:end],
            "phrases": phrases[start:end],
        }


def read_documents(
    shard_path: str | Path, start_document: int = 0, expected_sha256: str | None = None
) -> Iterator[dict]:
    """Documents of one shard in order, from document number `start_document` on, streamed a
    block at a time: {"key": str, "ids": int64 (n,), "sents": int32 (s,) sentence end offsets,
    "words": bool (n,) word starts, "phrases": uint8 (n,) span flags (OUTSIDE_SPAN ..
    INSIDE_SPAN; all zero for shards without annotations)}. Blocks before `start_document`
    are skipped without being decoded. Read from its start, the shard's sha256 is checked
    at its end against `expected_sha256`, or else the manifest beside it (if any). Raises
    ShardError naming the file (and member) when it is missing, truncated, corrupt or of
    format 1."""
    path = Path(shard_path)
    if not path.is_file():
        raise ShardError(f"{path}: shard not found; {_PREPARE_HINT}")
    record = _recorded_shard(path)
    sha256 = expected_sha256 or (record or {}).get("sha256")
    dtype = (record or {}).get("dtype")
    digest = hashlib.sha256() if sha256 and start_document == 0 else None
    try:
        with open(path, "rb") as f:
            reader = _HashingReader(f, digest)
            for block, first in _blocks(path, reader, dtype, start_document):
                yield from _documents(block, first)
    except OSError as error:
        raise ShardError(f"{path}: cannot be read ({error}); {_PREPARE_HINT}") from error
    if digest is not None and digest.hexdigest() != sha256:
        raise ShardError(
            f"{path}: sha256 differs from the manifest's (corrupt or rewritten?); {_PREPARE_HINT}"
        )


def verify_shards(manifest: Manifest) -> None:
    """Read every document of every shard of `manifest` (checking every block, and each
    shard's sha256) and compare the documents and tokens with the manifest's counts. Raises
    ShardError naming the first shard at fault."""
    check_shards(manifest)
    for shard, path in zip(manifest.shards, manifest.shard_paths, strict=True):
        documents = tokens = 0
        for document in read_documents(path, expected_sha256=shard["sha256"]):
            documents += 1
            tokens += len(document["ids"])
        if (documents, tokens) != (shard["documents"], shard["tokens"]):
            raise ShardError(
                f"{path}: holds {documents} documents and {tokens} tokens, the manifest says "
                f"{shard['documents']} and {shard['tokens']}; {_PREPARE_HINT}"
            )
