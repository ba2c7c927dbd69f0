"""Preemption done safely: a signal asks for a checkpoint, every rank saves it together at the
next optimizer-step boundary, then the job stops (and, under SLURM, is requeued).

Saving from inside a signal handler is unsafe: ranks stand at different points of a step, and
a sharded (ZeRO) save is a collective that would hang or mix two steps. So the handler only
sets a flag. The flags of all ranks are summed in the step's one all-reduce
(`runtime.epoch_end`: with the epoch-end agreement, on the host's CPU group, launched at a
step's start and read at the next step's start, so it never blocks the host in steady state;
`step_flags` gives this rank's, `agree` takes the sums); when any rank was signalled, all of
them save one complete checkpoint at the end of the step whose start read it, through the
run's checkpoint callback to `<run_dir>/checkpoints/last.ckpt` (model, optimizer, schedule,
loop and data-stream position: a normal Lightning checkpoint, the one `resume=auto` continues
from), then the trainer stops. The bound: a signal that comes during optimizer step N is
saved at the end of step N+2 at the latest (every rank at the same step); at N's end in a
run of one process, which has nothing to agree on, and at the end of the launch's or an
epoch's first step when it came before it (that step agrees without a lag). Without the
step's agreement (a module other than `PretrainingTask`) the flag is summed by a blocking
all-reduce after each optimizer step and saved at N's end. Lightning's own per-batch
broadcast of its SIGTERM flag (a device tensor read back each micro-batch) is turned off
while these handlers hold the signals (`lightning_compat.skip_sigterm_broadcast`).

Signals:
- `trainer.preemption_signal` (default USR1: `#SBATCH --signal=USR1@90` of slurm/train.sbatch,
  or `scancel --signal=USR1 JOBID`), and under the submitit launcher also the signal submitit
  handles (USR2, `signal_delay_s` before the time limit): save, requeue the job, stop.
  Requeueing: under submitit, rank 0 hands over to submitit's own handler (it re-pickles the
  job, counts timeouts against `max_num_timeout`, runs `scontrol requeue` and exits);
  otherwise rank 0 runs `scontrol requeue $SLURM_JOB_ID` itself. Outside SLURM it only saves
  and stops.
- SIGTERM (scancel, time limit, SLURM's own preemption): save and stop, no requeue (a
  cancelled job must stay cancelled; SLURM requeues by itself where PreemptMode=REQUEUE).

A run stopped this way before `trainer.max_steps` is not finished: `train` raises `Preempted`
and the process exits with `PREEMPTED_EXIT_STATUS` (75, EX_TEMPFAIL of sysexits.h: a temporary
failure, try again), distinct from success (0), config/data errors (2), a non-finite loss (3)
and a stuck rank (4), so scripts and `make` do not take it for a finished run. Data-loader
workers ignore the signals (`pretrain.cluster.signals`), and a signal that comes during start-up,
before the handlers below exist, is held by the entry point and taken at `setup`.

Handlers are installed at `setup` (so a signal that comes while the checkpoint is restored is
kept for the first step) and again at `on_train_start` (Lightning registers its own in
between, which they replace while training runs); the previous ones are put back at teardown.
"""

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from pretrain.cluster.collectives import reduce_on_host
from pretrain.cluster.signals import PREEMPTION_SIGNALS, is_holding, parse_signal, take_held
from pretrain.errors import write_line
from pretrain.lightning_compat import (
    clear_lightning_sigterm,
    save_last_checkpoint,
    skip_sigterm_broadcast,
)

STOP_SIGNAL = signal.SIGTERM
SUBMITIT_SIGNALS = (signal.SIGUSR2, signal.SIGUSR1)  # submitit's timeout signal is USR2
# Exit status of a run stopped by a signal after saving a complete checkpoint: resumable, not
# finished. EX_TEMPFAIL (sysexits.h): outside 0-4 (the run's other statuses), 124-127 (timeout
# and shell errors) and 128+N (killed by signal N).
PREEMPTED_EXIT_STATUS = 75


