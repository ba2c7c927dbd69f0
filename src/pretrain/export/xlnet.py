"""XLNet weights <-> Hugging Face `XLNetLMHeadModel` (or `XLNetModel` without the LM bias).

Our encoder's names are HF's under `encoder.` instead of `transformer.`, except the
embeddings (`encoder.embeddings.word_embedding` / `.mask_emb`); the objective's
`lm_head.bias` is HF's `lm_loss.bias`, and `lm_loss.weight` is the tied word embedding.
`model.bi_data` is exported as trained (HF's XLNetConfig.bi_data gives the second half of a
batch backward positions, as our model does); load with `bi_data=False` to fine-tune, as
XLNet does (`pretrain.eval` does so).
"""

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch

from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel
from pretrain.export.naming import (
    cpu_copies,
    require_hf_keys,
    require_model_keys,
    without_compile_prefix,
)
from pretrain.models.build import DESCRIPTIVE_KEYS
from pretrain.models.configs import XLNetEncoderConfig

TARGET = "pretrain.models.xlnet.XLNetEncoder"
WORD_EMBEDDINGS = "encoder.embeddings.word_embedding.weight"
RENAMES = {  # ours -> HF, for the names that are not a plain prefix swap
    WORD_EMBEDDINGS: "transformer.word_embedding.weight",
    "encoder.embeddings.mask_emb": "transformer.mask_emb",
    "lm_head.bias": "lm_loss.bias",
}
INVERSE = {hf: ours for ours, hf in RENAMES.items()}
SIZE_KEYS = tuple(
    f.name
    for f in fields(XLNetEncoderConfig)
    if f.name not in (*DESCRIPTIVE_KEYS, "_target_", "bi_data")
)


def _hf_name(key: str) -> str | None:
    if key in RENAMES:
        return RENAMES[key]
    if key.startswith("encoder.layer."):
        return "transformer." + key.removeprefix("encoder.")
    return None


def hf_config(model_cfg: Mapping[str, Any], vocab_size: int, pad_token_id: int, arch: str) -> dict:
    """The config.json dict of `transformers.XLNetConfig` for our `model` config group."""
    require_model_keys(model_cfg, SIZE_KEYS)
    sizes = {key: model_cfg[key] for key in SIZE_KEYS}
    return {
        "architectures": [arch],
        "model_type": "xlnet",
        "vocab_size": int(vocab_size),
        "pad_token_id": int(pad_token_id),
        **sizes,
        "d_head": sizes["d_model"] // model_cfg["n_head"],
        "bi_data": bool(model_cfg.get("bi_data", False)),  # a config before it: off
        "same_length": False,
        "use_mems_eval": True,
        "use_mems_train": False,
        "tie_word_embeddings": True,
    }


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's XLNet weights and run config -> `XLNetLMHeadModel` (with the LM bias) or
    `XLNetModel`. Keys outside `encoder.` and `lm_head.` are ignored."""
    weights: dict[str, torch.Tensor] = {}
    for key, tensor in without_compile_prefix(state_dict).items():
        if not key.startswith(("encoder.", "lm_head.")):
            continue
        name = _hf_name(key)
        if name is None:
            raise ValueError(f"state_dict key {key!r} has no Hugging Face XLNet counterpart")
        weights[name] = tensor
    if RENAMES[WORD_EMBEDDINGS] not in weights:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not an XLNetEncoder checkpoint")
    arch = "XLNetModel"
    if "lm_loss.bias" in weights:
        arch = "XLNetLMHeadModel"
        weights["lm_loss.weight"] = weights[RENAMES[WORD_EMBEDDINGS]]
    else:  # XLNetModel's weights carry no `transformer.` prefix
        weights = {k.removeprefix("transformer."): v for k, v in weights.items()}
    runtime = config["model_runtime"]
    hf = hf_config(config["model"], runtime["vocab_size"], runtime["pad_token_id"], arch)
    return HFModel(hf, cpu_copies(weights))


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face XLNet model -> (our `model` config group, state_dict: `encoder.*` and,
    for XLNetLMHeadModel, `lm_head.bias`). The inverse of `to_hf`."""
    config = hf_model.config
    require_hf_keys(config, SIZE_KEYS, "an XLNet")
    if config.get("same_length") or config.get("attn_type") != "bi":
        raise ExportError("config.json: only attn_type='bi' and same_length=false")
    model_cfg = {"name": "xlnet_imported", "_target_": TARGET}
    model_cfg.update({key: config[key] for key in SIZE_KEYS})
    model_cfg["bi_data"] = bool(config.get("bi_data", False))
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in hf_model.weights.items():
        if name == "lm_loss.weight":
            continue  # tied to the word embedding
        full = name if name.startswith(("transformer.", "lm_loss.")) else "transformer." + name
        if full in INVERSE:
            ours[INVERSE[full]] = tensor
        elif full.startswith("transformer.layer."):
            ours["encoder." + full.removeprefix("transformer.")] = tensor
    if WORD_EMBEDDINGS not in ours:
        raise ExportError("the weights lack transformer.word_embedding.weight: not an XLNet model")
    return model_cfg, ours
