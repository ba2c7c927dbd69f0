"""The end of a training epoch, agreed by every rank: an epoch ends at the first optimizer step
some rank lacks batches for (`pretrain.data.loader`), on every rank alike, so all ranks take
the same number of steps; a rank that met a bad shard stops every rank at the same step.

One small all-reduce per optimizer step carries what the ranks must agree on: for the step,
how many ranks are at the epoch's end, how many met a bad shard, and its loss tokens over all
ranks (token-budget batches: `weighed_loss`); and whether a rank was signalled to save
(`cluster.preemption`). It does not block the host: the loader looks a step ahead
(`NEXT_STEP_KEY`), so the sum for step s+1 is launched at step s's start without waiting
(`collectives.LaggedSum`, the host's gloo group) and read at step s+1's start, one step of
training later, when every rank has launched it. A launch's first step, and each epoch's,
agree with one blocking all-reduce instead (nothing was launched for them); so does the
epoch's end (the tails' count). The preemption flags in the sum are those of the previous
step's start: with several ranks a signal saves at most two optimizer steps after the one it
came in (`PreemptionCheckpoint.agree`)."""

from dataclasses import dataclass

import lightning as L
import torch
import torch.distributed as dist

from pretrain.cluster.collectives import LaggedSum, ranks_met, reduce_on_host
from pretrain.cluster.preemption import PreemptionCheckpoint
from pretrain.data.loader import (
    DATA_ERROR_KEY,
    LOSS_TOKENS_KEY,
    NEXT_STEP_KEY,
    STEP_LOSS_TOKENS_KEY,
    StepAlignedLoader,
    step_flag,
)
from pretrain.data.shard_format import ShardError


@dataclass(frozen=True)
class StepAgreement:
    """What the ranks agreed at a step's first micro-batch: whether the epoch continues; with
    token-budget batches, the step's loss scale (ranks x accumulation / the step's loss tokens
    over all ranks); when it ends, the sequences the ranks held past the end (dropped)."""

    continues: bool
    loss_scale: float | None = None
    dropped: int = 0


def step_sums(flag: int, tokens: int | None, preemption: PreemptionCheckpoint | None) -> list:
    """What a rank adds to a step's all-reduce: [at the epoch's end, met a bad shard, loss
    tokens, signalled, asked for a requeue] (`flag`: `loader.step_flag`)."""
    signals = preemption.step_flags() if preemption is not None else [0, 0]
    return [int(flag == 0), int(flag < 0), tokens or 0, *signals]


def preemption_callback(module: L.LightningModule) -> PreemptionCheckpoint | None:
    """The run's preemption callback, if it has one."""
    callbacks = module.trainer.callbacks
    return next((c for c in callbacks if isinstance(c, PreemptionCheckpoint)), None)


def agree_on_step(
    module: L.LightningModule, batch: dict, batch_idx: int, sums: LaggedSum
) -> StepAgreement:
    """Whether every rank has a whole optimizer step of batches: read from `sums`, launched a
    step ago (a blocking all-reduce on the host when nothing was: the launch's or an epoch's
    first step), within the wait in force (`collectives.timeout_in_force`); then launches
    the next step's (`NEXT_STEP_KEY`). When the epoch ends, counts, logs and prints the
    sequences the ranks' tails held. ShardError when a rank met a shard that failed its
    checks."""
    flag = step_flag(batch)
    weighed = isinstance(batch, dict) and STEP_LOSS_TOKENS_KEY in batch
    tokens = batch.pop(STEP_LOSS_TOKENS_KEY) if weighed else 0
    upcoming = batch.pop(NEXT_STEP_KEY, None) if isinstance(batch, dict) else None
    preemption = preemption_callback(module)
    agreed = sums.result()  # this step's, launched a step ago: done by now in steady state
    if agreed is None:
        agreed = reduce_on_host(step_sums(flag, tokens, preemption), dist.ReduceOp.SUM)
    ends, errors, total, *signals = agreed
    if preemption is not None:
        preemption.agree(*signals)
    if not (ends or errors):
        if upcoming is not None:  # the next step's, read at its start
            sums.launch(step_sums(*upcoming, preemption))
        if weighed:  # micro-batches weighed by their loss tokens: the step's, all ranks
            ranks_steps = module.trainer.world_size * module.trainer.accumulate_grad_batches
            return StepAgreement(True, loss_scale=ranks_steps / max(total, 1))
        return StepAgreement(True)
    if errors:  # a rank met a bad shard: every rank stops here, with the same step
        raise ShardError(
            batch.get(DATA_ERROR_KEY)
            or f"rank {module.global_rank}: another rank met a shard that failed its checks "
            f"at step {module.global_step} (its error names the shard); data.bad_shards=skip "
            "leaves such shards out"
        )
    loader = module.trainer.train_dataloader
    tail = loader.drain(batch_idx) if isinstance(loader, StepAlignedLoader) else 0
    dropped = reduce_on_host(tail, dist.ReduceOp.SUM)
    if module.trainer.is_global_zero:  # the same number on every rank: written once
        for logger in module.loggers:
            logger.log_metrics({"train/epoch_dropped_samples": dropped}, module.global_step)
        print(
            f"epoch {module.current_epoch} ends at step {module.global_step} on every rank; "
            f"{dropped} sequences the ranks held past the end were not trained "
            "(train/epoch_dropped_samples)",
            flush=True,
        )
    return StepAgreement(False, dropped=dropped)


def weighed_loss(task: L.LightningModule, loss: torch.Tensor, batch: dict) -> torch.Tensor:
    """The micro-batch's `loss` as its step weighs it: with token-budget batches
    (`loader.weigh_step`) by its predicted tokens over the step's (all ranks), times ranks x
    accumulation (`task._loss_scale`, from `agree_on_step`), which Lightning and DDP divide
    back out: the step's gradient is that of the mean loss over every predicted token of the
    step. Under the batch-size warm-up a step's a real micro-batches weigh accumulation / a
    each, which Lightning divides back out: the step's gradient is that of the mean loss over
    its real micro-batches."""
    if LOSS_TOKENS_KEY in batch:
        return loss * batch[LOSS_TOKENS_KEY] * task._loss_scale
    if task.batch_warmup is not None:
        plan = task.batch_plan
        real = task.batch_warmup.micro_batches(
            task.global_step, plan.micro_batch_size * plan.world_size
        )
        return loss * (task.trainer.accumulate_grad_batches / real)
    return loss


def start_step(task: L.LightningModule, batch: dict, batch_idx: int) -> bool:
    """At a step's first micro-batch: whether every rank has a whole optimizer step of
    batches (`agree_on_step`, with the task's `step_sums`); keeps the step's loss scale of
    token-budget batches (`task._loss_scale`) and the epochs ended (`task.loaders`)."""
    agreed = agree_on_step(task, batch, batch_idx, task.step_sums)
    ranks_met()  # every rank got here: from now on collectives wait collective_timeout_s
    if agreed.loss_scale is not None:
        task._loss_scale = agreed.loss_scale
    if not agreed.continues:
        task.loaders.append((task.current_epoch, task.global_step, agreed.dropped))
    return agreed.continues
