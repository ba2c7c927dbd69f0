"""Reading checkpoints written by earlier versions of `pretrain`: the one place that knows
their names. Every reader of a checkpoint's weights goes through these two functions.

- Weights under the objective's own names (`encoder.*`, `mlm_head.*`): checkpoints written
  when the objective was itself the LightningModule. Today's task holds the objective as its
  `objective` submodule, so its state dict says `objective.encoder.*`.
- `nsp_head.*`: the sentence-relation head of checkpoints written before NSP, SOP and the
  three-way task shared one `sentence_head`.
"""

from collections.abc import Mapping

import torch

OBJECTIVE_PREFIX = "objective."  # the task's submodule holding the objective
SENTENCE_HEAD = "sentence_head."
LEGACY_NAMES = {"nsp_head.": SENTENCE_HEAD}  # an old first component -> today's


def objective_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's weights (any version's) under the objective's names: `encoder.*`,
    heads; what exports, `init_from` and teachers read."""
    out = {}
    for key, tensor in state_dict.items():
        key = key.removeprefix(OBJECTIVE_PREFIX)
        for old, new in LEGACY_NAMES.items():
            if key.startswith(old):
                key = new + key.removeprefix(old)
        out[key] = tensor
    return out


def task_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's weights (any version's) under the task's names (`objective.encoder.*`),
    which `PretrainingTask.load_state_dict` expects when a run resumes."""
    return {OBJECTIVE_PREFIX + k: t for k, t in objective_state_dict(state_dict).items()}
