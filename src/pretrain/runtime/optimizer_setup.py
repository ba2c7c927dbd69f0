"""The optimizer of a run and its first learning-rate schedule segment: AdamW-style parameter
groups (no weight decay on biases and LayerNorms), the optimizer config's `_partial_` built at
the batch plan's learning rate, and warm-up then the configured decay (`schedule.py`)."""

from typing import TYPE_CHECKING

import torch
from hydra.utils import instantiate

from pretrain.batching import BatchPlan, learning_rate, warmup_steps
from pretrain.errors import ConfigError
from pretrain.runtime.kernels import optimizer_settings
from pretrain.runtime.schedule import LearningRateSchedule, first_segment, run_schedule_end

if TYPE_CHECKING:
    from pretrain.config import TrainConfig


def check_world_size(world_size: int, run: "TrainConfig", plan: BatchPlan) -> None:
    """ConfigError naming trainer.devices when the trainer has another number of ranks than
    the batch plan assumed (`devices` given as something other than a number)."""
    if world_size != plan.world_size:
        raise ConfigError(
            f"trainer.devices = {run.trainer.devices!r}: the run has "
            f"{world_size} ranks, not the {plan.world_size} the batch plan assumed; "
            "give trainer.devices as a number"
        )


def build_optimizer(
    parameters: list[torch.nn.Parameter], run: "TrainConfig", plan: BatchPlan, device: torch.device
) -> tuple[torch.optim.Optimizer, str]:
    """The optimizer of `parameters` (matrices decayed, vectors not) and the line saying which
    kernels it uses (`kernels.optimizer_settings`, for `device` and the run's strategy)."""
    optim = run.optim
    decay = [p for p in parameters if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in parameters if p.requires_grad and p.ndim < 2]  # biases, LayerNorm
    settings, choice = optimizer_settings(
        optim.optimizer, optim.impl, device, run.strategy, str(run.trainer.precision)
    )
    optimizer = instantiate(settings, lr=learning_rate(optim, plan), _convert_="all")(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    )
    return optimizer, choice


def first_schedule(run: "TrainConfig", plan: BatchPlan) -> LearningRateSchedule:
    """The learning-rate multiplier per optimizer step of a new launch: one segment, warm-up
    then optim.schedule up to the run's end (a resumed launch continues its checkpoint's)."""
    optim = run.optim
    segment = first_segment(warmup_steps(optim, plan), run_schedule_end(run), optim.schedule, optim)
    return LearningRateSchedule([segment])


def clip_gradients(task, optimizer, clip_val: float | None, algorithm: str | None) -> None:
    """Clip `task`'s gradients per trainer.gradient_clip_val. Lightning's mixed-precision
    plugin refuses to clip for an optimizer that unscales its own gradients (torch's fused
    AdamW, which GPU runs use) even in bf16, where no gradient scaler exists and nothing is
    unscaled; there the plugin's plain clipping runs. With fp16's scaler, Lightning's check
    stands."""
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    plugin = task.trainer.precision_plugin
    if isinstance(plugin, MixedPrecision) and plugin.scaler is None:
        Precision.clip_gradients(plugin, optimizer, clip_val or 0.0, algorithm or "norm")
    else:
        L.LightningModule.configure_gradient_clipping(task, optimizer, clip_val, algorithm)
