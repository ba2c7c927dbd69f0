"""Checkpoints that a crash cannot corrupt, and finding the one to resume from.

Every checkpoint is written beside its final name (`NAME.partial`), flushed to disk, then
renamed over the final name: a file named `*.ckpt` is always complete, so resuming never
meets a half-written one. Leftover `.partial` files are ignored and cleaned up.

Under DeepSpeed a checkpoint is a directory (`last.ckpt/` holding `latest` and a tag folder
of per-rank shards), written by DeepSpeed's engine rather than CheckpointIO. The strategy
(`pretrain.strategies.PretrainDeepSpeedStrategy`) writes it aside as `NAME.partial/` and
renames it into place once every rank has written its part; a directory counts as complete
only when DeepSpeed's `latest` file (written last) is in it.
"""

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

PARTIAL_SUFFIX = ".partial"
REPLACED_SUFFIX = ".replaced"


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


def is_deepspeed_checkpoint(path: str | Path) -> bool:
    """True for a complete DeepSpeed checkpoint directory (it holds DeepSpeed's `latest`)."""
    return (Path(path) / "latest").is_file()


def is_complete_checkpoint(path: str | Path) -> bool:
    """A `.ckpt` file (always complete, see AtomicCheckpointIO) or a complete ZeRO directory."""
    return Path(path).is_file() or is_deepspeed_checkpoint(path)


def replace_directory(written: Path, final: Path) -> None:
    """Move the complete directory `written` to `final`, replacing an older one. Between the
    two renames `final` is briefly absent; resuming then falls back to the newest step
    checkpoint (`find_resume_checkpoint`)."""
    replaced = final.with_name(final.name + REPLACED_SUFFIX)
    if replaced.exists():
        shutil.rmtree(replaced)
    if final.exists():
        os.replace(final, replaced)
    os.replace(written, final)
    shutil.rmtree(replaced, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def find_resume_checkpoint(run_dir: str | Path, resume: str) -> str | None:
    """The checkpoint `resume` asks for: None for 'never' or when the run has none yet; for
    'auto' `<run_dir>/checkpoints/last.ckpt` when complete, else the complete
    `step-*.ckpt` of the highest step; else the given path (a file or a ZeRO directory, which
    must exist and be complete)."""
    if resume == "never":
        return None
    if resume != "auto":
        if not is_complete_checkpoint(resume):
            raise FileNotFoundError(
                f"resume={resume}: no such checkpoint file or complete DeepSpeed checkpoint "
                "directory (one holding a 'latest' file)"
            )
        return resume
    directory = checkpoint_dir(run_dir)
    for leftover in directory.glob(f"*{PARTIAL_SUFFIX}"):
        _remove(leftover)  # an interrupted write; the previous complete checkpoint is intact
    last = directory / "last.ckpt"
    if is_complete_checkpoint(last):
        return str(last)
    steps = sorted(p for p in directory.glob("step-*.ckpt") if is_complete_checkpoint(p))
    return str(steps[-1]) if steps else None


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


def deepspeed_client_state_file(checkpoint: str | Path) -> Path:
    """The file of a ZeRO checkpoint directory that holds Lightning's client state (loops,
    callbacks, our `config` and `rng`): rank 0's model-states file in the `latest` tag folder."""
    checkpoint = Path(checkpoint)
    tag_dir = checkpoint / (checkpoint / "latest").read_text().strip()
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (tag_dir / name).is_file():
            return tag_dir / name
    raise FileNotFoundError(f"{tag_dir}: no rank-0 model states file; is the checkpoint complete?")


def saved_config(checkpoint_path: str | Path) -> dict:
    """The composed config stored in a checkpoint (memory-mapped: the weights are not read);
    for a ZeRO directory, from its client state."""
    if Path(checkpoint_path).is_dir():
        state = torch.load(deepspeed_client_state_file(checkpoint_path), weights_only=False)
        return state.get("config", {})
    return torch.load(checkpoint_path, weights_only=True, mmap=True).get("config", {})
