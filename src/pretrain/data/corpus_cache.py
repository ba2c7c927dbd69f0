"""A per-process cache of what is computed from a shard, one LRU per corpus (the shard's
directory, or a remote corpus's directory in the node's cache), bounded per corpus: the
sources of a mixture (`data.sources`), read in turn, never evict each other's entries, and
one corpus's memory stays within its bound. Imports nothing of ours."""

import functools
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class CorpusLRU:
    """`function(path, *args)` cached per corpus: each corpus keeps its most recently used
    entries whose `weight(path)` (1 an entry by default) sums to at most `limit` (the last
    entry is kept whatever its weight). `cache_clear()` empties every corpus's;
    `cache_info()` sums their hits, misses and entries (maxsize: `limit`, per corpus)."""

    def __init__(
        self, function: Callable, limit: int, weight: Callable[[str], int] | None = None
    ) -> None:
        functools.update_wrapper(self, function)
        self.function, self.limit = function, limit
        self.weight = weight or (lambda path: 1)
        self.corpora: dict[str, OrderedDict[tuple, tuple[int, Any]]] = {}
        self.hits = self.misses = 0

    def __call__(self, path: str, *args: Any) -> Any:
        corpus = self.corpora.setdefault(os.path.dirname(path), OrderedDict())
        key = (path, *args)
        held = corpus.get(key)
        if held is not None:
            self.hits += 1
            corpus.move_to_end(key)
            return held[1]
        self.misses += 1
        value = self.function(path, *args)
        corpus[key] = (self.weight(path), value)
        total = sum(weight for weight, _ in corpus.values())
        while total > self.limit and len(corpus) > 1:
            total -= corpus.popitem(last=False)[1][0]
        return value

    def cache_clear(self) -> None:
        """Forget every corpus's entries and the counts."""
        self.corpora.clear()
        self.hits = self.misses = 0

    def cache_info(self) -> functools._CacheInfo:
        """(hits, misses, maxsize = the limit per corpus, entries held) over every corpus."""
        held = sum(len(corpus) for corpus in self.corpora.values())
        return functools._CacheInfo(self.hits, self.misses, self.limit, held)


def corpus_lru(limit: int, weight: Callable[[str], int] | None = None) -> Callable:
    """A decorator: the function cached as a `CorpusLRU` of `limit` (and `weight`)."""
    return lambda function: CorpusLRU(function, limit, weight)
