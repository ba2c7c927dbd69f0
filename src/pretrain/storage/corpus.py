"""A prepared corpus at a URL, read through the node-shared cache: its manifest and tokenizer
mirrored into the cache, its shards fetched when read (and a few ahead). Publishing a
locally written corpus to a URL is `pretrain.storage.upload`."""

import hashlib
import heapq
import itertools
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pretrain.storage import cache
from pretrain.storage.retry import RetryPolicy, StorageError, with_retries
from pretrain.storage.urls import filesystem, is_url, join_url, protocol, redact

MANIFEST_FILE = "manifest.json"


def default_cache_dir() -> Path:
    """Node-local temporary storage: `$TMPDIR/pretrain-cache-<user>` (/tmp without TMPDIR)."""
    user = os.environ.get("USER") or str(os.getuid())
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"pretrain-cache-{user}"


def corpus_key(url: str) -> str:
    """The cache directory name of the corpus at `url`: its last path part and a hash of the
    whole URL (credentials and query left out)."""
    clean = redact(url).rstrip("/")
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in clean.rsplit("/", 1)[-1])
    return f"{name[:40]}-{hashlib.sha256(clean.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class StorageSpec:
    """How the readers of one remote corpus get its shards (picklable, for data-loader
    workers): the corpus `url`, the local `root` its manifest and tokenizer were mirrored to
    (inside `cache_dir`), `shards` as (name, bytes, sha256) triples, the cache's
    `limit_bytes` (None: unbounded), `prefetch_shards` fetched ahead of each reader (and
    as many downloads at once, up to MAX_CONNECTIONS), the retry policy, and the fsspec options as JSON (`data.storage_options`)."""

    url: str
    root: str
    shards: "ShardRecords"  # given as (name, bytes, sha256) triples, kept as arrays
    limit_bytes: int | None = None
    prefetch_shards: int = 8
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    options_json: str = "{}"

    def __post_init__(self) -> None:
        if not isinstance(self.shards, ShardRecords):
            object.__setattr__(self, "shards", ShardRecords(self.shards))

    def record(self, name: str) -> tuple[int, str]:
        """(bytes, sha256) the manifest records for shard `name`."""
        return self.shards.record(name)


class ShardRecords:
    """(name, bytes, sha256) of each shard of a corpus as sorted numpy arrays, a few tens of
    bytes a shard in every process that holds a `StorageSpec` (data-loader workers)."""

    def __init__(self, triples) -> None:
        triples = sorted(triples)
        width = max((len(name.encode()) for name, _, _ in triples), default=1)
        self.names = np.asarray([t[0].encode() for t in triples], dtype=f"S{width}")
        self.sizes = np.asarray([t[1] for t in triples], np.int64)
        digests = b"".join(bytes.fromhex(t[2]) for t in triples)  # 32 bytes each
        self.sha256 = np.frombuffer(digests, np.uint8).reshape(len(triples), 32)

    @classmethod
    def from_sorted(
        cls, names: np.ndarray, sizes: np.ndarray, sha256: np.ndarray
    ) -> "ShardRecords":
        """Records of the arrays of names (bytes, sorted), bytes and sha256 ((n, 32) uint8)
        in that order (a manifest's shard table), copied into memory."""
        records = cls(())
        records.names = np.array(names)
        records.sizes = np.array(sizes, np.int64)
        records.sha256 = np.array(sha256, np.uint8).reshape(len(records.names), 32)
        return records

    def record(self, name: str) -> tuple[int, str]:
        """(bytes, sha256 in hex) of shard `name`; KeyError naming it when there is none."""
        key = name.encode()
        place = int(np.searchsorted(self.names, key))
        if place == len(self.names) or self.names[place] != key:
            raise KeyError(name)
        return int(self.sizes[place]), self.sha256[place].tobytes().hex()

    def __len__(self) -> int:
        return len(self.names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardRecords) and all(
            np.array_equal(a, b)
            for a, b in zip(
                (self.names, self.sizes, self.sha256),
                (other.names, other.sizes, other.sha256),
                strict=True,
            )
        )

    def __hash__(self) -> int:
        return hash((self.names.tobytes(), self.sha256.tobytes()))

    def nbytes(self) -> int:
        """Bytes its arrays hold."""
        return self.names.nbytes + self.sizes.nbytes + self.sha256.nbytes


