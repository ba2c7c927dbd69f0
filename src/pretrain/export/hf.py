"""Our checkpoints <-> Hugging Face model directories, for every model family.

Each family has a module (`pretrain.export.<family>`, named by the model class's
`hf_format`) with `to_hf(state_dict, run_config) -> HFModel` and
`from_hf(HFModel) -> (model config group, state_dict)`. The objective module decides which
models a checkpoint holds (`Objective.hf_exports`): usually one, ELECTRA two.
A directory holds config.json, model.safetensors and the run's tokenizer files, and loads with
`transformers.AutoModel*.from_pretrained` / `AutoTokenizer.from_pretrained`.
"""

import json
import os
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pretrain.export.checkpoint import ExportError, read_checkpoint
from pretrain.export.naming import cpu_copies
from pretrain.export.output_dir import copy_tokenizer_files, write_directory

# Hugging Face `model_type` (config.json) -> the module converting that family's weights.
FAMILIES = {"bert": "pretrain.export.bert", "albert": "pretrain.export.albert"}
FAMILIES["roberta"] = "pretrain.export.roberta"
FAMILIES["bart"] = "pretrain.export.bart"
FAMILIES["xlnet"] = "pretrain.export.xlnet"
FAMILIES["gpt2"] = "pretrain.export.gpt2"
FAMILIES["distilbert"] = "pretrain.export.distilbert"
FAMILIES["electra"] = "pretrain.export.electra"
FAMILIES["modernbert"] = "pretrain.export.modernbert"
# config.json's record of the objective (its class) that trained an exported model
OBJECTIVE_KEY = "pretrain_objective"


@dataclass
class HFModel:
    """A Hugging Face model in memory: its config.json dict and its weights by HF name."""

    config: dict[str, Any]
    weights: dict[str, torch.Tensor]


def recording_objective(model: HFModel, target: str) -> HFModel:
    """`model` whose config.json records the objective class that trained it
    (`OBJECTIVE_KEY`), for tools that must know (`pretrain-generate`)."""
    return HFModel({**model.config, OBJECTIVE_KEY: target}, model.weights)


def family_module(model_cfg: dict[str, Any]) -> Any:
    """The `pretrain.export.<family>` module of the model class named by `model_cfg["_target_"]`."""
    from hydra.utils import get_class

    return import_module(get_class(model_cfg["_target_"]).hf_format)


def current_umask() -> int:
    """The process's file-creation mask (os.umask can only be read by setting it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_hf_model(model: HFModel, directory: Path, tokenizer_dir: Path | None) -> None:
    """Write config.json, model.safetensors (contiguous, unshared copies) and tokenizer files."""
    weights = cpu_copies(model.weights)
    config = dict(model.config)
    first = next(iter(weights.values()))
    config.setdefault("dtype", str(first.dtype).removeprefix("torch."))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    # safetensors creates the file private (0600); an export is for a team: 0644 under the
    # usual umask 022, like any file written here
    (directory / "model.safetensors").chmod(0o666 & ~current_umask())
    if tokenizer_dir is not None:
        copy_tokenizer_files(tokenizer_dir, directory)


def read_hf_model(hf_dir: str | Path) -> HFModel:
    """Read config.json and model.safetensors of a Hugging Face directory on disk."""
    directory = Path(hf_dir)
    config_path, weights_path = directory / "config.json", directory / "model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise ExportError(
                f"{path}: not found; point at a Hugging Face model directory with config.json "
                "and model.safetensors (save_pretrained writes both)"
            )
    return HFModel(json.loads(config_path.read_text()), load_file(str(weights_path)))


def import_hf_model(hf_dir: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face directory -> (our `model` config group, state_dict under our names),
    dispatching on config.json's `model_type`."""
    model = read_hf_model(hf_dir)
    model_type = model.config.get("model_type")
    if model_type not in FAMILIES:
        raise ExportError(
            f"{Path(hf_dir) / 'config.json'}: model_type {model_type!r} cannot be imported; "
            f"supported: {', '.join(sorted(FAMILIES))}"
        )
    try:
        return import_module(FAMILIES[model_type]).from_hf(model)
    except (KeyError, ValueError) as error:
        raise ExportError(f"{hf_dir}: cannot import the weights ({error})") from error


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write the HF directory (or directories) of a `pretrain` checkpoint; returns `out_dir`.

    The objective's main model goes to `out_dir`; further models (ELECTRA's generator) to
    subdirectories of it. The model's settings are those in force at the checkpoint's step
    (`pretrain.export.stage`: a context-extension stage's RoPE theta). Each holds config.json
    (which records the objective that trained it, `OBJECTIVE_KEY`), model.safetensors (weights
    in the checkpoint's dtype) and the run's tokenizer files. A non-empty `out_dir` is
    replaced only with `overwrite`; nothing is left behind on failure.
    """
    from hydra.utils import get_class

    state_dict, config = read_checkpoint(ckpt_path, at_step=True)  # a stage's RoPE theta
    target = config.get("objective", {}).get(
        "_target_", "pretrain.objectives.mlm.MaskedLanguageModel"
    )
    try:
        models = get_class(target).hf_exports(state_dict, config)
    except (KeyError, ValueError) as error:
        raise ExportError(f"{ckpt_path}: {error}") from error
    models = {subdir: recording_objective(model, target) for subdir, model in models.items()}
    vocab_size = config["model_runtime"]["vocab_size"]
    for subdir, model in models.items():
        if model.config.get("vocab_size", vocab_size) != vocab_size:
            raise ExportError(
                f"{ckpt_path}: config.model_runtime.vocab_size is {vocab_size} but the exported "
                f"model{' ' + subdir if subdir else ''} has {model.config['vocab_size']} tokens"
            )
    tokenizer_dir = Path(config["data"]["tokenizer_dir"])

    def fill(directory: Path) -> None:
        for subdir, model in models.items():
            write_hf_model(model, directory / subdir, tokenizer_dir)

    return write_directory(out_dir, fill, overwrite=overwrite, keep=(ckpt_path, tokenizer_dir))


def import_torchao() -> None:
    """Import torchao without its warnings about the CUDA kernel libraries it ships, which a
    CPU build of torch cannot load (harmless: the CPU paths do not use them)."""
    import logging

    log = logging.getLogger("torchao")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torchao  # noqa: F401
    finally:
        log.setLevel(level)
