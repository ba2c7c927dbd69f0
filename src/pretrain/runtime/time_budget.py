"""`trainer.max_time_s`: a wall-clock budget counted from the process's start, so start-up
(imports, building the model, the first batches) is paid from it as a user's minutes are.
The run stops at the first optimizer step boundary past the budget; the step checkpoint
callback then saves last.ckpt at that step (`runtime.trainer.StepCheckpoint.on_train_end`).
Rank 0's clock decides, broadcast to every rank, so all stop at the same step."""

import time

import lightning as L
import psutil
from lightning.pytorch.callbacks import Callback

from pretrain.lightning_compat import should_accumulate


def process_seconds() -> float:
    """Seconds since this process started (its creation time as the OS records it)."""
    return time.time() - psutil.Process().create_time()


class TimeBudget(Callback):
    """Stops training at the first optimizer step boundary after `max_time_s` seconds of the
    process's life; `reached` says whether it did."""

    def __init__(self, max_time_s: float) -> None:
        self.max_time_s = max_time_s
        self.reached = False

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        if should_accumulate(trainer):
            return  # mid-step: a budget ends whole optimizer steps only
        over = process_seconds() >= self.max_time_s
        if trainer.world_size > 1:
            over = trainer.strategy.broadcast(over, src=0)
        if over:
            self.reached = True
            trainer.should_stop = True


def time_budget_callbacks(max_time_s: float | None) -> list[Callback]:
    """[TimeBudget] for a `trainer.max_time_s` budget, [] for none (null)."""
    return [] if max_time_s is None else [TimeBudget(max_time_s)]


def stopped_by_time_budget(trainer: L.Trainer) -> bool:
    """Whether `trainer`'s TimeBudget ended its training (a finished run, not a failure)."""
    return any(isinstance(c, TimeBudget) and c.reached for c in trainer.callbacks)
