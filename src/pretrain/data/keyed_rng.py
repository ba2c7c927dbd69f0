"""Randomness keyed by (seed, epoch, sample key): the same draws whatever the number of nodes
and workers, whatever the order samples arrive in, and after a resume.

`keyed_uniform` is a counter-based generator (splitmix64 over seed, epoch, stream, key and
position), vectorised over a whole batch. `keyed_generator` gives a numpy Generator for
per-sequence decisions that need more than uniforms (lengths, choices), and
`keyed_generators` one per key of a batch: each is exactly
`np.random.default_rng([seed, epoch, stream, key_hash(key)])`, but numpy's SeedSequence
(its entropy mixing and `generate_state`, ~4/5 of the cost of building a Generator) is
computed here vectorised over the keys and handed to PCG64 through numpy's `ISeedSequence`
interface (checked against numpy once per process, else numpy seeds each key itself;
`tests/unit/test_batched_draws.py` compares the draws on random inputs).
"""

import hashlib
from functools import lru_cache

import numpy as np
from numpy.random.bit_generator import ISeedSequence

# splitmix64's constants, as Python ints (`_splitmix64_int`) and as numpy words
GOLDEN, M1, M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN, _M1, _M2 = np.uint64(GOLDEN), np.uint64(M1), np.uint64(M2)

# Streams keep independent uses of one key apart.
STREAM_SHARD_ORDER = 1
STREAM_SHUFFLE = 2
STREAM_FORMAT = 3
STREAM_SEQUENCE_ORDER = 4
STREAM_MASK_SELECT = 10
STREAM_MASK_ACTION = 11
STREAM_MASK_RANDOM_TOKEN = 12


_BLAKE2B_8 = hashlib.blake2b(digest_size=8)  # never updated: key_hash copies it per key


@lru_cache(maxsize=1024)  # a few batches: hits within a batch, not across an epoch
def key_hash(key: str) -> int:
    """Stable unsigned 64-bit hash of a sample key (not Python's salted `hash`); cached for
    the per-key callers (`keyed_generator`, `scalar_keyed_uniform`: a key's several draws)."""
    return int.from_bytes(_digest(key), "little")


def _digest(key: str) -> bytes:
    """blake2b(digest_size=8) of the key's UTF-8 bytes: 8 bytes."""
    blake = _BLAKE2B_8.copy()  # the same digest as a new blake2b(digest_size=8), made faster
    blake.update(key.encode())
    return blake.digest()


def key_hashes(keys: list[str]) -> np.ndarray:
    """`key_hash` of each key, as a uint64 array of shape (len(keys),): the digests joined
    and read as little-endian words (not through `key_hash`'s cache, whose misses cost more
    than hashing a batch's keys afresh)."""
    return np.frombuffer(b"".join(map(_digest, keys)), "<u8").astype(np.uint64)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, wrapping modulo 2**64: arrays wrap silently (numpy checks
    overflow of scalars only, under `np.errstate(over="ignore")` in `_stream_key`)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@lru_cache(maxsize=64)
def _stream_key(seed: int, epoch: int, stream: int) -> np.uint64:
    """What `keyed_uniform` mixes each row's hash with, for (seed, epoch, stream)."""
    with np.errstate(over="ignore"):
        base = np.uint64(seed) ^ _splitmix64(np.uint64(epoch) ^ _splitmix64(np.uint64(stream)))
        return _splitmix64(base)


def _row_keys(seed: int, epoch: int, stream: int, hashes: np.ndarray) -> np.ndarray:
    """The per-row keys of `keyed_uniform`, (len(hashes),) uint64."""
    return _splitmix64(hashes.astype(np.uint64) ^ _stream_key(seed, epoch, stream))


def keyed_uniform(
    seed: int, epoch: int, stream: int, hashes: np.ndarray, length: int
) -> np.ndarray:
    """Uniform [0, 1) floats of shape (len(hashes), length); entry (i, t) depends only on
    (seed, epoch, stream, hashes[i], t)."""
    rows = _row_keys(seed, epoch, stream, hashes)  # (batch,)
    positions = np.arange(length, dtype=np.uint64) * _GOLDEN  # (length,)
    x = _splitmix64(rows[:, None] ^ positions[None, :])  # (batch, length)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