class Preempted(Exception):
    """A signal stopped the run at a step boundary before `trainer.max_steps`, after every
    rank saved one complete checkpoint: resumable, not finished."""

    def __init__(
        self, step: int, max_steps: int, checkpoint: str, requeued: bool, report: bool = True
    ):
        self.step, self.max_steps, self.checkpoint = step, max_steps, checkpoint
        # Whether this process reports the stop: global rank 0 only, so a job of many ranks
        # says in one line what happened (only rank 0 knows whether the job was requeued).
        self.report = report
        then = (
            "the SLURM job was requeued and will resume"
            if requeued
            else "run the same command again to resume (resume=auto)"
        )
        super().__init__(
            f"preempted at step {step} of {max_steps}: saved {checkpoint}; not finished, "
            f"{then} (exit status {PREEMPTED_EXIT_STATUS})"
        )


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes for this job (`<array job>_<task>` in an array), or None
    outside SLURM."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def requeue_slurm_job(job_id: str) -> bool:
    """`scontrol requeue JOB_ID`; True when SLURM accepted it."""
    if not re.fullmatch(r"[0-9_]+", job_id):
        raise ValueError(f"SLURM job id {job_id!r}: expected digits (and _ for array tasks)")
    # SLURM signals every process of the job's steps as it requeues the job, scontrol included,
    # which can then die of SIGTERM before it reads SLURM's answer: it runs with SIGTERM ignored
    # (a disposition that survives exec), so its exit status is SLURM's answer.
    command = ["sh", "-c", 'trap "" TERM; exec scontrol requeue "$0"', job_id]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        write_line(f"preemption: scontrol requeue {job_id} failed: {error}")
        return False
    if result.returncode != 0:
        write_line(
            f"preemption: scontrol requeue {job_id} failed (exit status {result.returncode}): "
            f"{result.stderr.strip()}"
        )
    return result.returncode == 0


def _is_submitit_handler(handler: Any) -> bool:
    """Whether `handler` is submitit's requeueing handler (installed before the job runs)."""
    owner = getattr(handler, "__self__", None)
    return owner is not None and type(owner).__module__.startswith("submitit")


