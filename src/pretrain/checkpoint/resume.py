"""Finding the checkpoint to resume from, setting old checkpoints aside, and the run's
config as saved (the relaunch policy that judges it: `checkpoint/relaunch.py`).

`resume=auto` takes the newest complete checkpoint by the step stored in it (`last.ckpt` or a
`step-*.ckpt`); one that cannot be read is skipped, named.
"""

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from pretrain.checkpoint.atomic import (
    checkpoint_dir,
    fsync_directory,
    is_complete_checkpoint,
    recover_replacements,
)
from pretrain.checkpoint.safety import load_weights_only
from pretrain.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig


def checkpoint_step(path: str | Path) -> int:
    """The optimizer step stored in a checkpoint (file or ZeRO directory); raises (OSError,
    RuntimeError, pickle/zip errors, KeyError) when it cannot be read."""
    if Path(path).is_dir():
        state = load_weights_only(deepspeed_client_state_file(path), mmap=True)
    else:
        state = load_weights_only(path, mmap=True)
    return int(state["global_step"])


def step_checkpoints(directory: Path) -> list[Path]:
    """The `step-N.ckpt` files and directories of `directory`, by N as a number (the names
    have 7 digits, more past step 9,999,999, so text order would be wrong there)."""

    def number(path: Path) -> int:
        digits = path.name.removeprefix("step-").removesuffix(".ckpt")
        return int(digits) if digits.isdigit() else -1

    return sorted(directory.glob("step-*.ckpt"), key=lambda path: (number(path), path.name))


def last_checkpoint(directory: Path) -> Path:
    """`directory/last.ckpt`, a file, a ZeRO directory or a link to a checkpoint beside it
    (`atomic.link_checkpoint`). A link is read as data, never trusted: one that leads
    outside `directory` (or through another link) is refused with a ConfigError naming it."""
    last = directory / "last.ckpt"
    if not last.is_symlink():
        return last
    target = Path(os.readlink(last))
    resolved = (directory / target).resolve()
    inside = resolved.parent == directory.resolve() and target.name == resolved.name
    if not inside or target.parent != Path(".") or target.name == last.name:
        raise ConfigError(
            f"{last}: a link to {target}, not to a checkpoint beside it in {directory}; "
            "remove the link (resume=auto then takes the newest step-*.ckpt) or resume a "
            "checkpoint by its path (resume=PATH)"
        )
    return last


def newest_checkpoint(directory: Path) -> str | None:
    """The complete checkpoint of `directory` (`last.ckpt`, `step-*.ckpt`) with the highest
    stored step, `last.ckpt` on a tie (a link to the checkpoint of its step, checked by
    `last_checkpoint`); a file or ZeRO directory that cannot be read (truncated,
    a shard missing) is skipped with a warning naming it. None when there is none."""
    candidates = [last_checkpoint(directory), *step_checkpoints(directory)[::-1]]
    best: tuple[int, Path] | None = None
    for path in candidates:
        if not is_complete_checkpoint(path):
            continue
        try:
            step = checkpoint_step(path)
        except Exception as error:  # noqa: BLE001 - any unreadable checkpoint is skipped
            print(f"warning: skipping unreadable checkpoint {path}: {error}", flush=True)
            continue
        if best is None or step > best[0]:
            best = (step, path)
    return str(best[1]) if best else None


def find_resume_checkpoint(run_dir: str | Path, resume: str) -> str | None:
    """The checkpoint `resume` asks for: None for 'never' or when the run has none yet; for
    'auto' and 'force' the newest complete one in `<run_dir>/checkpoints` (`newest_checkpoint`);
    else the given path (a file or a ZeRO directory, which must exist and be complete)."""
    if resume == "never":
        return None
    if resume not in ("auto", "force"):
        if not is_complete_checkpoint(resume):
            raise FileNotFoundError(
                f"resume={resume}: no such checkpoint file or complete DeepSpeed checkpoint "
                "directory (one holding a 'latest' file)"
            )
        return resume
    directory = checkpoint_dir(run_dir)
    if directory.is_dir():
        recover_replacements(directory)
    return newest_checkpoint(directory)


def set_aside_checkpoints(run_dir: str | Path) -> Path | None:
    """`resume=never` in a run directory that holds checkpoints: move them to
    `checkpoints.previous/` (replacing an older one), so the new run's and the old run's
    checkpoints never mix (`resume=auto` takes the highest step). Returns where they went."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir() or not any(directory.iterdir()):
        return None
    previous = directory.with_name(directory.name + ".previous")
    if previous.exists():
        shutil.rmtree(previous)
    os.replace(directory, previous)
    fsync_directory(previous.parent)
    return previous


def save_hydra_config(cfg: "DictConfig") -> Path | None:
    """Write what Hydra writes to `<output dir>/.hydra` (config.yaml, hydra.yaml,
    overrides.yaml), after the relaunch check passed: `conf/train.yaml` sets
    `hydra.output_subdir: null`, so Hydra itself no longer overwrites an old run's
    `config.yaml` with a config it was not trained with. None outside a Hydra app (or when
    Hydra writes it itself)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.output_subdir is not None or not hydra_cfg.runtime.get("output_dir"):
        return None
    out = Path(hydra_cfg.runtime.output_dir) / ".hydra"
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), out / "hydra.yaml")
    OmegaConf.save(hydra_cfg.overrides.task, out / "overrides.yaml")
    return out


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
        state = load_weights_only(deepspeed_client_state_file(checkpoint_path), mmap=True)
        return state.get("config", {})
    return load_weights_only(checkpoint_path, mmap=True).get("config", {})


def checkpoint_weight_shapes(checkpoint_path: str | Path) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of the weights stored in a checkpoint file (memory-mapped: nothing is
    read but the index); None for a ZeRO directory (its weights are partitioned)."""
    if Path(checkpoint_path).is_dir():
        return None
    state = load_weights_only(checkpoint_path, mmap=True).get("state_dict") or {}
    return {key: tuple(value.shape) for key, value in state.items() if hasattr(value, "shape")}
