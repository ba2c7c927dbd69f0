"""The node-shared shard cache: remote shards become verified local files.

Layout: `<cache_dir>/<corpus key>/<shard name>` beside the corpus's manifest and tokenizer
(so the shard reader finds the manifest's sha256 beside each shard), and
`<shard name>.sha256`, written after the shard was checked and renamed into place (its
mtime is the entry's last use). One download per node: the ranks and workers of a node that
share `cache_dir` take `<shard name>.lock` (a file lock) before downloading, and a waiter
finds the shard there when it gets the lock. A download goes to a partial file, is checked
(size and sha256 against the manifest) and only then renamed, so a reader never sees a
partial or changed shard.

Every download is logged to `<cache_dir>/downloads.log` (the node's bytes downloaded).

Eviction: least recently used first, so that the shards of the whole cache_dir (every
corpus in it, and the shards being downloaded into it, counted at their manifest size from
the start of their download) stay within `limit_bytes`. A shard in use is never evicted:
readers hold a shared lock (flock) on it while they read (`Pin`), and eviction takes the
exclusive lock without waiting or skips it. The bound this gives: a prefetch is made only
when it fits within the limit (`fetch(..., prefetch=True)` raises NoRoom otherwise, and the
reader fetches the shard itself when it gets there); a shard a reader needs now is always
fetched, evicting what is not in use. So the cache on disk never holds more than
`limit_bytes` plus the bytes of the shards pinned by readers at the time of a download.
"""

import fcntl
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SIDECAR = ".sha256"
INCOMING = ".incoming"  # `.<shard>.incoming`: "<bytes> <pid>" of a download under way
EVICTION_LOCK = ".eviction.lock"
DOWNLOAD_LOG = "downloads.log"  # per cache_dir (node): one line per shard downloaded


@dataclass
class CacheStats:
    """This process's counters: shards found in the cache, downloaded, bytes downloaded,
    shards evicted."""

    hits: int = 0
    misses: int = 0
    bytes_downloaded: int = 0
    evicted: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses); 1.0 before any request."""
        total = self.hits + self.misses
        return self.hits / total if total else 1.0


STATS = CacheStats()


class Pin:
    """A shared lock on a cached shard while it is read: eviction skips it. Release with
    `close()` (or as a context manager)."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    def close(self) -> None:
        """Release the lock."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _pin_if_valid(path: Path, size: int, sha256: str) -> Pin | None:
    """A Pin on `path` when it is a complete, checked entry (size, sidecar), else None; its
    last use is refreshed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        stat = os.fstat(fd)
        sidecar = path.with_name(path.name + SIDECAR)
        if stat.st_nlink == 0 or stat.st_size != size or sidecar.read_text().strip() != sha256:
            raise OSError("not a complete entry")
        mark_used(sidecar)
    except OSError:
        os.close(fd)
        return None
    return Pin(path, fd)


clock_ns = time.time_ns  # the last-use clock (a test's own clock orders uses without waiting)


def mark_used(sidecar: Path) -> None:
    """Record now as the entry's last use, for eviction: its sidecar's mtime."""
    now = clock_ns()
    os.utime(sidecar, ns=(now, now))


def file_lock(path: Path):
    """A file lock (filelock.FileLock) at `path`, shared by the processes of a node."""
    from filelock import FileLock

    return FileLock(str(path))


def fetch(
    path: Path,
    size: int,
    sha256: str,
    download: Callable[[Path], None],
    limit_bytes: int | None = None,
    prefetch: bool = False,
) -> Pin:
    """A Pin on the checked local copy of a shard at `path` (its cache entry) of `size` bytes
    and hex `sha256`, downloading it with `download(partial_path)` when the cache does not
    hold it (once per node: under the entry's file lock). `download` raises on failure; a
    copy of another size or hash raises ShardMismatch (the partial file removed). A
    `prefetch` raises NoRoom instead of downloading when the shard does not fit within
    `limit_bytes` beside the shards in use (see the module docstring)."""
    pin = _pin_if_valid(path, size, sha256)
    if pin is not None:
        STATS.hits += 1
        return pin
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_name(path.name + ".lock")):
        pin = _pin_if_valid(path, size, sha256)  # another process of the node fetched it
        if pin is not None:
            STATS.hits += 1
            return pin
        incoming = path.with_name(f".{path.name}{INCOMING}")
        if not make_room(path.parent.parent, size, limit_bytes, incoming, prefetch) and prefetch:
            raise NoRoom(f"{path.name}: {size} bytes do not fit within the cache limit now")
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        pin = None
        try:
            download(partial)
            check_download(partial, size, sha256)
            pin = _pin_file(partial, path)  # pinned before eviction can see it
            sidecar = path.with_name(path.name + SIDECAR)
            sidecar.unlink(missing_ok=True)
            os.replace(partial, path)
            sidecar_partial = partial.with_name(partial.name + SIDECAR)
            sidecar_partial.write_text(sha256 + "\n")
            os.replace(sidecar_partial, sidecar)
            mark_used(sidecar)
        except BaseException:
            if pin is not None:
                pin.close()
            raise
        finally:
            partial.unlink(missing_ok=True)
            incoming.unlink(missing_ok=True)
        STATS.misses += 1
        STATS.bytes_downloaded += size
        log_download(path, size)
    return pin