def download_file(
    url: str, destination: Path, options_json: str = "{}", size: int | None = None
) -> None:
    """Copy the object at `url` to the local file `destination` (one attempt). A shard (its
    `size` known) is streamed to disk in one request (`get_file`); over HTTP, a file of
    unknown size is fetched whole (the small ones), so a server that is down is a
    connection error, not a missing file."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    fs = filesystem(url, options_json)
    if size is not None:
        fs.get_file(url, str(destination))
        return
    if protocol(url) in ("http", "https"):
        destination.write_bytes(fs.cat_file(url))
        return
    with fs.open(url, "rb", block_size=0) as source, open(destination, "wb") as target:
        while chunk := source.read(1 << 20):
            target.write(chunk)


def pin_shard(spec: StorageSpec, name: str, prefetch: bool = False) -> cache.Pin:
    """A Pin on the checked local copy of shard `name` of the corpus (fetched once per node
    into the cache, with retries). Raises StorageError naming the URL after the retries, or
    at once when the remote object is missing; a `prefetch` raises cache.NoRoom where the
    shard does not fit within the cache limit now."""
    size, sha256 = spec.record(name)
    url = join_url(spec.url, name)

    def download(partial: Path) -> None:  # checked by cache.fetch: a mismatch is retried
        download_file(url, partial, spec.options_json, size)

    def fetch() -> cache.Pin:
        entry = Path(spec.root) / name
        return cache.fetch(entry, size, sha256, download, spec.limit_bytes, prefetch)

    return with_retries(fetch, url, spec.retry)


HELD_SHARDS = 8  # per process: the shards its readers use now (cf. reading.decoded_shard)
_HELD: dict = {"pid": None, "pins": OrderedDict()}


def _held() -> OrderedDict:
    """{(corpus cache directory, shard name): Pin} this process holds (none in a forked child)."""
    if _HELD["pid"] != os.getpid():  # a forked child holds nothing of its parent's
        _HELD["pid"], _HELD["pins"] = os.getpid(), OrderedDict()
    return _HELD["pins"]


def hold_shard(spec: StorageSpec, name: str) -> Path:
    """The checked local copy of shard `name` (`pin_shard`, or the prefetcher's pin when it
    fetched the shard), kept from eviction until this process has asked for HELD_SHARDS
    other shards since: the shard's readers read it whole as soon as they get it, and the
    partitions that share a shard read it at about the same time, so a held shard is not
    downloaded again for each of them. Returns its path."""
    pins = _held()
    key = (spec.root, name)
    if key in pins:
        pins.move_to_end(key)
        return pins[key].path
    pins[key] = pin = prefetcher().take(key) or pin_shard(spec, name)
    while len(pins) > HELD_SHARDS:
        pins.popitem(last=False)[1].close()
    return pin.path


MAX_CONNECTIONS = 4  # downloads at once per process
READY_SHARDS = 64  # prefetched shards pinned per process until a reader takes them


class Prefetcher:
    """Background downloads of the shards this process's readers read next, most urgent
    first (the lowest priority: (epoch, place in the epoch's shard order)), over as many
    threads as the readers' `prefetch_shards` (at most MAX_CONNECTIONS). A prefetched shard
    stays pinned, safe from eviction, until a reader takes it (`take`; at most READY_SHARDS
    wait, the oldest released first, and at most half the cache limit: the rest is for the
    shards being read). A prefetch that would take the cache past its limit is not made
    (the reader fetches that shard itself); errors are left for the reader to meet (it
    fetches again and reports)."""

    def __init__(self):
        self._queue: list = []  # heap of (priority, count, spec, name)
        self._count = itertools.count()
        self._known: set[tuple[str, str]] = set()  # (spec.root, name) queued or being fetched
        self._fetching: set[tuple[str, str]] = set()  # being fetched now
        self._ready: OrderedDict = OrderedDict()  # (spec.root, name) -> Pin
        self._latest_epoch = 0
        self._threads: list[threading.Thread] = []
        self._cond = threading.Condition()

    def prefetch(self, spec: StorageSpec, wanted: list[tuple[tuple[int, int], str]]) -> None:
        """Queue the shards `wanted` ((priority, name) pairs) of the corpus of `spec` unless
        queued, held or fetched already; shards of earlier epochs still queued are dropped."""
        held = _held()
        with self._cond:
            for priority, name in wanted:
                key = (spec.root, name)
                self._latest_epoch = max(self._latest_epoch, priority[0])
                if key in self._known or key in self._ready or key in held:
                    continue
                self._known.add(key)
                heapq.heappush(self._queue, (priority, next(self._count), spec, name))
            connections = min(MAX_CONNECTIONS, max(1, spec.prefetch_shards))
            while len(self._threads) < connections:
                thread = threading.Thread(target=self._work, name="shard-prefetch", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cond.notify_all()

    def take(self, key: tuple[str, str]) -> cache.Pin | None:
        """The pin on the prefetched shard `key` ((corpus cache directory, name)), now the
        caller's, after its download when one is under way (so that it is not downloaded
        twice); None when it was not prefetched."""
        with self._cond:
            self._cond.wait_for(lambda: key not in self._fetching)
            return self._ready.pop(key, None)

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until nothing is queued or being fetched (at most `timeout_s` seconds);
        whether that came."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._known, timeout_s)

    def _over_half_the_limit(self, spec: StorageSpec, name: str) -> bool:
        """Whether shard `name` would take the prefetched shards waiting for their readers
        past half the cache limit of `spec`."""
        if spec.limit_bytes is None:
            return False
        with self._cond:
            waiting = sum(spec.record(n)[0] for root, n in self._ready if root == spec.root)
        return waiting + spec.record(name)[0] > spec.limit_bytes // 2

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                priority, _, spec, name = heapq.heappop(self._queue)
                key = (spec.root, name)
                if priority[0] < self._latest_epoch or key in _held():
                    self._known.discard(key)
                    self._cond.notify_all()
                    continue
                self._fetching.add(key)
            pin = None
            try:
                if self._over_half_the_limit(spec, name):
                    raise cache.NoRoom(name)  # the rest is for the shards being read
                pin = pin_shard(spec, name, prefetch=True)
            except Exception:  # noqa: BLE001 (NoRoom, or an error the reader meets again)
                pass
            with self._cond:
                self._known.discard(key)
                self._fetching.discard(key)
                if pin is not None:
                    self._ready[key] = pin
                    while len(self._ready) > READY_SHARDS:
                        self._ready.popitem(last=False)[1].close()
                self._cond.notify_all()


_PREFETCHERS: dict[int, Prefetcher] = {}


def prefetcher() -> Prefetcher:
    """This process's Prefetcher (a new one in a forked child: threads do not survive a
    fork)."""
    pid = os.getpid()
    if pid not in _PREFETCHERS:
        _PREFETCHERS.clear()
        _PREFETCHERS[pid] = Prefetcher()
    return _PREFETCHERS[pid]


def list_objects(url: str, options_json: str = "{}") -> dict[str, int]:
    """{path relative to `url`: bytes} of every object under the corpus URL `url`."""
    fs = filesystem(url, options_json)
    base = fs._strip_protocol(url).rstrip("/")
    found = fs.find(base, detail=True)
    return {
        path[len(base) :].lstrip("/"): int(info.get("size") or 0)
        for path, info in found.items()
        if info.get("type", "file") != "directory"
    }


# The files of a corpus besides its shards, fetched by name where storage cannot list
# (plain HTTP): the tokenizer (tokenizer.json required), the annotation lexicons.
KNOWN_FILES = (
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
    "tokenizer/special_tokens_map.json",
    "tokenizer/vocab.txt",
    "phrases.txt",
    "entities.txt",
)


def mirror_corpus(
    url: str, cache_dir: Path, options_json: str = "{}", retry: RetryPolicy | None = None
) -> tuple[Path, None]:
    """Copy the manifest, tokenizer and other small files (`KNOWN_FILES`) of the corpus at
    `url` into `<cache_dir>/<corpus key>/` (under a lock, files renamed into place); returns
    (that directory, None). The store is never listed: the manifest is authoritative (each
    shard is checked against it when fetched). Fetched once per launch and node: the first
    process of a launch (`launch_key`) fetches, the node's others wait on the lock and find
    its copy; without a launch key, every call fetches anew. Raises StorageError naming the
    URL when there is no manifest."""
    retry = retry or RetryPolicy()
    root = Path(cache_dir) / corpus_key(url)
    root.mkdir(parents=True, exist_ok=True)
    launch, marker = launch_key(), root / ".mirrored"
    with cache.file_lock(root / ".mirror.lock"):
        if launch and marker.is_file() and marker.read_text() == launch:
            return root, None  # this launch's copy, by another process of this node
        marker.unlink(missing_ok=True)
        manifest_part = root / f".{MANIFEST_FILE}.partial-{os.getpid()}"
        try:
            _fetch_small(join_url(url, MANIFEST_FILE), manifest_part, options_json, retry)
        except FileNotFoundError:
            raise _no_manifest(url) from None
        for name in KNOWN_FILES:
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(f".{target.name}.partial-{os.getpid()}")
            try:
                _fetch_small(join_url(url, name), part, options_json, retry)
            except FileNotFoundError:
                if name == KNOWN_FILES[0]:
                    raise StorageError(
                        f"{redact(join_url(url, name))}: missing; the corpus needs the "
                        "tokenizer it was made with beside its shards"
                    ) from None
                continue
            os.replace(part, target)
        os.replace(manifest_part, root / MANIFEST_FILE)
        if launch:
            marker.write_text(launch)
    return root, None


LAUNCH_VARIABLES = ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "MASTER_PORT")


def launch_key() -> str:
    """What names this launch of a job to its processes on a node: its SLURM job and restart,
    torchrun's run id, the rendezvous port (those set); "" when none is (a lone process)."""
    return ",".join(f"{n}={os.environ[n]}" for n in LAUNCH_VARIABLES if os.environ.get(n))


