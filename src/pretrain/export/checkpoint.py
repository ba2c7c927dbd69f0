"""Reading a training checkpoint for export, with errors that name the file and the key."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pretrain.checkpoint.compat import objective_state_dict
from pretrain.checkpoint.safety import (
    UnsafeCheckpointError,
    check_stored_targets,
    load_weights_only,
    weights_only_loading,
)
from pretrain.export.stage import config_at_checkpoint


class ExportError(RuntimeError):
    """An export cannot proceed; the message names the file or key and says what to do."""


def _lookup(config: Mapping, dotted: str, ckpt_path: Path) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ExportError(
                f"{ckpt_path}: the checkpoint's config lacks config.{dotted}; export needs a "
                "checkpoint written by `pretrain` (its config holds model, model_runtime and data)"
            )
        node = node[part]
    return node


def read_checkpoint(
    ckpt_path: str | Path, at_step: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load a `pretrain` checkpoint on the CPU; returns (state_dict under the objective's
    names, `encoder.*` and heads, whichever version wrote it; run config as plain dicts).
    With `at_step`, the config's model holds the settings in force at the checkpoint's step
    (a context-extension stage's RoPE theta: `pretrain.export.stage`), not the last stage's.

    Checks that the file exists, loads with `weights_only=True`, and that it holds
    `state_dict` (with `encoder.` keys), `config.model`, `config.model_runtime.vocab_size`,
    `config.model_runtime.pad_token_id` and `config.data.tokenizer_dir`. A DeepSpeed ZeRO
    checkpoint directory is first consolidated to one fp32 state (`consolidate_zero_checkpoint`).
    The stored config may name only this project's classes (`check_stored_targets`): it is
    instantiated by generate, export, init_from and a distillation teacher.
    """
    path = Path(ckpt_path)
    if path.is_dir():
        checkpoint = consolidate_zero_checkpoint(path)
    elif not path.is_file():
        raise ExportError(
            f"{path}: checkpoint file not found; pass the path of a .ckpt written by `pretrain`"
        )
    else:
        checkpoint = _load_file(path)
    state_dict, config = _check_checkpoint(path, checkpoint)
    try:
        check_stored_targets(config, path)
    except UnsafeCheckpointError as error:
        raise ExportError(str(error)) from None
    if at_step:
        config = config_at_checkpoint(config, checkpoint)
    return state_dict, config


def consolidate_zero_checkpoint(path: Path, output_file: str | Path | None = None) -> dict:
    """Gather the partitions of a DeepSpeed ZeRO checkpoint directory (any stage, written with
    any number of ranks) into one fp32 checkpoint dict: Lightning's client state (our
    `config`, `rng`, loops) plus `state_dict`. Written to `output_file` too when given, else
    to a temporary file. Uses Lightning's `convert_zero_checkpoint_to_fp32_state_dict`
    (DeepSpeed's zero_to_fp32), every file loaded weights_only (`weights_only_loading`):
    a pickle that would run code is refused."""
    import tempfile

    from pretrain.checkpoint.atomic import is_deepspeed_checkpoint

    if not is_deepspeed_checkpoint(path):
        raise ExportError(
            f"{path}: a directory but not a complete DeepSpeed checkpoint (no 'latest' file); "
            "pass a .ckpt file, or a ZeRO checkpoint directory written by `pretrain`"
        )
    try:
        from lightning.pytorch.utilities.deepspeed import (
            convert_zero_checkpoint_to_fp32_state_dict,
        )

        with weights_only_loading():
            if output_file is not None:
                return convert_zero_checkpoint_to_fp32_state_dict(path, output_file)
            with tempfile.TemporaryDirectory() as scratch:
                scratch_file = Path(scratch) / "fp32.ckpt"
                return convert_zero_checkpoint_to_fp32_state_dict(path, scratch_file)
    except UnsafeCheckpointError as error:
        raise ExportError(str(error)) from None
    except (ImportError, ModuleNotFoundError) as error:
        raise ExportError(f"{path}: reading a ZeRO checkpoint needs DeepSpeed ({error})") from error
    except Exception as error:
        raise ExportError(
            f"{path}: cannot consolidate the ZeRO checkpoint ({type(error).__name__}: {error}); "
            "is it complete?"
        ) from error


def _load_file(path: Path) -> Any:
    try:
        return load_weights_only(path, map_location="cpu")
    except UnsafeCheckpointError as error:
        raise ExportError(str(error)) from None
    except Exception as error:  # pickle, zip and torch errors all mean: not a loadable checkpoint
        raise ExportError(
            f"{path}: cannot read the checkpoint ({type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}); "
            "is it a complete .ckpt written by `pretrain`?"
        ) from error


def _check_checkpoint(
    path: Path, checkpoint: Any
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    if not isinstance(checkpoint, Mapping):
        raise ExportError(
            f"{path}: expected a checkpoint dict, found a {type(checkpoint).__name__}"
        )
    for key in ("state_dict", "config"):
        if not isinstance(checkpoint.get(key), Mapping):
            raise ExportError(
                f"{path}: the checkpoint has no '{key}' dict (found keys: {sorted(checkpoint)}); "
                "export needs a checkpoint written by `pretrain`"
            )
    state_dict = objective_state_dict(checkpoint["state_dict"])
    config = checkpoint["config"]
    if not any(key.startswith("encoder.") for key in state_dict):
        raise ExportError(
            f"{path}: state_dict has no 'encoder.' weights; is this a `pretrain` checkpoint?"
        )
    for dotted in (
        "model",
        "model_runtime.vocab_size",
        "model_runtime.pad_token_id",
        "data.tokenizer_dir",
    ):
        _lookup(config, dotted, path)
    return state_dict, dict(config)
