"""BERT weights <-> Hugging Face `BertForPreTraining` / `BertForMaskedLM` / `BertModel`.

`to_hf` renames a checkpoint's weights and writes BertConfig as a plain dict (so `transformers`
is not needed to export); `from_hf` is its inverse, for initialising from a HF directory.
"""

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch

from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel
from pretrain.export.naming import (
    FusedQKV,
    check_tied,
    cpu_copies,
    exported_heads,
    invert,
    renamed,
    require_hf_keys,
    require_model_keys,
    to_hf_names,
    without_compile_prefix,
)
from pretrain.models.build import DESCRIPTIVE_KEYS
from pretrain.models.configs import BertEncoderConfig

PREFIXES = ("encoder.", "mlm_head.", "sentence_head.")

# Our parameter names (with the checkpoint's `encoder.`/`mlm_head.`/`sentence_head.` prefix)
# -> HF BertForPreTraining names.
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
    (r"sentence_head\.pooler\.(weight|bias)", r"bert.pooler.dense.\1"),
    (r"sentence_head\.classifier\.(weight|bias)", r"cls.seq_relationship.\1"),
]
QKV = FusedQKV(
    "encoder.layers.{layer}.attention.qkv.{kind}",
    "bert.encoder.layer.{layer}.attention.self.{part}.{kind}",
)
INVERSE_RENAMES = invert(RENAMES)
TIED_DECODER = "mlm_head.decoder.weight"
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"


def bert_to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's BertEncoder/MaskedLMHead/NextSentenceHead weights to HF's names.

    Keys outside `encoder.`, `mlm_head.` and `sentence_head.` are ignored (a sentence head
    only when 2-way: `exported_heads`); an unknown key inside them raises ValueError. The fused qkv projection is split into query/key/value; the MLM decoder
    weight (tied to the word embeddings) and bias are written under both of HF's tied names
    (`cls.predictions.decoder.*`, `cls.predictions.bias`). Returns contiguous, unshared tensors.
    """
    state_dict = exported_heads(without_compile_prefix(state_dict))
    check_tied(state_dict, TIED_DECODER, WORD_EMBEDDINGS, "BERT ties them, cannot export")
    hf = to_hf_names(
        state_dict,
        RENAMES,
        PREFIXES,
        "state_dict key {key!r} has no Hugging Face BERT counterpart; cannot export it",
        QKV,
        skip=(TIED_DECODER,),
    )
    if "bert.embeddings.word_embeddings.weight" not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not a BertEncoder checkpoint")
    if "cls.predictions.bias" in hf:
        hf["cls.predictions.decoder.weight"] = hf["bert.embeddings.word_embeddings.weight"]
        hf["cls.predictions.decoder.bias"] = hf["cls.predictions.bias"]
    return cpu_copies(hf)


def architecture(hf_state_dict: Mapping[str, torch.Tensor]) -> str:
    """The HF class that the exported weights fill: BertForPreTraining, BertForMaskedLM or BertModel."""
    has_mlm = "cls.predictions.bias" in hf_state_dict
    has_nsp = "cls.seq_relationship.weight" in hf_state_dict
    if has_mlm and has_nsp:
        return "BertForPreTraining"
    return "BertForMaskedLM" if has_mlm else "BertModel"


# BertEncoder's settings carry BertConfig's names: all of BertEncoderConfig but those of ModelConfig.
SIZE_KEYS = tuple(
    f.name for f in fields(BertEncoderConfig) if f.name not in (*DESCRIPTIVE_KEYS, "_target_")
)


def hf_config(
    model_cfg: Mapping[str, Any],
    vocab_size: int,
    pad_token_id: int,
    architectures: tuple[str, ...] = ("BertForPreTraining",),
    model_type: str = "bert",
    size_keys: tuple[str, ...] = SIZE_KEYS,
) -> dict[str, Any]:
    """The config.json dict of `transformers.BertConfig` for our `model` config group; the
    families that share BERT's config (`model_type` roberta, electra) pass their own
    `size_keys`, the `model` keys copied as they are."""
    require_model_keys(model_cfg, size_keys)
    sizes = {key: model_cfg[key] for key in size_keys}
    return {
        "architectures": list(architectures),
        "model_type": model_type,
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


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face BERT model -> (our `model` config group, state_dict under our names:
    `encoder.*`, plus `mlm_head.*` / `sentence_head.*` when the model has those heads).
    The inverse of `to_hf`: export -> import -> export gives the same weights and config."""
    require_hf_keys(hf_model.config, SIZE_KEYS, "a BERT")
    model_cfg = {
        "name": "bert_imported",
        "_target_": "pretrain.models.bert.BertEncoder",
        **{key: hf_model.config[key] for key in SIZE_KEYS},
    }
    ours = renamed(hf_model.weights, INVERSE_RENAMES)
    ours.update(QKV.join(hf_model.weights))
    if WORD_EMBEDDINGS not in ours:
        raise ExportError(
            "the weights lack bert.embeddings.word_embeddings.weight: not a BERT model"
        )
    if "mlm_head.bias" in ours:
        ours[TIED_DECODER] = ours[WORD_EMBEDDINGS]
    return model_cfg, ours
