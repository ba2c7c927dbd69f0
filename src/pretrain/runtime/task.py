"""The one LightningModule of a run: `PretrainingTask` wraps any objective
(`pretrain.objectives.base.Objective`, under `objective.*` in the state dict) and wires the
training machinery, each part beside it: `optimizer_setup` (parameter groups, optimizer,
clipping), `schedule` (the learning-rate schedule, continued on resume), `epoch_end` (the
epoch end every rank agrees on, the loss weights), `random_state`, `nonfinite_policy` (the
optimizer step under `trainer.nonfinite`), `step_log` (the step's metrics row, throughput
and MFU); the composed config and random state go into checkpoints."""

from collections.abc import Mapping

import lightning as L
import torch
from hydra.utils import get_class
from torch.optim.lr_scheduler import LambdaLR

from pretrain.batching import BatchPlan, warmup_steps
from pretrain.checkpoint.compat import check_weight_shapes, task_state_dict
from pretrain.cluster.collectives import LaggedSum
from pretrain.config import TrainConfig, run_config
from pretrain.data.batch_warmup import batch_size_warmup, is_skipped_batch
from pretrain.data.loader import NEXT_STEP_KEY
from pretrain.data.vocab import Vocabulary
from pretrain.lightning_compat import attached_trainer, should_accumulate
from pretrain.models.unpadding import mark_padding, with_unpadded_index
from pretrain.objectives.base import Losses, Objective
from pretrain.runtime.epoch_end import start_step, weighed_loss
from pretrain.runtime.kernels import layer_norm_choice, report_kernel, use_layer_norm_impl
from pretrain.runtime.nonfinite_policy import NonFinitePolicy, check_finite_parameters
from pretrain.runtime.optimizer_setup import (
    build_optimizer,
    check_world_size,
    clip_gradients,
    first_schedule,
)
from pretrain.runtime.random_state import rng_state, set_rng_state
from pretrain.runtime.schedule import (
    LearningRateSchedule,
    continue_schedule,
    describe_extension,
    stored_schedule,
)
from pretrain.runtime.step_log import StepLog, announce_peak_tflops


def objective_class(config: TrainConfig | Mapping) -> type[Objective]:
    """The objective class a run config names (`objective._target_`)."""
    return get_class(run_config(config).objective._target_)


