"""ALBERT weights <-> Hugging Face `AlbertForPreTraining` / `AlbertForMaskedLM` / `AlbertModel`.

HF's ALBERT shares layers by groups: `num_hidden_groups` blocks of consecutive layers, each
group one set of weights. `share_layers=all` is one group, `none` one group per layer; the
attention-only and feed-forward-only sharing of our encoder have no HF counterpart and are
refused with an ExportError. The fused qkv projection is split into query/key/value.
"""

from collections.abc import Mapping
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

ENCODER = "pretrain.models.albert.AlbertEncoder"
SIZE_KEYS = (
    "embedding_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "layer_norm_eps",
    "initializer_range",
)
GROUP = r"albert.encoder.albert_layer_groups.\1.albert_layers.0."
# Our names (with the checkpoint's module prefix; a block index where there is one) -> HF
# AlbertForPreTraining names.
RENAMES = [
    (
        r"encoder\.embeddings\.(word|position|token_type)_embeddings\.weight",
        r"albert.embeddings.\1_embeddings.weight",
    ),
    (r"encoder\.embeddings\.norm\.(weight|bias)", r"albert.embeddings.LayerNorm.\1"),
    (
        r"encoder\.embedding_projection\.(weight|bias)",
        r"albert.encoder.embedding_hidden_mapping_in.\1",
    ),
    (
        r"encoder\.attention_blocks\.(\d+)\.attention\.output\.(weight|bias)",
        GROUP + r"attention.dense.\2",
    ),
    (r"encoder\.attention_blocks\.(\d+)\.norm\.(weight|bias)", GROUP + r"attention.LayerNorm.\2"),
    (r"encoder\.ffn_blocks\.(\d+)\.intermediate\.(weight|bias)", GROUP + r"ffn.\2"),
    (r"encoder\.ffn_blocks\.(\d+)\.output\.(weight|bias)", GROUP + r"ffn_output.\2"),
    (r"encoder\.ffn_blocks\.(\d+)\.norm\.(weight|bias)", GROUP + r"full_layer_layer_norm.\2"),
    (r"mlm_head\.dense\.(weight|bias)", r"predictions.dense.\1"),
    (r"mlm_head\.norm\.(weight|bias)", r"predictions.LayerNorm.\1"),
    (r"mlm_head\.bias", r"predictions.bias"),
    (r"sentence_head\.pooler\.(weight|bias)", r"albert.pooler.\1"),
    (r"sentence_head\.classifier\.(weight|bias)", r"sop_classifier.classifier.\1"),
]
INVERSE_RENAMES = invert(RENAMES)
QKV = FusedQKV(
    "encoder.attention_blocks.{layer}.attention.qkv.{kind}",
    "albert.encoder.albert_layer_groups.{layer}.albert_layers.0.attention.{part}.{kind}",
)
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"
TIED_DECODER = "mlm_head.decoder.weight"
PREFIXES = ("encoder.", "mlm_head.", "sentence_head.")


def num_hidden_groups(model_cfg: Mapping[str, Any]) -> int:
    """HF's `num_hidden_groups` for our `share_layers`; ExportError for partial sharing."""
    share = model_cfg.get("share_layers", "all")
    if share == "all":
        return 1
    if share == "none":
        return int(model_cfg["num_hidden_layers"])
    raise ExportError(
        f"model.share_layers = {share!r}: Hugging Face's ALBERT shares whole layers only "
        "(groups of layers), so attention-only or feed-forward-only sharing cannot be exported; "
        "train with model.share_layers=all or none to export"
    )


def albert_to_hf_state_dict(
    state_dict: Mapping[str, torch.Tensor], model_cfg: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's AlbertEncoder/MaskedLMHead/NextSentenceHead weights to HF's
    names (keys outside `encoder.`, `mlm_head.`, `sentence_head.` are ignored; an unknown key
    inside them raises ValueError). Returns contiguous, unshared tensors."""
    num_hidden_groups(model_cfg)
    state_dict = exported_heads(without_compile_prefix(state_dict))
    check_tied(state_dict, TIED_DECODER, WORD_EMBEDDINGS, "cannot export")
    hf = to_hf_names(
        state_dict,
        RENAMES,
        PREFIXES,
        "state_dict key {key!r} has no Hugging Face ALBERT counterpart",
        QKV,
        skip=(TIED_DECODER,),
    )
    if "albert.embeddings.word_embeddings.weight" not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not an AlbertEncoder checkpoint")
    if "predictions.bias" in hf:
        hf["predictions.decoder.weight"] = hf["albert.embeddings.word_embeddings.weight"]
        hf["predictions.decoder.bias"] = hf["predictions.bias"]
    return cpu_copies(hf)


def architecture(hf_state_dict: Mapping[str, torch.Tensor]) -> str:
    """AlbertForPreTraining (MLM + sentence order), AlbertForMaskedLM or AlbertModel."""
    has_mlm = "predictions.bias" in hf_state_dict
    if has_mlm and "sop_classifier.classifier.weight" in hf_state_dict:
        return "AlbertForPreTraining"
    return "AlbertForMaskedLM" if has_mlm else "AlbertModel"


def hf_config(
    model_cfg: Mapping[str, Any], vocab_size: int, pad_token_id: int, architectures: tuple[str, ...]
) -> dict[str, Any]:
    """The config.json dict of `transformers.AlbertConfig` for our `model` config group."""
    require_model_keys(model_cfg, SIZE_KEYS)
    return {
        "architectures": list(architectures),
        "model_type": "albert",
        "vocab_size": int(vocab_size),
        "pad_token_id": int(pad_token_id),
        **{key: model_cfg[key] for key in SIZE_KEYS},
        "num_hidden_groups": num_hidden_groups(model_cfg),
        "inner_group_num": 1,
        "classifier_dropout_prob": 0.1,
        "tie_word_embeddings": True,
    }


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's ALBERT weights and run config -> the Hugging Face ALBERT model."""
    weights = albert_to_hf_state_dict(state_dict, config["model"])
    runtime = config["model_runtime"]
    model_config = hf_config(
        config["model"], runtime["vocab_size"], runtime["pad_token_id"], (architecture(weights),)
    )
    return HFModel(model_config, weights)


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face ALBERT model -> (our `model` config group, state_dict under our names).
    The inverse of `to_hf`; ExportError for groups of several layers or inner groups."""
    config = hf_model.config
    require_hf_keys(config, SIZE_KEYS, "an ALBERT")
    layers, groups = config["num_hidden_layers"], config.get("num_hidden_groups", 1)
    if config.get("inner_group_num", 1) != 1 or groups not in (1, layers):
        raise ExportError(
            f"config.json has num_hidden_groups={groups}, inner_group_num="
            f"{config.get('inner_group_num', 1)}: only one group (all layers shared) or one per "
            "layer with one inner layer can be imported"
        )
    model_cfg = {
        "name": "albert_imported",
        "_target_": ENCODER,
        **{key: config[key] for key in SIZE_KEYS},
        "share_layers": "all" if groups == 1 else "none",
    }
    ours = renamed(hf_model.weights, INVERSE_RENAMES)
    ours.update(QKV.join(hf_model.weights))
    if WORD_EMBEDDINGS not in ours:
        raise ExportError("the weights lack albert.embeddings.word_embeddings.weight")
    if "mlm_head.bias" in ours:
        ours[TIED_DECODER] = ours[WORD_EMBEDDINGS]
    return model_cfg, ours