class PreemptionCheckpoint(Callback):
    """On `requeue_signal` or SIGTERM: all ranks save last.ckpt together at an optimizer-step
    boundary at most two steps later (the step's agreement: `step_flags`, `agree`) and stop; after `requeue_signal` the SLURM job is also requeued
    (see the module docstring). `requeue_signal` None: only SIGTERM is handled."""

    def __init__(
        self,
        requeue_signal: str | signal.Signals | None = "USR1",
        requeue: Callable[[str], bool] = requeue_slurm_job,
    ):
        self.requeue_signal = (
            parse_signal(requeue_signal)
            if isinstance(requeue_signal, str)
            else (signal.Signals(requeue_signal) if requeue_signal is not None else None)
        )
        self._requeue = requeue
        self._received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._last_checked_step = -1
        self._agreed: tuple[int, int] | None = None  # (signalled, requeue) summed: `agree`
        self.saved_step: int | None = None  # the step of the preemption checkpoint, once saved
        self.saved_path: str | None = None
        self.requeued = False

    @property
    def received(self) -> signal.Signals | None:
        """The preemption signal received so far (None before one came)."""
        return self._received

    @property
    def signals(self) -> tuple[signal.Signals, ...]:
        """The signals this callback handles."""
        if self.requeue_signal is None or self.requeue_signal == STOP_SIGNAL:
            return (STOP_SIGNAL,)
        return (self.requeue_signal, STOP_SIGNAL)

    def step_flags(self) -> list[int]:
        """This rank's part of the step's all-reduce: [signalled, asked for a requeue]."""
        return [int(self._received is not None), int(self._received not in (None, STOP_SIGNAL))]

    def agree(self, signalled: int, requeue: int) -> None:
        """The sums of `step_flags` over all ranks, read at a step's start
        (`runtime.epoch_end`): when a rank was signalled, every rank saves at this step's end.
        A signal once agreed stays agreed until saved."""
        if self._agreed is None or not self._agreed[0]:
            self._agreed = (signalled, requeue)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        # Only a flag: the checkpoint is written at the next step boundary, by every rank.
        if self._received is None or signum != STOP_SIGNAL:
            self._received = signal.Signals(signum)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return  # signals can only be caught in the main thread
        # Under submitit, its timeout signal (USR2) is a requeue signal too.
        submitit = [s for s in SUBMITIT_SIGNALS if _is_submitit_handler(signal.getsignal(s))]
        handled = dict.fromkeys([*self.signals, *submitit])
        for signum in handled:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)
        self._take_held_signals(handled)

    def _take_held_signals(self, handled: dict[signal.Signals, None]) -> None:
        """Signals held since the entry point started (`pretrain.cluster.signals`): a handled one
        counts as received now; the others get their default action back (and, when one
        came, it is delivered again: the process ends as it would have)."""
        unhandled = [s for s in PREEMPTION_SIGNALS if s not in handled]
        for signum in unhandled:
            if is_holding(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        for signum in take_held():
            if signum in handled:
                write_line(f"preemption: {signum.name} came during start-up", sys.stdout)
                self._handle(signum, None)
            else:
                signal.raise_signal(signum)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning registers its SIGTERM handler (which stops without saving) after setup:
        # ours takes the signals back for the training loop. A SIGTERM that came in between
        # (while the first epoch's workers start) ran Lightning's handler and ours (Lightning
        # calls the one it found): ours saves at the first step, and Lightning's flag, on
        # which its loop would exit with status 0 (a finished job to SLURM), is cleared.
        for signum in self._previous:
            signal.signal(signum, self._handle)
        if self._received is not None:
            clear_lightning_sigterm(trainer)
        if self._previous:  # ours hold SIGTERM: Lightning's flag stays unset while training
            skip_sigterm_broadcast(trainer)
        self._last_checked_step = trainer.global_step

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *_: object
    ) -> None:
        if trainer.global_step == self._last_checked_step:
            return  # inside gradient accumulation: not a step boundary
        self._last_checked_step = trainer.global_step
        if trainer.world_size > 1 and self._agreed is not None:  # the step's agreement
            signalled, requeue = self._agreed
        else:  # one process: its own flags; else one blocking host all-reduce
            signalled, requeue = reduce_on_host(self.step_flags(), dist.ReduceOp.SUM)
        if not signalled:
            return
        self.save_last(trainer)
        self.saved_step, self.saved_path = trainer.global_step, self._last_path(trainer)
        write_line(
            f"preemption: saved step {trainer.global_step} to {self._last_path(trainer)} "
            f"(rank {trainer.global_rank}); stopping",
            sys.stdout,
        )
        trainer.should_stop = True
        if requeue and trainer.is_global_zero:
            self.requeued = self._requeue_job()

    def _requeue_job(self) -> bool:
        for signum, previous in self._previous.items():
            if _is_submitit_handler(previous):
                previous(signum, None)  # re-pickles, counts timeouts, requeues, exits
                return True
        job_id = slurm_job_id()
        if job_id is None:
            write_line("preemption: not a SLURM job, nothing to requeue", sys.stdout)
        else:
            # Said before `scontrol requeue`: SLURM cancels the job's steps as it requeues, and a
            # line printed after it may never reach the log (a failure is printed after it).
            write_line(f"preemption: requeueing SLURM job {job_id}", sys.stdout)
            return self._requeue(job_id)
        return False

    def raise_if_preempted(self, trainer: L.Trainer) -> None:
        """Raise `Preempted` when this callback stopped the run before `trainer.max_steps`
        (a stop at the last step is a finished run)."""
        if self.saved_step is not None and self.saved_step < trainer.max_steps:
            raise Preempted(
                self.saved_step,
                trainer.max_steps,
                str(self.saved_path),
                self.requeued,
                report=trainer.is_global_zero,
            )

    @staticmethod
    def _checkpoint_callback(trainer: L.Trainer) -> ModelCheckpoint:
        callback = trainer.checkpoint_callback
        if not isinstance(callback, ModelCheckpoint) or not callback.save_last:
            raise RuntimeError(
                "PreemptionCheckpoint needs a ModelCheckpoint with save_last=True among the "
                "trainer's callbacks (its last.ckpt is what resume=auto continues from)"
            )
        return callback

    def _last_path(self, trainer: L.Trainer) -> str:
        callback = self._checkpoint_callback(trainer)
        return callback.last_model_path or str(callback.dirpath)

    def save_last(self, trainer: L.Trainer) -> None:
        """Save last.ckpt through the checkpoint callback, as its periodic saves do (every
        rank calls this: sharded strategies save collectively), and wait until it is on disk
        (`trainer.async_checkpoint` writes on a background thread): the run exits 75 only
        with its checkpoint complete."""
        callback = self._checkpoint_callback(trainer)
        save_last_checkpoint(trainer, callback)
        # checkpoint.background's writer (duck-typed: the checkpoint layer is above this one)
        getattr(trainer.strategy.checkpoint_io, "wait", lambda: None)()


def preemption_callbacks(trainer: Any) -> list[Callback]:
    """The preemption callback of a run's typed `trainer` section (`preemption_signal`: the
    requeue signal's name, or null for SIGTERM only)."""
    return [PreemptionCheckpoint(trainer.preemption_signal)]


def raise_if_preempted(trainer: L.Trainer) -> None:
    """After `fit`: raise `Preempted` when a signal stopped `trainer` before its max_steps."""
    for callback in trainer.callbacks:
        if isinstance(callback, PreemptionCheckpoint):
            callback.raise_if_preempted(trainer)


def slurm_plugins() -> list[Any]:
    """Under SLURM, Lightning's SLURM environment without its own auto-requeue handler (which
    saves from inside the signal handler); PreemptionCheckpoint does that job. Outside SLURM:
    none (Lightning picks the environment)."""
    if SLURMEnvironment.detect() and not TorchElasticEnvironment.detect():
        return [SLURMEnvironment(auto_requeue=False)]
    return []
