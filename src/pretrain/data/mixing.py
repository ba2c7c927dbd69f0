"""The mixing schedule of several prepared corpora (`data.sources`): which source each global
sample of an epoch comes from. Pure arithmetic, no I/O; imports nothing of ours.

Every block of `block` consecutive global samples holds each source's count (its share of
the block by largest remainder, `block_counts`) in the same fixed order, a smooth weighted
round-robin (`smooth_order`): source s is picked where its running deficit is largest, so
every window of `block` samples, aligned or not, holds each source's count within one
sample. The schedule depends on the shares and the block only: never on ranks, workers, the
batch size or the epoch, so sample i of a mixture is source `locate(i)[0]`'s
`locate(i)[1]`-th sample of its own global order (`data/mixture.py`) for any shape.

A mix per phase (`objective.stages[k].source_weights`, `PhasedMix`): stage k's samples, those
whose progress e x T + min(i x L, T) (`data/stages.py`) lies in its range, follow stage k's
schedule, from the stage's first sample of the epoch on; each source continues its own order
where the previous phases left it. A function of (epoch, i) only, so a resume in mid-phase,
on any shape, continues it.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

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

    @cached_property
    def _picks(self) -> tuple[int, list[int], list[int]]:
        """The block, `order` and `within` as Python lists (a sample's lookup, per sample of
        the stream, without numpy scalars)."""
        return len(self.order), self.order.tolist(), self.within.tolist()

    def locate(self, i: int) -> tuple[int, int]:
        """(source, k) of global sample `i`: it is the source's k-th sample (from 0)."""
        block, order, within = self._picks
        q, j = divmod(i, block)
        s = order[j]
        return s, q * self.counts[s] + within[j]

    def counts_before(self, i: int) -> tuple[int, ...]:
        """Each source's samples among global samples 0 .. i - 1."""
        q, j = divmod(i, self.block)
        return tuple(q * c + int(p) for c, p in zip(self.counts, self.prefix[j], strict=True))

    @cached_property
    def _places(self) -> list[list[int]]:
        """Each source's places in the block, as Python lists."""
        return [np.flatnonzero(self.order == s).tolist() for s in range(len(self.counts))]

    def index_of(self, s: int, k: int) -> int:
        """The global sample that is source `s`'s k-th (from 0): `locate`'s inverse."""
        q, r = divmod(k, self.counts[s])
        return q * self.block + self._places[s][r]

    def of_epoch(self, epoch: int) -> "MixSchedule":
        """The schedule of epoch `epoch`: the same in every epoch."""
        return self


NEVER = 1 << 62  # the first sample of a phase an epoch does not reach