def _pin_file(source: Path, path: Path) -> Pin:
    """A Pin, for the entry at `path`, on the file now at `source` (renamed to `path` next):
    the lock is the inode's, so eviction cannot take the new entry between its rename and
    its reader's pin."""
    fd = os.open(source, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return Pin(path, fd)


def log_download(path: Path, size: int) -> None:
    """Append `<unix time> <pid> <corpus key>/<shard name> <bytes>` to the cache's download
    log (one write, so lines of the node's processes never interleave)."""
    line = f"{time.time():.3f} {os.getpid()} {path.parent.name}/{path.name} {size}\n"
    fd = os.open(path.parent.parent / DOWNLOAD_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def downloads(cache_dir: Path) -> list[tuple[str, int]]:
    """(corpus key/shard name, bytes) of every download logged in `cache_dir`, in order."""
    try:
        lines = (Path(cache_dir) / DOWNLOAD_LOG).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(parts[2], int(parts[3])) for parts in (line.split() for line in lines)]


class NoRoom(Exception):
    """A prefetch would take the cache past its limit (the shards in it are in use)."""


class ShardMismatch(OSError):
    """A downloaded copy is not the shard the manifest records (truncated or changed)."""


def check_download(path: Path, size: int, sha256: str) -> None:
    """ShardMismatch when the file at `path` has another size or sha256 than recorded."""
    actual = path.stat().st_size
    if actual != size:
        raise ShardMismatch(f"got {actual} bytes, the manifest records {size} (truncated body?)")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise ShardMismatch(
            "sha256 differs from the manifest's (the object changed after the manifest was "
            "written, or was corrupted on the way)"
        )


def cached_entries(cache_dir: Path) -> list[tuple[float, int, Path]]:
    """(last use as a timestamp, bytes, path) of every complete shard entry under
    `cache_dir` (all corpora), oldest first."""
    entries = []
    for sidecar in cache_dir.glob(f"*/*{SIDECAR}"):
        shard = sidecar.with_name(sidecar.name[: -len(SIDECAR)])
        try:
            entries.append((sidecar.stat().st_mtime, shard.stat().st_size, shard))
        except OSError:
            continue
    return sorted(entries)


def incoming_bytes(cache_dir: Path) -> int:
    """Bytes of the downloads under way into `cache_dir` (their `.incoming` records, those of
    live processes: a crashed download's record is left out)."""
    total = 0
    for record in cache_dir.glob(f"*/.*{INCOMING}"):
        try:
            size, pid = (int(part) for part in record.read_text().split())
            os.kill(pid, 0)  # raises when the process is gone
        except (OSError, ValueError):
            continue
        total += size
    return total


def make_room(
    cache_dir: Path,
    incoming: int,
    limit_bytes: int | None,
    record: Path | None = None,
    prefetch: bool = False,
) -> bool:
    """Evict least recently used shards not in use until the cache's shards and downloads
    under way total at most `limit_bytes` - `incoming` bytes (no limit: nothing is
    evicted); whether they do. `record`, when given, is written with `incoming` (the
    download's bytes, counted as in the cache from now on) unless a `prefetch` does not
    fit (it is not made)."""
    if limit_bytes is None:
        return True
    cache_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(cache_dir / EVICTION_LOCK):
        # downloads under way first: one that completes meanwhile (its entry is written
        # before its record goes) is then counted twice, never missed
        total = incoming_bytes(cache_dir)
        entries = cached_entries(cache_dir)
        total += sum(size for _, size, _ in entries)
        for _, size, shard in entries:
            if total + incoming <= limit_bytes:
                break
            if evict(shard):
                total -= size
        fits = total + incoming <= limit_bytes
        if record is not None and (fits or not prefetch):
            record.write_text(f"{incoming} {os.getpid()}\n")
        return fits


def evict(shard: Path) -> bool:
    """Remove one cache entry unless a reader holds it; whether it was removed."""
    try:
        fd = os.open(shard, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # in use
    try:
        shard.with_name(shard.name + SIDECAR).unlink(missing_ok=True)
        shard.unlink(missing_ok=True)
        STATS.evicted += 1
        return True
    finally:
        os.close(fd)
