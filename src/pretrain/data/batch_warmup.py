"""Batch-size warm-up (ModernBERT): the global batch starts small and grows to the full one
over the first tokens of training (`data.batch_size_warmup_start`, samples, and
`data.batch_size_warmup_tokens`; the full batch is `data.global_batch_size`).

The global batch of optimizer step k is a whole multiple of the start size G0, growing
linearly with the tokens trained before the step:

    G_k = n_k x G0,   n_k = min(M, 1 + floor((M - 1) x T_k / N)),   M = G / G0,
    T_k = L x (G_0 + ... + G_{k-1})

(N = batch_size_warmup_tokens, L = data.max_seq_length: every sample counts as one sequence
of L tokens, padding included, as in `stages.py`). So the batch grows in M - 1 equal steps
of G0 and is full from the first step at or after N tokens on. G_k is a function of the
step index only: the same for any number of ranks, micro-batch size or data-loader workers,
and after a resume.

How a run trains it: the micro-batch keeps its shape, and Lightning accumulates the full
batch's A = G / (batch_size x ranks) micro-batches at every step. Step k's loader yields
A - a_k skipped micro-batches (markers the task does not compute) and then a_k = G_k /
(batch_size x ranks) real ones, whose loss the task scales by A / a_k, so the step's gradient
is the mean over its G_k samples. The stream itself is untouched: the samples come in the
order they come without warm-up, only grouped into steps differently (step k trains the G_k
samples after the first T_k / L), and every rank takes the same steps by construction.
"""

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pretrain.errors import ConfigError

SKIPPED_BATCH_KEY = "skipped_micro_batch"  # a marker micro-batch of a warm-up step


def is_skipped_batch(batch: object) -> bool:
    """True for the marker micro-batches that fill a warm-up step up to the full
    accumulation (no samples; the task computes nothing for them)."""
    return isinstance(batch, dict) and SKIPPED_BATCH_KEY in batch


@dataclass(frozen=True)
class BatchSizeWarmup:
    """The global batch of every optimizer step (module docstring). `start_samples` (G0) and
    `full_samples` (G) in samples per step, `warmup_tokens` (N) in tokens, `sample_tokens`
    (L) tokens a sample."""

    start_samples: int
    full_samples: int
    warmup_tokens: int
    sample_tokens: int

    @cached_property
    def level_starts(self) -> tuple[int, ...]:
        """The first optimizer step of each batch size n x G0, n = 1 .. M (M = G / G0)."""
        levels = self.full_samples // self.start_samples
        starts, step, tokens = [0], 0, 0  # tokens trained before `step`
        for n in range(1, levels):
            # level n lasts while (M - 1) x T < n x N
            short = n * self.warmup_tokens - (levels - 1) * tokens
            per_step = (levels - 1) * n * self.start_samples * self.sample_tokens
            steps = max(0, -(-short // per_step))
            step, tokens = (
                step + steps,
                tokens + steps * n * self.start_samples * self.sample_tokens,
            )
            starts.append(step)
        return tuple(starts)

    def global_batch(self, step: int) -> int:
        """Samples of optimizer step `step` (0-based), all ranks together."""
        return bisect_right(self.level_starts, step) * self.start_samples

    def samples_before(self, step: int) -> int:
        """Samples trained by the first `step` optimizer steps (the stream's position after
        them, within the first epoch)."""
        total, starts = 0, self.level_starts
        for n, first in enumerate(starts, start=1):
            last = starts[n] if n < len(starts) else None
            until = step if last is None else min(step, last)
            total += max(0, until - first) * n * self.start_samples
        return total

    def micro_batches(self, step: int, per_pass: int) -> int:
        """Real micro-batches per rank of step `step`: its global batch over `per_pass` =
        data.batch_size x ranks samples."""
        return self.global_batch(step) // per_pass


def batch_size_warmup(run: Any) -> BatchSizeWarmup | None:
    """The run's (typed TrainConfig) warm-up, or None when data.batch_size_warmup_tokens is
    null. ConfigError naming data.batch_size_warmup_start when a micro-batch pass over all
    ranks (data.batch_size x ranks) does not divide it."""
    data, plan = run.data, run.batch_plan
    if data.batch_size_warmup_tokens is None:
        return None
    per_pass = plan.micro_batch_size * plan.world_size
    if data.batch_size_warmup_start % per_pass:
        raise ConfigError(
            f"data.batch_size_warmup_start = {data.batch_size_warmup_start}: must be a multiple "
            f"of data.batch_size ({plan.micro_batch_size}) x ranks ({plan.world_size}) = "
            f"{per_pass} samples (every warm-up step is whole micro-batches on every rank); "
            "change it or data.batch_size"
        )
    return BatchSizeWarmup(
        data.batch_size_warmup_start,
        plan.global_batch_size,
        data.batch_size_warmup_tokens,
        data.max_seq_length,
    )
