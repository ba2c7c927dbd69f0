"""The local ranks Lightning starts end with the process that started them.

A multi-rank run on one node without a cluster launcher (`trainer.devices=2`) is one process
the user started, rank 0, and the other local ranks, which Lightning's launcher starts as its
subprocesses (the same command line again). Were rank 0 killed by SIGKILL (the OOM killer, a
node agent), nothing would stop the others: they would wait in their next collective until
`trainer.collective_timeout_s`, holding memory and cores. So:

- `follow_launcher`, first thing in the entry point, records this process's pid in
  `LAUNCHER_PID` (its subprocesses inherit it); in a process whose parent is the pid found
  there (a local rank), it asks the kernel for SIGKILL when the parent dies
  (`PR_SET_PDEATHSIG`, Linux) and starts a thread that ends the process when its parent
  changes (elsewhere than Linux, and in case the kernel's signal is cleared or missed). A
  rank's own data-loader workers, forkserver and resource tracker follow it
  (`pretrain.data.worker_processes`).
- `wait_for_local_ranks`: rank 0 of a run that ended together (finished, or preempted with a
  complete checkpoint) waits for the ranks it started before it exits, so its exit does not
  kill them while they finish theirs.

The kernel's signal comes when the thread that started the process ends: Lightning starts
the ranks from the thread that calls `Trainer.fit`, which outlives them (the main thread).

Imports only the standard library.
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

LAUNCHER_PID = "PRETRAIN_LAUNCHER_PID"  # the pid of the `pretrain` process that started this one
LAUNCHER_GONE_EXIT_STATUS = 128 + signal.SIGKILL  # a local rank whose launcher died
_PR_SET_PDEATHSIG = 1  # prctl option, <linux/prctl.h>
_POLL_S = 0.5  # how often the watching thread looks at the parent (seconds)


def follow_launcher() -> None:
    """In a process started by another `pretrain` process: end when that process dies, by any
    signal (see the module doc); it is already gone: end now. Then record this process as the
    launcher of whatever it starts."""
    launcher = os.environ.get(LAUNCHER_PID, "")
    os.environ[LAUNCHER_PID] = str(os.getpid())
    if not launcher.isdigit() or int(launcher) == os.getpid():
        return
    pid = int(launcher)
    if os.getppid() != pid:  # started through another process, or the launcher is gone
        if not is_alive(pid):
            os._exit(LAUNCHER_GONE_EXIT_STATUS)
        return
    kill_on_parent_death()
    if os.getppid() != pid:  # it died before the kernel was asked
        os._exit(LAUNCHER_GONE_EXIT_STATUS)
    threading.Thread(target=_watch_parent, args=(pid,), name="launcher-alive", daemon=True).start()


def kill_on_parent_death() -> bool:
    """Ask the kernel to send this process SIGKILL when its parent dies; False where it
    cannot (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(pid: int) -> None:
    while os.getppid() == pid:
        time.sleep(_POLL_S)
    os._exit(LAUNCHER_GONE_EXIT_STATUS)


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process of that pid
    return True


def wait_for_local_ranks(trainer: object, timeout_s: float) -> None:
    """In rank 0: wait (at most `timeout_s` seconds in all) for the local ranks Lightning's
    launcher started to exit. They are taken off the launcher's list first, so Lightning's
    watcher of them (which kills rank 0 when one exits with a non-zero status, as a
    preempted rank does) leaves them alone. Nothing in other ranks or without a launcher."""
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    procs = getattr(launcher, "procs", None)
    if not procs:
        return
    ranks = list(procs)
    procs.clear()  # the same list Lightning's watcher reads
    deadline = time.monotonic() + timeout_s
    for rank in ranks:
        try:
            rank.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:  # still running: it dies with this process
            return
