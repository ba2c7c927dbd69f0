"""Checkpoints that a crash cannot corrupt, and finding the one to resume from.

Every checkpoint is written beside its final name (`NAME.partial`), flushed to disk, then
renamed over the final name: a file named `*.ckpt` is always complete, so resuming never
meets a half-written one. Leftover `.partial` files are ignored and cleaned up.
"""

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

PARTIAL_SUFFIX = ".partial"


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes aside, fsyncs, then renames into place."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + PARTIAL_SUFFIX)
        with open(partial, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)

    def remove_checkpoint(self, path: str | Path) -> None:
        fs = get_filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def find_resume_checkpoint(run_dir: str | Path, resume: str) -> str | None:
    """The checkpoint `resume` asks for: None for 'never' or when the run has none yet,
    `<run_dir>/checkpoints/last.ckpt` for 'auto', else the given path (which must exist)."""
    if resume == "never":
        return None
    if resume != "auto":
        if not Path(resume).is_file():
            raise FileNotFoundError(f"resume={resume}: no such checkpoint file")
        return resume
    directory = checkpoint_dir(run_dir)
    for leftover in directory.glob(f"*{PARTIAL_SUFFIX}"):
        leftover.unlink()  # an interrupted write; the previous complete checkpoint is intact
    last = directory / "last.ckpt"
    return str(last) if last.is_file() else None


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_changes(saved: dict, current: dict, ignore: tuple[str, ...] = ("resume",)) -> list[str]:
    """Keys whose value differs between a checkpoint's config and the current one, as
    'key: saved -> current' lines (keys in `ignore` are skipped)."""
    old, new = _flatten(saved), _flatten(current)
    return [
        f"{key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"
        for key in sorted(old.keys() | new.keys())
        if key not in ignore and old.get(key, "<unset>") != new.get(key, "<unset>")
    ]


def saved_config(checkpoint_path: str | Path) -> dict:
    """The composed config stored in a checkpoint (memory-mapped: the weights are not read)."""
    return torch.load(checkpoint_path, weights_only=True, mmap=True).get("config", {})
