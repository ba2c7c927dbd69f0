"""A corpus manifest as compact arrays, parsed once per node (issue 54 item 1).

The first process of a node to open a manifest (under a file lock) parses and checks it
(`shard_format.load_manifest`'s checks) and writes its shard table as .npy arrays in a
directory named for the sha256 of the manifest's bytes, `<home>/<sha256>/`; every other
rank and data-loader worker memory-maps those arrays (`np.load(mmap_mode="r",
allow_pickle=False)`), so a 100,000-shard manifest is parsed once, not once per process,
and its pages are shared by the node's processes. Nothing read from disk is trusted: a
table whose header names another manifest hash, version or count, or whose arrays have
other shapes or dtypes, is rebuilt; a manifest whose bytes changed has another hash, so
another table. The manifest itself is read and hashed once per node too: its identity
(size, inode, device, mtime and ctime in ns) is recorded beside the tables,
`<home>/identities/<sha256 of its path>.json`, and a process that finds it unchanged maps
the table without reading it; a rewrite in place moves mtime and ctime, so it is hashed.

Arrays (S shards, B blocks): `names` (S,) bytes, `bytes`, `documents`, `tokens` (S,) int64
(tokens -1 where a record has none), `sha256` (S, 32) uint8, `block_bounds` (S + 1,) int64
(shard s's blocks are block_bounds[s] .. block_bounds[s + 1]), `block_documents`,
`block_tokens` (B,) int64, `block_sha256` (B, 32) uint8 with `block_hashed` (B,) bool,
`sorted_names` (S,) bytes and `name_order` (S,) int64 (a shard's number by name).

Processes find a manifest's table through a registry {manifest directory: table
directory} that `register_table` fills in the process that opened it and that
`shard_table.ShardPaths` carries to data-loader workers.
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

TABLE_VERSION = 1
HEADER_FILE = "header.json"
HASH = 32  # bytes of a sha256


def manifest_sha256(data: bytes) -> str:
    """Hex sha256 of a manifest's bytes: the name of its table."""
    return hashlib.sha256(data).hexdigest()


def table_arrays(shards: list[dict]) -> dict[str, np.ndarray]:
    """The arrays of the shard records `shards` (a checked manifest's "shards")."""
    blocks = [block for shard in shards for block in shard["blocks"]]
    encoded = [str(shard["name"]).encode() for shard in shards]
    names = np.asarray(encoded, dtype=f"S{max(map(len, encoded), default=1)}")
    order = np.argsort(names, kind="stable").astype(np.int64)
    return {
        "names": names,
        "bytes": np.asarray([int(s["bytes"]) for s in shards], np.int64),
        "sha256": _digests([s["sha256"] for s in shards]),
        "documents": np.asarray([int(s["documents"]) for s in shards], np.int64),
        "tokens": np.asarray([int(s.get("tokens", -1)) for s in shards], np.int64),
        "block_bounds": np.cumsum([0] + [len(s["blocks"]) for s in shards], dtype=np.int64),
        "block_documents": np.asarray([int(b["documents"]) for b in blocks], np.int64),
        "block_tokens": np.asarray([int(b["tokens"]) for b in blocks], np.int64),
        "block_sha256": _digests([b.get("sha256") or "" for b in blocks]),
        "block_hashed": np.asarray([bool(b.get("sha256")) for b in blocks], bool),
        "sorted_names": names[order],
        "name_order": order,
    }


def _digests(hex_digests: list[str]) -> np.ndarray:
    """(n, 32) uint8 of hex sha256 digests ("" -> zeros)."""
    raw = b"".join(bytes.fromhex(h) if h else bytes(HASH) for h in hex_digests)
    return np.frombuffer(raw, np.uint8).reshape(len(hex_digests), HASH).copy()


