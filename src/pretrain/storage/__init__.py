"""URLs -> verified local files: fsspec filesystems (s3://, gs://, az://, hf://, http(s)://,
imported lazily), the node-shared LRU shard cache with file locks, atomic and sha256-checked
downloads, prefetch, and retries with backoff and jitter. Nothing else in the project knows
about remote storage: readers ask `pin_shard` for a shard and read a local file."""

from pretrain.storage.cache import STATS, CacheStats, Pin
from pretrain.storage.corpus import (
    StorageSpec,
    check_remote_shards,
    corpus_key,
    default_cache_dir,
    hold_shard,
    keep_copy,
    mirror_corpus,
    pin_shard,
    prefetcher,
    remote_manifest_exists,
)
from pretrain.storage.retry import RetryPolicy, StorageError, with_retries
from pretrain.storage.upload import publish_corpus
from pretrain.storage.urls import expand_braces, filesystem, is_url, join_url, local_path, redact

__all__ = [
    "STATS",
    "CacheStats",
    "Pin",
    "RetryPolicy",
    "StorageError",
    "StorageSpec",
    "check_remote_shards",
    "corpus_key",
    "default_cache_dir",
    "expand_braces",
    "filesystem",
    "hold_shard",
    "keep_copy",
    "is_url",
    "join_url",
    "local_path",
    "mirror_corpus",
    "pin_shard",
    "prefetcher",
    "publish_corpus",
    "redact",
    "remote_manifest_exists",
    "with_retries",
]
