"""The run config's `optim` section: the optimizer (a `_partial_` receiving the parameter
groups) and the learning-rate schedule; types, defaults and the checks of its own values."""

import math
from dataclasses import dataclass, field

from pretrain.errors import require
from pretrain.models.configs import KERNEL_IMPLS

LR_SCALINGS = ("none", "linear", "sqrt")


@dataclass
class OptimConfig:
    """Optimizer (a `_partial_` receiving the parameter groups) and learning-rate schedule."""

    optimizer: dict = field(
        default_factory=lambda: {
            "_target_": "torch.optim.AdamW",
            "_partial_": True,
            "lr": 1e-4,
            "betas": [0.9, 0.999],
            "eps": 1e-6,
            "weight_decay": 0.01,
        }
    )
    schedule: str = "linear"  # linear | constant | wsd (warm-up, stable, decay)
    # wsd: the share of the steps after the warm-up that decay to 0, and the decay's shape
    # (linear | 1-sqrt); pretrain/runtime/schedule.py
    decay_fraction: float = 0.1
    decay_shape: str = "1-sqrt"
    warmup_steps: int = 10000
    # Optimizer steps over which `linear` decays to 0 (null: trainer.max_steps); set it to stop
    # early with trainer.max_steps and continue later exactly.
    schedule_steps: int | None = None
    # A later launch with trainer.max_steps past the end of a decaying schedule (stored in the
    # checkpoint): refuse (an error), or rewarm (warm up again, then decay to the new
    # max_steps); see pretrain/runtime/schedule.py.
    extend: str = "refuse"
    # Warm-up in samples instead of optimizer steps (null: use warmup_steps); the same
    # samples of warm-up whatever the global batch size.
    warmup_samples: int | None = None
    # optimizer.lr is the rate at reference_batch_size samples per step; the run's rate is
    # scaled by (global batch / reference) for linear, its square root for sqrt.
    lr_scaling: str = "none"
    reference_batch_size: int = 256
    # Optimizer kernels: auto (apex's FusedAdam/FusedLAMB on CUDA when apex is installed, else
    # torch's, fused on CUDA) | torch | apex (an error where apex cannot run); pretrain/runtime/kernels.py.
    impl: str = "auto"

    def __post_init__(self) -> None:
        require(
            self.impl in KERNEL_IMPLS,
            "optim.impl",
            self.impl,
            f"must be one of {', '.join(KERNEL_IMPLS)}",
        )
        lr = self.optimizer["lr"] if "lr" in self.optimizer else None
        number = isinstance(lr, int | float) and not isinstance(lr, bool)
        require(
            number and math.isfinite(lr) and lr > 0,
            "optim.optimizer.lr",
            lr,
            "must be set to a finite positive number",
        )
        require(
            self.lr_scaling in LR_SCALINGS,
            "optim.lr_scaling",
            self.lr_scaling,
            f"must be one of {', '.join(LR_SCALINGS)}",
        )
        require(
            self.reference_batch_size >= 1,
            "optim.reference_batch_size",
            self.reference_batch_size,
            "must be at least 1 (samples per optimizer step)",
        )
        require(
            self.warmup_samples is None or self.warmup_samples >= 0,
            "optim.warmup_samples",
            self.warmup_samples,
            "must be 0 or more, or null (use optim.warmup_steps)",
        )
        require(
            0 < self.decay_fraction <= 1,
            "optim.decay_fraction",
            self.decay_fraction,
            "must be in (0, 1] (the share of the steps after the warm-up that decay)",
        )
        require(
            self.decay_shape in ("linear", "1-sqrt"),
            "optim.decay_shape",
            self.decay_shape,
            "must be 'linear' or '1-sqrt'",
        )
        require(
            self.schedule in ("linear", "constant", "wsd"),
            "optim.schedule",
            self.schedule,
            "must be 'linear', 'constant' or 'wsd'",
        )
        require(
            self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be 0 or more"
        )
        require(
            self.schedule_steps is None or self.schedule_steps >= 1,
            "optim.schedule_steps",
            self.schedule_steps,
            "must be at least 1 (optimizer steps), or null (trainer.max_steps)",
        )
        require(
            self.extend in ("refuse", "rewarm"),
            "optim.extend",
            self.extend,
            "must be 'refuse' or 'rewarm'",
        )
