"""Export a BERT checkpoint of `pretrain` to a Hugging Face `BertForPreTraining` directory.

The directory holds config.json (written here as a plain dict, so `transformers` is not
needed to export), model.safetensors and the run's tokenizer files, and loads with
`transformers.AutoModel*.from_pretrained` / `AutoTokenizer.from_pretrained`.
"""

import json
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from pretrain.config import ModelConfig
from pretrain.export.checkpoint import ExportError, read_checkpoint
from pretrain.export.output_dir import copy_tokenizer_files, write_directory

PREFIXES = ("encoder.", "mlm_head.", "nsp_head.")

# Our parameter names (without the `encoder.`/`mlm_head.`/`nsp_head.` module prefix of the
# checkpoint, which is part of the pattern) -> HF BertForPreTraining names.
RENAMES = [
    (
        r"encoder\.embeddings\.(word|position|token_type)_embeddings\.weight",
        r"bert.embeddings.\1_embeddings.weight",
    ),
    (r"encoder\.embeddings\.norm\.(weight|bias)", r"bert.embeddings.LayerNorm.\1"),
    (
        r"encoder\.layers\.(\d+)\.attention\.output\.(weight|bias)",
        r"bert.encoder.layer.\1.attention.output.dense.\2",
    ),
    (
        r"encoder\.layers\.(\d+)\.attention_norm\.(weight|bias)",
        r"bert.encoder.layer.\1.attention.output.LayerNorm.\2",
    ),
    (
        r"encoder\.layers\.(\d+)\.intermediate\.(weight|bias)",
        r"bert.encoder.layer.\1.intermediate.dense.\2",
    ),
    (r"encoder\.layers\.(\d+)\.output\.(weight|bias)", r"bert.encoder.layer.\1.output.dense.\2"),
    (
        r"encoder\.layers\.(\d+)\.output_norm\.(weight|bias)",
        r"bert.encoder.layer.\1.output.LayerNorm.\2",
    ),
    (r"mlm_head\.dense\.(weight|bias)", r"cls.predictions.transform.dense.\1"),
    (r"mlm_head\.norm\.(weight|bias)", r"cls.predictions.transform.LayerNorm.\1"),
    (r"mlm_head\.bias", r"cls.predictions.bias"),
    (r"nsp_head\.pooler\.(weight|bias)", r"bert.pooler.dense.\1"),
    (r"nsp_head\.classifier\.(weight|bias)", r"cls.seq_relationship.\1"),
]
FUSED_QKV = re.compile(r"encoder\.layers\.(\d+)\.attention\.qkv\.(weight|bias)")
TIED_DECODER = "mlm_head.decoder.weight"
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"


def _hf_name(key: str) -> str | None:
    for pattern, replacement in RENAMES:
        if re.fullmatch(pattern, key):
            return re.sub(pattern, replacement, key)
    return None


