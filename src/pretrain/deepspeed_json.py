"""The DeepSpeed JSON of a run config, and DeepSpeed's own check of it.

`deepspeed_config` builds the JSON from the typed run config (its batch plan, `trainer` and
`strategy`, with `strategy.deepspeed` merged over it); `check_strategy`, called when the config
is validated, parses it with DeepSpeed's `DeepSpeedConfig`, so a bad value fails before a job
is queued. Imports torch, and DeepSpeed only inside `check_deepspeed_config`; no Lightning
(`pretrain.runtime.strategies` builds the strategy that takes this JSON).
"""

import copy
import os
from collections.abc import Mapping
from typing import Any

import torch

from pretrain.errors import ConfigError


def _deep_merge(base: dict, extra: Mapping) -> dict:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def deepspeed_config(config: Any) -> dict:
    """The DeepSpeed JSON of a run (the typed TrainConfig): micro-batch per rank (its batch
    plan), gradient clipping, precision and the ZeRO section from `strategy`, with
    `strategy.deepspeed` merged over it. Without `gradient_accumulation_steps`, which
    Lightning fills in from the Trainer (it refuses the key in the JSON)."""
    strategy, trainer = config.strategy, config.trainer
    zero: dict[str, Any] = {"stage": strategy.zero_stage}
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": config.batch_plan.micro_batch_size,
        "gradient_clipping": trainer.gradient_clip_val or 0.0,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": zero,
    }
    if strategy.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
        # allow a torch optimizer (LAMB; AdamW where DeepSpeedCPUAdam's op cannot be built):
        # kernels.offload_settings picks it
        ds["zero_force_ds_cpu_optimizer"] = False
    if strategy.offload_parameters:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    precision = str(trainer.precision)
    if precision.startswith("bf16"):
        ds["bf16"] = {"enabled": True}
    elif precision.startswith("16"):
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    extra = strategy.deepspeed
    if "gradient_accumulation_steps" in extra or "train_batch_size" in extra:
        raise ConfigError(
            "strategy.deepspeed: do not set gradient_accumulation_steps or train_batch_size; "
            "set data.global_batch_size (accumulation is derived from it)"
        )
    return _deep_merge(ds, extra)


def check_deepspeed_config(ds_config: dict, accumulation: int) -> None:
    """Parse `ds_config` with DeepSpeed's own `DeepSpeedConfig` (as one rank, with the
    derived accumulation); raises ConfigError naming `strategy` with DeepSpeed's message."""
    os.environ.setdefault("DS_BUILD_OPS", "0")
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError as error:
        raise ConfigError(
            f"strategy.name = 'deepspeed': DeepSpeed is not installed ({error}); "
            "pip install deepspeed"
        ) from error
    try:
        DeepSpeedConfig({**ds_config, "gradient_accumulation_steps": accumulation})
    except Exception as error:  # pydantic ValidationError, AssertionError, DeepSpeedConfigError
        raise ConfigError(
            f"strategy (DeepSpeed JSON from conf/strategy + strategy.deepspeed) is rejected by "
            f"DeepSpeed's config parser: {type(error).__name__}: {error}"
        ) from error


def check_strategy(config: Any) -> None:
    """Validation hook of TrainConfig (typed, with its batch plan): for DeepSpeed, build and
    parse the JSON now."""
    if config.strategy.name != "deepspeed":
        return
    check_deepspeed_config(deepspeed_config(config), config.batch_plan.accumulate_grad_batches)