def _shapes(shards: int, blocks: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """{array: (shape, dtype kind)} a table of `shards` shards and `blocks` blocks has."""
    one, block = (shards,), (blocks,)
    return {
        "names": (one, "S"),
        "bytes": (one, "i"),
        "sha256": ((shards, HASH), "u"),
        "documents": (one, "i"),
        "tokens": (one, "i"),
        "block_bounds": ((shards + 1,), "i"),
        "block_documents": (block, "i"),
        "block_tokens": (block, "i"),
        "block_sha256": ((blocks, HASH), "u"),
        "block_hashed": (block, "b"),
        "sorted_names": (one, "S"),
        "name_order": (one, "i"),
    }


class ManifestTable:
    """A manifest's shard table, mapped from its directory: `header` (the manifest without
    its shards under "raw", its "content_sha256", "manifest_sha256", counts) and the
    arrays (module docstring) as attributes of `arrays`."""

    def __init__(self, directory: Path, header: dict, arrays: dict[str, np.ndarray]) -> None:
        self.directory, self.header, self.arrays = directory, header, arrays

    def __len__(self) -> int:
        return len(self.arrays["names"])

    def name(self, number: int) -> str:
        """The file name of shard `number`."""
        return self.arrays["names"][number].decode()

    def record(self, number: int) -> dict:
        """Shard `number`'s record as the manifest has it (name, bytes, sha256, documents,
        tokens, blocks of documents, tokens and sha256 where recorded)."""
        a = self.arrays
        start, stop = int(a["block_bounds"][number]), int(a["block_bounds"][number + 1])
        blocks = []
        for b in range(start, stop):
            block = {"documents": int(a["block_documents"][b]), "tokens": int(a["block_tokens"][b])}
            if a["block_hashed"][b]:
                block["sha256"] = a["block_sha256"][b].tobytes().hex()
            blocks.append(block)
        record = {
            "name": self.name(number),
            "documents": int(a["documents"][number]),
            "bytes": int(a["bytes"][number]),
            "sha256": a["sha256"][number].tobytes().hex(),
            "blocks": blocks,
        }
        if a["tokens"][number] >= 0:
            record["tokens"] = int(a["tokens"][number])
        return record

    def find(self, name: str) -> int | None:
        """The number of the shard called `name`, None when the manifest lists none."""
        key, names = name.encode(), self.arrays["sorted_names"]
        place = int(np.searchsorted(names, key))
        if place == len(names) or names[place] != key:
            return None
        return int(self.arrays["name_order"][place])

    def repeats(self) -> dict[int, str]:
        """`shard_checks.repeated_shards` of the table's shards, from its arrays (a corpus
        without a repeated shard or block hash is told in a few vectorised passes)."""
        a = {key: np.asarray(value) for key, value in self.arrays.items()}
        names = a["names"]
        blocks = a["block_sha256"][a["block_hashed"]]
        if _all_distinct(a["sha256"]) and _all_distinct(blocks):
            return {}
        by_shard: dict[bytes, int] = {}
        by_block: dict[bytes, tuple[int, int]] = {}
        repeats: dict[int, str] = {}
        bounds, hashed, digests = a["block_bounds"], a["block_hashed"], a["block_sha256"]
        for number, digest in enumerate(map(bytes, a["sha256"])):
            if digest in by_shard:
                repeats[number] = f"the same bytes as shard {names[by_shard[digest]].decode()}"
            else:
                by_shard[digest] = number
            start = int(bounds[number])
            for b in range(start, int(bounds[number + 1])):
                if not hashed[b]:
                    continue
                block = bytes(digests[b])
                if block in by_block and number not in repeats:
                    first, first_block = by_block[block]
                    repeats[number] = (
                        f"block {b - start} holds the documents of block {first_block} of "
                        f"shard {names[first].decode()}"
                    )
                by_block.setdefault(block, (number, b - start))
        return repeats


def _all_distinct(digests: np.ndarray) -> bool:
    """Whether the rows of (n, 32) uint8 `digests` are all different: told by their first 8
    bytes (one sort of n integers), False (so checked in full) where any of those repeat."""
    prefixes = np.sort(np.ascontiguousarray(digests[:, :8]).view(np.uint64).ravel())
    return not np.any(prefixes[1:] == prefixes[:-1])


class TableShards(Sequence[dict]):
    """A manifest's "shards" as a sequence of records built on access from its table."""

    def __init__(self, table: ManifestTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index):  # int -> dict (a slice -> list of dict)
        if isinstance(index, slice):
            return [self.table.record(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.table.record(index)

    def __iter__(self) -> Iterator[dict]:
        return (self.table.record(i) for i in range(len(self)))


def read_table(directory: Path, sha256: str) -> ManifestTable | None:
    """The table in `directory`, mapped, if it is whole and of the manifest of hex `sha256`
    (header, version, every array's shape and dtype); None otherwise."""
    try:
        header = json.loads((directory / HEADER_FILE).read_text(encoding="utf-8"))
        if header.get("table_version") != TABLE_VERSION or header.get("manifest_sha256") != sha256:
            return None
        shards, blocks = int(header["shards"]), int(header["blocks"])
        arrays = {}
        for name, (shape, kind) in _shapes(shards, blocks).items():
            array = np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False)
            if array.shape != shape or array.dtype.kind != kind:
                return None
            arrays[name] = array
        bounds = arrays["block_bounds"]
        if bounds[0] != 0 or bounds[-1] != blocks or np.any(np.diff(bounds) < 0):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return ManifestTable(directory, header, arrays)


def write_table(directory: Path, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write a table into `directory` whole: into a partial directory beside it, renamed
    into place (a table already there is replaced)."""
    partial = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, array in arrays.items():
        np.save(partial / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
    (partial / HEADER_FILE).write_text(json.dumps(header), encoding="utf-8")
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(partial, directory)


def node_table(
    manifest_path: Path, home: Path, parse: Callable[[bytes], tuple[dict, list[dict], str]]
) -> ManifestTable:
    """The table of the manifest at `manifest_path`, from `<home>/<its sha256>/`: mapped when
    whole and right, else built under `home`'s lock by the first process of the node that
    asks (`parse(manifest bytes)` -> (the manifest without its shards, its checked shard
    records, its content sha256); its errors pass through) and mapped by the others. The
    process that builds or first verifies the table records the manifest's identity
    (`record_identity`); a later process whose `os.stat` of it matches maps the table without
    reading or hashing the manifest (`known_table`), and any other hashes it as before."""
    from pretrain.storage.cache import file_lock

    before = os.stat(manifest_path)
    table = known_table(manifest_path, home, before)
    if table is not None:
        return table
    data = manifest_path.read_bytes()
    sha256 = manifest_sha256(data)
    unchanged = file_identity(before) == file_identity(os.stat(manifest_path))
    directory = Path(home) / sha256
    table = read_table(directory, sha256)
    if table is not None:
        if unchanged:
            record_identity(manifest_path, home, before, sha256)
        return table
    Path(home).mkdir(parents=True, exist_ok=True)
    with file_lock(Path(home) / ".tables.lock"):
        table = read_table(directory, sha256)  # built by another process meanwhile
        if table is None:
            raw, shards, content = parse(data)
            arrays = table_arrays(shards)
            header = {
                "table_version": TABLE_VERSION,
                "manifest_sha256": sha256,
                "content_sha256": content,
                "shards": len(shards),
                "blocks": len(arrays["block_documents"]),
                "raw": raw,
            }
            write_table(directory, header, arrays)
            table = read_table(directory, sha256)
    if table is None:
        raise OSError(f"{directory}: the manifest table just written does not read back")
    if unchanged:
        record_identity(manifest_path, home, before, sha256)
    return table


IDENTITIES_DIR = "identities"
IDENTITY_VERSION = 1
SETTLED_NS = 2_000_000_000  # a manifest changed more recently than this is not recorded
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def file_identity(stat: os.stat_result) -> dict[str, int]:
    """What tells a file changed without reading it: size, inode, device, mtime and ctime
    in ns (an in-place rewrite of the same size moves mtime and ctime)."""
    return {
        "size": stat.st_size,
        "ino": stat.st_ino,
        "dev": stat.st_dev,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
    }


def identity_path(manifest_path: Path, home: Path) -> Path:
    """`<home>/identities/<sha256 of the manifest's absolute path>.json`: where the identity
    of the manifest at `manifest_path` and the sha256 of its bytes are recorded."""
    key = hashlib.sha256(os.path.abspath(manifest_path).encode()).hexdigest()
    return Path(home) / IDENTITIES_DIR / f"{key}.json"


def record_identity(manifest_path: Path, home: Path, stat: os.stat_result, sha256: str) -> None:
    """Record that the manifest at `manifest_path`, while its `os.stat` was `stat`, had the
    bytes of hex `sha256` (written whole: a temporary file renamed into place). Not recorded
    when it changed less than SETTLED_NS before now: a rewrite within the file system's
    timestamp granularity could keep its identity (git's "racy clean" entries)."""
    now = time.time_ns()
    if now - max(stat.st_mtime_ns, stat.st_ctime_ns) < SETTLED_NS:
        return
    path = identity_path(manifest_path, home)
    record = {
        "version": IDENTITY_VERSION,
        "manifest": os.path.abspath(manifest_path),
        "identity": file_identity(stat),
        "manifest_sha256": sha256,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.")
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(partial, path)
    except OSError:  # a read-only home: the next process hashes the manifest, as before
        return


def known_table(manifest_path: Path, home: Path, stat: os.stat_result) -> ManifestTable | None:
    """The table of the manifest at `manifest_path` when its identity record (written by
    the process that built or first verified the table) matches `stat`, its `os.stat` now:
    mapped without reading the manifest. None, so the manifest is hashed, when there is no
    record, it is not a JSON object of the expected fields and types, or anything differs."""
    try:
        record = json.loads(identity_path(manifest_path, home).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != IDENTITY_VERSION:
        return None
    identity, sha256 = record.get("identity"), record.get("manifest_sha256")
    if record.get("manifest") != os.path.abspath(manifest_path) or not isinstance(sha256, str):
        return None
    if not _SHA256_HEX.fullmatch(sha256) or not isinstance(identity, dict):
        return None
    expected = file_identity(stat)
    if set(identity) != set(expected) or any(type(v) is not int for v in identity.values()):
        return None
    if identity != expected:
        return None
    return read_table(Path(home) / sha256, sha256)


_REGISTERED: dict[str, str] = {}  # manifest directory -> its table's directory


def register_table(manifest_dir: str | Path, table_dir: str | Path) -> None:
    """Record that the manifest in `manifest_dir` has its table in `table_dir` (this
    process, and the data-loader workers its `ShardPaths` reach)."""
    _REGISTERED[os.path.normpath(manifest_dir)] = str(table_dir)


def registered_table(manifest_dir: str | Path) -> str | None:
    """The table directory registered for the manifest in `manifest_dir`, or None."""
    return _REGISTERED.get(os.path.normpath(manifest_dir))


@lru_cache(maxsize=16)
def mapped_table(table_dir: str) -> ManifestTable | None:
    """The registered table in `table_dir` (named for its manifest's sha256, which its
    header must give), mapped once per process; None when it is not whole."""
    directory = Path(table_dir)
    return read_table(directory, directory.name)