def keep_copy(source: Path, target: Path) -> Path:
    """Copy the files at the top of the directory `source` into `target` (created), each
    renamed into place, so processes doing the same at once leave one whole copy; returns
    `target`. For a run's copy of a cached corpus's tokenizer, which outlives the cache."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(Path(source).iterdir()):
        if path.is_file():
            part = target / f".{path.name}.partial-{os.getpid()}"
            part.write_bytes(path.read_bytes())
            os.replace(part, target / path.name)
    return target


def _no_manifest(url: str) -> StorageError:
    return StorageError(
        f"{redact(join_url(url, MANIFEST_FILE))}: no manifest; prepare a corpus there with "
        f"`pretrain-data prepare out_dir={redact(url)}` (or point at the out_dir of a prepare run)"
    )


def _fetch_small(url: str, destination: Path, options_json: str, retry: RetryPolicy) -> None:
    """`download_file` with retries; FileNotFoundError (not retried) when it is missing."""
    try:
        with_retries(lambda: download_file(url, destination, options_json), url, retry)
    except StorageError as error:
        if isinstance(error.__cause__, FileNotFoundError):
            raise error.__cause__ from None
        raise


def check_remote_shards(url: str, shards: list[dict], objects: dict[str, int] | None) -> None:
    """StorageError naming the first shard of the manifest that is missing at `url` or has
    another size there than recorded (`objects`: the listing; None: not listable, each
    download checks its shard)."""
    if objects is None:
        return
    for shard in shards:
        size = objects.get(shard["name"])
        where = redact(join_url(url, shard["name"]))
        if size is None:
            raise StorageError(f"{where}: shard listed in the manifest is missing")
        if size != int(shard["bytes"]):
            raise StorageError(
                f"{where}: {size} bytes, the manifest says {shard['bytes']} (rewritten?); "
                "prepare the corpus again"
            )


def remote_manifest_exists(url: str, options_json: str = "{}") -> bool:
    """Whether a corpus manifest lies at `url`."""
    return bool(is_url(url)) and filesystem(url, options_json).exists(join_url(url, MANIFEST_FILE))
