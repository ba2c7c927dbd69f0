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
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from pretrain.data.masking import IGNORE_INDEX

PROGRESS_KEY = "sample_progress_tokens"  # (batch,) int64, put in by the stream, read here


def sample_progress_tokens(
    marks: np.ndarray, epoch: int, partitions: int, max_seq_length: int, epoch_tokens: int
) -> np.ndarray:
    """Each sample's training progress in tokens (the module docstring), (batch,) int64.
    marks (batch, 7) int64: the stream's marks (partition, number in the partition, ...);
    `epoch_tokens`: T, the training shards' tokens per the manifest."""
    index = marks[:, 1] * partitions + marks[:, 0]  # global sample index in the epoch
    within = index * max_seq_length
    if epoch_tokens > 0:
        within = np.minimum(within, epoch_tokens)
    elif epoch > 0:
        raise ValueError("objective.stages needs the manifest's shard token counts (shard_tokens)")
    return epoch * epoch_tokens + within


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
    uses_progress = True  # the stream adds PROGRESS_KEY to each batch

    def __getattr__(self, name: str) -> Any:
        """Other attributes (reuse_len, predicts_next_token, ...) are the last stage's."""
        if name.startswith("_") or name in ("stages", "until_tokens", "pad_id"):
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
        if progress is None:
            return self.stages[-1](batch, epoch)
        stage = self.stage_of(np.asarray(progress))
        present = [int(k) for k in np.unique(stage)]
        if len(present) == 1:
            return self.stages[present[0]](batch, epoch)
        outputs = {k: self.stages[k](_copied(batch), epoch) for k in present}
        return _rows_by_stage(outputs, stage, _fills(self.pad_id))


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
