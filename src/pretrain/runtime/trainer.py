"""Builds the Lightning Trainer of a run: loggers, checkpointing, precision, strategy
(pretrain.runtime.strategies) and accumulation (derived from the global batch, pretrain.batching)."""

import hashlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger

from pretrain.checkpoint.atomic import AtomicCheckpointIO, checkpoint_dir, link_checkpoint
from pretrain.checkpoint.background import BackgroundCheckpointIO, run_after_writes
from pretrain.cluster.preemption import preemption_callbacks, slurm_plugins
from pretrain.errors import ConfigError, RunEnvironmentError
from pretrain.lightning_compat import (
    CheckpointHooks,
    forget_wandb_run,
    progress_bar_due,
    set_progress_bar,
    summary_table,
    wandb_run_started,
)
from pretrain.runtime.progress_log import ProgressLog, is_log_step
from pretrain.runtime.strategies import build_strategy

if TYPE_CHECKING:
    from pretrain.config import TrainConfig


class StepCheckpoint(CheckpointHooks):
    """ModelCheckpoint that also saves (top-k and last) when training ends between two
    `every_n_train_steps` saves, so the final state is always on disk. At `max_steps` it saves
    right after the last optimizer step, before Lightning closes the epoch, so the checkpoint
    holds the epoch and stream position the next launch continues from.

    `last.ckpt` is a link to the step checkpoint saved at the same step
    (`atomic.link_checkpoint`), not a second write of it; only a save of `last` alone (the
    preemption's, between two periodic saves) writes it in full. The link is made after that
    step's write has landed (`background.run_after_writes`), and rotation never removes the
    checkpoint `last.ckpt` links to: such a removal waits until the link has moved on."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._saved: tuple[int, Path] | None = None  # (step, path) of the latest save
        self._linked: Path | None = None  # what last.ckpt links to (None: not a link)
        self._read_link = False  # whether _linked was read from disk in this launch
        self._deferred: list[str] = []  # removals of the linked checkpoint, held back

    def write_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super().write_checkpoint(trainer, filepath)
        self._saved = (trainer.global_step, Path(filepath))

    def write_last(self, trainer: L.Trainer, monitor_candidates: dict) -> None:
        if not self.save_last:
            return
        link = Path(self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST))
        self.last_model_path = str(link)
        step, saved = self._saved or (None, None)
        if step != trainer.global_step or saved is None or saved.parent != link.parent:
            self._linked, self._read_link = None, True
            self.write_checkpoint(trainer, str(link))  # the only copy of this step
            return
        if saved == link:
            return  # last.ckpt was written in full at this step already
        self._linked, self._read_link = saved, True
        if trainer.is_global_zero:
            run_after_writes(trainer.strategy.checkpoint_io, lambda: link_checkpoint(saved, link))
        deferred, self._deferred = self._deferred, []
        for path in deferred:
            super().remove_checkpoint_file(trainer, path)

    def remove_checkpoint_file(self, trainer: L.Trainer, filepath: str) -> None:
        if not self._read_link:  # a resumed launch: what the previous one linked
            last = Path(str(self.dirpath)) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
            self._linked = last.with_name(os.readlink(last)) if last.is_symlink() else None
            self._read_link = True
        if self._linked is not None and Path(filepath) == self._linked:
            self._deferred.append(filepath)  # removed once last.ckpt links elsewhere
            return
        super().remove_checkpoint_file(trainer, filepath)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, *args)
        final = trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps
        if final and self.last_saved_step != trainer.global_step:
            self.save_now(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.last_saved_step != trainer.global_step:
            self.save_now(trainer)
        super().on_train_end(trainer, pl_module)


class StepProgressBar(TQDMProgressBar):
    """One bar over optimizer steps up to max_steps (epochs of a stream have no known length)."""

    def on_train_epoch_start(self, trainer: L.Trainer, *_: object) -> None:
        bar = self.train_progress_bar
        if bar.total != trainer.max_steps:
            bar.reset(total=trainer.max_steps)
            set_progress_bar(bar, trainer.global_step)
        bar.set_description(f"epoch {trainer.current_epoch}, step")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *_: object
    ) -> None:
        if progress_bar_due(self, trainer.global_step, trainer.max_steps):
            set_progress_bar(self.train_progress_bar, trainer.global_step)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        """Lightning's bar values and the summary loss of the last log step, read on the host
        there (`loss_history`): the bar reads nothing from the device."""
        metrics = super().get_metrics(trainer, pl_module)
        if history := getattr(pl_module, "loss_history", None):
            metrics["loss"] = f"{history[-1][1]:.3g}"
        return metrics

    def on_train_end(self, *_: object) -> None:
        self.train_progress_bar.close()


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of a run directory: 16 hex digits of the SHA-1 of its absolute path.
    A resumed or requeued launch of the same directory continues the same wandb run; another
    directory (another sweep point) never does."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def own_wandb_service(mode: str) -> str:
    """The wandb mode for logger.mode (`auto`: online when WANDB_API_KEY is set, else
    offline), for a wandb run of this process's own wandb-core. wandb passes its service's
    address to child processes in WANDB_SERVICE; a run launched by another process that used
    wandb (a test runner, a notebook, a driver script) would log into that process's
    wandb-core: relative paths resolved against its working directory, files closed only when
    it closes them, and wandb.init failing once it has exited. So the address is dropped and
    this process starts its own (ended by `wandb.teardown`, see finish_loggers)."""
    os.environ.pop("WANDB_SERVICE", None)
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


def build_loggers(config: "TrainConfig", run_dir: Path) -> list[Logger]:
    """CSV always (a new version folder per launch, nothing overwritten); wandb when
    logger.wandb, offline unless an API key is configured: one wandb run per run directory
    (`wandb_run_id`), grouped by logger.group (default: the experiment), job_type the
    objective, tagged with model, objective and input format. `config`: the typed
    TrainConfig."""
    loggers: list[Logger] = [CSVLogger(save_dir=str(run_dir), name="csv")]
    options = config.logger
    if options.wandb:
        offline = own_wandb_service(options.mode) == "offline"
        loggers.append(
            WandbLogger(
                project=options.project,
                group=options.group or config.experiment_name,
                name=config.run_name,
                id=wandb_run_id(run_dir),
                save_dir=str(Path(run_dir).resolve()),
                offline=offline,
                resume="allow",
                job_type=config.objective.name,
                tags=[config.model.name, config.objective.name, config.data.format],
            )
        )
    return loggers


def finish_loggers(trainer: L.Trainer, finished: bool) -> None:
    """End this launch's wandb run (rank 0), so the next run in this process (the next point
    of a sweep under Hydra's basic launcher) starts its own instead of reusing it. When the
    run `finished` (not failed or preempted), its summary gets the last value of every logged
    metric and `trainer/global_step` first.

    `run.finish` returns once wandb-core has the exit record, but wandb-core (a process of
    its own) writes and closes the run's `.wandb` file only later; `wandb.teardown` waits
    until it has closed every run's files and exited, so a run's files are complete when
    its launch returns, before the next sweep point starts."""
    for logger in trainer.loggers:
        if not isinstance(logger, WandbLogger) or not wandb_run_started(logger):
            continue
        import wandb

        run = logger.experiment
        if finished and trainer.is_global_zero:
            final = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
            run.summary.update({"trainer/global_step": trainer.global_step, **final})
        run.finish(exit_code=0 if finished else 1)
        forget_wandb_run(logger)
        try:
            wandb.teardown()
        except SystemExit as error:  # wandb-core's own failure: the run itself is done
            print(f"warning: wandb-core exited with status {error.code}", flush=True)


def check_accelerator(accelerator: str) -> None:
    """RunEnvironmentError (one line, exit status 2) when `trainer.accelerator` names a
    device this machine does not have (`gpu`/`cuda` without CUDA, `mps` without MPS)."""
    import torch

    wanted = str(accelerator).lower()
    available = {
        "gpu": torch.cuda.is_available() or torch.backends.mps.is_available(),
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
    }
    if not available.get(wanted, True):
        raise RunEnvironmentError(
            f"trainer.accelerator={accelerator}: this machine has no such device "
            f"(torch {torch.__version__} sees none); use trainer.accelerator=cpu (or auto), "
            "or run on a machine with one"
        )


class ParameterSummary(ModelSummary):
    """Lightning's table of submodules and parameter counts without its FLOP column and total:
    those count FLOPs of an `example_input_array` forward, which no objective has (the table
    read "Total FLOPs: 0"); a run's model FLOPs are logged as `train/model_tflops` instead
    (`models/flops.py`)."""

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, modes, **_):
        from lightning.pytorch.callbacks.model_summary import log

        columns = [column for column in summary_data if column[0] != "FLOPs"]
        table = summary_table(total_parameters, trainable_parameters, model_size, modes, columns)
        log.info("\n" + table.rsplit("\n", 1)[0])  # its last line is the FLOP total


def format_duration(seconds: float) -> str:
    """`seconds` as "1h02m", "4m20s" or "12s"."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class StepLines(L.Callback):
    """With the progress bar off (logs, sweeps, SLURM): one line on rank 0 at log steps
    (`trainer.log_every_n_steps`, where the loss is read back anyway) once `every_s` seconds
    passed or another tenth of max_steps was crossed, and at the last step: the step of max,
    the training loss, steps/s over this launch and the ETA."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self._start_step = self._seen_step = self._last_tenth = 0
        self._start = self._last_line = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._last_line = time.monotonic()
        self._start_step = self._seen_step = trainer.global_step
        self._last_tenth = trainer.global_step * 10 // max(trainer.max_steps, 1)

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        step, total = trainer.global_step, max(trainer.max_steps, 1)
        stepped, self._seen_step = step != self._seen_step, step
        log_step = is_log_step(step, trainer.log_every_n_steps, total)
        if not (trainer.is_global_zero and stepped and log_step):
            return
        now, tenth = time.monotonic(), step * 10 // total
        if now - self._last_line < self.every_s and tenth == self._last_tenth and step < total:
            return
        self._last_line, self._last_tenth = now, tenth
        loss = trainer.callback_metrics.get("loss")
        print(step_line(step, total, loss, self._rate(step, now)), flush=True)

    def _rate(self, step: int, now: float) -> float:
        return (step - self._start_step) / max(now - self._start, 1e-9)


def step_line(step: int, total: int, loss: object, steps_per_s: float) -> str:
    """ "step 120/1000 (12%), loss 6.2130, 3.40 steps/s, ETA 4m19s"."""
    loss_text = "" if loss is None else f", loss {float(loss):.4f}"
    eta = format_duration((total - step) / steps_per_s) if steps_per_s > 0 else "?"
    return (
        f"step {step}/{total} ({step / total:.0%}){loss_text}, {steps_per_s:.2f} steps/s, ETA {eta}"
    )


def build_trainer(
    config: "TrainConfig", run_dir: str | Path, callbacks: list | tuple = ()
) -> L.Trainer:
    """A Trainer for `config` (the typed TrainConfig, with its batch plan) writing logs and
    checkpoints under `run_dir`, with `callbacks` besides its own (held-out evaluation)."""
    t, run_dir = config.trainer, Path(run_dir)
    check_accelerator(t.accelerator)
    checkpoints = StepCheckpoint(
        dirpath=str(checkpoint_dir(run_dir)),
        filename="step-{step:07d}",
        auto_insert_metric_name=False,
        monitor="step",
        mode="max",
        save_top_k=t.keep_checkpoints,
        save_last=True,
        every_n_train_steps=t.checkpoint_every_n_steps,
        enable_version_counter=False,
    )
    loggers = build_loggers(config, run_dir)
    return L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=build_strategy(config),
        precision=t.precision,
        max_steps=t.max_steps,
        max_epochs=-1,
        accumulate_grad_batches=config.batch_plan.accumulate_grad_batches,
        gradient_clip_val=t.gradient_clip_val,
        log_every_n_steps=t.log_every_n_steps,
        enable_progress_bar=t.enable_progress_bar,
        callbacks=[*callbacks, ProgressLog(), checkpoints, *preemption_callbacks(t)]
        + [
            ParameterSummary(),
            StepProgressBar(refresh_rate=5) if t.enable_progress_bar else StepLines(),
        ],
        logger=loggers,
        plugins=[checkpoint_io(config), *slurm_plugins()],
        reload_dataloaders_every_n_epochs=1,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=str(run_dir),
    )


def checkpoint_io(config: "TrainConfig") -> AtomicCheckpointIO:
    """How the run writes checkpoint files: atomically, on a writer thread with
    `trainer.async_checkpoint` (`pretrain.checkpoint.background`). DeepSpeed writes its
    shards itself, so the option is refused there (one line)."""
    if not config.trainer.async_checkpoint:
        return AtomicCheckpointIO()
    if config.strategy.name == "deepspeed":
        raise ConfigError(
            "trainer.async_checkpoint=true: not with strategy.name=deepspeed (DeepSpeed's "
            "engine writes its shards itself, synchronously); set trainer.async_checkpoint=false"
        )
    return BackgroundCheckpointIO()
