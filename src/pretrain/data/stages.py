"""Corruption settings by training progress (`objective.stages`): ERNIE's curriculum (basic,
then phrase, then entity masking), a masking-rate schedule, any objective's settings changed
at set points of training.

Progress is keyed to the sample, never to the job: a sample's progress, in tokens, is

    progress(epoch e, global sample index i) = e x T + min(i x L, T)

where i is the sample's index in its epoch's global sample order (`stream.py`: the n-th
sequence of canonical partition p is sample n x P + p), L = data.max_seq_length (every
sample counts as one sequence of L tokens, padding included) and T = the training shards'
tokens per the manifest (what one epoch reads). It depends on (seed, epoch, partitions) only,
like the order itself, so a sample falls in the same stage whatever the number of nodes,
ranks, data-loader workers, micro-batch size or accumulation, and after a resume. Within the
first epoch a run that has trained s optimizer steps of G samples has consumed the first
s x G samples of the order, so its progress is the tokens it has seen (s x G x L); later
epochs start at e x T (the cap keeps progress increasing across an epoch's end).

Stage k serves the samples with until_tokens[k-1] <= progress < until_tokens[k]; the last
stage runs to the end of training. In the first epoch the first sample of stage k + 1 is
sample ceil(until_tokens[k] / L). A batch whose rows straddle a boundary is corrupted once per
stage it holds and its rows taken from their own stage (padded to the widest, which is in the
run's shape set: `shape_axes` is the union of the stages'). Batches without a position
(held-out evaluation, `pretrain-data preview`) use the last stage.

A context-extension phase: a stage may also set `max_seq_length` (its samples' length, at
most data.max_seq_length, which stays the run's longest and sizes its shapes; packed formats
only) and `global_rope_theta` (the global layers' RoPE theta of its rows, a ModernBERT model's;
the other stages keep the model's). A sample of stage k then counts L_k tokens
(`StageLengths`): progress is the sum of the lengths of the samples before it, and the
partition's format packs each sequence to its sample's stage length (`stream.py`). Each row
carries its stage's theta (ROPE_THETA_KEY, (batch,) float32), which the encoder uses. Keyed to
the sample like the rest, so a resume in any phase, on any job shape, continues it.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.positions import MARK_COLUMNS

PROGRESS_KEY = "sample_progress_tokens"  # (batch,) int64, put in by the stream, read here
ROPE_THETA_KEY = "global_rope_theta"  # (batch,) float32: a row's stage's RoPE theta
OWN_FIELDS = ("stages", "until_tokens", "pad_id", "stage_lengths", "rope_thetas")


def sample_progress_tokens(
    marks: np.ndarray,
    epoch: int,
    partitions: int,
    max_seq_length: int,
    epoch_tokens: int,
    lengths: "StageLengths | None" = None,
) -> np.ndarray:
    """Each sample's training progress in tokens (the module docstring), (batch,) int64.
    marks (batch, 8) int64: the stream's marks (a `positions.StreamMark` a row);
    `epoch_tokens`: T, the training shards' tokens per the manifest; `lengths`: the stages'
    sequence lengths when they differ (`StageLengths`)."""
    number, partition = marks[:, MARK_COLUMNS["number"]], marks[:, MARK_COLUMNS["partition"]]
    index = number * partitions + partition  # global sample index in the epoch
    if lengths is not None:  # a context-extension stage: samples of other lengths
        return lengths.progress(index, epoch, epoch_tokens)
    within = index * max_seq_length
    if epoch_tokens > 0:
        within = np.minimum(within, epoch_tokens)
    elif epoch > 0:
        raise ValueError("objective.stages needs the manifest's shard token counts (shard_tokens)")
    return epoch * epoch_tokens + within


@dataclass(frozen=True)
class StageLengths:
    """Sequence lengths by stage (a context-extension phase: `objective.stages[k]
    .max_seq_length`): a sample of stage k counts `lengths[k]` tokens, so progress is the sum
    of the lengths of the epoch's samples before it (capped at T, as above) instead of i x L,
    and stage k + 1 begins at the first sample whose progress reaches until_tokens[k]. Still a
    function of (epoch, global sample index) only; with equal lengths, i x L exactly."""

    lengths: tuple[int, ...]
    until_tokens: tuple[int, ...]

    def segments(self, epoch: int, epoch_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Epoch `epoch`'s runs of samples of one stage: (first global sample index, progress
        there in tokens, tokens a sample), each (runs,) int64."""
        if epoch > 0 and epoch_tokens <= 0:
            raise ValueError("objective.stages needs the manifest's shard token counts")
        until = np.asarray(self.until_tokens, np.int64)
        progress = epoch * epoch_tokens
        stage = int(np.searchsorted(until, progress, side="right"))
        starts, bases, lengths = [0], [progress], [self.lengths[stage]]
        while stage < len(until):
            length = self.lengths[stage]
            samples = max(0, -(-(int(until[stage]) - bases[-1]) // length))
            starts.append(starts[-1] + samples)
            bases.append(bases[-1] + samples * length)
            stage += 1
            lengths.append(self.lengths[stage])
        return np.asarray(starts), np.asarray(bases), np.asarray(lengths)

    def progress(self, index: np.ndarray, epoch: int, epoch_tokens: int) -> np.ndarray:
        """(batch,) global sample indices of epoch `epoch` -> their progress (tokens), int64."""
        starts, bases, lengths = self.segments(epoch, epoch_tokens)
        run = np.searchsorted(starts, index, side="right") - 1
        within = bases[run] - epoch * epoch_tokens + (index - starts[run]) * lengths[run]
        if epoch_tokens > 0:
            within = np.minimum(within, epoch_tokens)
        return epoch * epoch_tokens + within

    def length_of(self, index: int, epoch: int, epoch_tokens: int) -> int:
        """Tokens of global sample `index` of epoch `epoch` (its stage's max_seq_length)."""
        starts, _, lengths = self.segments(epoch, epoch_tokens)
        return int(lengths[np.searchsorted(starts, index, side="right") - 1])


def first_sample_of_stage(until_tokens: int, max_seq_length: int) -> int:
    """The global sample index (first epoch) of the first sample past `until_tokens`."""
    return -(-until_tokens // max_seq_length)


def _fills(pad_id: int) -> dict[str, Any]:
    """What pads each batch array that may differ in width between stages."""
    return {
        "input_ids": pad_id,
        "decoder_input_ids": pad_id,
        "attention_mask": 0,
        "decoder_attention_mask": 0,
        "token_type_ids": 0,
        "document_ids": 0,
        "labels": IGNORE_INDEX,
        "target_labels": IGNORE_INDEX,
        "target_mapping": 0,
        "prediction_positions": -1,
        "shuffle_positions": -1,
    }


@dataclass(frozen=True)
class StagedCorruption:
    """(batch, epoch) -> batch: each row corrupted by the stage its progress falls in.
    `stages`: one corruption per stage; `until_tokens`: where each stage but the last ends
    (increasing, tokens); `pad_id`: pads the rows of a narrower stage's output."""

    stages: tuple[Any, ...]
    until_tokens: tuple[int, ...]
    pad_id: int = 0
    # a context-extension phase: each stage's sequence length (None: data.max_seq_length for
    # all) and global RoPE theta (None: the model's for all), put in each row as ROPE_THETA_KEY
    stage_lengths: StageLengths | None = None
    rope_thetas: tuple[float, ...] | None = None
    uses_progress = True  # the stream adds PROGRESS_KEY to each batch

    def __getattr__(self, name: str) -> Any:
        """Other attributes (reuse_len, predicts_next_token, ...) are the last stage's."""
        if name.startswith("_") or name in OWN_FIELDS:
            raise AttributeError(name)
        return getattr(self.stages[-1], name)

    def stage_of(self, progress: np.ndarray) -> np.ndarray:
        """The stage index of each progress (tokens), same shape, int64."""
        return np.searchsorted(np.asarray(self.until_tokens, np.int64), progress, side="right")

    def shape_axes(self, max_seq_length: int) -> dict[str, tuple[int, ...]]:
        """The union of the stages' axes (`prediction_budget.shape_set`)."""
        axes: dict[str, set[int]] = {}
        for stage in self.stages:
            own = getattr(stage, "shape_axes", None)
            for name, sizes in (own(max_seq_length) if own else {}).items():
                axes.setdefault(name, set()).update(sizes)
        return {name: tuple(sorted(sizes)) for name, sizes in axes.items()}

    def __call__(self, batch: dict, epoch: int) -> dict:
        progress = batch.pop(PROGRESS_KEY, None)
        rows = len(batch["keys"])
        if progress is None:
            stage = np.full(rows, len(self.stages) - 1)
        else:
            stage = self.stage_of(np.asarray(progress))
        present = [int(k) for k in np.unique(stage)]
        if len(present) == 1:
            merged = self.stages[present[0]](batch, epoch)
        else:
            outputs = {k: self.stages[k](_copied(batch), epoch) for k in present}
            merged = _rows_by_stage(outputs, stage, _fills(self.pad_id))
        if self.rope_thetas is not None:  # (batch,) float32: each row's stage's theta
            merged[ROPE_THETA_KEY] = np.asarray(self.rope_thetas, np.float32)[stage]
        return merged


def _copied(batch: dict) -> dict:
    return {k: v.copy() if isinstance(v, np.ndarray | list) else v for k, v in batch.items()}


def _rows_by_stage(outputs: dict[int, dict], stage: np.ndarray, fills: dict) -> dict:
    """One batch whose row r is row r of `outputs[stage[r]]`; arrays of different widths
    are padded to the widest with `fills`."""
    first = outputs[int(stage[0])]
    merged = {}
    for key, value in first.items():
        if not isinstance(value, np.ndarray):
            merged[key] = value  # keys (the sample keys): the same in every output
            continue
        arrays = {k: out[key] for k, out in outputs.items()}
        shape = np.max([a.shape for a in arrays.values()], axis=0)
        if any(a.shape != tuple(shape) for a in arrays.values()) and key not in fills:
            raise ValueError(
                f"objective.stages: the stages give {key} of different widths; a batch that "
                "straddles a stage boundary cannot be joined (change settings that keep it)"
            )
        result = np.full(tuple(shape), fills.get(key, 0), dtype=value.dtype)
        for k, array in arrays.items():
            rows = np.flatnonzero(stage == k)
            result[(rows, *(slice(0, n) for n in array.shape[1:]))] = array[rows]
        merged[key] = result
    return merged
