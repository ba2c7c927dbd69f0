"""int8 quantization of an exported BERT, shipped as a TorchScript file torch alone loads.

- post-training dynamic int8: every `quantizable` Linear (all but the tied MLM decoder)
  becomes torch's dynamic int8 Linear
  (`torch.ao.quantization.quantize_dynamic`, per-channel int8 weights prepacked for
  fbgemm/oneDNN, activations quantized per batch at run time); embeddings, LayerNorms and the
  tied MLM decoder stay fp32. torchao's int8 (`Int8DynamicActivationInt8WeightConfig`) ran at
  0.28-0.49x the fp32 speed on this project's CPU and saves only as torchao tensor subclasses;
  torch's own ran 1.05-1.23x faster than fp32 and saves as TorchScript.
- Q8BERT-style quantization-aware fine-tuning: fake-quantized int8 weights (symmetric, per
  channel) and activations (asymmetric, per token) in every encoder Linear, gradients passed
  straight through the rounding (torchao QAT `prepare`); then the fake quantizers are removed
  (torchao QAT `convert` without a base config) and the fine-tuned weights quantized as above.

A quantized model is saved as `model.ts` (pretrain.compress.artifacts: the whole masked-LM
model, ids, types, mask -> logits, plus a `hidden_states` method) beside config.json (with a
`quantization` entry) and the tokenizer files: `torch.jit.load("model.ts")` runs it with torch
only.
"""

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import Tensor, nn

from pretrain.compress.artifacts import TORCHSCRIPT, save_torchscript
from pretrain.errors import ConfigError
from pretrain.export.hf import import_torchao

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def quantizable(module: nn.Module, name: str) -> bool:
    """The Linear layers made int8: every one but the MLM decoder, whose weight is the word
    embeddings (the encoder's and the MLM head's transform)."""
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
    """Replace, in place, every `quantizable` Linear of `model` by torch's dynamic int8 Linear
    (per-channel weights); returns `model`."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {
        name: per_channel_dynamic_qconfig
        for name, module in model.named_modules()
        if quantizable(module, name)
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
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
    """The fake-quantized model of `prepare_qat` -> the int8 model of `quantize_dynamic_int8`
    (torchao's fake quantizers removed, the fine-tuned weights quantized by torch)."""
    import_torchao()
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig

    quantize_(model, QATConfig(step="convert"), filter_fn=quantizable)
    return quantize_dynamic_int8(model)


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


def save_quantized(
    model: nn.Module, source_dir: Path, out_dir: Path, extra: dict | None = None
) -> Path:
    """Write `out_dir`: config.json (with a `quantization` entry and `extra`), the tokenizer
    files of `source_dir` and `model.ts`, the TorchScript of the int8 `model`; returns it."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    config = json.loads((source_dir / "config.json").read_text())
    config["quantization"] = {
        "library": "torch.ao.quantization.quantize_dynamic",
        "weights": "int8 per channel",
        "activations": "int8 per batch, dynamic",
        "file": f"{TORCHSCRIPT}: torch.jit.load(path)(input_ids, token_type_ids, attention_mask)"
        " -> MLM logits",
        **(extra or {}),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (source_dir / name).is_file():
            shutil.copy2(source_dir / name, out_dir / name)
    save_torchscript(model, out_dir / TORCHSCRIPT, config["vocab_size"])
    return out_dir


def load_quantized(directory: str | Path) -> torch.jit.ScriptModule:
    """The int8 model saved by `save_quantized`: (ids, types, mask) -> logits, with a
    `hidden_states` method, in eval mode."""
    path = Path(directory) / TORCHSCRIPT
    if not path.is_file():
        raise ConfigError(f"{path}: not found; quantize with `pretrain-compress method=int8`")
    return torch.jit.load(str(path)).eval()


def is_quantized(directory: str | Path) -> bool:
    """Whether `directory` holds a `save_quantized` model."""
    return (Path(directory) / TORCHSCRIPT).is_file()


def max_abs_difference(
    reference: Callable[..., Tensor], other: Callable[..., Tensor], inputs: tuple[Tensor, ...]
) -> float:
    """max |reference(*inputs) - other(*inputs)| over every element, without gradients."""
    with torch.no_grad():
        return float((reference(*inputs) - other(*inputs)).abs().max())
