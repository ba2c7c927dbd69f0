"""The one LightningModule of a run: `PretrainingTask` wraps any objective
(`pretrain.objectives.base.Objective`, under `objective.*` in the state dict) and owns the
training machinery: the optimizer recipe and schedule, the composed config and random-number
state in checkpoints, the epoch end every rank agrees on, throughput and MFU logging, and the
handling of non-finite losses and gradients (`trainer.nonfinite`). The parts with a concept
of their own live beside it: `optimizer_setup` (parameter groups, optimizer, first schedule
segment), `epoch_end` (the ranks' agreement), `random_state`, `nonfinite` (device skips and
the skip bounds), `flops` (MFU)."""

import time
from collections.abc import Mapping

import lightning as L
import torch
from hydra.utils import get_class
from torch.optim.lr_scheduler import LambdaLR

from pretrain.batching import BatchPlan, warmup_steps
from pretrain.checkpoint.compat import task_state_dict
from pretrain.cluster.collectives import ranks_met
from pretrain.config import TrainConfig, run_config
from pretrain.data.batch_warmup import batch_size_warmup, is_skipped_batch
from pretrain.data.loader import LOSS_TOKENS_KEY
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError
from pretrain.models.flops import device_peak_tflops, model_flops_metrics, training_flops
from pretrain.models.unpadding import mark_padding, with_unpadded_index
from pretrain.objectives.base import Losses, Objective
from pretrain.runtime.epoch_end import agree_on_step
from pretrain.runtime.kernels import use_layer_norm_impl
from pretrain.runtime.memory import memory_metrics
from pretrain.runtime.nonfinite import (
    DeviceSkips,
    NonFiniteError,
    check_skip_bounds,
    clear_gradients,
    device_skip,
    nonfinite_flag,
    skips_on_device,
)
from pretrain.runtime.optimizer_setup import build_optimizer, check_world_size, first_schedule
from pretrain.runtime.progress_log import is_log_step
from pretrain.runtime.random_state import rng_state, set_rng_state
from pretrain.runtime.schedule import (
    LearningRateSchedule,
    describe_extension,
    extended,
    stored_schedule,
)

SKIP_WARNING_INTERVAL_S = 30.0  # at most one "step skipped" warning line per interval
# The memory metrics are read at most every this many optimizer steps (on log steps): one read
# costs about 10 ms of CPU per process (the kernel walks the ~1,100 mappings of a process that
# imported torch for /proc/<pid>/smaps_rollup), which at trainer.log_every_n_steps=1 added a
# fifth or more to a tiny CPU model's step; a leak shows over hundreds of steps.
MEMORY_EVERY_N_STEPS = 50


