"""The metrics row of an optimizer step (`PretrainingTask`'s collaborator): the loss and metrics
of its micro-batches, their mean weighed by loss tokens, the learning rate, and on log steps
throughput, MFU and memory, handed to Lightning only on the micro-batches whose row Lightning
writes. Steps that are not log steps read nothing back from the device."""

import time
from collections.abc import Callable, Mapping

import lightning as L
import torch

from pretrain.data.loader import LOSS_TOKENS_KEY
from pretrain.lightning_compat import is_log_row, should_accumulate
from pretrain.models.flops import device_peak_tflops, model_flops_metrics, training_flops
from pretrain.runtime.memory import memory_metrics
from pretrain.runtime.progress_log import is_log_step

# The memory metrics are read at most every this many optimizer steps (on log steps): one read
# costs about 10 ms of CPU per process (the kernel walks the ~1,100 mappings of a process that
# imported torch for /proc/<pid>/smaps_rollup), which at trainer.log_every_n_steps=1 added a
# fifth or more to a tiny CPU model's step; a leak shows over hundreds of steps.
MEMORY_EVERY_N_STEPS = 50


class StepLog:
    """This step's row and the throughput counters since the last log step; `loss_history`
    ((step, summary loss) of the launch's first step and the log steps) and `speed` (the
    last log step's throughput) are what the run summary reads."""

    def __init__(self) -> None:
        self._row: dict[str, object] = {}  # this step's metrics for the logger (`queue`)
        self._row_batch_size = 1
        self._step_sums: dict[str, torch.Tensor] = {}  # this step's micro-batches' metrics
        self._step_weight = 0.0  # their weights' sum (loss tokens, or 1 each: `add`)
        self._tokens = 0  # non-padding input tokens since the last log step (device tensor)
        self._flops = 0  # model FLOPs of the micro-batches since the last log step
        self._last_log_time = time.perf_counter()
        self._last_memory_step: int | None = None  # the step of this launch's last memory read
        self._summary_loss: torch.Tensor | None = None
        self.loss_history: list[tuple[int, float]] = []
        self.speed: dict[str, float] = {}

    def queue(self, metrics: Mapping[str, object], batch_size: int | None = None) -> None:
        """Add `metrics` to this step's row: Lightning writes a step's values only on its log
        steps (trainer.log_every_n_steps, and the step a run stops at), and each `self.log`
        costs about 0.1 ms of its bookkeeping (a tenth of a 64-wide BERT's step on a CPU core:
        benchmarks/RESULTS.md), so the row is handed to it only on the micro-batches whose row
        it writes (`flush`). Later values of a key replace earlier ones, as Lightning's
        per-step values do; `batch_size` is the micro-batch's."""
        self._row.update(metrics)
        if batch_size is not None:
            self._row_batch_size = batch_size

    def add(self, task: L.LightningModule, metrics: Mapping[str, torch.Tensor], batch: dict):
        """Queue the loss and metrics (`Losses`) under train/ for the step's row: their mean
        over the step's real micro-batches so far, weighed by loss tokens where the loader
        weighs them, so that a step logs the same value whatever its micro-batch size and
        accumulation; count the micro-batch's non-padding input tokens and model FLOPs."""
        weight = batch.get(LOSS_TOKENS_KEY, 1.0)  # its loss tokens, where a step is weighed
        self._step_weight = self._step_weight + weight
        for key, value in metrics.items():  # device tensors: no host sync
            value = value.detach() if isinstance(value, torch.Tensor) else value
            self._step_sums[key] = self._step_sums.get(key, 0) + value * weight
        mean = {key: total / self._step_weight for key, total in self._step_sums.items()}
        self.queue({f"train/{k}": v for k, v in mean.items()}, batch["input_ids"].shape[0])
        # device tensors, read back only on log steps: never a host sync per step
        self._tokens = self._tokens + batch["attention_mask"].sum()
        self._flops = self._flops + training_flops(task.objective, batch)
        self._summary_loss = mean.get(task.objective.summary_metric)

    def flush(self, task: L.LightningModule, batch_end: bool = False) -> None:
        """Log the queued row (the loss also as `loss`, for callbacks) when Lightning will write
        this micro-batch's row: the step's last micro-batch on a log step or on the step a run
        stops at. Called after the optimizer step (the step's line reads the loss) and at the
        batch's end (`batch_end`: after the callbacks, whose step counts join the row and
        whose preemption check may stop the run at this step); a row still queued at the end
        of a step Lightning does not write is dropped."""
        if not self._row or should_accumulate(task.trainer):
            return
        if not is_log_row(task.trainer):
            if batch_end:  # a row Lightning will not write
                self._row = {}
            return
        row, self._row = self._row, {}
        task.log_dict(row, batch_size=self._row_batch_size)
        if "train/loss" in row:  # for callbacks (callback_metrics), not as a progress-bar
            # value, which Lightning reads back with .item() at every later batch's end (a host
            # sync a micro-batch): the bar shows `loss_history`'s host value (StepProgressBar)
            task.log("loss", row["train/loss"], logger=False, batch_size=self._row_batch_size)

    def end_batch(self, task: L.LightningModule) -> None:
        """At a micro-batch's end: the row flushed (`flush`); the step's sums restarted after
        its last micro-batch."""
        self.flush(task, batch_end=True)
        if not should_accumulate(task.trainer):
            self._step_sums, self._step_weight = {}, 0.0

    def before_optimizer_step(
        self, task: L.LightningModule, optimizer, peak_tflops: float | None, on_log: Callable
    ) -> None:
        """Once per optimizer step: the learning rate, and on log steps (`is_log_step`: the
        run's last too; and the launch's first step, for the summary) the summary loss, on log
        steps tokens/s and MFU against `peak_tflops` since the last log, `on_log()` (the
        task's settling of device skips), and the run's memory (`runtime.memory`, `sys/*`) on
        the launch's first log step and then at least MEMORY_EVERY_N_STEPS after the last."""
        self.queue({"train/lr": optimizer.param_groups[0]["lr"]})
        trainer, step = task.trainer, task.global_step
        log_step = is_log_step(step + 1, trainer.log_every_n_steps, trainer.max_steps)
        if self._summary_loss is not None and (log_step or not self.loss_history):
            # the launch's first step and the log steps: the only steps that read the device
            self.loss_history.append((step, float(self._summary_loss.detach())))
        if not log_step:
            return
        now = time.perf_counter()
        elapsed = max(now - self._last_log_time, 1e-9)
        rate = float(self._tokens) / elapsed
        self.speed = {
            "train/tokens_per_s": rate,
            **model_flops_metrics(float(self._flops) / elapsed, peak_tflops),
        }
        self.queue(self.speed)
        self._tokens, self._flops, self._last_log_time = 0, 0, now
        on_log()
        if self._last_memory_step is None or step - self._last_memory_step >= MEMORY_EVERY_N_STEPS:
            self.queue(memory_metrics(task.device))
            self._last_memory_step = step


def announce_peak_tflops(run, trainer: L.Trainer, device: torch.device) -> float | None:
    """The device peak MFU is taken against: the run's trainer.peak_tflops, else
    `pretrain.models.flops`'s table (GPU) or a measured GEMM (CPU); printed once (rank 0)."""
    peak, source = run.trainer.peak_tflops, "trainer.peak_tflops"
    if peak is None:
        peak, source = device_peak_tflops(str(trainer.precision), device)
    if trainer.is_global_zero:
        shown = f"{peak:.3g} TFLOP/s" if peak else "unknown"
        print(f"MFU against a device peak of {shown} ({source})", flush=True)
    return peak
