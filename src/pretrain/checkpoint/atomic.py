"""Checkpoints that a crash cannot corrupt: written aside, fsynced, renamed into place.

Every checkpoint is written beside its final name (`NAME.partial`), flushed to disk, then
renamed over the final name, and the directory is fsynced so the rename itself survives a
crash: a file named `*.ckpt` is complete once "saved" is printed. Leftover `.partial` files
are ignored and cleaned up (which checkpoint a run resumes from: `checkpoint/resume.py`).

Under DeepSpeed a checkpoint is a directory (`last.ckpt/` holding `latest` and a tag folder
of per-rank shards), written by DeepSpeed's engine rather than CheckpointIO. The strategy
(`pretrain.runtime.strategies.PretrainDeepSpeedStrategy`) writes it aside as `NAME.partial/` and
renames it into place once every rank has written its part; a directory counts as complete
only when DeepSpeed's `latest` file (written last) is in it. Before the renames rank 0 marks
the written directory complete (`COMPLETE_MARKER`), so a crash between them loses nothing:
resuming finishes the replacement (`recover_replacements`).
"""

import contextlib
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

from pretrain.checkpoint.safety import load_weights_only
from pretrain.errors import filesystem_error

PARTIAL_SUFFIX = ".partial"
REPLACED_SUFFIX = ".replaced"
LINK_SUFFIX = ".link"  # `last.ckpt.link`: the new link, before it is renamed over last.ckpt
COMPLETE_MARKER = "complete"  # in a ZeRO directory: every rank has written its part


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes aside, fsyncs, then renames into place."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        """Write `checkpoint` to `path` by way of `path.partial`; a filesystem fault (a full
        disk, a read-only or forbidden directory, a directory in the way) is a one-line
        RunEnvironmentError naming the path, the previous checkpoints left intact."""
        path = Path(path)
        partial = path.with_name(path.name + PARTIAL_SUFFIX)
        writer = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as f:
                writer = RecordingWriter(f)
                torch.save(checkpoint, writer)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
            fsync_directory(path.parent)
        except (OSError, RuntimeError) as error:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            cause = writer.error if writer is not None and writer.error else error
            fault = filesystem_error(
                cause,
                "saving the checkpoint",
                f"run the same command again to resume (the previous checkpoints in "
                f"{path.parent} are intact)",
                path,
            )
            if fault is not None:
                raise fault from None
            raise

    def load_checkpoint(
        self, path: str | Path, map_location: Any = "cpu", weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Always weights_only (`pretrain.checkpoint.safety`): a checkpoint is data; a
        pickle that asks for more is refused with a one-line error naming the file. Memory-
        mapped (torch's zip format): every DDP rank of a node maps the same pages of the
        page cache instead of reading its own copy, and a tensor is read when it is copied
        into the model or optimizer."""
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such checkpoint file")
        mmap = zipfile.is_zipfile(path)  # torch's legacy format cannot be mapped
        return load_weights_only(path, map_location=map_location, mmap=mmap)

    def remove_checkpoint(self, path: str | Path) -> None:
        fs = get_filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)


class RecordingWriter:
    """A binary file that keeps the OSError of a failed write (`error`): torch.save reports
    it as a RuntimeError of its own ("enforce fail at inline_container.cc")."""

    def __init__(self, f: BinaryIO):
        self.f, self.error = f, None

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.f.flush()


def fsync_directory(directory: str | Path) -> None:
    """Flush `directory`'s entries (a rename into it) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` (a DeepSpeed checkpoint written by
    `torch.save` without fsync) to disk."""
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(Path(directory) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_directory(directory)


def checkpoint_dir(run_dir: str | Path) -> Path:
    """`<run_dir>/checkpoints`: where a run's checkpoints are written and resumed from."""
    return Path(run_dir) / "checkpoints"


def is_deepspeed_checkpoint(path: str | Path) -> bool:
    """True for a complete DeepSpeed checkpoint directory (it holds DeepSpeed's `latest`)."""
    return (Path(path) / "latest").is_file()


def is_complete_checkpoint(path: str | Path) -> bool:
    """A `.ckpt` file (always complete, see AtomicCheckpointIO) or a complete ZeRO directory."""
    return Path(path).is_file() or is_deepspeed_checkpoint(path)


def replace_directory(written: Path, final: Path) -> None:
    """Move the complete directory `written` to `final`, replacing an older one (moved to
    `final.replaced` first). `written` is marked complete before the renames, so a crash
    between them leaves a checkpoint that resuming recovers (`recover_replacements`)."""
    marker = written / COMPLETE_MARKER
    marker.touch()
    fsync_tree(written)
    replaced = final.with_name(final.name + REPLACED_SUFFIX)
    _remove(replaced)
    if os.path.lexists(final):  # a directory, or `last`'s link to a step's (`link_checkpoint`)
        os.replace(final, replaced)
    os.replace(written, final)
    fsync_directory(final.parent)
    _remove(replaced)


def link_checkpoint(target: Path, link: Path) -> None:
    """Make `link` (`last.ckpt`) a symbolic link to `target`, a checkpoint file or ZeRO
    directory beside it, by a relative name, atomically: the link is made aside
    (`NAME.link`) and renamed over `link`; a ZeRO directory written in full at `link` (a
    preemption's save) is moved aside first (`replace_directory`'s `.replaced`)."""
    aside = link.with_name(link.name + LINK_SUFFIX)
    aside.unlink(missing_ok=True)
    os.symlink(target.name, aside)
    replaced = link.with_name(link.name + REPLACED_SUFFIX)
    if link.is_dir() and not link.is_symlink():
        _remove(replaced)
        os.replace(link, replaced)
    os.replace(aside, link)
    fsync_directory(link.parent)
    _remove(replaced)


def recover_replacements(directory: Path) -> None:
    """Finish the replacements of ZeRO directories that a crash interrupted (`replace_directory`):
    a `NAME.partial` marked complete becomes `NAME`; else a `NAME.replaced` (the previous one)
    goes back to a missing `NAME`. Other leftovers (`.partial` writes that did not finish,
    `.replaced` copies no longer needed) are removed. Safe when several ranks run it at once."""
    for partial in sorted(directory.glob(f"*{PARTIAL_SUFFIX}")):
        final = partial.with_name(partial.name.removesuffix(PARTIAL_SUFFIX))
        try:
            if (partial / COMPLETE_MARKER).is_file():
                print(f"finishing the interrupted replacement of {final}", flush=True)
                replace_directory(partial, final)
            else:
                _remove(partial)  # an interrupted write; the previous checkpoint is intact
        except FileNotFoundError:
            pass  # another rank finished it
    for replaced in sorted(directory.glob(f"*{REPLACED_SUFFIX}")):
        final = replaced.with_name(replaced.name.removesuffix(REPLACED_SUFFIX))
        try:
            if not os.path.lexists(final) and is_deepspeed_checkpoint(replaced):
                os.replace(replaced, final)
            else:
                _remove(replaced)
        except FileNotFoundError:
            pass
    for link in directory.glob(f"*{LINK_SUFFIX}"):  # a link_checkpoint that did not finish
        link.unlink(missing_ok=True)
    fsync_directory(directory)


def _remove(path: Path) -> None:
    """Remove a file, a link (never what it points to) or a directory, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
