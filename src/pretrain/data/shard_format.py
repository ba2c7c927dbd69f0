"""Reading prepared shards: the manifest, its checks, and the documents of one shard.

A shards directory (written by `pretrain-data prepare`) holds
- `manifest.json`: format version, tokenizer (dir, sha256, vocab_size, lowercase), ids dtype,
  counts, sources, per shard its name, documents, tokens, bytes and sha256, and
  `annotations`: null, or {"phrases": phrase lexicon size, "entities": entity list size,
  "phrase_spans": n, "entity_spans": n} when the shards hold span annotations;
- `tokenizer/`: the tokenizer the shards were made with;
- `phrases.txt` (phrase annotations only): the phrase lexicon, one phrase a line with its
  count and score; `entities.txt` (entity annotations only): a copy of the entity list;
- `shard-NNNNNN.tar`: WebDataset tars, one sample per document with members `<key>.ids.npy`
  (token ids, manifest dtype), `<key>.sents.npy` (int32 sentence end offsets into ids,
  exclusive, strictly increasing, the last equal to len(ids)), `<key>.words.npy` (uint8,
  1 where a token starts a word; for Chinese with `segmenter=jieba`, a jieba word) and,
  when annotated, `<key>.phrases.npy` (uint8, one per token: 0 outside any span, 1 first
  token of a phrase, 2 first token of an entity, 3 later token of a phrase or entity; spans
  start and end at word starts or sentence ends, never overlap nor cross a sentence end).
Shards are read as a stream, one tar member at a time, never whole.
"""

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
MEMBERS = ("ids.npy", "sents.npy", "words.npy")
OPTIONAL_MEMBERS = ("phrases.npy",)
# Values of `<key>.phrases.npy`.
OUTSIDE_SPAN, PHRASE_START, ENTITY_START, INSIDE_SPAN = 0, 1, 2, 3
_END_OF_ARCHIVE = b"\0" * (2 * tarfile.BLOCKSIZE)
_PREPARE_HINT = "re-run `pretrain-data prepare` for this directory"


class ShardError(ValueError):
    """Shards or their manifest are missing, damaged or do not match; the message names the
    file and says what to do."""


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


def file_sha256(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks of `chunk_bytes`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def ids_dtype(vocab_size: int) -> str:
    """The smallest unsigned numpy dtype that holds ids 0 .. vocab_size - 1."""
    for dtype in ("uint8", "uint16", "uint32"):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return dtype
    raise ValueError(f"vocab_size {vocab_size} does not fit in uint32")


def load_manifest(shards_dir: str | Path) -> Manifest:
    """Parse `<shards_dir>/manifest.json`. Raises ShardError naming the file when it is
    missing, not JSON, of another format version or lacks a key."""
    root = Path(shards_dir).resolve()
    path = root / MANIFEST_FILE
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
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise ShardError(
            f"{path}: format_version is {version!r}, this code reads {FORMAT_VERSION}; {_PREPARE_HINT}"
        )
    try:
        manifest = Manifest(
            root=root,
            format_version=version,
            tokenizer_sha256=str(raw["tokenizer"]["sha256"]),
            vocab_size=int(raw["tokenizer"]["vocab_size"]),
            dtype=str(raw["dtype"]),
            shards=list(raw["shards"]),
            counts=dict(raw["counts"]),
            raw=raw,
        )
        for shard in manifest.shards:
            shard["name"], shard["bytes"]  # noqa: B018 (presence check)
        raw["tokenizer"]["dir"]  # noqa: B018
    except (KeyError, TypeError) as error:
        raise ShardError(f"{path}: missing or malformed key {error}; {_PREPARE_HINT}") from error
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


def _split_member_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def _document(path: Path, key: str, members: dict[str, bytes]) -> dict:
    optional = sorted(set(members) - set(MEMBERS))
    if not set(MEMBERS) <= set(members) or not set(optional) <= set(OPTIONAL_MEMBERS):
        raise ShardError(
            f"{path}: sample {key!r} has members {sorted(members)}, expected {list(MEMBERS)} "
            f"and optionally {list(OPTIONAL_MEMBERS)} (truncated or not a prepared shard); "
            f"{_PREPARE_HINT}"
        )
    arrays = {ext: np.load(io.BytesIO(data), allow_pickle=False) for ext, data in members.items()}
    ids, sents, words = arrays["ids.npy"], arrays["sents.npy"], arrays["words.npy"]
    n = len(ids)
    phrases = arrays.get("phrases.npy", np.zeros(n, np.uint8))
    valid = (
        ids.ndim == sents.ndim == words.ndim == phrases.ndim == 1
        and len(words) == len(phrases) == n
        and len(sents) > 0
        and int(sents[-1]) == n
        and sents[0] > 0
        and bool(np.all(np.diff(sents) > 0))
        and phrases.dtype == np.uint8
        and (n == 0 or int(phrases.max()) <= INSIDE_SPAN)
    )
    if not valid:
        raise ShardError(
            f"{path}: sample {key!r} is inconsistent (ids {ids.shape}, sents {sents.shape}, "
            f"words {words.shape}, phrases {phrases.dtype} {phrases.shape}); {_PREPARE_HINT}"
        )
    return {
        "key": key,
        "ids": ids.astype(np.int64),
        "sents": sents.astype(np.int32),
        "words": words.astype(bool),
        "phrases": phrases,
    }


def read_documents(shard_path: str | Path) -> Iterator[dict]:
    """Documents of one shard in tar order, streamed: {"key": str, "ids": int64 (n,),
    "sents": int32 (s,) sentence end offsets, "words": bool (n,) word starts, "phrases":
    uint8 (n,) span flags (OUTSIDE_SPAN .. INSIDE_SPAN; all zero for shards without
    annotations)}. Raises ShardError naming the file when it is missing, truncated or
    corrupt."""
    path = Path(shard_path)
    if not path.is_file():
        raise ShardError(f"{path}: shard not found; {_PREPARE_HINT}")
    key, members = None, {}
    try:
        with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                member_key, ext = _split_member_name(member.name)
                if member_key != key:
                    if key is not None:
                        yield _document(path, key, members)
                    key, members = member_key, {}
                members[ext] = tar.extractfile(member).read()
            end = tar.offset
        if key is not None:
            yield _document(path, key, members)
        with open(path, "rb") as f:
            f.seek(end)
            if f.read(len(_END_OF_ARCHIVE)) != _END_OF_ARCHIVE:
                raise ShardError(
                    f"{path}: no end-of-archive marker after byte {end} (truncated or "
                    f"damaged tar); {_PREPARE_HINT}"
                )
    except ShardError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as error:
        raise ShardError(
            f"{path}: cannot be read as a tar shard ({error}); truncated or damaged; "
            f"{_PREPARE_HINT}"
        ) from error