def bert_to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's BertEncoder/MaskedLMHead/NextSentenceHead weights to HF's names.

    Keys outside `encoder.`, `mlm_head.` and `nsp_head.` are ignored; an unknown key inside them
    raises ValueError. The fused qkv projection is split into query/key/value; the MLM decoder
    weight (tied to the word embeddings) and bias are written under both of HF's tied names
    (`cls.predictions.decoder.*`, `cls.predictions.bias`). Returns contiguous, unshared tensors.
    """
    hf: dict[str, torch.Tensor] = {}
    # torch.compile wraps modules as `_orig_mod`; its keys name the same weights.
    state_dict = {key.replace("_orig_mod.", ""): value for key, value in state_dict.items()}
    for key, tensor in state_dict.items():
        if not key.startswith(PREFIXES):
            continue
        if key == TIED_DECODER:
            embeddings = state_dict.get(WORD_EMBEDDINGS)
            if embeddings is not None and not torch.equal(tensor, embeddings):
                raise ValueError(
                    f"{TIED_DECODER} differs from {WORD_EMBEDDINGS}; BERT ties them, cannot export"
                )
            continue
        fused = FUSED_QKV.fullmatch(key)
        if fused:
            layer, kind = fused.groups()
            for part, name in zip(tensor.chunk(3, dim=0), ("query", "key", "value"), strict=True):
                hf[f"bert.encoder.layer.{layer}.attention.self.{name}.{kind}"] = part
            continue
        name = _hf_name(key)
        if name is None:
            raise ValueError(
                f"state_dict key {key!r} has no Hugging Face BERT counterpart; cannot export it"
            )
        hf[name] = tensor
    if "bert.embeddings.word_embeddings.weight" not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not a BertEncoder checkpoint")
    if "cls.predictions.bias" in hf:
        hf["cls.predictions.decoder.weight"] = hf["bert.embeddings.word_embeddings.weight"]
        hf["cls.predictions.decoder.bias"] = hf["cls.predictions.bias"]
    # safetensors refuses shared or strided storage: give every name its own contiguous copy.
    return {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in hf.items()}


def architecture(hf_state_dict: Mapping[str, torch.Tensor]) -> str:
    """The HF class that the exported weights fill: BertForPreTraining, BertForMaskedLM or BertModel."""
    has_mlm = "cls.predictions.bias" in hf_state_dict
    has_nsp = "cls.seq_relationship.weight" in hf_state_dict
    if has_mlm and has_nsp:
        return "BertForPreTraining"
    return "BertForMaskedLM" if has_mlm else "BertModel"


# BertEncoder's settings carry BertConfig's names: all of ModelConfig but its name and target.
SIZE_KEYS = tuple(f.name for f in fields(ModelConfig) if f.name not in ("name", "_target_"))


def hf_config(
    model_cfg: Mapping[str, Any],
    vocab_size: int,
    pad_token_id: int,
    architectures: tuple[str, ...] = ("BertForPreTraining",),
) -> dict[str, Any]:
    """The config.json dict of `transformers.BertConfig` for our `model` config group."""
    missing = [key for key in SIZE_KEYS if key not in model_cfg]
    if missing:
        raise ExportError(f"config.model lacks the key {missing[0]!r}, needed for config.json")
    sizes = {key: model_cfg[key] for key in SIZE_KEYS}
    return {
        "architectures": list(architectures),
        "model_type": "bert",
        "vocab_size": int(vocab_size),
        "pad_token_id": int(pad_token_id),
        **sizes,
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
        "classifier_dropout": None,
        "tie_word_embeddings": True,
        "is_decoder": False,
        "add_cross_attention": False,
        "use_cache": False,
    }


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write the HF directory for a `pretrain` checkpoint; returns the directory's path.

    Writes config.json, model.safetensors (weights in the checkpoint's dtype) and the files of
    `config.data.tokenizer_dir`. A non-empty `out_dir` is replaced only with `overwrite`.
    """
    state_dict, config = read_checkpoint(ckpt_path)
    try:
        weights = bert_to_hf_state_dict(state_dict)
    except ValueError as error:
        raise ExportError(f"{ckpt_path}: {error}") from error
    runtime = config["model_runtime"]
    model_config = hf_config(
        config["model"], runtime["vocab_size"], runtime["pad_token_id"], (architecture(weights),)
    )
    embeddings = weights["bert.embeddings.word_embeddings.weight"]
    if embeddings.shape[0] != model_config["vocab_size"]:
        raise ExportError(
            f"{ckpt_path}: config.model_runtime.vocab_size is {model_config['vocab_size']} but the word "
            f"embeddings have {embeddings.shape[0]} rows"
        )
    model_config["dtype"] = str(embeddings.dtype).removeprefix("torch.")
    tokenizer_dir = Path(config["data"]["tokenizer_dir"])

    def fill(directory: Path) -> None:
        (directory / "config.json").write_text(json.dumps(model_config, indent=2) + "\n")
        save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
        copy_tokenizer_files(tokenizer_dir, directory)

    return write_directory(out_dir, fill, overwrite=overwrite, keep=(ckpt_path, tokenizer_dir))