@dataclass(frozen=True, eq=False)
class EpochMix:
    """A `PhasedMix` in one epoch: phase k's schedule serves global samples starts[k] ..
    starts[k + 1] - 1, its sample j (from 0) being samples[k] + j; `bases[k]`: each source's
    samples before starts[k]. `locate`, `counts_before`, `index_of` as `MixSchedule`'s."""

    phases: tuple[MixSchedule, ...]
    starts: tuple[int, ...]
    bases: tuple[tuple[int, ...], ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The sources' names."""
        return self.phases[0].names

    def phase(self, i: int) -> int:
        """The phase of global sample `i`: the last whose start is at most i."""
        return int(np.searchsorted(self.starts, i, side="right")) - 1

    def locate(self, i: int) -> tuple[int, int]:
        """(source, k) of global sample `i`: it is the source's k-th sample (from 0)."""
        k = self.phase(i)
        s, n = self.phases[k].locate(i - self.starts[k])
        return s, self.bases[k][s] + n

    def counts_before(self, i: int) -> tuple[int, ...]:
        """Each source's samples among global samples 0 .. i - 1."""
        k = self.phase(i)
        here = self.phases[k].counts_before(i - self.starts[k])
        return tuple(b + c for b, c in zip(self.bases[k], here, strict=True))

    def index_of(self, s: int, n: int) -> int:
        """The global sample that is source `s`'s n-th (from 0)."""
        k = int(np.searchsorted([base[s] for base in self.bases], n, side="right")) - 1
        return self.starts[k] + self.phases[k].index_of(s, n - self.bases[k][s])


@dataclass(frozen=True, eq=False)
class PhasedMix:
    """A mix per phase of `objective.stages`: `phases[k]` is stage k's schedule, stage k
    ending where progress reaches `until_tokens[k]`; progress of global sample i of epoch
    e is e x T + min(i x L, T), L = `sample_tokens` (data.max_seq_length), T =
    `epoch_tokens` (the sources' training tokens), as `stages.sample_progress_tokens`; with
    `stage_lengths` (a `stages.StageLengths`: a stage's own max_seq_length, a
    context-extension phase) a sample of stage k counts its length, as there."""

    phases: tuple[MixSchedule, ...]
    until_tokens: tuple[int, ...]
    sample_tokens: int
    epoch_tokens: int
    stage_lengths: Any = None

    @property
    def names(self) -> tuple[str, ...]:
        """The sources' names."""
        return self.phases[0].names

    @property
    def counts(self) -> tuple[int, ...]:
        """The first phase's counts per block."""
        return self.phases[0].counts

    def first_sample(self, until: int, epoch: int) -> int:
        """The first global sample of epoch `epoch` whose progress reaches `until` tokens
        (`NEVER` when none does)."""
        left = until - epoch * self.epoch_tokens
        if left <= 0:
            return 0
        return -(-left // self.sample_tokens) if left <= self.epoch_tokens else NEVER

    def starts(self, epoch: int) -> list[int]:
        """The first global sample of each phase in epoch `epoch` (0: begun before it,
        `NEVER`: not reached in it)."""
        starts = [0, *(self.first_sample(until, epoch) for until in self.until_tokens)]
        if self.stage_lengths is None:
            return starts
        firsts = self.stage_lengths.segments(epoch, self.epoch_tokens)[0].tolist()
        firsts = [0] * (len(starts) - len(firsts)) + firsts  # 0: begun before this epoch
        pairs = zip(starts, firsts, strict=True)
        return [NEVER if plain == NEVER else first for plain, first in pairs]

    def of_epoch(self, epoch: int) -> EpochMix:
        """Epoch `epoch`'s `EpochMix`."""
        starts = self.starts(epoch)
        bases = [tuple(0 for _ in self.names)]
        for k in range(1, len(starts)):
            span = starts[k] - starts[k - 1]
            done = self.phases[k - 1].counts_before(span)
            bases.append(tuple(b + c for b, c in zip(bases[-1], done, strict=True)))
        return EpochMix(self.phases, tuple(starts), tuple(bases))


def mix_schedule(names: Sequence[str], shares: Sequence[float], block: int) -> MixSchedule:
    """The `MixSchedule` of sources `names` with `shares` (summing to 1; 0: a source left out
    of this phase) per block of `block` samples. ValueError naming the source when a
    positive share rounds to no sample of a block."""
    counts = block_counts(shares, block)
    for name, count, share in zip(names, counts, shares, strict=True):
        if count == 0 and share > 0:
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
    marks ((rows, 8) int64, `positions.StreamMark` a row: the partition is column 0)."""
    offsets = np.asarray([source.offset for source in spec.sources])
    return np.searchsorted(offsets, np.asarray(marks)[:, 0], side="right").astype(np.int64) - 1


def source_samples(spec, samples: int, epoch: int = 0) -> dict[str, int]:
    """{source name: its samples among the first `samples` global samples of epoch `epoch`
    of the mixture}; {} for one corpus."""
    if not getattr(spec, "sources", ()):
        return {}
    mix = spec.mix.of_epoch(epoch)
    return dict(zip(mix.names, mix.counts_before(samples), strict=True))
