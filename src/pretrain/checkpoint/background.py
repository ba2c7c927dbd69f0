"""Checkpoints written by a background thread (`trainer.async_checkpoint=true`): the training
loop is blocked only while the state is copied to host memory, not while it is written.

`BackgroundCheckpointIO` is `AtomicCheckpointIO` (written aside, fsynced, renamed into place)
whose writes run on one writer thread, in order. What the run does to its checkpoint
directory after a save (rotation's deletions, pointing `last.ckpt` at the new checkpoint)
goes into the same queue (`after_writes`), so it happens only once the write before it has
landed: a crash mid-write leaves `.partial` leftovers and the previous checkpoints, all
usable. `wait()` blocks until everything queued is done and raises a write's error;
the preemption save and the trainer's teardown call it, so a run that exits 75 or finishes
has its checkpoint on disk.
"""

import copy
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pretrain.checkpoint.atomic import AtomicCheckpointIO


def snapshot(value: Any) -> Any:
    """A copy of a checkpoint's state that later training cannot change: every tensor
    copied to host memory (a GPU tensor is read back here), containers rebuilt, other
    values deep-copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((key, snapshot(item)) for key, item in value.items())
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(snapshot(item) for item in value)
    if isinstance(value, tuple):  # a NamedTuple
        return type(value)(*(snapshot(item) for item in value))
    return copy.deepcopy(value)


class BackgroundCheckpointIO(AtomicCheckpointIO):
    """AtomicCheckpointIO whose saves and removals run on one writer thread, in order."""

    def __init__(self) -> None:
        super().__init__()
        self._tasks: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        """Copy `checkpoint` (`snapshot`) and queue its atomic write to `path`; raises the
        error of an earlier write that failed."""
        self._raise_failure()
        state = snapshot(checkpoint)
        self.after_writes(lambda: AtomicCheckpointIO.save_checkpoint(self, state, path))

    def remove_checkpoint(self, path: str | Path) -> None:
        """Queue the removal of `path`: it happens after the writes queued before it."""
        self.after_writes(lambda: AtomicCheckpointIO.remove_checkpoint(self, path))

    def after_writes(self, task: Callable[[], None]) -> None:
        """Run `task` on the writer thread once everything queued before it is done."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._work, name="checkpoint-writer", daemon=True
            )
            self._thread.start()
        self._tasks.put(task)

    def wait(self) -> None:
        """Block until every queued write and removal is done; raise the first error."""
        if self._thread is not None and self._thread.is_alive():
            self._tasks.join()
        self._raise_failure()

    def teardown(self) -> None:
        """Wait for the queued writes (the end of fit, or a preemption stop)."""
        self.wait()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            try:
                if self._error is None:  # after a failure nothing else is written
                    task()
            except BaseException as error:  # noqa: BLE001 - raised on the training thread
                self._error = error
            finally:
                self._tasks.task_done()

    def _raise_failure(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def run_after_writes(checkpoint_io: Any, task: Callable[[], None]) -> None:
    """Run `task` after the pending writes of `checkpoint_io` (a BackgroundCheckpointIO),
    or now for any other CheckpointIO (its writes are done when they return)."""
    if isinstance(checkpoint_io, BackgroundCheckpointIO):
        checkpoint_io.after_writes(task)
    else:
        task()


def wait_for_writes(checkpoint_io: Any) -> None:
    """Block until `checkpoint_io`'s pending writes are on disk (no-op unless it is a
    BackgroundCheckpointIO)."""
    if isinstance(checkpoint_io, BackgroundCheckpointIO):
        checkpoint_io.wait()
