"""The mixing schedule of several prepared corpora (`data.sources`): which source each global
sample of an epoch comes from. Pure arithmetic, no I/O; imports nothing of ours.

Every block of `block` consecutive global samples holds each source's count (its share of
the block by largest remainder, `block_counts`) in the same fixed order, a smooth weighted
round-robin (`smooth_order`): source s is picked where its running deficit is largest, so
every window of `block` samples, aligned or not, holds each source's count within one
sample. The schedule depends on the shares and the block only: never on ranks, workers, the
batch size or the epoch, so sample i of a mixture is source `locate(i)[0]`'s
`locate(i)[1]`-th sample of its own global order (`data/mixture.py`) for any shape.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def source_shares(
    weights: Sequence[float | None], epochs: Sequence[float | None], tokens: Sequence[int]
) -> list[float]:
    """Each source's share of the samples (summing to 1): its `weight`, or with `epochs` its
    passes per mixed epoch x its tokens (`tokens`: the source's training tokens), normalized.
    A source gives exactly one of the two (checked by the config's schema)."""
    raw = [
        float(w) if w is not None else float(e) * t
        for w, e, t in zip(weights, epochs, tokens, strict=True)
    ]
    total = sum(raw)
    return [r / total for r in raw]


def block_counts(shares: Sequence[float], block: int) -> tuple[int, ...]:
    """Samples of each source per block of `block` samples: floor(share x block), the rest
    dealt one each to the largest remainders (ties: the earlier source). Sums to `block`."""
    exact = [share * block for share in shares]
    counts = [int(np.floor(x)) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda s: (-(exact[s] - counts[s]), s))
    for s in by_remainder[: block - sum(counts)]:
        counts[s] += 1
    return tuple(counts)


def smooth_order(counts: Sequence[int]) -> np.ndarray:
    """(sum(counts),) int: the source of each sample of a block, by smooth weighted
    round-robin (each step every source gains its count, the largest total is picked, ties to
    the earlier source, and loses the block's size): source s's picks lie within one sample
    of the even spacing block / counts[s]."""
    block = sum(counts)
    current = np.zeros(len(counts), np.int64)
    gains = np.asarray(counts, np.int64)
    order = np.empty(block, np.int64)
    for j in range(block):
        current += gains
        s = int(np.argmax(current))  # the first of the largest
        current[s] -= block
        order[j] = s
    return order


@dataclass(frozen=True, eq=False)
class MixSchedule:
    """The mixture's fixed schedule: `names` of the sources, `counts` per block, and the
    block's order (`smooth_order`) with, for each of its samples, the number of samples of
    the same source before it in the block (`within`) and the counts of every source before
    it (`prefix`, (block + 1, sources))."""

    names: tuple[str, ...]
    counts: tuple[int, ...]
    order: np.ndarray
    within: np.ndarray
    prefix: np.ndarray

    @property
    def block(self) -> int:
        """Samples per block."""
        return len(self.order)

    def locate(self, i: int) -> tuple[int, int]:
        """(source, k) of global sample `i`: it is the source's k-th sample (from 0)."""
        q, j = divmod(i, self.block)
        s = int(self.order[j])
        return s, q * self.counts[s] + int(self.within[j])

    def counts_before(self, i: int) -> tuple[int, ...]:
        """Each source's samples among global samples 0 .. i - 1."""
        q, j = divmod(i, self.block)
        return tuple(q * c + int(p) for c, p in zip(self.counts, self.prefix[j], strict=True))


def mix_schedule(names: Sequence[str], shares: Sequence[float], block: int) -> MixSchedule:
    """The `MixSchedule` of sources `names` with `shares` (summing to 1) per block of `block`
    samples. ValueError naming the source when its share rounds to no sample of a block."""
    counts = block_counts(shares, block)
    for name, count, share in zip(names, counts, shares, strict=True):
        if count == 0:
            raise ValueError(
                f"source {name!r}: its share {share:.2g} gives no sample in a block of "
                f"{block} (data.mix_block_samples); raise the block or its weight"
            )
    order = smooth_order(counts)
    onehot = np.eye(len(counts), dtype=np.int64)[order]
    prefix = np.vstack([np.zeros(len(counts), np.int64), np.cumsum(onehot, axis=0)])
    within = prefix[np.arange(len(order)), order]
    return MixSchedule(tuple(names), counts, order, within, prefix)


SOURCE_KEY = "source_rows"  # (batch,) int64: each row's source in a mixture's batches


def row_sources(spec, marks):
    """(rows,) int64: the source (its index in spec.sources) of each row, from the rows'
    marks ((rows, 7) int64, `positions.StreamMark` a row: the partition is column 0)."""
    offsets = np.asarray([source.offset for source in spec.sources])
    return np.searchsorted(offsets, np.asarray(marks)[:, 0], side="right").astype(np.int64) - 1


def source_samples(spec, samples: int) -> dict[str, int]:
    """{source name: its samples among the mixture's first `samples` global samples}; {}
    for one corpus."""
    if not getattr(spec, "sources", ()):
        return {}
    return dict(zip(spec.mix.names, spec.mix.counts_before(samples), strict=True))
