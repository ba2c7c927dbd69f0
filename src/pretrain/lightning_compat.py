"""Lightning's private internals, behind one door: every use of a private attribute, method or
name of Lightning (2.6.x) by this project is a small named function here, each pinned by a test
in tests/integration/test_lightning_compat.py (an upgrade that changes one fails that test, naming the
function), and tests/unit/test_lightning_door.py fails when another module reaches past it.

It sits on the ground floor (layer 1 of src/pretrain/README.md) so that data, cluster and
runtime alike can use it; it imports nothing of ours."""

from typing import Any

import lightning as L
from lightning.fabric.connector import _convert_precision_to_unified_args
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks.progress.tqdm_progress import _update_n
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher


class LocalRanksLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher of a one-node run's local ranks (it runs the command line again
    for each), whose start of them a subclass may take over in `start_local_ranks` (called
    on rank 0; its `procs` list holds the children, each with `poll`, `send_signal`, `kill`)."""

    def _call_children_scripts(self) -> None:
        self.start_local_ranks()

    def start_local_ranks(self) -> None:
        """Start local ranks 1.. by running the command line again (Lightning's way)."""
        super()._call_children_scripts()

    def check_can_start_local_ranks(self) -> None:
        """Lightning's refusal to start local ranks where it cannot (interactive sessions)."""
        self._check_can_spawn_children()


class ReplacesScriptLauncher:
    """Strategy mixin (before a DDPStrategy): where Lightning would start the local ranks by
    running the command line again, `local_ranks_launcher()` (the subclass's) starts them."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if type(self._launcher) is _SubprocessScriptLauncher:
            self._launcher = self.local_ranks_launcher()

    def local_ranks_launcher(self) -> LocalRanksLauncher:
        """The launcher that replaces Lightning's (the subclass's)."""
        raise NotImplementedError


class CheckpointHooks(ModelCheckpoint):
    """Lightning's ModelCheckpoint with its private file hooks under public names, for a
    subclass to override or call: `write_checkpoint` (a save to a path), `write_last` (last.ckpt),
    `remove_checkpoint_file` (rotation), `save_now` (top-k and last at this step)."""

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        self.write_checkpoint(trainer, filepath)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict) -> None:
        self.write_last(trainer, monitor_candidates)

    def _remove_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        self.remove_checkpoint_file(trainer, filepath)

    def write_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        """Save the trainer's checkpoint to `filepath` (Lightning's way)."""
        super()._save_checkpoint(trainer, filepath)

    def write_last(self, trainer: L.Trainer, monitor_candidates: dict) -> None:
        """Save last.ckpt (Lightning's way: a copy, or a link where it links)."""
        super()._save_last_checkpoint(trainer, monitor_candidates)

    def remove_checkpoint_file(self, trainer: L.Trainer, filepath: str) -> None:
        """Remove a rotated-out checkpoint (Lightning's way)."""
        super()._remove_checkpoint(trainer, filepath)

    @property
    def last_saved_step(self) -> int | None:
        """The global step of this callback's latest save in this launch."""
        return self._last_global_step_saved

    def save_now(self, trainer: L.Trainer) -> None:
        """Save the top-k and last checkpoints of this step, as a periodic save does."""
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The trainer `module` is attached to, or None (`module.trainer` raises then)."""
    return module._trainer


def should_accumulate(trainer: L.Trainer) -> bool:
    """Whether the micro-batch in progress is not its optimizer step's last (the gradients
    accumulate); False at a step's last micro-batch, and at an epoch's last batch."""
    return trainer.fit_loop._should_accumulate()


def is_log_row(trainer: L.Trainer) -> bool:
    """Whether Lightning writes the logged values of the micro-batch in progress to the
    loggers (trainer.log_every_n_steps, counted in batches that stepped; or fast_dev_run)."""
    return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)


def batches_done_this_epoch(trainer: L.Trainer) -> int:
    """Micro-batches of the current epoch whose training step has run (the one in progress
    included from its `on_train_batch_end`): where a checkpoint saved now resumes."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.processed


def restart_epoch_counters(trainer: L.Trainer) -> None:
    """Make the resumed epoch's batch_idx (and so the accumulation phase) start at 0 at the
    resume position, whatever micro-batch size or accumulation reached it: Lightning restores
    its per-epoch counters, and counts a batch saved at its end as completed on restart."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    progress.current.reset()
    if progress.total.completed == progress.total.processed - 1:
        # saved at a batch's end: on restart Lightning counts that batch as completed (+1)
        # and restarts every counter there, so start from -1 to restart at 0
        progress.current.completed = -1


def clear_lightning_sigterm(trainer: L.Trainer) -> None:
    """Forget a SIGTERM that Lightning's own handler recorded (its loop would end the run with
    status 0 on it): the run's preemption callback handles the signal instead."""
    trainer._signal_connector.received_sigterm = False


def skip_sigterm_broadcast(trainer: L.Trainer) -> None:
    """Stop Lightning's per-micro-batch broadcast of its SIGTERM flag (with several ranks: a
    tensor copied to the device, broadcast and read back with `.item()`, a host sync each
    micro-batch). Only for a run whose preemption callback has taken SIGTERM from Lightning's
    handler, so that flag stays unset while it trains."""
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None


def save_last_checkpoint(trainer: L.Trainer, callback: ModelCheckpoint) -> None:
    """Save `callback`'s last.ckpt now, as its periodic saves do (every rank calls this:
    sharded strategies save collectively)."""
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def unified_precision(precision: Any) -> str | None:
    """Lightning's name of a precision setting (`16` -> `16-mixed`, `bf16` -> `bf16-mixed`)."""
    return _convert_precision_to_unified_args(precision)


def set_progress_bar(bar: Any, value: int) -> None:
    """Set a tqdm bar of Lightning's progress bar to `value` and redraw it (unless disabled)."""
    _update_n(bar, value)


def summary_table(
    total: int, trainable: int, size_mb: float, modes: dict, columns: list[tuple[str, list]]
) -> str:
    """Lightning's model-summary table of `columns` ((header, values) each) and its totals,
    as its ModelSummary callback prints it (its last line: the FLOP total, here 0)."""
    from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

    return _format_summary_table(total, trainable, size_mb, modes, 0, *columns)


def progress_bar_due(callback: Any, current: int, total: int) -> bool:
    """Whether a TQDMProgressBar callback redraws at `current` of `total` (its refresh rate)."""
    return callback._should_update(current, total)


def wandb_run_started(logger: Any) -> bool:
    """Whether a WandbLogger has started (or attached to) its wandb run."""
    return logger._experiment is not None


def forget_wandb_run(logger: Any) -> None:
    """Make a WandbLogger start a new wandb run at its next use (after `run.finish`)."""
    logger._experiment = None
