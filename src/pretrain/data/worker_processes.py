"""Where data-loader workers start: from a process that has not grown.

The loader is rebuilt every epoch (each epoch has its own stream), and its workers with it.
Forked from the main process, a later epoch's workers would start as copies of whatever the
main process has grown to by then (the heap of every step so far) and their memory would
grow with the run. So every loader's workers, the first epoch's included, are forked by
multiprocessing's forkserver: a small process started once per launch, at the data module's set-up
(a fresh interpreter that has imported only torch, the stream and the run's corruption
module, a few seconds of CPU, and never trains), so every epoch's workers start alike and
the run's memory is the same from its first step as at its last (had the first epoch's
workers been forked from the main process, the run's memory would step up once, at the
second epoch, when the forkserver and its workers start: XLNet's demo by 60% at step 550). The
stream they serve (`EpochStream`: the spec, the epoch, the resume position and the
partitions' positions) is pickled to them, so the resume and elastic-order guarantees are
those of any start method.

Signals: the forkserver is started with the job's preemption signals blocked
(`job_signals.PREEMPTION_SIGNALS`), so neither it nor a worker it forks can be ended by a
signal sent to the whole job, even before the worker's `ignore_in_data_worker` runs; the
main process keeps them (a signal that came meanwhile is delivered when they are unblocked).
Imports only the standard library.
"""

import multiprocessing
import os
import signal
import sys
from multiprocessing.context import BaseContext

from pretrain.cluster.signals import PREEMPTION_SIGNALS

START_METHOD = "forkserver"
# What the forkserver imports once, so a worker does not import it again each epoch
# ("__main__": the entry point, which multiprocessing imports in every new process).
PRELOAD = ("__main__", "torch", "numpy", "pretrain.cluster.signals", "pretrain.data.stream")


def worker_context(num_workers: int, corruption: object = None) -> BaseContext | None:
    """The multiprocessing context of a DataLoader's `num_workers` workers: the forkserver's,
    started now if it is not running (preloading `PRELOAD` and the module of `corruption`,
    the run's picklable corruption). None without workers (the DataLoader's own default).
    Where the entry point is no file a new process can import (a script read from stdin),
    "fork": workers are copies of the main process."""
    if num_workers == 0:
        return None
    if not main_importable():
        return multiprocessing.get_context("fork")  # workers forked from the main process
    context = multiprocessing.get_context(START_METHOD)
    preload = list(PRELOAD)
    if corruption is not None and type(corruption).__module__ not in preload:
        preload.append(type(corruption).__module__)
    context.set_forkserver_preload(preload)  # read only when the server starts
    start_forkserver()
    return context


def main_importable() -> bool:
    """Whether a process started by the forkserver can import the entry point (`__main__`):
    it has no file (python -c, an interactive session) or an existing one."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return path is None or os.path.isfile(path)


def start_forkserver() -> None:
    """Start multiprocessing's forkserver (once per process), and its resource tracker, with
    the preemption signals blocked, so they and the workers forked from the server inherit
    them blocked (a job's USR1 would end the tracker, and the next tracker would then be
    told to forget names it never saw); unblocked again here afterwards (a signal that came
    meanwhile is delivered then). Starting the tracker unblocks SIGTERM (it blocks SIGINT
    and SIGTERM around its own start, then unblocks them), so they are blocked again before
    the forkserver starts."""
    from multiprocessing import forkserver, resource_tracker

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)  # this thread's
    try:
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
