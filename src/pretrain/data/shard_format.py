"""The shard format (version 2) and its reader: the manifest, its checks, and the documents
of one shard, one at a time.

A shards directory (written by `pretrain-data prepare`) holds
- `manifest.json`: `format_version` (2), tokenizer (dir, sha256, vocab_size, lowercase), ids
  `dtype`, counts, sources, per shard its `name`, `documents`, `tokens`, `bytes`, `sha256` and
  `blocks` (per block {"documents", "tokens", "sha256"}, in order; the block's sha256 is of
  its members' contents, `block_sha256`, so a block repeated in another shard is seen;
  manifests written before it have none), `annotations` (null, or
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

A shard is read whole into memory (shards are tens of MB at most) and its sha256 compared
with the manifest's before any of its documents is used; its blocks are then decoded one at a
time (the blocks' members, key runs and checks: `pretrain.data.shard_blocks`), each checked as
it is decoded (member names and order, dtypes, lengths, offsets, ids inside the vocabulary,
key count). sha256 runs at about 500 MB/s on one core, the training stream consumes a few MB
of shards per second and core, so the check costs well under 1% there (benchmarks/RESULTS.md). `pretrain-data verify` checks every shard of a
directory in full without training.
"""

import functools
import hashlib
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pretrain.data.manifest_table import ManifestTable, mapped_table, registered_table
from pretrain.data.shard_blocks import (
    BLOCK_KEY,
    BLOCK_MEMBERS,
    ENTITY_START,
    IDS_DTYPES,
    INSIDE_SPAN,
    OPTIONAL_MEMBERS,
    OUTSIDE_SPAN,
    PHRASE_START,
    PREPARE_HINT,
    ForwardReader,
    ShardError,
    block_documents,
    decode_keys,
    encode_keys,
    read_blocks,
    upgrade_hint,
)
from pretrain.data.shard_checks import check_block_index, repeat_message, repeated_shards
from pretrain.data.shard_table import ShardPaths

# The format's public names, those of its blocks included (`shard_blocks`).
__all__ = [
    "BLOCK_KEY",
    "BLOCK_MEMBERS",
    "ENTITY_START",
    "FORMAT_VERSION",
    "IDS_DTYPES",
    "INSIDE_SPAN",
    "MANIFEST_FILE",
    "OPTIONAL_MEMBERS",
    "OUTSIDE_SPAN",
    "PHRASE_START",
    "Manifest",
    "ShardError",
    "check_shards",
    "check_tokenizer",
    "decode_keys",
    "encode_keys",
    "file_sha256",
    "ids_dtype",
    "load_manifest",
    "read_documents",
    "read_manifest_json",
    "upgrade_hint",
    "verify_shards",
]

