"""BERT weights <-> Hugging Face `BertForPreTraining` / `BertForMaskedLM` / `BertModel`.

`to_hf` renames a checkpoint's weights and writes BertConfig as a plain dict (so `transformers`
is not needed to export); `from_hf` is its inverse, for initialising from a HF directory.
"""

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch

from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel
from pretrain.models.bert import BertEncoderConfig

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


# BertEncoder's settings carry BertConfig's names: all of BertEncoderConfig but those of ModelConfig.
SIZE_KEYS = tuple(
    f.name
    for f in fields(BertEncoderConfig)
    if f.name not in ("name", "_target_", "reference_vocab_size")
)


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


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's BERT weights and run config -> the Hugging Face BERT model they make
    (BertForPreTraining, BertForMaskedLM or BertModel, by the heads present)."""
    weights = bert_to_hf_state_dict(state_dict)
    runtime = config["model_runtime"]
    model_config = hf_config(
        config["model"], runtime["vocab_size"], runtime["pad_token_id"], (architecture(weights),)
    )
    return HFModel(model_config, weights)


def _inverse(pattern: str, replacement: str) -> tuple[str, str]:
    """Swap a (our regex, HF replacement) rule into (HF regex, our replacement)."""
    groups = iter(re.findall(r"\(.*?\)", pattern))
    hf_pattern = re.sub(r"\\(\d)", lambda _: next(groups), re.escape(replacement))
    hf_pattern = hf_pattern.replace(r"\(", "(").replace(r"\)", ")").replace(r"\|", "|")
    hf_pattern = hf_pattern.replace(r"\\d\+", r"\d+")
    count = iter(range(1, 10))
    ours = re.sub(r"\(.*?\)", lambda _: f"\\{next(count)}", pattern).replace("\\.", ".")
    return hf_pattern, ours


INVERSE_RENAMES = [_inverse(pattern, replacement) for pattern, replacement in RENAMES]
HF_QKV = re.compile(
    r"bert\.encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)"
)


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face BERT model -> (our `model` config group, state_dict under our names:
    `encoder.*`, plus `mlm_head.*` / `nsp_head.*` when the model has those heads).
    The inverse of `to_hf`: export -> import -> export gives the same weights and config."""
    missing = [key for key in SIZE_KEYS if key not in hf_model.config]
    if missing:
        raise ExportError(f"config.json lacks {missing[0]!r}: not a BERT config")
    model_cfg = {
        "name": "bert_imported",
        "_target_": "pretrain.models.bert.BertEncoder",
        **{key: hf_model.config[key] for key in SIZE_KEYS},
    }
    ours: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, tensor in hf_model.weights.items():
        fused = HF_QKV.fullmatch(name)
        if fused:
            layer, part, kind = fused.groups()
            qkv.setdefault((layer, kind), {})[part] = tensor
            continue
        for pattern, replacement in INVERSE_RENAMES:
            if re.fullmatch(pattern, name):
                ours[re.sub(pattern, replacement, name)] = tensor
                break
    for (layer, kind), parts in qkv.items():
        ours[f"encoder.layers.{layer}.attention.qkv.{kind}"] = torch.cat(
            [parts["query"], parts["key"], parts["value"]], dim=0
        )
    if WORD_EMBEDDINGS not in ours:
        raise ExportError(
            "the weights lack bert.embeddings.word_embeddings.weight: not a BERT model"
        )
    if "mlm_head.bias" in ours:
        ours[TIED_DECODER] = ours[WORD_EMBEDDINGS]
    return model_cfg, ours
