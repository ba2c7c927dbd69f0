"""int8 quantization of an exported BERT through torchao (`torch.ao.quantization` is
deprecated; torchao is its successor and runs on the CPU with torch 2.13: torchao 0.18).

- post-training dynamic int8: every encoder Linear's weight becomes int8 per output channel
  (torchao `Int8DynamicActivationInt8WeightConfig`), activations are quantized per token at
  run time; embeddings, LayerNorms and the tied MLM decoder stay fp32.
- Q8BERT-style quantization-aware fine-tuning: fake-quantized int8 weights (symmetric, per
  channel) and activations (asymmetric, per token) in every encoder Linear, gradients passed
  straight through the rounding (torchao QAT `prepare`); then `convert` to the same int8
  model as above.

A quantized model is saved as `quantized.pt` (its state_dict with torchao's tensor
subclasses, loadable with `weights_only=True`) beside config.json and the tokenizer files,
and as `encoder.pt2`, a `torch.export` program of the base encoder (ids, types, mask ->
last hidden state) that runs with torch and torchao only, without this project.
"""

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import Tensor, nn

from pretrain.errors import ConfigError
from pretrain.export.hf import import_torchao

QUANTIZED_STATE = "quantized.pt"
PROGRAM = "encoder.pt2"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def quantizable(module: nn.Module, name: str) -> bool:
    """torchao's filter: the Linear layers of the encoder (not the MLM decoder, whose weight
    is the word embeddings)."""
    return isinstance(module, nn.Linear) and "decoder" not in name


def load_hf_masked_lm(hf_dir: str | Path) -> nn.Module:
    """`AutoModelForMaskedLM.from_pretrained(hf_dir)` (local files only), in eval mode."""
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    if not (Path(hf_dir) / "config.json").is_file():
        raise ConfigError(
            f"{hf_dir}: not a Hugging Face directory (no config.json); export the checkpoint "
            "with pretrain-export or give the output of another pretrain-compress method"
        )
    return AutoModelForMaskedLM.from_pretrained(str(hf_dir), local_files_only=True).eval()


def quantize_dynamic_int8(model: nn.Module) -> nn.Module:
    """Replace, in place, the weight of every `quantizable` Linear by an int8 tensor
    (per-channel scales) with per-token dynamic int8 activations; returns `model`."""
    import_torchao()
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(model, Int8DynamicActivationInt8WeightConfig(), filter_fn=quantizable)
    return model


def prepare_qat(model: nn.Module) -> nn.Module:
    """Insert Q8BERT's fake quantizers in place: int8 symmetric per-channel weights, int8
    asymmetric per-token activations, straight-through gradients; returns `model`."""
    import_torchao()
    from torchao.quantization import quantize_
    from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

    activations = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    weights = IntxFakeQuantizeConfig(torch.int8, "per_channel")
    config = QATConfig(activation_config=activations, weight_config=weights, step="prepare")
    quantize_(model, config, filter_fn=quantizable)
    return model


def convert_qat(model: nn.Module) -> nn.Module:
    """The fake-quantized model of `prepare_qat` -> the int8 model of `quantize_dynamic_int8`."""
    import_torchao()
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    from torchao.quantization.qat import QATConfig

    config = QATConfig(Int8DynamicActivationInt8WeightConfig(), step="convert")
    quantize_(model, config, filter_fn=quantizable)
    return model


def qat_finetune(
    model: nn.Module, batches: Iterable[dict[str, Tensor]], steps: int, lr: float
) -> list[float]:
    """Quantization-aware fine-tuning of a Hugging Face *ForMaskedLM `model` on MLM batches
    (input_ids, token_type_ids, attention_mask, labels), `steps` AdamW steps at `lr`; returns
    the per-step losses. Call `prepare_qat` before and `convert_qat` after."""
    from pretrain.compress.tinybert import cycled

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _, batch in zip(range(steps), cycled(batches), strict=False):
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def example_inputs(vocab_size: int, batch: int = 2, seq_len: int = 16) -> tuple[Tensor, ...]:
    """(input_ids, token_type_ids, attention_mask), each (batch, seq_len) int64, for tracing."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (batch, seq_len), generator=generator)
    return ids, torch.zeros_like(ids), torch.ones_like(ids)


class LastHiddenState(nn.Module):
    """A Hugging Face base model as (ids, types, mask) -> (batch, seq, hidden) tensor."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.base(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).last_hidden_state


def export_program(model: nn.Module, path: Path, max_seq_length: int) -> Path:
    """`torch.export` the base encoder of a (quantized) *ForMaskedLM `model` with dynamic
    batch and sequence sizes (sequences up to `max_seq_length` tokens) and save it to
    `path`; returns `path`. Load it with `torch.export.load(path).module()` after
    `import torchao` (its int8 operators)."""
    from torch.export import Dim

    wrapped = LastHiddenState(model.base_model).eval()
    inputs = example_inputs(model.config.vocab_size)
    batch, seq = Dim("batch", min=1, max=1024), Dim("seq", min=2, max=max_seq_length)
    shapes = {
        name: {0: batch, 1: seq} for name in ("input_ids", "token_type_ids", "attention_mask")
    }
    with torch.no_grad():
        program = torch.export.export(wrapped, inputs, dynamic_shapes=shapes)
    torch.export.save(program, path)
    return path


def save_quantized(
    model: nn.Module,
    source_dir: Path,
    out_dir: Path,
    max_seq_length: int,
    extra: dict | None = None,
) -> Path:
    """Write `out_dir`: config.json (with a `quantization` entry and `extra`), the tokenizer
    files of `source_dir`, `quantized.pt` (the state_dict) and `encoder.pt2`; returns it."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    config = json.loads((source_dir / "config.json").read_text())
    config["quantization"] = {
        "library": "torchao",
        "weights": "int8 per channel",
        "activations": "int8 per token, dynamic",
        **(extra or {}),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (source_dir / name).is_file():
            shutil.copy2(source_dir / name, out_dir / name)
    torch.save(model.state_dict(), out_dir / QUANTIZED_STATE)
    export_program(model, out_dir / PROGRAM, config.get("max_position_embeddings", 512))
    return out_dir


def load_quantized(directory: str | Path) -> nn.Module:
    """The int8 *ForMaskedLM model saved by `save_quantized` (weights_only load), eval mode."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    directory = Path(directory)
    state = directory / QUANTIZED_STATE
    if not state.is_file():
        raise ConfigError(f"{state}: not found; quantize with `pretrain-compress method=quantize`")
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    model = quantize_dynamic_int8(AutoModelForMaskedLM.from_config(config).eval())
    model.load_state_dict(torch.load(state, weights_only=True, map_location="cpu"), assign=True)
    return model.eval()


def is_quantized(directory: str | Path) -> bool:
    """Whether `directory` holds a `save_quantized` model."""
    return (Path(directory) / QUANTIZED_STATE).is_file()


def max_abs_difference(
    reference: Callable[..., Tensor], other: Callable[..., Tensor], inputs: tuple[Tensor, ...]
) -> float:
    """max |reference(*inputs) - other(*inputs)| over every element, without gradients."""
    with torch.no_grad():
        return float((reference(*inputs) - other(*inputs)).abs().max())
