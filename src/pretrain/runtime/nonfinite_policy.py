"""The policy of `trainer.nonfinite` for one run (`PretrainingTask`'s collaborator): the
optimizer step applied only when every rank's loss and gradients are finite, else skipped
(weights, optimizer state and learning-rate schedule untouched; counted in
`train/skipped_steps`; trainer.max_steps still counts it) or the run stopped
(NonFiniteError), along three paths: DeepSpeed's own overflow check, a skip on the device
(`nonfinite.device_skip`: no host sync, counted on log steps), or the host's decision of
every step (one read a step)."""

import time

import lightning as L
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy

from pretrain.cluster.collectives import sum_on_device
from pretrain.runtime.nonfinite import (
    DeviceSkips,
    NonFiniteError,
    check_skip_bounds,
    clear_gradients,
    device_skip,
    nonfinite_flag,
    skips_on_device,
)
from pretrain.runtime.schedule import rewind_schedule

SKIP_WARNING_INTERVAL_S = 30.0  # at most one "step skipped" warning line per interval


class NonFinitePolicy:
    """Skipped steps of the run (`skipped_steps`, saved in checkpoints by the task) and of
    this launch; `step` is the task's `optimizer_step`."""

    def __init__(self) -> None:
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite loss or gradient
        self.consecutive_skipped_steps = 0  # of them, since the last applied step
        self.last_step_applied = False  # an optimizer step was applied since the schedule's last
        self._last_warning = float("-inf")  # time.monotonic() of the last warning line
        self._nonfinite_loss: torch.Tensor | None = None  # any micro-batch of this step
        self._device_skips = DeviceSkips()  # steps skipped on the device, not yet counted

    def note_loss(self, loss: torch.Tensor) -> None:
        """Remember (on the device, no sync) whether any micro-batch of this step had a
        non-finite loss."""
        bad = ~torch.isfinite(loss.detach())
        self._nonfinite_loss = bad if self._nonfinite_loss is None else self._nonfinite_loss | bad

    def on_train_start(self, trainer: L.Trainer) -> None:
        """DeepSpeed skips a step whose gradients hold inf/NaN (its overflow check, on by
        default only for fp16); turned on for every precision, ZeRO 1-2 (ZeRO-3 always skips
        a step with a non-finite gradient norm)."""
        if isinstance(trainer.strategy, DeepSpeedStrategy):
            engine_optimizer = trainer.strategy.deepspeed_engine.optimizer
            if hasattr(engine_optimizer, "check_grad_overflow"):
                engine_optimizer.check_grad_overflow = True

    def ranks_with_nonfinite(self, task: L.LightningModule) -> torch.Tensor:
        """Ranks whose loss (any micro-batch of this step) or gradients are not finite,
        agreed by all ranks (`sum_on_device`: one number per optimizer step), as a float
        scalar on the device (no host synchronisation). Under fp16 mixed precision gradients
        are left to the loss scaler, which skips such steps itself."""
        fp16 = task.trainer.precision in ("16-mixed", "16")
        bad = nonfinite_flag(self._nonfinite_loss, task.parameters(), task.device, not fp16)
        self._nonfinite_loss = None
        return sum_on_device(bad.float())

    def step(self, task: L.LightningModule, optimizer, closure) -> None:
        """The optimizer step of `task` under trainer.nonfinite. Under DeepSpeed the engine
        decides, by its own overflow check on the gradients of all ranks: a NaN loss whose
        gradients stay finite is not caught there."""
        strategy = task.trainer.strategy
        if isinstance(strategy, DeepSpeedStrategy):  # called every micro-batch; the engine
            engine = strategy.deepspeed_engine  # steps at the accumulation boundary
            before = engine.skipped_steps
            optimizer.step(closure=closure)
            self._nonfinite_loss = None
            self.last_step_applied, bad_ranks = engine.skipped_steps == before, None
        else:
            loss = closure()  # forward and backward of the step's last micro-batch
            if skips_on_device(optimizer, task.trainer.precision):  # no host sync
                found_inf = self._device_skips.record(self.ranks_with_nonfinite(task))
                with device_skip(optimizer, found_inf) as arguments:  # found_inf, grad_scaler
                    optimizer.step(closure=lambda: loss, **arguments)  # settles on log steps
                self.last_step_applied = True  # as far as the host knows: see `settle`
                return
            bad_ranks = int(self.ranks_with_nonfinite(task).item())  # the host decides: a sync
            self.last_step_applied = bad_ranks == 0
            if self.last_step_applied:
                optimizer.step(closure=lambda: loss)
            else:
                clear_gradients(optimizer)  # apex's zero_grad takes no set_to_none
        if self.last_step_applied:
            self.consecutive_skipped_steps = 0
        else:
            self.on_skipped(task, bad_ranks)

    def settle(self, task: L.LightningModule, schedule) -> None:
        """Count the optimizer steps skipped on the device since the last call (one host
        read: on log steps, before a checkpoint, at the end of fit), apply
        `trainer.nonfinite`'s bounds to them and move the learning-rate schedule (the task's
        `LearningRateSchedule`) back by them, so it follows the applied steps again."""
        settled = self._device_skips.settle()
        if settled is None:  # no step skips on the device (the host decides each step)
            return
        skipped, run, longest = settled
        if skipped == 0:
            self.consecutive_skipped_steps = run
            return
        rewind_schedule(task.lr_schedulers(), schedule, skipped)
        steps = f"the last {skipped} non-finite step(s) up to this one, skipped on the device"
        self.on_skipped(task, steps, skipped, (run, longest))

    def on_skipped(
        self,
        task: L.LightningModule,
        ranks: int | str | None,
        count: int = 1,
        in_a_row: tuple[int, int] | None = None,
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
        run, step = task.run, task.global_step
        if run.trainer.nonfinite == "stop":
            raise NonFiniteError(
                f"step {step}: non-finite loss or gradient ({where}); "
                "trainer.nonfinite=stop. Lower optim.optimizer.lr or check the data, or set "
                "trainer.nonfinite=skip to skip such steps"
            )
        self.skipped_steps += count
        self.consecutive_skipped_steps += 1
        longest = self.consecutive_skipped_steps
        if in_a_row is not None:
            self.consecutive_skipped_steps, longest = in_a_row
        check_skip_bounds(run, step, self.skipped_steps, longest)
        bound = run.trainer.max_consecutive_skipped_steps
        now = time.monotonic()
        if task.trainer.is_global_zero and now - self._last_warning >= SKIP_WARNING_INTERVAL_S:
            self._last_warning = now
            limit = "" if bound is None else f"; the run stops at {bound} in a row"
            print(
                f"warning: step {step}: optimizer step skipped, non-finite loss or "
                f"gradient ({where}); {self.skipped_steps} skipped in all, "
                f"{self.consecutive_skipped_steps} in a row{limit} "
                "(trainer.max_consecutive_skipped_steps)",
                flush=True,
            )


def check_finite_parameters(task: L.LightningModule) -> None:
    """NonFiniteError when a parameter of `task` (this rank's partition under ZeRO-3) is not
    finite: a diverged model's checkpoint is never written."""
    for name, parameter in task.named_parameters():
        local = getattr(parameter, "ds_tensor", parameter)  # ZeRO-3: this rank's partition
        if not torch.isfinite(local.detach()).all():
            raise NonFiniteError(
                f"parameter {name} is not finite at step {task.global_step}: refusing to "
                "write a checkpoint of a diverged model"
            )
