"""Cumulative progress of a run, the x axes of `pretrain-compare`: non-padding input tokens
and samples trained (all ranks) and wall-clock seconds of training, logged as
`train/tokens_seen`, `train/samples_seen` and `train/elapsed_s` at every log step
(`trainer.log_every_n_steps`, counted in optimizer steps after the step) and the last. They
are saved in checkpoints (callback state), so a resumed run continues its counts; the time
between two launches is not counted."""

import time

import lightning as L
import torch


class ProgressLog(L.Callback):
    """Counts each micro-batch's tokens and samples on the device; after every optimizer step
    one all-reduce (sum over ranks, stream-ordered: no host sync) adds them to the run's
    totals, which are read back on log steps only."""

    def __init__(self) -> None:
        self.tokens = self.samples = 0  # before this launch (from the checkpoint)
        self.elapsed_s = 0.0
        self._launch: torch.Tensor | None = None  # (tokens, samples) of this launch, all ranks
        self._pending: torch.Tensor | None = None  # this rank's, since the last step
        self._start = time.monotonic()
        self._last_step = -1

    def state_dict(self) -> dict:
        tokens, samples = self._launch.tolist() if self._launch is not None else (0, 0)
        return {
            "tokens": self.tokens + int(tokens),
            "samples": self.samples + int(samples),
            "elapsed_s": self._elapsed(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.tokens, self.samples = state["tokens"], state["samples"]
        self.elapsed_s = state["elapsed_s"]

    def _elapsed(self) -> float:
        return self.elapsed_s + time.monotonic() - self._start

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.monotonic()
        self._last_step = trainer.global_step
        self._launch = self._pending = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        mask = batch["attention_mask"]  # (batch, seq)
        counts = torch.stack([mask.sum(), torch.tensor(mask.shape[0], device=mask.device)])
        self._pending = counts if self._pending is None else self._pending + counts
        step = trainer.global_step
        if step == self._last_step:  # inside an accumulation: no optimizer step yet
            return
        self._last_step = step
        total = trainer.strategy.reduce(self._pending.double(), reduce_op="sum")
        self._launch = total if self._launch is None else self._launch + total
        self._pending = None
        if step % trainer.log_every_n_steps and step < trainer.max_steps:
            return
        if trainer.is_global_zero:
            tokens, samples = self._launch.tolist()
            metrics = {
                "train/tokens_seen": self.tokens + tokens,
                "train/samples_seen": self.samples + samples,
                "train/elapsed_s": self._elapsed(),
            }
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
