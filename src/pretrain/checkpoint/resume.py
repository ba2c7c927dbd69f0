"""Finding the checkpoint to resume from, and the relaunch policy: which config changes a
resumed or initialised run may make (`config_changes`, `check_relaunch`, `check_init_from`).
"""

import os
import shutil
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from pretrain.checkpoint.atomic import (
    checkpoint_dir,
    fsync_directory,
    is_complete_checkpoint,
    recover_replacements,
)
from pretrain.checkpoint.safety import load_weights_only
from pretrain.errors import ConfigError
from pretrain.runtime.batching import batch_plan


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


def newest_checkpoint(directory: Path) -> str | None:
    """The complete checkpoint of `directory` (`last.ckpt`, `step-*.ckpt`) with the highest
    stored step, `last.ckpt` on a tie; a file or ZeRO directory that cannot be read (truncated,
    a shard missing) is skipped with a warning naming it. None when there is none."""
    candidates = [directory / "last.ckpt", *step_checkpoints(directory)[::-1]]
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


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Keys that may differ between the launches of one run: they say how long, where, how
# visibly and how fast it trains, not what it trains (fnmatch patterns over dotted keys).
# `trainer.devices` and `trainer.num_nodes` may change too while the global batch stays the
# same (`data.global_batch_size` set), and with a token budget (`data.tokens_per_batch`,
# whose steps hold the same samples for any shape) `trainer.accumulate_grad_batches` too.
# Anything else makes `resume=auto` refuse.
RELAUNCH_KEYS = (
    "resume",
    "run_name",
    "run_dir",
    "experiment_name",
    "trainer.max_steps",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.checkpoint_every_n_steps",
    "trainer.keep_checkpoints",
    "trainer.preemption_signal",
    "trainer.collective_timeout_s",
    "trainer.max_consecutive_skipped_steps",
    "trainer.max_skipped_steps",
    "trainer.peak_tflops",
    "trainer.tf32",  # speed switches: the same model and data either way
    "trainer.pin_memory",
    "trainer.compile",
    "trainer.compile_backend",
    "trainer.val_*",
    "logger.*",
    "data.num_workers",
    "data.verify_shards",
    "data.bad_shards",
    "data.cache_dir",  # where remote shards are cached and how: the same bytes either way
    "data.cache_limit",
    "data.prefetch_shards",
    "data.download_attempts",
    "data.storage_options",
    "optim.extend",
    "optim.impl",  # kernels (apex or torch) compute the same update: a machine may lack apex
    "model.layer_norm_impl",
    "model.unpad",  # the unpadded path computes the same outputs
)
RANK_KEYS = ("trainer.devices", "trainer.num_nodes")
UNSET = "<unset>"


def config_changes(saved: dict, current: dict, ignore: tuple[str, ...] = ("resume",)) -> list[str]:
    """Keys whose value differs between a checkpoint's config and the current one, as
    'key: saved -> current' lines (keys matching a pattern of `ignore` are skipped). Give
    `saved` through `config.with_schema_defaults`, so keys added since it was saved count at
    their defaults."""
    old, new = _flatten(saved), _flatten(current)
    return [
        f"{key}: {old.get(key, UNSET)!r} -> {new.get(key, UNSET)!r}"
        for key in sorted(old.keys() | new.keys())
        if not any(fnmatch(key, pattern) for pattern in ignore)
        and old.get(key, UNSET) != new.get(key, UNSET)
    ]


def _global_batch(config: dict) -> int | None:
    try:
        return batch_plan(config).global_batch_size
    except (ConfigError, KeyError, TypeError):
        return None


def refused_changes(saved: dict, current: dict) -> list[str]:
    """The differences (`config_changes` lines) that stop `resume=auto` from continuing a
    checkpoint with `current`: every key but `RELAUNCH_KEYS` and `init_from` (checked on its
    own, `check_init_from`), and `RANK_KEYS` only when the global batch changes with them."""
    allowed = (*RELAUNCH_KEYS, *RANK_KEYS, "init_from")
    tokens = saved.get("data", {}).get("tokens_per_batch")
    if tokens and tokens == current.get("data", {}).get("tokens_per_batch"):
        allowed += ("trainer.accumulate_grad_batches",)  # token-budget steps do not depend on it
    changes = config_changes(saved, current, allowed)
    ranks = config_changes(saved, current, ())
    ranks = [line for line in ranks if line.split(":")[0] in RANK_KEYS]
    before, after = _global_batch(saved), _global_batch(current)
    if ranks and (before is None or before != after):
        batch = f" (global batch {before} -> {after} samples per step)"
        changes += [line + batch for line in ranks]
    return changes


def check_init_from(saved: dict, current: dict, checkpoint: str) -> None:
    """ConfigError when the run asks for `init_from` other than the one the checkpoint's run
    started from: resuming continues the checkpoint's weights, so initialising from elsewhere
    cannot be honoured. The same `init_from` (a relaunch or a requeue of that run) or none is
    fine."""
    wanted = current.get("init_from")
    if wanted is None or wanted == saved.get("init_from"):
        return
    raise ConfigError(
        f"init_from={wanted}: the run directory already holds a checkpoint ({checkpoint}) "
        f"that started from {saved.get('init_from')!r}; resuming continues its weights, so "
        "init_from cannot apply. To start a run from init_from, name a new run (run_name=...) "
        "or start over here (resume=never)"
    )


def check_relaunch(saved: dict, current: dict, checkpoint: str, resume: str) -> None:
    """Whether the run may continue `checkpoint` (whose config is `saved`) with `current`:
    ConfigError listing the refused changes (`refused_changes`) and how to proceed for
    `resume=auto`; printed as a warning for `resume=force` or an explicit path (the launch
    names what it continues). `check_init_from` applies to every mode."""
    check_init_from(saved, current, checkpoint)
    changes = refused_changes(saved, current)
    if not changes:
        return
    listing = "\n  ".join(changes)
    if resume != "auto":
        print(
            f"warning: resume={resume}: continuing {checkpoint} although the config differs "
            f"(saved -> now):\n  {listing}",
            flush=True,
        )
        return
    raise ConfigError(
        f"the run directory holds a checkpoint ({checkpoint}) trained with another config; "
        f"these keys differ (saved -> now):\n  {listing}\n"
        f"Keys that may change between launches: {', '.join(RELAUNCH_KEYS)}; "
        f"{' and '.join(RANK_KEYS)} with the same global batch.\n"
        "To proceed: name a new run for this config (run_name=NAME), or start over in this "
        "directory (resume=never; the old checkpoints move to checkpoints.previous/), or "
        "continue the old run with the new values (resume=force)."
    )


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


def save_hydra_config(cfg: Any) -> Path | None:
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
