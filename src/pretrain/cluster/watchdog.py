"""A watchdog for hangs: a rank that makes no progress for `trainer.hang_timeout_s` ends the
run with the requeue status, leaving a record of where it stood.

Some hangs no collective timeout catches: a data-loader worker stuck (the main process waits
on its queue for good), a read from a dead NFS mount, a collective of a backend that ignores
its timeout. `HangWatchdog` runs a daemon thread per rank, fed by a counter the training loop
bumps after every micro-batch (training or held-out: an int assignment, no sync). When the
counter has not moved for `hang_timeout_s` seconds, the rank

1. prints one line to stderr: which rank stalled, after which step, for how many seconds,
   and where its main thread stands (file:line in function);
2. writes every thread's stack (`faulthandler`) to its rank log (Hydra's job log: rank 0's
   `<hydra.job.name>.log`, local rank k's `train_ddp_process_<k>.log`; stderr without one)
   and records the stall in `<run_dir>/stalled/rank<r>`;
3. under SLURM, global rank 0 requeues the job (`scontrol requeue`, as a preemption does);
   every rank waits (bounded) until every rank has recorded that it stops, kills its
   data-loader workers and, on a launcher (local rank 0), waits for the local ranks it
   started; global rank 0 then prints one line of where each rank stood;
4. exits with `PREEMPTED_EXIT_STATUS` (75, not finished): the requeued job, or the same
   command run again, continues from the last checkpoint (`resume=auto`).

The other ranks' watchdogs see the record within a poll and stop the same way (their stacks
in their logs too, no line on stderr), so every rank exits 75 whichever one stalled, before a
collective with the stopped rank fails them with status 4 (`stop_if_stalled` covers a
collective that fails first). The records are cleared by rank 0 at a launch's start.

Start-up: the clock starts when the training loop starts (after the rendezvous, checkpoint
restore and set-up), and until the launch's first micro-batch ends the allowance is
`hang_timeout_s + startup_timeout_s` (the first batch starts the workers, and the first
collective may wait `startup_timeout_s` for a rank that starts late). 0 or null disables it.
"""

import faulthandler
import logging
import multiprocessing
import os
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from pretrain.cluster.preemption import PREEMPTED_EXIT_STATUS, requeue_slurm_job, slurm_job_id
from pretrain.errors import write_line

STALL_DIR = "stalled"  # under the run directory: one record per rank that stops
log = logging.getLogger(__name__)
_ENDING = threading.Lock()  # held by whichever thread ends this process


