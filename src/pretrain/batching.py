"""Effective batch size, gradient accumulation and learning-rate scaling.

One key sets the effective batch: `data.global_batch_size` (samples per optimizer step over
all ranks). The micro-batch (`data.batch_size`, samples per rank per forward pass) and the
number of ranks (`trainer.devices` x `trainer.num_nodes`) are given; accumulation is derived:

    global_batch_size = batch_size x accumulate_grad_batches x ranks

With `data.global_batch_size: null` the product of today's keys is the global batch.
`optim.lr_scaling` (none | linear | sqrt) scales `optim.optimizer.lr`, the rate at
`optim.reference_batch_size` samples per step, to the global batch (Goyal et al. 2017 for
linear; Krizhevsky 2014 / You et al. for sqrt); `optim.warmup_samples` states the warm-up in
samples so it covers the same data whatever the batch.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pretrain.errors import ConfigError

# The config sections below are pretrain.config's DataConfig, TrainerConfig and OptimConfig,
# named in docstrings: pretrain.config imports this module, so it cannot import them back.


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's samples are made: all counts in samples or micro-batches."""

    global_batch_size: int  # samples per optimizer step, all ranks together
    micro_batch_size: int  # samples per rank per forward/backward pass
    accumulate_grad_batches: int  # micro-batches per rank per optimizer step
    world_size: int  # ranks (processes)
    tokens_per_batch: int | None = None  # a token budget per step (then the sizes are nominal)


def count_devices(devices: int | str | Sequence[int], accelerator: str = "auto") -> int:
    """Processes per node for Lightning's `devices` value: an int, a list of indices, a string
    '0,1' or '2', or 'auto'/-1 (all devices of the accelerator: 1 on CPU, every GPU)."""
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            return len([part for part in text.split(",") if part.strip()])
        devices = text if text == "auto" else int(text) if text.lstrip("-").isdigit() else text
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return len(devices)
    if devices in ("auto", -1):
        import torch

        if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
            return torch.cuda.device_count()
        return 1
    if not isinstance(devices, int) or devices < 1:
        raise ConfigError(
            f"trainer.devices = {devices!r}: must be a positive int, a list of device "
            "indices, or 'auto'"
        )
    return devices


def world_size(trainer: Any) -> int:
    """Ranks of a run (`trainer`: a TrainerConfig): devices per node x `trainer.num_nodes`."""
    return count_devices(trainer.devices, trainer.accelerator) * trainer.num_nodes


def batch_plan(data: Any, trainer: Any, ranks: int | None = None) -> BatchPlan:
    """The run's `BatchPlan` (`data`: a DataConfig, `trainer`: a TrainerConfig) from
    `data.global_batch_size`, `data.batch_size`, `trainer.accumulate_grad_batches` and the
    ranks (derived from `trainer` when not given).
    Raises ConfigError naming `data.global_batch_size` when it is not a multiple of
    batch_size x ranks, or contradicts an explicit trainer.accumulate_grad_batches."""
    ranks = world_size(trainer) if ranks is None else ranks
    micro, accumulation = data.batch_size, trainer.accumulate_grad_batches
    wanted, tokens = data.global_batch_size, data.tokens_per_batch
    if tokens:  # nominal sizes: the budget in sequences of data.max_seq_length tokens
        full = max(1, tokens // data.max_seq_length)
        micro = max(1, -(-full // (accumulation * ranks)))
        return BatchPlan(full, micro, accumulation, ranks, tokens)
    if wanted is None:
        return BatchPlan(micro * accumulation * ranks, micro, accumulation, ranks)
    per_pass = micro * ranks
    if wanted % per_pass:
        lower = max(per_pass, wanted // per_pass * per_pass)
        raise ConfigError(
            f"data.global_batch_size = {wanted}: must be a multiple of data.batch_size ({micro}) "
            f"x ranks ({ranks}) = {per_pass} samples, e.g. {lower} or {lower + per_pass}; "
            "or change data.batch_size"
        )
    derived = wanted // per_pass
    if accumulation not in (1, derived):
        raise ConfigError(
            f"data.global_batch_size = {wanted} gives {derived} accumulated micro-batches "
            f"({micro} samples x {ranks} ranks per pass) but trainer.accumulate_grad_batches = "
            f"{accumulation}; set only one of them (leave trainer.accumulate_grad_batches at 1)"
        )
    return BatchPlan(wanted, micro, derived, ranks)


def lr_scale(scaling: str, global_batch_size: int, reference_batch_size: int) -> float:
    """Multiplier of the reference learning rate: 1 (none), global/reference (linear) or
    sqrt(global/reference) (sqrt). Batch sizes in samples per optimizer step."""
    ratio = global_batch_size / reference_batch_size
    if scaling == "none":
        return 1.0
    if scaling == "linear":
        return ratio
    if scaling == "sqrt":
        return math.sqrt(ratio)
    raise ConfigError(f"optim.lr_scaling = {scaling!r}: must be none, linear or sqrt")


def learning_rate(optim: Any, plan: BatchPlan) -> float:
    """The run's peak learning rate: `optim.optimizer["lr"]` scaled by `optim.lr_scaling`."""
    scale = lr_scale(optim.lr_scaling, plan.global_batch_size, optim.reference_batch_size)
    return optim.optimizer["lr"] * scale


def warmup_steps(optim: Any, plan: BatchPlan) -> int:
    """Warm-up in optimizer steps: ceil(optim.warmup_samples / global batch) when
    warmup_samples is set, else optim.warmup_steps."""
    if optim.warmup_samples is None:
        return optim.warmup_steps
    return math.ceil(optim.warmup_samples / plan.global_batch_size)


def describe(optim: Any, plan: BatchPlan) -> str:
    """One line for the log: the global batch, how it is made, and the learning rate."""
    lr = learning_rate(optim, plan)
    base = optim.optimizer["lr"]
    scaling = optim.lr_scaling
    rate = f"lr {lr:.3g}" if scaling == "none" else f"lr {base:.3g} -> {lr:.3g} ({scaling})"
    if plan.tokens_per_batch:
        return (
            f"Global batch: ~{plan.tokens_per_batch} tokens per step (data.tokens_per_batch; "
            f"~{plan.global_batch_size} full sequences) in {plan.accumulate_grad_batches} "
            f"accumulated x {plan.world_size} ranks micro-batches of varying size; {rate}; "
            f"warm-up {warmup_steps(optim, plan)} steps"
        )
    return (
        f"Global batch: {plan.global_batch_size} samples per step = {plan.micro_batch_size} "
        f"x {plan.accumulate_grad_batches} accumulated x {plan.world_size} ranks; {rate}; "
        f"warm-up {warmup_steps(optim, plan)} steps"
    )
