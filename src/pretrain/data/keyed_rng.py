"""Randomness keyed by (seed, epoch, sample key): the same draws whatever the number of nodes
and workers, whatever the order samples arrive in, and after a resume.

`keyed_uniform` is a counter-based generator (splitmix64 over seed, epoch, stream, key and
position), vectorised over a whole batch. `keyed_generator` gives a numpy Generator for
per-sequence decisions that need more than uniforms (lengths, choices).
"""

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

# Streams keep independent uses of one key apart.
STREAM_SHARD_ORDER = 1
STREAM_SHUFFLE = 2
STREAM_FORMAT = 3
STREAM_MASK_SELECT = 10
STREAM_MASK_ACTION = 11
STREAM_MASK_RANDOM_TOKEN = 12


def key_hash(key: str) -> int:
    """Stable unsigned 64-bit hash of a sample key (not Python's salted `hash`)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def key_hashes(keys: list[str]) -> np.ndarray:
    """`key_hash` of each key, as a uint64 array of shape (len(keys),)."""
    return np.fromiter((key_hash(k) for k in keys), dtype=np.uint64, count=len(keys))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def keyed_uniform(
    seed: int, epoch: int, stream: int, hashes: np.ndarray, length: int
) -> np.ndarray:
    """Uniform [0, 1) floats of shape (len(hashes), length); entry (i, t) depends only on
    (seed, epoch, stream, hashes[i], t)."""
    with np.errstate(over="ignore"):
        base = np.uint64(seed) ^ _splitmix64(np.uint64(epoch) ^ _splitmix64(np.uint64(stream)))
        rows = _splitmix64(hashes.astype(np.uint64) ^ _splitmix64(base))  # (batch,)
        positions = np.arange(length, dtype=np.uint64) * _GOLDEN  # (length,)
        x = _splitmix64(rows[:, None] ^ positions[None, :])  # (batch, length)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def keyed_generator(seed: int, epoch: int, stream: int, key: str) -> np.random.Generator:
    """A numpy Generator seeded from (seed, epoch, stream, key)."""
    return np.random.default_rng([seed, epoch, stream, key_hash(key)])
