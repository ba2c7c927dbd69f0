"""multiprocessing's resource tracker, when it dies under a run: one warning line.

The tracker is a helper process that records the named semaphores and shared-memory
segments this process creates (a DataLoader's queues hold semaphores) and removes any left
at exit. Killed (`kill -9`, the OOM killer), it is started again by the next record, and the
new one, told to forget names only the old one had heard of, printed a `KeyError: '/mp-…'`
traceback for each of them until the run ended. `guard_resource_tracker` wraps the module's
`register` and `unregister`: a tracker found dead is reported in one line and started again
quietly, and a name registered with a tracker that has died since is not sent to the new
one (the semaphore itself is unlinked as always; only the tracker's bookkeeping is skipped).

Imports only the standard library.
"""

import threading
import warnings
from multiprocessing import resource_tracker

from pretrain.errors import write_line

_lock = threading.Lock()
_registered: dict[tuple[str, str], int | None] = {}  # (name, kind) -> tracker pid at the time
_installed = False


def _tracker() -> object:
    return getattr(resource_tracker, "_resource_tracker", None)


def _running_tracker_pid() -> int | None:
    """The pid of a live tracker, started again (one warning line) when it died."""
    tracker = _tracker()
    fd, pid = getattr(tracker, "_fd", None), getattr(tracker, "_pid", None)
    alive = getattr(tracker, "_check_alive", None)
    if fd is not None and alive is not None and not alive():
        write_line(
            f"warning: multiprocessing's resource tracker (pid {pid}) died; a new one is "
            "started (named semaphores of the old one are still removed as they are freed)"
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="resource_tracker: process died")
        resource_tracker.ensure_running()
    return getattr(tracker, "_pid", None)


def _register(name: str, rtype: str) -> None:
    pid = _running_tracker_pid()
    with _lock:
        _registered[(name, rtype)] = pid
    _original_register(name, rtype)


def _unregister(name: str, rtype: str) -> None:
    pid = _running_tracker_pid()
    with _lock:
        registered_with = _registered.pop((name, rtype), pid)
    if registered_with != pid:
        return  # the tracker that knew the name is gone: the new one never heard of it
    _original_unregister(name, rtype)


_original_register = resource_tracker.register
_original_unregister = resource_tracker.unregister


def guard_resource_tracker() -> None:
    """Install the wrappers (once per process; nothing where this Python's tracker lacks the
    attributes they rely on)."""
    global _installed
    if _installed or not hasattr(_tracker(), "_check_alive"):
        return
    resource_tracker.register, resource_tracker.unregister = _register, _unregister
    _installed = True