_MASK64 = (1 << 64) - 1


def _splitmix64_int(x: int) -> int:
    """`_splitmix64` of one Python int."""
    x = (x + GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * M1) & _MASK64
    x = ((x ^ (x >> 27)) * M2) & _MASK64
    return x ^ (x >> 31)


def scalar_keyed_uniform(seed: int, epoch: int, stream: int, key: str, length: int) -> list:
    """`keyed_uniform(seed, epoch, stream, [key_hash(key)], length)[0]` as Python
    floats, in plain integer arithmetic: one key's few draws without numpy's per-call cost
    (a memory segment's cut and random-B choice)."""
    base = seed ^ _splitmix64_int(epoch ^ _splitmix64_int(stream))
    row = _splitmix64_int(key_hash(key) ^ _splitmix64_int(base))
    return [
        (_splitmix64_int(row ^ ((t * GOLDEN) & _MASK64)) >> 11) * (1.0 / (1 << 53))
        for t in range(length)
    ]


def keyed_uniform_at(
    seed: int, epoch: int, stream: int, hashes: np.ndarray, rows: np.ndarray, columns: np.ndarray
) -> np.ndarray:
    """`keyed_uniform(seed, epoch, stream, hashes, length)[rows, columns]` (any length past
    the columns), computed at those entries only: rows, columns int arrays of one shape
    (row indices into hashes, positions); returns floats of that shape."""
    keys = _row_keys(seed, epoch, stream, hashes)[rows]
    x = _splitmix64(keys ^ (columns.astype(np.uint64) * _GOLDEN))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def keyed_generator(seed: int, epoch: int, stream: int, key: str) -> np.random.Generator:
    """A numpy Generator seeded from (seed, epoch, stream, key): the one
    `np.random.default_rng([seed, epoch, stream, key_hash(key)])` gives."""
    return np.random.default_rng([seed, epoch, stream, key_hash(key)])


def keyed_generators(
    seed: int, epoch: int, stream: int, keys: list[str]
) -> list[np.random.Generator]:
    """`keyed_generator(seed, epoch, stream, key)` for each of `keys`, the seeding
    vectorised over the keys (one independent Generator each)."""
    if not keys:
        return []
    if not _batched_seeding_works():
        return [keyed_generator(seed, epoch, stream, key) for key in keys]
    words = _seed_words([seed, epoch, stream], key_hashes(keys))
    return [_generator(row) for row in words]


@lru_cache(maxsize=1)
def _batched_seeding_works() -> bool:
    """Whether this numpy seeds `default_rng` as reproduced here (SeedSequence into PCG64),
    checked once per process on a few keys."""
    hashes = np.array([0, 1, 2**32 + 5, 2**64 - 1], np.uint64)
    try:
        ours = [_generator(words).random(3) for words in _seed_words([1234, 1, 3], hashes)]
    except (TypeError, ValueError):
        return False
    theirs = [np.random.default_rng([1234, 1, 3, int(h)]).random(3) for h in hashes]
    return all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


# numpy's SeedSequence (numpy/random/bit_generator.pyx, unchanged since numpy 1.17): the
# entropy's 32-bit words are mixed into a pool of 4 words by `hashmix` and `mix`, each
# hashmix call advancing a hash constant; `generate_state` draws the output words from the
# pool the same way with another constant. All arithmetic is modulo 2**32; the functions
# below take Python ints (constants) or uint32 arrays (a batch of keys) alike.
_POOL_SIZE = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_MASK32 = 0xFFFFFFFF
_OUTPUT_WORDS = 8  # generate_state(4, np.uint64): 8 words of 32 bits


def _hash_constants(count: int, init: int, mult: int) -> list[tuple[int, int]]:
    """(constant xored in, constant multiplied by) of the first `count` hash calls: the
    running constant before and after its update. Data-independent."""
    pairs, h = [], init
    for _ in range(count):
        after = (h * mult) & _MASK32
        pairs.append((h, after))
        h = after
    return pairs


