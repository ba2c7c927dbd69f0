"""A pretrained encoder for downstream tasks: from a `pretrain` checkpoint or an exported
Hugging Face directory, loaded with `transformers.AutoModel` (local files only, never a
download), with its tokenizer; or a randomly initialised encoder of the same size."""

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pretrain.errors import ConfigError
from pretrain.eval.features import TensorRows
from pretrain.eval.heads import pool

INITS = ("pretrained", "random")


@dataclass
class LoadedEncoder:
    """An encoder ready for a task head: `model` maps a tokenized batch to every layer's hidden
    states; `tokenizer` is the run's (a fast Hugging Face tokenizer); `model_type` the family
    (config.json's, e.g. "bert", "xlnet"); `run_dir` the pretraining run's directory, where
    evaluations are written by default."""

    model: "HiddenStates"
    tokenizer: Any
    model_type: str
    run_dir: Path


class HiddenStates(nn.Module):
    """A Hugging Face base model returning the hidden states of the embeddings and of every
    layer: a tuple of num_layers + 1 tensors (batch, seq, hidden)."""

    def __init__(self, model: nn.Module, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.hidden_size = int(
            model.config.hidden_size
            if hasattr(model.config, "hidden_size")
            else model.config.d_model
        )
        self.num_layers = int(model.config.num_hidden_layers)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        inputs = {name: batch[name] for name in self.input_names if name in batch}
        return tuple(self.model(**inputs, output_hidden_states=True).hidden_states)


def run_dir_of(source: Path) -> Path:
    """The pretraining run directory of `source`: `runs/x` for `runs/x/checkpoints/last.ckpt`,
    the checkpoint's folder otherwise; an exported directory is its own."""
    if source.is_dir() and (source / "config.json").is_file():
        return source
    return source.parent.parent if source.parent.name == "checkpoints" else source.parent


def _load_hf_dir(directory: Path, init: str, seed: int) -> tuple[nn.Module, Any]:
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()  # the load report lists the pretraining heads left out
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if not tokenizer.is_fast:
        raise ConfigError(
            f"encoder.path = {str(directory)!r}: its tokenizer has no tokenizer.json (a fast "
            "tokenizer is needed for QA offsets and word alignment); export it with pretrain-export"
        )
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    if getattr(config, "bi_data", False):  # XLNet's pretraining data only; fine-tune without
        config.bi_data = False
    if init == "random":
        torch.manual_seed(seed)
        return AutoModel.from_config(config), tokenizer
    return AutoModel.from_pretrained(directory, config=config, local_files_only=True), tokenizer


def unfinished_run_warning(checkpoint: Path) -> str | None:
    """One warning line when `checkpoint` (a file or ZeRO directory) holds fewer optimizer
    steps than its run's trainer.max_steps (a preempted or failed run), else None."""
    from pretrain.checkpoint.resume import deepspeed_client_state_file
    from pretrain.checkpoint.safety import load_weights_only

    try:
        state_file = checkpoint
        if checkpoint.is_dir():
            state_file = deepspeed_client_state_file(checkpoint)
        state = load_weights_only(state_file, mmap=True)  # one read: the weights stay mapped
        step, max_steps = int(state["global_step"]), int(state["config"]["trainer"]["max_steps"])
    except (OSError, RuntimeError, KeyError, TypeError, ValueError):
        return None  # not readable here: the export that follows names the fault
    if step >= max_steps:
        return None
    return (
        f"warning: {checkpoint} is from an unfinished run (step {step} of {max_steps}): "
        "the encoder evaluated is not the finished one; resume the run (same command) to finish it"
    )


def load_encoder(path: str | Path, init: str = "pretrained", seed: int = 0) -> LoadedEncoder:
    """Load the encoder at `path`: a Hugging Face directory (config.json, model.safetensors,
    tokenizer files, as `pretrain-export` writes) or a `pretrain` checkpoint (.ckpt or ZeRO
    directory, exported to a temporary directory first). `init="random"` keeps the size and
    tokenizer but draws fresh weights (seeded by `seed`), the baseline a pretrained encoder
    should beat."""
    source = Path(path)
    if init not in INITS:
        raise ConfigError(f"encoder.init = {init!r}: must be one of {', '.join(INITS)}")
    if not source.exists():
        raise ConfigError(
            f"encoder.path = {str(path)!r}: not found; pass a checkpoint (.ckpt) written by "
            "`pretrain` or a directory written by `pretrain-export`"
        )
    if source.is_dir() and (source / "config.json").is_file():
        model, tokenizer = _load_hf_dir(source, init, seed)
    else:
        from pretrain.export import export_checkpoint

        if (warning := unfinished_run_warning(source)) is not None:
            print(warning, file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            exported = export_checkpoint(source, Path(scratch) / "hf")
            model, tokenizer = _load_hf_dir(exported, init, seed)
    input_names = tuple(tokenizer.model_input_names)
    model_type = str(model.config.model_type)
    return LoadedEncoder(
        HiddenStates(model, input_names), tokenizer, model_type, run_dir_of(source)
    )


@torch.no_grad()
def with_hidden_states(
    encoder: HiddenStates,
    rows: TensorRows,
    batch_size: int,
    pooling: str | None = None,
    last_token: bool = False,
) -> TensorRows:
    """`rows` plus `hidden_states` (rows, num_layers + 1, seq, hidden): the frozen encoder's
    output for every row, computed once in eval mode (no dropout) in batches of `batch_size`
    rows, so that a features-mode head trains for every epoch without running the encoder
    again (the results equal running it per batch, up to float rounding).

    With `pooling` (a sequence-level task's `eval.pooling`; `last_token`: XLNet's summary
    token), each state is pooled over its tokens first and kept as one position:
    (rows, num_layers + 1, 1, hidden), the attention mask that one position. Every layer
    choice is a selection, a concatenation or a weighted sum of the states, and pooling is a
    selection or a mean over the tokens, so the head reads the same vector either way, from
    seq times less memory and work per epoch."""
    mode = encoder.training
    encoder.eval()
    states = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        layers = encoder(batch)  # num_layers + 1 of (batch, seq, hidden)
        if pooling is not None:
            mask = batch["attention_mask"]
            layers = [pool(h, mask, pooling, last_token).unsqueeze(1) for h in layers]
        states.append(torch.stack(layers, dim=1))  # (batch, states, seq or 1, hidden)
    encoder.train(mode)
    tensors = {**rows.tensors, "hidden_states": torch.cat(states)}
    if pooling is not None:
        tensors["attention_mask"] = torch.ones(len(rows), 1, dtype=torch.long)
    return TensorRows(tensors)


@torch.no_grad()
def feature_statistics(
    encoder: HiddenStates,
    rows: TensorRows,
    batch_size: int,
    pooling: str | None = None,
    last_token: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, standard deviation), each (num_layers + 1, hidden): every state's features over
    the rows' real tokens, or with `pooling` over the rows' pooled vectors (what a
    sequence-level head reads), from the rows' cached `hidden_states` (`with_hidden_states`)
    where they have them, else from the encoder in eval mode. A feature that never varies
    gets a deviation of 1e-6, not 0."""
    total = square = count = 0.0
    mode = encoder.training
    encoder.eval()
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        mask = batch["attention_mask"]
        if "hidden_states" in batch:
            states = batch["hidden_states"]  # (batch, states, seq or 1, hidden)
        else:
            layers = encoder(batch)
            if pooling is not None:
                layers = [pool(h, mask, pooling, last_token).unsqueeze(1) for h in layers]
                mask = torch.ones(len(mask), 1, dtype=mask.dtype)
            states = torch.stack(layers, dim=1)
        weights = mask[:, None, :, None].to(states.dtype)
        total = total + (states * weights).sum((0, 2))
        square = square + (states.square() * weights).sum((0, 2))
        count = count + weights.sum((0, 2))
    encoder.train(mode)
    mean = total / count
    return mean, (square / count - mean.square()).clamp_min(0).sqrt().clamp_min(1e-6)
