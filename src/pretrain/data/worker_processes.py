"""Where data-loader workers start: from a process that has not grown.

The loader is rebuilt every epoch (each epoch has its own stream), and its workers with it.
Forked from the main process, a later epoch's workers would start as copies of whatever the
main process has grown to by then (the heap of every step so far) and their memory would
grow with the run. So every loader's workers, the first epoch's included, are forked by
multiprocessing's forkserver: a small process started once per launch, at the data module's set-up
(a fresh interpreter that has imported only the entry point, torch, the stream and the
run's corruption module, a few seconds of CPU, and never trains; a worker imports nothing of
these again), so every epoch's workers start alike and
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
Lifetime: a worker ends as soon as the main process does, however it ended (SIGKILL from
the OOM killer or a node agent included): `init_data_worker` starts a thread that waits on
the main process's sentinel (a pipe multiprocessing gives every child, which reads EOF once
the process that started it is gone) and exits the worker then. The forkserver and the
resource tracker follow by themselves: every worker holds the forkserver's "alive" pipe and
the tracker's pipe open, and both end when the last holder has gone (without this, the
workers' own watchdog, which watches the forkserver, kept the three alive for good).

Imports only the standard library.
"""

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import wait
from multiprocessing.context import BaseContext

from pretrain.cluster.signals import PREEMPTION_SIGNALS, ignore_in_data_worker

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
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    main_name = getattr(main_spec, "name", None) or ""
    if main_name and not main_name.endswith("__main__"):  # `python -m package.module`
        preload.append(main_name)  # its imports once; each worker runs only its body again
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
    from multiprocessing import forkserver

    from pretrain.cluster.resource_tracking import start_resource_tracker

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)  # this thread's
    try:
        start_resource_tracker()  # its death: one warning line, not a traceback per name
        signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
        with forkserver_imports_main_script():
            forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextlib.contextmanager
def forkserver_imports_main_script() -> Iterator[None]:
    """While the forkserver starts, give it the entry script's path, so that "__main__" in
    its preload imports the script there once. The standard library (3.8 to 3.13) asks the
    preparation data for "main_path", a key it does not have ("init_main_from_path"), so
    the server never imported the script and every worker ran it again on its start (its
    imports: 3.7 s of CPU a worker, each epoch, for benchmarks/loaders.py), where a worker
    finding the script already imported (same path) runs nothing."""
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def with_main_path(name: str) -> dict:
        data = original(name)
        if "init_main_from_path" in data:
            data.setdefault("main_path", data["init_main_from_path"])
        return data

    spawn.get_preparation_data = with_main_path
    try:
        yield
    finally:
        spawn.get_preparation_data = original


MAIN_GONE_EXIT_STATUS = 128 + signal.SIGKILL  # a worker whose main process died


def init_data_worker(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: the job's signals ignored (`ignore_in_data_worker`: the
    main process decides), and the worker ends as soon as the main process has gone
    (`exit_with_main_process`). One torch thread per worker (torch's own default there, made
    explicit): the training process's threads keep the cores."""
    import torch

    torch.set_num_threads(1)
    ignore_in_data_worker(worker_id)
    exit_with_main_process()


def exit_with_main_process() -> None:
    """In a process started by multiprocessing (a data-loader worker): a daemon thread that
    waits on the starting process's sentinel and ends this process (exit status
    `MAIN_GONE_EXIT_STATUS`) once it reads EOF: the starter has died, by any signal. Does
    nothing in a process multiprocessing did not start."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch(sentinel: int) -> None:
        wait([sentinel])  # readable only at EOF: every write end closed with the process
        os._exit(MAIN_GONE_EXIT_STATUS)

    threading.Thread(target=watch, args=(parent.sentinel,), name="main-alive", daemon=True).start()