def layer_norm_choice(impl: str, precision: str) -> str:
    """model.layer_norm_impl as used under Lightning's `precision`: `auto` under mixed
    precision is torch's LayerNorm, which autocast keeps in fp32 (apex's FusedLayerNorm casts
    its input and weights to the autocast dtype: BERT's post-LN residual stream in bf16);
    `apex` is honoured as asked. README: model.layer_norm_impl."""
    return "torch" if impl == "auto" and precision.endswith("-mixed") else impl


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
        self._tokens_since_log = 0
        self._row: dict[str, object] = {}  # this step's metrics for the logger (`queue_log`)
        self._row_batch_size = 1
        self._flops_since_log = 0  # model FLOPs of the micro-batches since the last log step
        self._last_log_time = time.perf_counter()
        self._last_memory_step: int | None = None  # the step of this launch's last memory read
        self.peak_tflops: float | None = None  # set when training starts (`set_peak_tflops`)
        self.speed: dict[str, float] = {}  # the last log step's throughput, for the summary
        self._last_summary_loss: torch.Tensor | None = None
        self._step_sums: dict[str, torch.Tensor] = {}  # this step's micro-batches' metrics, summed
        self._step_weight = 0.0  # their weights' sum (loss tokens, or 1 each: `log_step`)
        self.loss_history: list[tuple[int, float]] = []
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite loss or gradient
        self.consecutive_skipped_steps = 0  # of them, since the last applied step
        self._last_skip_warning = float("-inf")  # time.monotonic() of the last warning line
        self._nonfinite_loss: torch.Tensor | None = None  # any micro-batch of this step
        self._device_skips = DeviceSkips()  # steps skipped on the device, not yet counted
        self._last_step_applied = False  # an optimizer step was applied since the schedule's last
        self.loaders: list[tuple[int, int, int]] = []  # (epoch, step, sequences dropped)
        self._lr_schedule: LearningRateSchedule | None = None  # the scheduler's (schedule.py)
        self._saved_schedule: list[dict] | None = None  # a resumed checkpoint's segments
        self._loss_scale = 1.0  # token-budget batches: ranks x accumulation / step's tokens
        self.batch_warmup = batch_size_warmup(self.run)  # None: every step the full batch

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
        trainer, plan = self._trainer, self.batch_plan
        if trainer is not None:
            check_world_size(trainer.world_size, self.run, plan)
        optimizer, choice = build_optimizer(
            list(self.parameters()), self.run, plan, self.run_device()
        )
        self.report_kernel("optimizer", choice)
        self._lr_schedule = first_schedule(self.run, plan)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": LambdaLR(optimizer, self._lr_schedule),
                "interval": "step",
            },
        }

    def settle_skips(self) -> None:
        """Count the optimizer steps skipped on the device since the last call (one host
        read: on logging steps, before a checkpoint, at the end of fit), apply
        `trainer.nonfinite`'s bounds to them and move the learning-rate schedule back by
        them, so it follows the applied steps again."""
        settled = self._device_skips.settle()
        if settled is None:  # no step skips on the device (the host decides each step)
            return
        skipped, run, longest = settled
        if skipped == 0:
            self.consecutive_skipped_steps = run
            return
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.last_epoch -= skipped
            rate = self._lr_schedule(scheduler.last_epoch) if self._lr_schedule else 1.0
            for group, base in zip(
                scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True
            ):
                group["lr"] = base * rate
        steps = f"the last {skipped} non-finite step(s) up to this one, skipped on the device"
        self._on_skipped_step(steps, skipped, (run, longest))

    def on_train_end(self) -> None:
        self.settle_skips()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.settle_skips()  # counted, and checked against trainer.nonfinite, before saving
        for name, parameter in self.named_parameters():
            local = getattr(parameter, "ds_tensor", parameter)  # ZeRO-3: this rank's partition
            if not torch.isfinite(local.detach()).all():
                raise NonFiniteError(
                    f"parameter {name} is not finite at step {self.global_step}: refusing to "
                    "write a checkpoint of a diverged model"
                )
        checkpoint["config"] = self.config
        checkpoint["rng"] = rng_state()
        checkpoint["skipped_steps"] = self.skipped_steps
        if self._lr_schedule is not None:
            checkpoint["lr_schedule"] = self._lr_schedule.segments
        self.objective.save_state(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Brings older checkpoints' weight names to this task's (`pretrain.checkpoint.compat`)
        and checks that the weights fit this model (ConfigError naming the first key and both
        shapes, instead of torch's list of every size mismatch); the random state is applied at
        the first batch, after the data loaders have been built, exactly where the interrupted
        run stood when it saved."""
        if checkpoint.get("state_dict"):  # none under DeepSpeed, which loads its partitions
            checkpoint["state_dict"] = task_state_dict(checkpoint["state_dict"])
        saved_weights = checkpoint.get("state_dict") or {}
        ours = self.state_dict() if saved_weights else {}
        for key, saved in saved_weights.items():
            if key in ours and tuple(saved.shape) != tuple(ours[key].shape):
                source = self._trainer.ckpt_path if self._trainer is not None else "checkpoint"
                raise ConfigError(
                    f"{source}: the checkpoint's {key} has shape {tuple(saved.shape)}, this "
                    f"run's model {tuple(ours[key].shape)}: it was trained with another model config; "
                    "resume with that model config, or start over (resume=never)"
                )
        self._restored_rng = checkpoint.get("rng")
        self.skipped_steps = checkpoint.get("skipped_steps", 0)
        self._saved_schedule = stored_schedule(checkpoint)
        self.objective.load_state(checkpoint)

    def on_train_start(self) -> None:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        self._continue_schedule()
        self.set_peak_tflops()

        if isinstance(self.trainer.strategy, DeepSpeedStrategy):
            # DeepSpeed skips a step whose gradients hold inf/NaN (its overflow check, on by
            # default only for fp16); turn it on for every precision, ZeRO 1-2 (ZeRO-3 always
            # skips a step with a non-finite gradient norm)
            engine_optimizer = self.trainer.strategy.deepspeed_engine.optimizer
            if hasattr(engine_optimizer, "check_grad_overflow"):
                engine_optimizer.check_grad_overflow = True

    def host_batch(self, batch: dict) -> dict:
        """On the host, before the batch moves to the device (the data module's
        `on_before_batch_transfer`): the unpadded layout's index (model.unpad,
        `models/unpadding.py`), so the step reads no token count from the device; whether it
        has padding at all (`mark_padding`: no mask, FlashAttention's SDPA, when none)."""
        batch = mark_padding(batch)
        return with_unpadded_index(batch, getattr(self.objective, "encoder", None), self.device)

    def setup(self, stage: str) -> None:
        """Before the optimizer is built: the LayerNorm kernels (model.layer_norm_impl)."""
        precision = str(self.trainer.precision) if self._trainer is not None else "32-true"
        impl = layer_norm_choice(self.run.model.layer_norm_impl, precision)
        choice = use_layer_norm_impl(self, impl, self.run_device())
        self.report_kernel("layer_norm", choice)

    def run_device(self) -> torch.device:
        """The device this rank trains on (the module may not be there yet)."""
        return self._trainer.strategy.root_device if self._trainer is not None else self.device

    def report_kernel(self, part: str, choice: str) -> None:
        """Print which kernels `part` uses (once, rank 0) and log it with the hyperparameters."""
        if self._trainer is None or not self.trainer.is_global_zero:
            return
        print(choice, flush=True)
        for logger in self.loggers:
            logger.log_hyperparams({f"kernels/{part}": choice.split(": ", 1)[1]})

    def set_peak_tflops(self) -> None:
        """The device peak MFU is taken against: trainer.peak_tflops, else `pretrain.models.flops`'s
        table (GPU) or a measured GEMM (CPU); printed once."""
        self.peak_tflops, source = self.run.trainer.peak_tflops, "trainer.peak_tflops"
        if self.peak_tflops is None:
            self.peak_tflops, source = device_peak_tflops(str(self.trainer.precision), self.device)
        if self.trainer.is_global_zero:
            peak = f"{self.peak_tflops:.3g} TFLOP/s" if self.peak_tflops else "unknown"
            print(f"MFU against a device peak of {peak} ({source})", flush=True)

    def _continue_schedule(self) -> None:
        """A resumed launch follows the checkpoint's schedule (`pretrain.runtime.schedule`), extended
        per optim.extend when its max_steps passes the end of a decaying one (ConfigError under
        `refuse`); the rate of the next step is set from it."""
        saved, self._saved_schedule = self._saved_schedule, None
        if saved is None or self._lr_schedule is None:
            return
        scheduler = self.lr_schedulers()
        warmup = warmup_steps(self.run.optim, self.batch_plan)
        segments = extended(saved, scheduler.last_epoch, self.run, warmup)
        self._lr_schedule.segments = [dict(s) for s in segments]
        for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
            group["lr"] = base * self._lr_schedule(scheduler.last_epoch)
        if len(segments) > len(saved) and self.trainer.is_global_zero:
            print(describe_extension(segments), flush=True)

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Remember (on the device, no sync) whether any micro-batch of this step had a
        non-finite loss."""
        bad = ~torch.isfinite(loss.detach())
        self._nonfinite_loss = bad if self._nonfinite_loss is None else self._nonfinite_loss | bad

    def _ranks_with_nonfinite(self) -> torch.Tensor:
        """Ranks whose loss (any micro-batch of this step) or gradients are not finite,
        agreed by all ranks (an all-reduce of one number per optimizer step), as a float
        scalar on the device (no host synchronisation). Under fp16 mixed precision gradients
        are left to the loss scaler, which skips such steps itself."""
        fp16 = self.trainer.precision in ("16-mixed", "16")
        bad = nonfinite_flag(self._nonfinite_loss, self.parameters(), self.device, not fp16)
        self._nonfinite_loss = None
        return self.trainer.strategy.reduce(bad.float(), reduce_op="sum")

    def _on_skipped_step(
        self, ranks: int | str | None, count: int = 1, in_a_row: tuple[int, int] | None = None
    ) -> None:
        """Count `count` skipped optimizer steps (`in_a_row`: the run of skipped steps now and
        its longest, from `DeviceSkips.settle`; else this step one more in a row); under
        trainer.nonfinite=stop, or once trainer.max_consecutive_skipped_steps steps in a row
        (the run diverged) or trainer.max_skipped_steps in all were skipped,
        raise NonFiniteError (exit status 3, no checkpoint after the last one written). A
        warning line is printed for skipped steps, at most one per `SKIP_WARNING_INTERVAL_S`."""
        where = "DeepSpeed's overflow check" if ranks is None else f"{ranks} rank(s)"
        if isinstance(ranks, str):  # skipped on the device, counted now
            where = ranks
        if self.run.trainer.nonfinite == "stop":
            raise NonFiniteError(
                f"step {self.global_step}: non-finite loss or gradient ({where}); "
                "trainer.nonfinite=stop. Lower optim.optimizer.lr or check the data, or set "
                "trainer.nonfinite=skip to skip such steps"
            )
        self.skipped_steps += count
        self.consecutive_skipped_steps += 1
        longest = self.consecutive_skipped_steps
        if in_a_row is not None:
            self.consecutive_skipped_steps, longest = in_a_row
        check_skip_bounds(self.run, self.global_step, self.skipped_steps, longest)
        bound = self.run.trainer.max_consecutive_skipped_steps
        now = time.monotonic()
        if self.trainer.is_global_zero and now - self._last_skip_warning >= SKIP_WARNING_INTERVAL_S:
            self._last_skip_warning = now
            limit = "" if bound is None else f"; the run stops at {bound} in a row"
            print(
                f"warning: step {self.global_step}: optimizer step skipped, non-finite loss or "
                f"gradient ({where}); {self.skipped_steps} skipped in all, "
                f"{self.consecutive_skipped_steps} in a row{limit} "
                "(trainer.max_consecutive_skipped_steps)",
                flush=True,
            )

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Apply the step only when every rank's loss and gradients are finite; else skip it
        (weights, optimizer state and learning-rate schedule untouched; counted in
        `train/skipped_steps`; trainer.max_steps still counts it) or raise NonFiniteError, per
        `trainer.nonfinite`. Under DeepSpeed the engine decides, by its own overflow check on
        the gradients of all ranks: a NaN loss whose gradients stay finite is not caught there."""
        from lightning.pytorch.strategies import DeepSpeedStrategy

        strategy = self.trainer.strategy
        if isinstance(strategy, DeepSpeedStrategy):  # called every micro-batch; the engine
            engine = strategy.deepspeed_engine  # steps at the accumulation boundary
            before = engine.skipped_steps
            optimizer.step(closure=optimizer_closure)
            self._nonfinite_loss = None
            self._last_step_applied = engine.skipped_steps == before
        else:
            loss = optimizer_closure()  # forward and backward of the step's last micro-batch
            if skips_on_device(optimizer, self.trainer.precision):  # no host sync (nonfinite.py)
                found_inf = self._device_skips.record(self._ranks_with_nonfinite())
                with device_skip(optimizer, found_inf) as arguments:  # found_inf, grad_scaler
                    optimizer.step(closure=lambda: loss, **arguments)  # settles on log steps
                self._last_step_applied = True  # as far as the host knows: see settle_skips
                self.queue_log({"train/skipped_steps": float(self.skipped_steps)})
                self.flush_logs()
                return
            bad_ranks = int(self._ranks_with_nonfinite().item())  # the host decides: a sync
            self._last_step_applied = bad_ranks == 0
            if self._last_step_applied:
                optimizer.step(closure=lambda: loss)
            else:
                clear_gradients(optimizer)  # apex's zero_grad takes no set_to_none
        if self._last_step_applied:
            self.consecutive_skipped_steps = 0
        else:
            self._on_skipped_step(None if isinstance(strategy, DeepSpeedStrategy) else bad_ranks)
        self.queue_log({"train/skipped_steps": float(self.skipped_steps)})
        self.flush_logs()

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        """Clip per trainer.gradient_clip_val. Lightning's mixed-precision plugin refuses to
        clip for an optimizer that unscales its own gradients (torch's fused AdamW, which GPU
        runs use) even in bf16, where no gradient scaler exists and nothing is unscaled; there
        the plugin's plain clipping runs. With fp16's scaler, Lightning's check stands."""
        from lightning.pytorch.plugins.precision import MixedPrecision, Precision

        plugin = self.trainer.precision_plugin
        if isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            algorithm = gradient_clip_algorithm or "norm"
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val or 0.0, algorithm)
        else:
            super().configure_gradient_clipping(
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )

    def lr_scheduler_step(self, scheduler, metric=None) -> None:
        """The schedule advances once per applied optimizer step (Lightning also calls this
        when an epoch is ended by on_train_batch_start, where no step was taken)."""
        if self._last_step_applied:
            super().lr_scheduler_step(scheduler, metric)
        self._last_step_applied = False

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> int | None:
        """Ends the epoch on every rank alike (returns -1) at the first optimizer step some
        rank lacks batches for (`pretrain.data.loader`); restores a resumed run's random
        state at its first batch; then the objective's `start_batch`. The last micro-batch of
        the run's last step (trainer.max_steps) sets `trainer.should_stop`, so that step is
        a log step (Lightning writes its row, `is_log_step`)."""
        if batch_idx % self.trainer.accumulate_grad_batches == 0 and not self._epoch_continues(
            batch, batch_idx
        ):
            return -1
        if self._restored_rng is not None:
            set_rng_state(self._restored_rng)
            self._restored_rng = None
        if not is_skipped_batch(batch):
            self.objective.start_batch(self, batch, batch_idx)
        trainer = self.trainer
        if self.global_step + 1 >= trainer.max_steps and not trainer.fit_loop._should_accumulate():
            # the run's last step: a stopping step, whose row Lightning writes (should_update_logs)
            trainer.should_stop = True

    def on_train_epoch_start(self) -> None:
        self.objective.start_epoch(self)

    def _epoch_continues(self, batch: dict, batch_idx: int) -> bool:
        """Whether every rank has a whole optimizer step of batches (`epoch_end.agree_on_step`);
        the step's loss scale of token-budget batches, and the epochs ended, kept."""
        agreed = agree_on_step(self, batch, batch_idx)
        ranks_met()  # every rank got here: from now on collectives wait collective_timeout_s
        if agreed.loss_scale is not None:
            self._loss_scale = agreed.loss_scale
        if not agreed.continues:
            self.loaders.append((self.current_epoch, self.global_step, agreed.dropped))
        return agreed.continues

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """The micro-batch's loss (the objective's `forward`), logged; with token-budget
        batches (`loader.weigh_step`) weighed by its predicted tokens over the step's (all
        ranks), times ranks x accumulation, which Lightning and DDP divide back out: the
        step's gradient is that of the mean loss over every predicted token of the step.
        Under the batch-size warm-up a step's skipped micro-batches compute nothing (a zero
        loss that reaches no parameter: Lightning refuses None under DDP; they come first, so
        the step's last backward, which DDP syncs, is a real one) and its a real ones weigh
        accumulation / a each, which Lightning divides back out: the step's gradient is that
        of the mean loss over its real micro-batches."""
        if is_skipped_batch(batch):
            return torch.zeros((), device=self.device, requires_grad=True)
        losses = self(batch)
        self.log_step(losses, batch)
        if LOSS_TOKENS_KEY in batch:
            return losses.loss * batch[LOSS_TOKENS_KEY] * self._loss_scale
        if self.batch_warmup is not None:
            plan = self.batch_plan
            real = self.batch_warmup.micro_batches(
                self.global_step, plan.micro_batch_size * plan.world_size
            )
            return losses.loss * (self.trainer.accumulate_grad_batches / real)
        return losses.loss

    def log_step(self, metrics: Mapping[str, torch.Tensor], batch: dict) -> None:
        """Queue the loss and metrics (`Losses`) under train/ for the step's row (`queue_log`):
        their mean over the step's real micro-batches so far, weighed by loss tokens where the
        loader weighs them, so that a step logs the same value whatever its micro-batch size
        and accumulation (one batch of 8 and 2 micro-batches of 4 log the mean over the same
        predicted tokens); count the micro-batch's non-padding input tokens and model FLOPs."""
        weight = batch.get(LOSS_TOKENS_KEY, 1.0)  # its loss tokens, where a step is weighed
        self._step_weight = self._step_weight + weight
        for key, value in metrics.items():  # device tensors: no host sync
            value = value.detach() if isinstance(value, torch.Tensor) else value
            self._step_sums[key] = self._step_sums.get(key, 0) + value * weight
        mean = {key: total / self._step_weight for key, total in self._step_sums.items()}
        self.queue_log({f"train/{k}": v for k, v in mean.items()}, batch["input_ids"].shape[0])
        # device tensors, read back only on log steps: never a host sync per step
        self._tokens_since_log = self._tokens_since_log + batch["attention_mask"].sum()
        self._flops_since_log = self._flops_since_log + training_flops(self.objective, batch)
        self._last_summary_loss = mean.get(self.objective.summary_metric)

    def queue_log(self, metrics: Mapping[str, object], batch_size: int | None = None) -> None:
        """Add `metrics` to this step's row: Lightning writes a step's values only on its log
        steps (trainer.log_every_n_steps, and the step a run stops at), and each `self.log`
        costs about 0.1 ms of its bookkeeping (a tenth of a 64-wide BERT's step on a CPU core:
        benchmarks/RESULTS.md), so the row is handed to it only on the micro-batches whose row
        it writes (`flush_logs`). Later values of a key replace earlier ones, as Lightning's
        per-step values do; `batch_size` is the micro-batch's."""
        self._row.update(metrics)
        if batch_size is not None:
            self._row_batch_size = batch_size

    def flush_logs(self, batch_end: bool = False) -> None:
        """Log the queued row (`queue_log`), the loss also to the progress bar, when Lightning
        will write this micro-batch's row: the step's last micro-batch on a log step or on the
        step a run stops at. Called after the optimizer step (the step's line reads the loss)
        and at the batch's end (`batch_end`: after the callbacks, whose step counts join the
        row and whose preemption check may stop the run at this step); a row still queued at
        the end of a step Lightning does not write is dropped."""
        trainer = self.trainer
        if not self._row or trainer.fit_loop._should_accumulate():
            return
        if not (trainer._logger_connector.should_update_logs or trainer.fast_dev_run):
            if batch_end:  # a row Lightning will not write
                self._row = {}
            return
        row, self._row = self._row, {}
        self.log_dict(row, batch_size=self._row_batch_size)
        if "train/loss" in row:
            self.log(
                "loss",
                row["train/loss"],
                prog_bar=True,
                logger=False,
                batch_size=self._row_batch_size,
            )

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        self.flush_logs(batch_end=True)
        if not self.trainer.fit_loop._should_accumulate():  # the step's last micro-batch
            self._step_sums, self._step_weight = {}, 0.0

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per optimizer step (after all accumulated micro-batches): the learning rate,
        and on log steps (`is_log_step`: the run's last too; and the launch's first step, for
        the summary) the summary loss (`summary_metric`), on log steps tokens/s since the last
        log, and the run's memory (`pretrain.runtime.memory`, `sys/*`) on the launch's first
        log step and then on log steps at least MEMORY_EVERY_N_STEPS after the last read. Other
        steps read nothing back from the device."""
        self.queue_log({"train/lr": optimizer.param_groups[0]["lr"]})
        log_step = is_log_step(
            self.global_step + 1, self.trainer.log_every_n_steps, self.trainer.max_steps
        )
        if self._last_summary_loss is not None and (log_step or not self.loss_history):
            # the launch's first step and the log steps: the only steps that read the device
            self.loss_history.append((self.global_step, float(self._last_summary_loss.detach())))
        if log_step:
            now = time.perf_counter()
            elapsed = max(now - self._last_log_time, 1e-9)
            rate = float(self._tokens_since_log) / elapsed
            flops = model_flops_metrics(float(self._flops_since_log) / elapsed, self.peak_tflops)
            self.queue_log({"train/tokens_per_s": rate, **flops})
            self.speed = {"train/tokens_per_s": rate, **flops}
            self._tokens_since_log, self._flops_since_log, self._last_log_time = 0, 0, now
            self.settle_skips()
            last = self._last_memory_step
            if last is None or self.global_step - last >= MEMORY_EVERY_N_STEPS:
                self.queue_log(memory_metrics(self.device))
                self._last_memory_step = self.global_step
