"""multiprocessing's resource tracker, when it dies under a run: one warning line.

The tracker is a helper process that records the named semaphores and shared-memory
segments this process creates (a DataLoader's queues hold semaphores) and removes any left
at exit. Killed (`kill -9`, the OOM killer), it is started again by the next record, and the
new one, told to forget names only the old one had heard of, prints a `KeyError: '/mp-…'`
traceback for each of them until the run ends. `start_resource_tracker` starts it with the
module's `register` and `unregister` wrapped: a tracker found dead (by the wrappers, or by the
standard library while it sends a message) is reported in one line and started again
quietly, and a name registered with a tracker that has died since is not sent to the new one
(the semaphore itself is unlinked as always; only the tracker's bookkeeping is skipped).

Imports only the standard library.
"""

import threading
import warnings
from multiprocessing import resource_tracker

from pretrain.errors import write_line

_lock = threading.Lock()
_registered: dict[tuple[str, str], int | None] = {}  # (name, kind) -> tracker pid at the time
_known_pid: int | None = None  # the tracker this process last talked to
_installed = False


def _tracker() -> object:
    return getattr(resource_tracker, "_resource_tracker", None)


def _quietly(call, *args, again: bool = False) -> int | None:
    """`call(*args)` with the standard library's own relaunch warning silenced; when the
    tracker died between the probe and the message (a broken pipe), it is started again and,
    `again`, the call repeated. Returns the pid of the tracker running afterwards; one other
    than the one last seen means the old one died: one line."""
    global _known_pid
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="resource_tracker: process died")
        try:
            call(*args)
        except BrokenPipeError:
            resource_tracker.ensure_running()
            if again:
                call(*args)
    pid = getattr(_tracker(), "_pid", None)
    with _lock:
        died = None not in (pid, _known_pid) and pid != _known_pid
        _known_pid = pid if pid is not None else _known_pid
    if died:
        write_line(
            "warning: multiprocessing's resource tracker died; a new one is started "
            f"(pid {pid}; named semaphores of the old one are still removed as they are freed)"
        )
    return pid


def _register(name: str, rtype: str) -> None:
    pid = _quietly(_original_register, name, rtype, again=True)  # the tracker it went to
    with _lock:
        _registered[(name, rtype)] = pid


def _unregister(name: str, rtype: str) -> None:
    pid = _quietly(resource_tracker.ensure_running)
    with _lock:
        registered_with = _registered.pop((name, rtype), pid)
    if registered_with != pid:
        return  # the tracker that knew the name is gone: the new one never heard of it
    _quietly(_original_unregister, name, rtype)  # a broken pipe: it went with the tracker


_original_register = resource_tracker.register
_original_unregister = resource_tracker.unregister


def start_resource_tracker() -> None:
    """Start the tracker (when not running) with the wrappers installed (once per process;
    not where this Python's tracker lacks the attributes they rely on), so that its pid is
    known from the start and any later death is reported."""
    global _installed
    if not _installed and hasattr(_tracker(), "_check_alive"):
        resource_tracker.register, resource_tracker.unregister = _register, _unregister
        _installed = True
    _quietly(resource_tracker.ensure_running)
