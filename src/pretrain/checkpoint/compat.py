"""Reading checkpoints written by earlier versions of `pretrain`: the one place that knows
their names. Every reader of a checkpoint's weights goes through these two functions.

- Weights under the objective's own names (`encoder.*`, `mlm_head.*`): checkpoints written
  when the objective was itself the LightningModule. Today's task holds the objective as its
  `objective` submodule, so its state dict says `objective.encoder.*`.
- `nsp_head.*`: the sentence-relation head of checkpoints written before NSP, SOP and the
  three-way task shared one `sentence_head`.
- DeepSpeed ZeRO directories of the first kind: their model-state files name the weights
  (`module`, `param_shapes`, ...) and their optimizer shards the flat partitions'
  parameters (`param_slice_mappings`) by the old names; `zero_state_with_task_names` renames
  them as DeepSpeed's engine loads each file. The partitions themselves hold the parameters
  in the optimizer groups' order, which the task keeps (its only child is the objective), so
  only names change; the strategy checks the renamed order against the engine's
  (`pretrain.runtime.strategies`).
"""

from collections import OrderedDict
from collections.abc import Mapping

import torch

from pretrain.errors import ConfigError

OBJECTIVE_PREFIX = "objective."  # the task's submodule holding the objective
SENTENCE_HEAD = "sentence_head."
LEGACY_NAMES = {"nsp_head.": SENTENCE_HEAD}  # an old first component -> today's


def objective_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's weights (any version's) under the objective's names: `encoder.*`,
    heads; what exports, `init_from` and teachers read."""
    return {task_key(k).removeprefix(OBJECTIVE_PREFIX): t for k, t in state_dict.items()}


def task_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's weights (any version's) under the task's names (`objective.encoder.*`),
    which `PretrainingTask.load_state_dict` expects when a run resumes."""
    return {OBJECTIVE_PREFIX + k: t for k, t in objective_state_dict(state_dict).items()}


def task_key(key: str) -> str:
    """One weight's name (any version's) under the task's names."""
    key = key.removeprefix(OBJECTIVE_PREFIX)
    for old, new in LEGACY_NAMES.items():
        if key.startswith(old):
            key = new + key.removeprefix(old)
    return OBJECTIVE_PREFIX + key


def _renamed(names: Mapping) -> OrderedDict:
    return OrderedDict((task_key(name), value) for name, value in names.items())


def _old_names(names: object) -> bool:
    return isinstance(names, Mapping) and any(
        not str(name).startswith(OBJECTIVE_PREFIX) for name in names
    )


def zero_state_with_task_names(state: object) -> tuple[object, bool]:
    """A file of a DeepSpeed ZeRO checkpoint directory as loaded (`torch.load`) with the
    weights' names of an older version renamed to the task's (`task_key`), and whether any
    were: a model-state file's `module`, `param_shapes` (one mapping per optimizer group),
    `frozen_param_shapes`, `frozen_param_fragments`, `shared_params`, `buffer_names`; an
    optimizer shard's `param_slice_mappings`. Files of today's names, and others, unchanged."""
    if not isinstance(state, dict):
        return state, False
    renamed = False
    groups = state.get("param_shapes")
    if isinstance(groups, list) and any(_old_names(group) for group in groups):
        state["param_shapes"] = [_renamed(group) for group in groups]
        if isinstance(state.get("module"), Mapping):
            state["module"] = task_state_dict(state["module"])
        for key in ("frozen_param_shapes", "frozen_param_fragments"):
            if isinstance(state.get(key), Mapping):
                state[key] = _renamed(state[key])
        if isinstance(state.get("shared_params"), Mapping):
            state["shared_params"] = {
                task_key(k): task_key(v) for k, v in state["shared_params"].items()
            }
        if isinstance(state.get("buffer_names"), list):
            state["buffer_names"] = [task_key(name) for name in state["buffer_names"]]
        renamed = True
    optimizer = state.get("optimizer_state_dict")
    if isinstance(optimizer, dict):
        mappings = optimizer.get("param_slice_mappings")
        if isinstance(mappings, list) and any(_old_names(group) for group in mappings):
            optimizer["param_slice_mappings"] = [_renamed(group) for group in mappings]
            renamed = True
    return state, renamed


def check_weight_shapes(
    saved: Mapping[str, torch.Tensor], ours: Mapping[str, torch.Tensor], source: str
) -> None:
    """ConfigError naming `source` (the checkpoint), the first key whose saved shape differs
    from this model's and both shapes, instead of torch's list of every size mismatch."""
    for key, tensor in saved.items():
        if key in ours and tuple(tensor.shape) != tuple(ours[key].shape):
            raise ConfigError(
                f"{source}: the checkpoint's {key} has shape {tuple(tensor.shape)}, this "
                f"run's model {tuple(ours[key].shape)}: it was trained with another model "
                "config; resume with that model config, or start over (resume=never)"
            )