_MIX_CONSTANTS = _hash_constants(_POOL_SIZE * _POOL_SIZE + _POOL_SIZE * 16, _INIT_A, _MULT_A)
_OUTPUT_CONSTANTS = _hash_constants(_OUTPUT_WORDS, _INIT_B, _MULT_B)


def _hashmix(value, call: int):
    """SeedSequence's hashmix as its `call`-th call (0-based) makes it."""
    xor, mult = _MIX_CONSTANTS[call]
    value = ((value ^ xor) * mult) & _MASK32
    return value ^ (value >> 16)


def _mix(x, y):
    result = (((_MIX_MULT_L * x) & _MASK32) - ((_MIX_MULT_R * y) & _MASK32)) & _MASK32
    return result ^ (result >> 16)


def _int_words(value: int) -> list[int]:
    """A non-negative int as SeedSequence reads it: 32-bit words, least significant first
    ([0] for 0)."""
    if value < 0:
        raise ValueError(f"seed entropy must be non-negative, got {value}")
    words = [value & _MASK32]
    value >>= 32
    while value:
        words.append(value & _MASK32)
        value >>= 32
    return words


def _pool(words: list) -> list:
    """SeedSequence's entropy pool (4 words) mixed from `words` (ints or uint32 arrays)."""
    if len(words) > _POOL_SIZE + 16:
        raise ValueError("seed entropy too long")
    pool = [_hashmix(words[i] if i < len(words) else 0, i) for i in range(_POOL_SIZE)]
    call = _POOL_SIZE
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = _mix(pool[dst], _hashmix(pool[src], call))
                call += 1
    for src in range(_POOL_SIZE, len(words)):
        for dst in range(_POOL_SIZE):
            pool[dst] = _mix(pool[dst], _hashmix(words[src], call))
            call += 1
    return pool


def _output(pool: list):
    """generate_state(4, np.uint64) from the pool: 4 uint64 words (ints or arrays)."""
    out = []
    for i, (xor, mult) in enumerate(_OUTPUT_CONSTANTS):
        value = ((pool[i % _POOL_SIZE] ^ xor) * mult) & _MASK32
        out.append(value ^ (value >> 16))
    return [out[i] | (out[i + 1] << 32) for i in range(0, _OUTPUT_WORDS, 2)]


def _seed_words(prefix: list[int], hashes: np.ndarray) -> np.ndarray:
    """`np.random.SeedSequence([*prefix, h]).generate_state(4, np.uint64)` for each h of
    `hashes` (n,) uint64: (n, 4) uint64."""
    head = [w for value in prefix for w in _int_words(int(value))]
    hashes = np.asarray(hashes, dtype=np.uint64)
    low = (hashes & np.uint64(_MASK32)).astype(np.uint32)
    high = (hashes >> np.uint64(32)).astype(np.uint32)
    two = high != 0  # a hash of 2**32 or more is two words of entropy, a smaller one one
    with np.errstate(over="ignore"):
        pool = [
            np.where(two, with_high, without)
            for with_high, without in zip(
                _pool([*head, low, high]), _pool([*head, low]), strict=True
            )
        ]
        words = [w.astype(np.uint64) for w in _output([p.astype(np.uint64) for p in pool])]
    return np.stack(words, axis=1)


class _StateWords(ISeedSequence):
    """The words a SeedSequence would generate for PCG64, handed to it as they are."""

    def __init__(self, words: np.ndarray) -> None:
        self.words = words

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        if n_words != 4 or np.dtype(dtype) != np.uint64:
            raise ValueError("only PCG64's seeding (4 uint64 words) is precomputed")
        return self.words


def _generator(words: np.ndarray) -> np.random.Generator:
    """A PCG64 Generator seeded from generate_state words (4,) uint64."""
    return np.random.Generator(np.random.PCG64(_StateWords(np.ascontiguousarray(words))))