class HangWatchdog(Callback):
    """Ends the run with status 75 when this rank makes no progress for `timeout_s` seconds
    (`timeout_s + startup_s` before the launch's first micro-batch ends), or when another
    rank's watchdog did (the module doc). `run_dir`: where the ranks' stall records go."""

    def __init__(self, timeout_s: float, startup_s: float, run_dir: str | Path):
        self.timeout_s, self.startup_s = float(timeout_s), float(startup_s)
        self.records = Path(run_dir) / STALL_DIR
        self.poll_s = min(max(self.timeout_s / 20, 0.25), 10.0)  # a shared dir: not too often
        self.grace_s = 4 * self.poll_s + 10  # how long a stopping rank waits for the others
        self.beats = 0  # micro-batches ended so far in this launch
        self.step = 0  # optimizer steps completed (the last one seen)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trainer: L.Trainer | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer, self.step, self.beats = trainer, trainer.global_step, 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)
        self._thread.start()
        _ACTIVE[0] = self

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        self.step = trainer.global_step
        self.beats += 1

    def on_validation_batch_end(self, *_: object) -> None:
        self.beats += 1

    def on_train_end(self, *_: object) -> None:
        self._stop.set()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop.set()

    def _watch(self) -> None:
        seen, since, allowance = self.beats, time.monotonic(), self.timeout_s + self.startup_s
        while not self._stop.wait(self.poll_s):
            other = self.stall_records()
            if other:
                self.stop(
                    f"watchdog: rank {self._trainer.global_rank} stops with the run ({other[0]})"
                )
            if self.beats != seen:
                seen, since, allowance = self.beats, time.monotonic(), self.timeout_s
            elif time.monotonic() - since > allowance:
                self.stop(self._stall_line(time.monotonic() - since), stalled=True)

    def _stall_line(self, waited_s: float) -> str:
        return (
            f"watchdog: rank {self._trainer.global_rank} made no progress for {waited_s:.0f} s "
            f"after step {self.step} (trainer.hang_timeout_s={self.timeout_s:g}), in "
            f"{main_thread_place()}; every thread's stack is in {rank_log() or 'stderr'}; "
            f"exiting with status {PREEMPTED_EXIT_STATUS} (not finished: a requeued job or the "
            "same command resumes from the last checkpoint)"
        )

    def stall_records(self, others: bool = True) -> list[str]:
        """What the ranks (`others`: but this one) recorded as they stalled or stopped, by
        rank: "stalled|stopped: rank R after step S, in PLACE"; none: []."""
        mine = f"rank{self._trainer.global_rank}"
        try:
            names = [n for n in ranks_of(os.listdir(self.records)) if n != mine or not others]
            names.sort(key=lambda name: int(name[4:]))
            return [(self.records / name).read_text().strip() for name in names]
        except OSError:
            return []

    def record(self, where: str) -> bool:
        """Record that this rank stops (`where`: its state and place) for the other ranks;
        False when the run directory cannot be written (the others' watchdogs then stop
        their ranks by their own clock)."""
        path = self.records / f"rank{self._trainer.global_rank}"
        try:
            self.records.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".partial").write_text(where + "\n")
            os.replace(path.with_suffix(".partial"), path)  # read whole or not at all
        except OSError as error:
            write_line(f"watchdog: {path}: not written ({error})")
            return False
        return True

    def stop(self, line: str, stalled: bool = False) -> None:
        """End this process with status 75 (the steps of the module doc); a second caller
        waits for the first to end it."""
        if not _ENDING.acquire(blocking=False):
            while True:
                time.sleep(3600)  # another thread is ending the process
        trainer = self._trainer
        state = "stalled" if stalled else "stopped"
        where = (
            f"{state}: rank {trainer.global_rank} after step {self.step}, in {main_thread_place()}"
        )
        if stalled:
            write_line(line)
        dump_stacks(line)
        local_ranks = take_local_ranks(trainer)  # before the record: Lightning kills on exit
        recorded = self.record(where)
        if trainer.is_global_zero and (job := slurm_job_id()):  # before srun ends the tasks
            write_line(f"watchdog: requeueing SLURM job {job}")
            requeue_slurm_job(job)
        deadline = time.monotonic() + self.grace_s
        while recorded and len(self.stall_records(others=False)) < trainer.world_size:
            if time.monotonic() > deadline:
                break
            time.sleep(self.poll_s)
        kill_data_workers()
        for rank in local_ranks:
            try:
                status = rank.wait(timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                rank.kill()
                status = rank.wait()
            log.error(f"watchdog: local rank (pid {rank.pid}) exited with status {status}")
        if trainer.is_global_zero:  # the stuck rank may be one waiting for no collective
            stood = "; ".join(self.stall_records(others=False))
            write_line(f"watchdog: where the ranks stood: {stood}")
        flush_logs()
        os._exit(PREEMPTED_EXIT_STATUS)


_ACTIVE: list[HangWatchdog | None] = [None]  # this process's watchdog, once training started


def stop_if_stalled() -> None:
    """In the main thread, after training raised: when this process's watchdog is ending it,
    or another rank's watchdog recorded a stall (a collective with that rank failed first),
    end it with status 75 as the watchdog does; otherwise return."""
    watchdog = _ACTIVE[0]
    if _ENDING.locked():
        while True:
            time.sleep(3600)  # the watchdog thread ends the process
    if watchdog is not None and watchdog._trainer is not None:
        other = watchdog.stall_records()
        if other:
            rank = watchdog._trainer.global_rank
            watchdog.stop(f"watchdog: rank {rank} stops with the run ({other[0]})")


def ranks_of(names: list[str]) -> list[str]:
    """The complete records among a stall directory's file names."""
    return [name for name in names if name.startswith("rank") and "." not in name]


def main_thread_place() -> str:
    """Where the main thread stands: `file:line in function` of its innermost Python frame
    outside the standard library (a queue's or socket's wait says little; its caller does)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "an unknown place"
    stdlib = sysconfig.get_paths()["stdlib"]
    while frame.f_back is not None and frame.f_code.co_filename.startswith(stdlib):
        frame = frame.f_back
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"


def rank_log() -> str | None:
    """The path of this rank's log file (the root logger's file handler), or None."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    return None


def dump_stacks(line: str) -> None:
    """`line`, then every thread's stack, into this rank's log (stderr without one)."""
    handler = next(
        (h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)), None
    )
    stream = handler.stream if handler is not None and handler.stream else sys.stderr
    try:
        stream.write(f"{line}\nevery thread's stack:\n")
        stream.flush()
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
    except (OSError, ValueError):  # a log on a dead mount: the stderr line has said it
        pass


def take_local_ranks(trainer: L.Trainer) -> list:
    """The local ranks this process's launcher started, taken off Lightning's list (whose
    watcher would kill this process when one exits with a non-zero status); [] elsewhere."""
    procs = getattr(getattr(trainer.strategy, "launcher", None), "procs", None)
    if not procs:
        return []
    ranks = list(procs)
    procs.clear()  # the same list Lightning's watcher reads
    return ranks


def kill_data_workers() -> None:
    """SIGKILL this process's multiprocessing children (its data-loader workers; a hung one
    never ends by itself), and wait for them to be gone."""
    workers = multiprocessing.active_children()
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.join(timeout=5)


def flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except (OSError, ValueError):
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def clear_stall_records(run_dir: str | Path) -> None:
    """Remove a previous launch's stall records (rank 0, before the ranks start training)."""
    records = Path(run_dir) / STALL_DIR
    if records.is_dir():
        for path in records.iterdir():
            path.unlink(missing_ok=True)


def watchdog_callbacks(trainer: object, run_dir: str | Path) -> list[Callback]:
    """The watchdog of a run's typed `trainer` section (`hang_timeout_s`: 0 or null, none)."""
    if not trainer.hang_timeout_s:
        return []
    return [HangWatchdog(trainer.hang_timeout_s, trainer.startup_timeout_s, run_dir)]