FORMAT_VERSION = 2
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    """The parsed `manifest.json` of a shards directory (`root`, absolute)."""

    root: Path
    format_version: int
    tokenizer_sha256: str
    vocab_size: int
    dtype: str
    shards: Sequence[dict]  # a list, or `manifest_table.TableShards` (`open_manifest`)
    counts: dict
    raw: dict  # the parsed JSON (from a table: without "shards")
    table: ManifestTable | None = None  # the node's shard table it was opened from

    @property
    def tokenizer_dir(self) -> Path:
        """The tokenizer stored beside the shards."""
        return self.root / self.raw["tokenizer"]["dir"]

    @property
    def content_sha256(self) -> str:
        """Hex sha256 of what the corpus holds: the manifest as canonical JSON without how it
        was made (`sources`, `config`), so copies of one corpus (a local path, a URL) agree
        and corpora with other shards or another tokenizer do not."""
        if self.table is not None:
            return self.table.header["content_sha256"]
        held = {k: v for k, v in self.raw.items() if k not in ("sources", "config")}
        canonical = json.dumps(held, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def annotations(self) -> dict | None:
        """Phrase/entity annotation counts, or None when the shards hold none."""
        return self.raw.get("annotations")

    @functools.cached_property
    def shard_paths(self) -> list[Path]:
        """Paths of the shards, in manifest order."""
        if self.table is not None:
            return [self.root / name.decode() for name in self.table.arrays["names"]]
        return [self.root / shard["name"] for shard in self.shards]

    @functools.cached_property
    def shard_path_table(self) -> ShardPaths:
        """`shard_paths` as str, compact: from the table's names where the manifest has a
        table (no str or Path per shard), else from `shard_paths`."""
        names = self.table.arrays["names"] if self.table is not None else None
        if names is not None and _plain_names(names):
            return ShardPaths.in_directory(str(self.root), names)
        return ShardPaths([str(path) for path in self.shard_paths])

    @property
    def shard_documents(self) -> list[int]:
        """Documents per shard, in manifest order."""
        if self.table is not None:
            return self.table.arrays["documents"].tolist()
        return [int(shard["documents"]) for shard in self.shards]

    def shard_counts(self, numbers: Sequence[int]) -> tuple[tuple[int, ...], int]:
        """(tokens of each of the shards `numbers`, in that order; documents of them all),
        from the table's arrays where it has every one's tokens (no record a shard), else
        from the records (KeyError "tokens" where one has none)."""
        if self.table is not None:
            numbers = np.asarray(numbers, np.int64)
            tokens = self.table.arrays["tokens"][numbers]
            if not np.any(tokens < 0):
                documents = int(self.table.arrays["documents"][numbers].sum())
                return tuple(tokens.tolist()), documents
        shards = [self.shards[number] for number in numbers]
        return tuple(shard["tokens"] for shard in shards), sum(s["documents"] for s in shards)

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


def _plain_names(names: np.ndarray) -> bool:
    """Whether the bytes array `names` holds plain file names only (no "/", not "", "." or
    ".."), which `root / name` and `os.path.join(str(root), name)` spell alike."""
    odd = (names == b"") | (names == b".") | (names == b"..")
    return b"/" not in np.ascontiguousarray(names).tobytes() and not odd.any()


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
            f"{path}: no manifest; {PREPARE_HINT} (or point at the out_dir of a prepare run)"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ShardError(f"{path}: not valid JSON ({error}); {PREPARE_HINT}") from error
    if not isinstance(raw, dict):
        raise ShardError(f"{path}: not a JSON object; {PREPARE_HINT}")
    return path, raw


def load_manifest(shards_dir: str | Path) -> Manifest:
    """Parse `<shards_dir>/manifest.json`. Raises ShardError naming the file when it is
    missing, not JSON, of another format version (format 1: with the upgrade command) or
    lacks a key."""
    path, raw = read_manifest_json(shards_dir)
    return checked_manifest(path, raw)


def checked_manifest(path: Path, raw: dict) -> Manifest:
    """The `Manifest` of the parsed JSON `raw` of the manifest at `path`, with
    `load_manifest`'s checks (ShardError naming `path`)."""
    version = raw.get("format_version")
    if version == 1:
        raise ShardError(
            f"{path.parent}: shards of format 1 (one tar sample per document), this code reads "
            f"format {FORMAT_VERSION}; {upgrade_hint(path.parent)}"
        )
    if version != FORMAT_VERSION:
        raise ShardError(
            f"{path}: format_version is {version!r}, this code reads {FORMAT_VERSION}; {PREPARE_HINT}"
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
        raise ShardError(f"{path}: missing or malformed key {error}; {PREPARE_HINT}") from error
    if manifest.dtype not in IDS_DTYPES:
        raise ShardError(f"{path}: dtype {manifest.dtype!r} is not one of {IDS_DTYPES}")
    check_manifest_consistency(path, manifest)
    return manifest


def check_manifest_consistency(path: Path, manifest: Manifest) -> None:
    """ShardError naming `path` (the manifest) when it contradicts itself: a shard listed
    twice (its documents would train twice an epoch), a dtype too narrow for vocab_size, or
    counts.documents / counts.tokens other than the sums over the shards."""
    seen: set[str] = set()
    for shard in manifest.shards:
        if shard["name"] in seen:
            raise ShardError(
                f"{path}: shard {shard['name']} is listed more than once (its documents would "
                f"train more than once an epoch); {PREPARE_HINT}"
            )
        seen.add(shard["name"])
    if manifest.vocab_size < 1 or np.iinfo(manifest.dtype).max < manifest.vocab_size - 1:
        raise ShardError(
            f"{path}: dtype {manifest.dtype} cannot hold the ids of vocab_size "
            f"{manifest.vocab_size}; {PREPARE_HINT}"
        )
    for key in ("documents", "tokens"):
        if key not in manifest.counts or any(key not in shard for shard in manifest.shards):
            continue
        total = sum(int(shard[key]) for shard in manifest.shards)
        if int(manifest.counts[key]) != total:
            raise ShardError(
                f"{path}: counts.{key} is {manifest.counts[key]} but its shards hold {total}; "
                f"{PREPARE_HINT}"
            )


def check_shards(manifest: Manifest, verify_sha256: bool = False) -> None:
    """Check that every shard of the manifest exists with its recorded size in bytes (and,
    with `verify_sha256`, its recorded hash, which reads every byte). Raises ShardError
    naming the first shard at fault. A shard's block index is checked against the manifest
    by whoever reads the shard, when it is read (`checked_blocks`)."""
    if not manifest.shards:
        raise ShardError(
            f"{manifest.root / MANIFEST_FILE}: lists no shards; {PREPARE_HINT} with inputs that hold text"
        )
    if manifest.table is not None:
        sizes = manifest.table.arrays["bytes"].tolist()
    else:
        sizes = [shard["bytes"] for shard in manifest.shards]
    for number, (size, path) in enumerate(zip(sizes, manifest.shard_path_table, strict=True)):
        try:
            found = os.stat(path).st_size
        except FileNotFoundError:
            raise ShardError(
                f"{path}: shard listed in {manifest.root / MANIFEST_FILE} is missing; {PREPARE_HINT}"
            ) from None
        if found != size:
            raise ShardError(
                f"{path}: {found} bytes, the manifest says {size} "
                f"(truncated or rewritten?); {PREPARE_HINT}"
            )
        if verify_sha256 and file_sha256(path) != manifest.shards[number].get("sha256"):
            raise ShardError(
                f"{path}: sha256 differs from the manifest's (corrupt?); {PREPARE_HINT}"
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


@functools.lru_cache(maxsize=64)
def _manifest_shards(root: str, mtime_ns: int) -> dict[str, dict]:
    """{shard name: record} of the format-2 manifest in `root` ({} when unreadable)."""
    try:
        raw = json.loads((Path(root) / MANIFEST_FILE).read_text(encoding="utf-8"))
        if raw.get("format_version") != FORMAT_VERSION:
            return {}
        vocab_size = int(raw["tokenizer"]["vocab_size"])
        return {
            s["name"]: {**s, "dtype": raw["dtype"], "vocab_size": vocab_size} for s in raw["shards"]
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _recorded_shard(path: Path) -> dict | None:
    """The manifest's record of the shard at `path`, when a manifest lies beside it: from
    the node's shard table when this process has one registered for it (`open_manifest`,
    carried to workers by `ShardPaths`), else parsed from the manifest (once per process)."""
    table_dir = registered_table(path.parent.resolve())
    table = mapped_table(table_dir) if table_dir else None
    if table is not None:
        number = table.find(path.name)
        if number is None:
            return None
        raw = table.header["raw"]
        vocab_size = int(raw["tokenizer"]["vocab_size"])
        return {**table.record(number), "dtype": raw["dtype"], "vocab_size": vocab_size}
    manifest = path.parent / MANIFEST_FILE
    try:
        mtime = manifest.stat().st_mtime_ns
    except OSError:
        return None
    return _manifest_shards(str(path.parent.resolve()), mtime).get(path.name)


def read_documents(
    shard_path: str | Path,
    start_document: int = 0,
    expected_sha256: str | None = None,
    wanted: np.ndarray | None = None,
) -> Iterator[dict]:
    """Documents of one shard in order, from document number `start_document` on, streamed a
    block at a time: {"key": str, "ids": int64 (n,), "sents": int32 (s,) sentence end offsets,
    "words": bool (n,) word starts, "phrases": uint8 (n,) span flags (OUTSIDE_SPAN ..
    INSIDE_SPAN; all zero for shards without annotations)}. Blocks before `start_document`
    are skipped without being decoded; with `wanted` (bool, one per document of the shard)
    only the wanted documents are built. When its sha256 is known (`expected_sha256`, or else
    the manifest beside it), the shard is read whole into memory and checked before any of
    its documents is used. Raises ShardError naming the file (and member) when it is
    missing, truncated, corrupt or of format 1."""
    for block, first, offset in checked_blocks(shard_path, start_document, expected_sha256):
        keep = None if wanted is None else wanted[offset : offset + len(block.docs)]
        yield from block_documents(block, first, keep)


def block_token_counts(block: Any) -> np.ndarray:
    """Tokens of each document of a checked block (int64), from its sentence offsets."""
    token_ends = block.sents[np.cumsum(block.docs) - 1].astype(np.int64)
    return np.diff(token_ends, prepend=0)


def document_token_counts(shard_path: str | Path) -> np.ndarray:
    """Tokens of each document of one shard, in order (int64), without building the
    documents; checked as `read_documents` checks."""
    blocks = checked_blocks(shard_path)
    return np.concatenate([np.zeros(0, np.int64)] + [block_token_counts(b) for b, _, _ in blocks])


def checked_blocks(
    shard_path: str | Path,
    start_document: int = 0,
    expected_sha256: str | None = None,
    hash_blocks: bool = False,
) -> Iterator[tuple[Any, int, int]]:
    """(block, its first document to yield, number of its first document in the shard) for
    the checked blocks of one shard, from the block holding `start_document` on (see
    `read_documents`, whose checks they pass); with `hash_blocks`, each block's `sha256`."""
    path = Path(shard_path)
    if not path.is_file():
        raise ShardError(f"{path}: shard not found; {PREPARE_HINT}")
    record = _recorded_shard(path)
    sha256 = expected_sha256 or (record or {}).get("sha256")
    dtype = (record or {}).get("dtype")
    vocab_size = (record or {}).get("vocab_size")
    try:
        with open(path, "rb") as f:
            source = f
            if sha256:  # a shard is read whole anyway: check it before using any of it
                data = f.read()
                if hashlib.sha256(data).hexdigest() != sha256:
                    raise ShardError(
                        f"{path}: sha256 differs from the manifest's (corrupt or rewritten?); "
                        f"{PREPARE_HINT}"
                    )
                source = io.BytesIO(data)
                if record and record.get("sha256") == sha256 and "blocks" in record:
                    check_block_index(record, path, data)  # counts edited by hand
            reader = ForwardReader(source)
            offset = None
            blocks = read_blocks(path, reader, dtype, start_document, vocab_size, hash_blocks)
            for block, first in blocks:
                if offset is None:  # the blocks before it were skipped, not yielded
                    offset = start_document - first
                yield block, first, offset
                offset += len(block.docs)
    except OSError as error:
        raise ShardError(f"{path}: cannot be read ({error}); {PREPARE_HINT}") from error


def verify_shard(shard: dict, path: Path) -> dict:
    """Read every document of one shard (its sha256 against `shard`, every block checked and
    hashed) and compare its documents, tokens and block hashes (where the manifest has them)
    with the manifest record `shard`. Returns what was read: {"sha256", "blocks": [{"sha256"}]}.
    Raises ShardError naming the shard."""
    documents = tokens = 0
    hashes = []
    for block, first, _ in checked_blocks(path, 0, shard["sha256"], hash_blocks=True):
        for document in block_documents(block, first):
            documents += 1
            tokens += len(document["ids"])
        hashes.append(block.sha256)
    if (documents, tokens) != (shard["documents"], shard["tokens"]):
        raise ShardError(
            f"{path}: holds {documents} documents and {tokens} tokens, the manifest says "
            f"{shard['documents']} and {shard['tokens']}; {PREPARE_HINT}"
        )
    listed = [block.get("sha256") for block in shard["blocks"]]
    for number, (found, recorded) in enumerate(zip(hashes, listed, strict=False)):
        if recorded and found != recorded:
            raise ShardError(
                f"{path}: block {number}'s content hash differs from the manifest's; {PREPARE_HINT}"
            )
    return {"sha256": shard["sha256"], "blocks": [{"sha256": h} for h in hashes]}


def verify_shards(manifest: Manifest) -> None:
    """`verify_shard` for every shard of `manifest`, then no shard may repeat another's
    content (`repeated_shards` over what was read). Raises ShardError naming the first shard
    at fault."""
    check_shards(manifest)
    read = [
        verify_shard(shard, path)
        for shard, path in zip(manifest.shards, manifest.shard_paths, strict=True)
    ]
    repeats = repeated_shards(read, [shard["name"] for shard in manifest.shards])
    if repeats:
        number, why = min(repeats.items())
        raise ShardError(repeat_message(manifest, number, why))
