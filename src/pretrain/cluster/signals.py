"""The signals SLURM sends a job, where the training loop does not handle them itself.

SLURM delivers preemption as SIGTERM or a warning signal (`--signal=USR1@90`, submitit's
USR2), often to every process of the job: `scancel --full`, a time limit and
`--signal=USR1@...` without `B:` reach the data-loader workers too, and a signal can come
before the training loop is ready to save. `pretrain.cluster.preemption.PreemptionCheckpoint`
decides what happens (a checkpoint at the next step boundary, exit status 75); this module
keeps the signals from killing processes before it can:

- `hold_preemption_signals`: from the first line of the entry point until the preemption
  callback installs its handlers, the signals are recorded, not fatal (Python's default for
  USR1/USR2/TERM ends the process). The callback takes the recorded one (`take_held`) and
  saves at the first step boundary. A signal that reached `slurm/train.sbatch` before it
  started Python comes as the name in `PRETRAIN_HELD_SIGNAL` (HELD_SIGNAL_ENV) and is held
  the same way.
- `ignore_in_data_worker` (a DataLoader `worker_init_fn`): data-loader workers ignore them
  (SIGTERM only from other senders than their own main process); the main process stops
  the workers when it stops.

Imports only the standard library, so the entry point installs it before torch loads.
"""

import os
import signal
import threading
from types import FrameType

from pretrain.errors import ConfigError

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
HELD_SIGNAL_ENV = "PRETRAIN_HELD_SIGNAL"
_held: list[signal.Signals] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _held.append(signal.Signals(signum))


def hold_preemption_signals() -> None:
    """Record SIGTERM, SIGUSR1 and SIGUSR2 instead of dying of them, until a handler of the
    training loop replaces this one. Only the main thread can set handlers: elsewhere this
    does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, _record)
    handed_over = os.environ.pop(HELD_SIGNAL_ENV, "")
    if handed_over:
        _held.append(parse_signal(handed_over, HELD_SIGNAL_ENV))


def parse_signal(name: str, key: str = "trainer.preemption_signal") -> signal.Signals:
    """The signal named `name` ("USR1", "SIGUSR1" or a number as text); ConfigError naming
    `key` otherwise."""
    text = str(name).strip().upper()
    try:
        if text.isdigit():
            return signal.Signals(int(text))
        return signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        raise ConfigError(
            f"{key} = {name!r}: not a signal name; use e.g. USR1, USR2 or TERM "
            "(the one sbatch --signal or the launcher sends)"
        ) from None


def is_holding(handler: object) -> bool:
    """Whether `handler` is the recording handler of `hold_preemption_signals`."""
    return handler is _record


def take_held() -> list[signal.Signals]:
    """The signals recorded since `hold_preemption_signals`, oldest first; forgets them."""
    held = list(_held)
    _held.clear()
    return held


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """A handler that does nothing (unlike SIG_IGN, the signal stays pending while blocked)."""


def _end_on_sigterm_from(parent: int) -> None:
    """The worker's SIGTERM thread: the parent's own `terminate()` (a DataLoader shutting its
    workers down, multiprocessing's exit) ends the worker; any other sender's is ignored."""
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(128 + signal.SIGTERM)


def ignore_in_data_worker(_worker_id: int) -> None:
    """DataLoader `worker_init_fn`: the worker ignores SIGTERM, SIGUSR1 and SIGUSR2 sent to
    the whole job, so the main process can finish the step and save; the main process ends
    the workers. SIGTERM from the main process itself still ends the worker (else a worker
    left at exit would keep the process waiting for it): SIGTERM is blocked and a thread
    reads who sent each one. The main process is the one that started the worker, also
    when a forkserver forked it (`pretrain.data.worker_processes`)."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, _ignore)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later too
    threading.Thread(
        target=_end_on_sigterm_from,
        args=(parent.pid if parent is not None else os.getppid(),),
        name="sigterm",
        daemon=True,
    ).start()
