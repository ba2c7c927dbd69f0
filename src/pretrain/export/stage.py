"""The model settings a checkpoint trained with at its step.

A context-extension schedule (`objective.stages`, `pretrain.data.stages`) may give a stage
its own global RoPE theta; the run's `config.model` holds the last stage's (the model's own).
A checkpoint saved in an earlier stage was trained with that stage's theta, so an export of
it must carry that one. The stage is found from the data stream's position that Lightning
saves with the checkpoint (the data module's state: epoch, samples of its order consumed,
the epoch's tokens), by the same progress rule the stream uses (`sample_progress_tokens`).
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from pretrain.data.positions import MARK_COLUMNS
from pretrain.data.stages import StageLengths, sample_progress_tokens

DATA_STATE = "PretrainingDataModule"  # Lightning saves a data module's state by class name
STAGE_MODEL_SETTINGS = ("global_rope_theta",)  # a stage's settings that belong to the model


def stage_at_checkpoint(config: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> int | None:
    """The index in `config.objective.stages` of the stage the checkpoint's last trained
    sample fell in; None without stages, or when the checkpoint holds no stream position
    (or, past the first epoch, not the epoch's tokens) to tell: then the last stage."""
    stages = (config.get("objective") or {}).get("stages") or []
    position = checkpoint.get(DATA_STATE)
    if len(stages) < 2 or not isinstance(position, Mapping) or "samples" not in position:
        return None
    epoch, epoch_tokens = int(position.get("epoch", 0)), int(position.get("epoch_tokens", 0))
    if epoch > 0 and epoch_tokens <= 0:
        return None
    longest = int(config["data"]["max_seq_length"])
    until = tuple(int(stage["until_tokens"]) for stage in stages[:-1])
    lengths = tuple(int(stage.get("max_seq_length", longest)) for stage in stages)
    staged = StageLengths(lengths, until) if any(n != longest for n in lengths) else None
    last = max(int(position["samples"]) - 1, 0)  # the last trained sample's index in its epoch
    marks = np.zeros((1, len(MARK_COLUMNS)), np.int64)
    marks[0, MARK_COLUMNS["number"]] = last  # one partition: its n-th sequence is sample n
    progress = sample_progress_tokens(marks, epoch, 1, longest, epoch_tokens, staged)
    return int(np.searchsorted(np.asarray(until), progress[0], side="right"))


def config_at_checkpoint(config: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> dict:
    """`config` with `config.model` holding the settings in force at the checkpoint's step:
    its stage's `STAGE_MODEL_SETTINGS` where the stage sets them (the model's own otherwise)."""
    stage = stage_at_checkpoint(config, checkpoint)
    if stage is None:
        return dict(config)
    settings = config["objective"]["stages"][stage]
    model = dict(config["model"])
    model.update({key: settings[key] for key in STAGE_MODEL_SETTINGS if key in settings})
    return {**config, "model": model}