class PretrainingTask(L.LightningModule):
    """The LightningModule that trains `objective` (its weights under `objective.*`). `run` is
    the objective's typed run config, `batch_plan` the launch's, and `config` the same as plain
    containers, which checkpoints store."""

    def __init__(self, objective: Objective):
        super().__init__()
        self.objective = objective
        self.run: TrainConfig = objective.run
        self.batch_plan: BatchPlan = self.run.batch_plan
        self.config = objective.config
        self.vocab = objective.vocab
        self._restored_rng: dict | None = None
        self.peak_tflops: float | None = None  # MFU's device peak, set when training starts
        self.nonfinite = NonFinitePolicy()  # the optimizer step under trainer.nonfinite
        self.step_log = StepLog()  # the step's metrics row, throughput and summary loss
        self.loaders: list[tuple[int, int, int]] = []  # (epoch, step, sequences dropped)
        self._lr_schedule: LearningRateSchedule | None = None  # the scheduler's (schedule.py)
        self._saved_schedule: list[dict] | None = None  # a resumed checkpoint's segments
        self._loss_scale = 1.0  # token-budget batches: ranks x accumulation / step's tokens
        self.step_sums = LaggedSum()  # the next step's agreement, launched (`epoch_end`)
        self.batch_warmup = batch_size_warmup(self.run)  # None: every step the full batch

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps of the run skipped for a non-finite loss or gradient."""
        return self.nonfinite.skipped_steps

    @property
    def loss_history(self) -> list[tuple[int, float]]:
        """(step, summary loss) of the launch's first step and its log steps."""
        return self.step_log.loss_history

    @property
    def speed(self) -> dict[str, float]:
        """The last log step's throughput (tokens/s, MFU), for the run summary."""
        return self.step_log.speed

    @classmethod
    def from_config(cls, config: TrainConfig | Mapping, vocab: Vocabulary) -> "PretrainingTask":
        """The task around the objective that the run config `config` (typed, or plain as a
        checkpoint's) names in `objective._target_`, built for `vocab`."""
        return cls(objective_class(config)(config, vocab))

    @property
    def summary_metric(self) -> str:
        """The metric the run summary reports, first and last logged (the objective's)."""
        return self.objective.summary_metric

    def forward(self, batch: dict) -> Losses:
        """The objective's loss and metrics of one batch."""
        return self.objective(batch)

    def configure_optimizers(self) -> dict:
        """AdamW-style parameter groups (no weight decay on biases and LayerNorms), the
        optimizer at the batch plan's learning rate, and warm-up then decay per step."""
        trainer, plan = attached_trainer(self), self.batch_plan
        if trainer is not None:
            check_world_size(trainer.world_size, self.run, plan)
        optimizer, choice = build_optimizer(
            list(self.parameters()), self.run, plan, self.run_device()
        )
        self.report_kernel("optimizer", choice)
        self._lr_schedule = first_schedule(self.run, plan)
        scheduler = {"scheduler": LambdaLR(optimizer, self._lr_schedule), "interval": "step"}
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def settle_skips(self) -> None:
        """Count the steps skipped on the device since the last call and move the schedule
        back by them (`NonFinitePolicy.settle`)."""
        self.nonfinite.settle(self, self._lr_schedule)

    def on_train_end(self) -> None:
        self.settle_skips()
        self.step_sums.result()  # the agreement launched at the last step: none left in flight

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.settle_skips()  # counted, and checked against trainer.nonfinite, before saving
        check_finite_parameters(self)
        checkpoint["config"] = self.config
        checkpoint["rng"] = rng_state()
        checkpoint["skipped_steps"] = self.nonfinite.skipped_steps
        if self._lr_schedule is not None:
            checkpoint["lr_schedule"] = self._lr_schedule.segments
        self.objective.save_state(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Brings older checkpoints' weight names to this task's and checks that the weights
        fit this model (`pretrain.checkpoint.compat`); the random state is applied at the
        first batch, after the data loaders were built, where the interrupted run saved."""
        if saved := checkpoint.get("state_dict"):  # none under DeepSpeed (its partitions)
            checkpoint["state_dict"] = saved = task_state_dict(saved)
            source = getattr(attached_trainer(self), "ckpt_path", None) or "checkpoint"
            check_weight_shapes(saved, self.state_dict(), source)
        self._restored_rng = checkpoint.get("rng")
        self.nonfinite.skipped_steps = checkpoint.get("skipped_steps", 0)
        self._saved_schedule = stored_schedule(checkpoint)
        self.objective.load_state(checkpoint)

    def on_train_start(self) -> None:
        """A resumed launch follows the checkpoint's schedule (`schedule.continue_schedule`);
        the device peak for MFU; DeepSpeed's overflow check on (`NonFinitePolicy`)."""
        saved, self._saved_schedule = self._saved_schedule, None
        if saved is not None and self._lr_schedule is not None:
            warmup = warmup_steps(self.run.optim, self.batch_plan)
            scheduler = self.lr_schedulers()
            added = continue_schedule(scheduler, self._lr_schedule, saved, self.run, warmup)
            if added and self.trainer.is_global_zero:
                print(describe_extension(self._lr_schedule.segments), flush=True)
        self.peak_tflops = announce_peak_tflops(self.run, self.trainer, self.device)
        self.nonfinite.on_train_start(self.trainer)

    def host_batch(self, batch: dict) -> dict:
        """On the host (the data module's `on_before_batch_transfer`): the unpadded layout's
        index (`models/unpadding.py`) and whether the batch has padding (`mark_padding`)."""
        batch = mark_padding(batch)
        return with_unpadded_index(batch, getattr(self.objective, "encoder", None), self.device)

    def setup(self, stage: str) -> None:
        """Before the optimizer is built: the LayerNorm kernels (model.layer_norm_impl)."""
        precision = str(getattr(attached_trainer(self), "precision", "32-true"))
        impl = layer_norm_choice(self.run.model.layer_norm_impl, precision)
        choice = use_layer_norm_impl(self, impl, self.run_device())
        self.report_kernel("layer_norm", choice)

    def run_device(self) -> torch.device:
        """The device this rank trains on (the module may not be there yet)."""
        trainer = attached_trainer(self)
        return trainer.strategy.root_device if trainer is not None else self.device

    def report_kernel(self, part: str, choice: str) -> None:
        """Print which kernels `part` uses (`kernels.report_kernel`)."""
        if attached_trainer(self) is not None:
            report_kernel(self.trainer, part, choice)

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.nonfinite.note_loss(loss)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """The step applied only when every rank's loss and gradients are finite, else
        skipped or the run stopped, per `trainer.nonfinite` (`NonFinitePolicy.step`)."""
        self.nonfinite.step(self, optimizer, optimizer_closure)
        self.queue_log({"train/skipped_steps": float(self.nonfinite.skipped_steps)})
        self.flush_logs()

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        """Clip per trainer.gradient_clip_val (`optimizer_setup.clip_gradients`)."""
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def lr_scheduler_step(self, scheduler, metric=None) -> None:
        """The schedule advances once per applied optimizer step (Lightning also calls this
        when an epoch is ended by on_train_batch_start, where no step was taken)."""
        if self.nonfinite.last_step_applied:
            super().lr_scheduler_step(scheduler, metric)
        self.nonfinite.last_step_applied = False

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> int | None:
        """Ends the epoch on every rank alike (returns -1) at the first optimizer step some
        rank lacks batches for (`pretrain.data.loader`); restores a resumed run's random
        state at its first batch; then the objective's `start_batch`. The run's last step
        (trainer.max_steps) sets `trainer.should_stop`: Lightning writes its row."""
        first = batch_idx % self.trainer.accumulate_grad_batches == 0
        if first and not start_step(self, batch, batch_idx):
            return -1
        if isinstance(batch, dict):  # a resume's partial first step: agreed at the next one
            batch.pop(NEXT_STEP_KEY, None)
        if self._restored_rng is not None:
            set_rng_state(self._restored_rng)
            self._restored_rng = None
        if not is_skipped_batch(batch):
            self.objective.start_batch(self, batch, batch_idx)
        if self.global_step + 1 >= self.trainer.max_steps and not should_accumulate(self.trainer):
            self.trainer.should_stop = True  # a stopping step: Lightning writes its row

    def on_train_epoch_start(self) -> None:
        self.step_sums.result()  # an epoch's first step agrees anew (blocking)
        self.objective.start_epoch(self)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """The micro-batch's loss (the objective's `forward`), logged, weighed as its step
        weighs it (`epoch_end.weighed_loss`). A batch-size warm-up's skipped micro-batches
        compute nothing (a zero loss that reaches no parameter: Lightning refuses None under
        DDP; they come first, so the step's last backward, which DDP syncs, is a real one)."""
        if is_skipped_batch(batch):
            return torch.zeros((), device=self.device, requires_grad=True)
        losses = self(batch)
        self.log_step(losses, batch)
        return weighed_loss(self, losses.loss, batch)

    def log_step(self, metrics: Mapping[str, torch.Tensor], batch: dict) -> None:
        """Queue the micro-batch's loss and metrics for the step's row (`StepLog.add`)."""
        self.step_log.add(self, metrics, batch)

    def queue_log(self, metrics: Mapping[str, object], batch_size: int | None = None) -> None:
        """Add `metrics` to this step's row (`StepLog.queue`), written on log steps."""
        self.step_log.queue(metrics, batch_size)

    def flush_logs(self, batch_end: bool = False) -> None:
        """Hand the row to Lightning where it writes it (`StepLog.flush`)."""
        self.step_log.flush(self, batch_end)

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        self.step_log.end_batch(self)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.step_log.before_optimizer_step(self, optimizer, self.peak_tflops, self.settle_skips)
