"""pretrain.storage without a network: URLs and brace patterns, the retry policy's backoff
statistics and budget, and the node-shared shard cache (atomic, checked downloads, one
download among concurrent fetchers, least-recently-used eviction that spares shards in use)."""

import hashlib
import itertools
import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from pretrain.errors import ConfigError
from pretrain.storage import (
    RetryPolicy,
    StorageError,
    cache,
    expand_braces,
    filesystem,
    is_url,
    join_url,
    redact,
    with_retries,
)


def test_brace_patterns_expand_as_webdataset_does():
    assert expand_braces("s3://b/shard-{000000..000002}.tar") == [
        "s3://b/shard-000000.tar",
        "s3://b/shard-000001.tar",
        "s3://b/shard-000002.tar",
    ]
    assert expand_braces("{a,b}-{8..10}") == ["a-8", "a-9", "a-10", "b-8", "b-9", "b-10"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def test_urls_are_told_from_paths_and_credentials_are_hidden():
    assert is_url("s3://bucket/corpus") and is_url("https://host/x") and is_url("gs://b")
    assert not is_url("data/builtin") and not is_url("/abs/path") and not is_url("file:///x")
    assert join_url("s3://b/corpus/", "shard-000000.tar") == "s3://b/corpus/shard-000000.tar"
    assert redact("https://user:secret@host/c?token=abc") == "https://host/c"


def test_a_missing_backend_names_the_extra_to_install():
    with pytest.raises(ConfigError, match=r'pip install "pretrain\[azure\]"'):
        filesystem("az://container/corpus")


def test_backoff_is_full_jitter_under_a_growing_cap():
    policy, rng = RetryPolicy(attempts=8, base_delay_s=0.5, max_delay_s=3.0), random.Random(0)
    for attempt, cap in ((1, 1.0), (2, 2.0), (5, 3.0)):
        draws = [policy.delay_s(attempt, rng) for _ in range(4000)]
        assert 0 <= min(draws) and max(draws) <= cap
        assert sum(draws) / len(draws) == pytest.approx(cap / 2, rel=0.05)  # uniform on [0, cap]
        assert max(draws) > 0.95 * cap


def test_transient_failures_are_retried_within_the_budget_then_named():
    calls, waits = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "bytes"

    policy = RetryPolicy(attempts=4, base_delay_s=0.1)
    assert with_retries(flaky, "s3://b/k", policy, sleep=waits.append) == "bytes"
    assert len(calls) == 3 and len(waits) == 2

    def down():
        raise TimeoutError("timed out")

    with pytest.raises(StorageError, match=r"s3://b/k: download failed after 4 attempt\(s\)"):
        with_retries(down, "s3://key:pw@b/k", policy, sleep=waits.append)

    def missing():
        calls.append(1)
        raise FileNotFoundError("no such key")

    calls.clear()
    with pytest.raises(StorageError, match=r"after 1 attempt\(s\): FileNotFoundError"):
        with_retries(missing, "s3://b/k", policy, sleep=waits.append)
    assert len(calls) == 1  # a missing object is not retried


def _writer(data: bytes, counter: list, before=lambda: None):
    def download(partial: Path) -> None:
        counter.append(1)
        before()
        partial.write_bytes(data)

    return download


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_one_download_among_concurrent_fetchers_then_hits(tmp_path, monkeypatch):
    data, downloads = b"x" * 5000, []
    entry = tmp_path / "corpus" / "shard-000000.tar"
    pins, errors = [], []
    # the download goes on once every fetcher has missed and gone for the entry's lock
    missed, file_lock = threading.Semaphore(0), cache.file_lock
    monkeypatch.setattr(cache, "file_lock", lambda path: missed.release() or file_lock(path))

    def all_missed():
        assert all(missed.acquire(timeout=120) for _ in range(4))

    def fetch():
        try:
            pins.append(
                cache.fetch(entry, len(data), _sha(data), _writer(data, downloads, all_missed))
            )
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(pins) == 4 and len(downloads) == 1
    assert entry.read_bytes() == data
    assert cache.downloads(tmp_path) == [("corpus/shard-000000.tar", 5000)]
    assert not list(entry.parent.glob(".*partial*"))  # renamed into place


def test_a_wrong_download_is_refused_and_leaves_nothing(tmp_path):
    entry = tmp_path / "corpus" / "shard-000000.tar"
    good, bad = b"a" * 100, b"b" * 100
    with pytest.raises(cache.ShardMismatch, match="sha256 differs"):
        cache.fetch(entry, 100, _sha(good), _writer(bad, []))
    with pytest.raises(cache.ShardMismatch, match="got 50 bytes"):
        cache.fetch(entry, 100, _sha(good), _writer(good[:50], []))
    assert sorted(p.name for p in entry.parent.iterdir()) == ["shard-000000.tar.lock"]


def test_eviction_is_least_recently_used_and_spares_shards_in_use(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "clock_ns", itertools.count(1).__next__)  # a tick per use
    shards = {name: name.encode() * 1000 for name in ("a", "b", "c", "d")}  # 1000 bytes each
    root = tmp_path / "corpus"

    def get(name: str) -> cache.Pin:
        data = shards[name]
        return cache.fetch(root / name, len(data), _sha(data), _writer(data, []), 2500)

    get("a").close()
    get("b").close()
    get("a").close()  # a hit: now b is the least recently used
    get("c").close()
    assert sorted(p.name for p in root.glob("?")) == ["a", "c"]
    held = get("a")  # in use while d arrives: c (older use) goes although a is the oldest
    with held:
        get("c").close()
        get("d").close()
    assert sorted(p.name for p in root.glob("?")) == ["a", "d"]
    stored = sum(p.stat().st_size for p in root.glob("?"))
    assert stored <= 2500


def test_a_process_holds_its_recent_shards_from_eviction(tmp_path):
    """Through fsspec's in-memory filesystem: shards this process holds (its last
    HELD_SHARDS) are not evicted however small the limit; older ones are."""
    import fsspec

    from pretrain.storage import StorageSpec, hold_shard
    from pretrain.storage.corpus import HELD_SHARDS

    memory = fsspec.filesystem("memory")
    names = [f"shard-{n:06d}.tar" for n in range(HELD_SHARDS + 3)]
    records = []
    for number, name in enumerate(names):
        data = bytes([number]) * 1000
        memory.pipe_file(f"/held-corpus/{name}", data)
        records.append((name, len(data), _sha(data)))
    spec = StorageSpec(
        url="memory://held-corpus", root=str(tmp_path / "c"), shards=tuple(records), limit_bytes=1
    )
    for name in names:
        assert hold_shard(spec, name).read_bytes() == memory.cat_file(f"/held-corpus/{name}")
    kept = sorted(p.name for p in (tmp_path / "c").glob("shard-*.tar"))
    # evicted before each download: the held ones then (released since) and the newest stay
    assert kept == names[-(HELD_SHARDS + 1) :]


def test_the_cache_exceeds_its_limit_only_by_the_shards_readers_hold(tmp_path):
    """Real files, real eviction, real prefetch threads (fsspec's in-memory filesystem as
    the remote): prefetching alone never takes the cache past its limit; reading, the cache
    holds at most the limit plus the shards the readers hold (HELD_SHARDS), never evicts a
    shard held, and downloads each shard once (a prefetched shard waits, pinned, for its
    reader)."""
    import fsspec

    from pretrain.storage import StorageSpec, hold_shard, prefetcher
    from pretrain.storage.corpus import HELD_SHARDS, _held

    memory, shard_bytes = fsspec.filesystem("memory"), 1000
    names = [f"shard-{n:06d}.tar" for n in range(3 * HELD_SHARDS)]
    records = []
    for number, name in enumerate(names):
        data = bytes([number]) * shard_bytes
        memory.pipe_file(f"/bounded-corpus/{name}", data)
        records.append((name, shard_bytes, _sha(data)))
    limit = 5 * shard_bytes
    root = tmp_path / "cache" / "corpus"
    spec = StorageSpec(
        url="memory://bounded-corpus",
        root=str(root),
        shards=tuple(records),
        limit_bytes=limit,
        prefetch_shards=4,
    )

    def stored() -> int:
        return sum(size for _, size, _ in cache.cached_entries(tmp_path / "cache"))

    prefetcher().prefetch(spec, [((0, n), name) for n, name in enumerate(names)])
    assert prefetcher().wait_idle()
    assert stored() <= limit  # the first shards that fit, pinned for their reader
    for number, name in enumerate(names):
        upcoming = list(enumerate(names))[number + 1 : number + 5]
        prefetcher().prefetch(spec, [((0, n), later) for n, later in upcoming])
        path = hold_shard(spec, name)
        assert path.read_bytes() == bytes([number]) * shard_bytes
        assert prefetcher().wait_idle()
        held = _held()
        assert all(pin.path.exists() for pin in held.values())  # never evicted in use
        assert stored() <= limit + len(held) * shard_bytes <= limit + HELD_SHARDS * shard_bytes
    fetched = Counter(name for name, _ in cache.downloads(tmp_path / "cache"))
    assert set(fetched) == {f"corpus/{name}" for name in names}
    assert set(fetched.values()) == {1}
    assert not list(root.glob(".*.incoming"))
