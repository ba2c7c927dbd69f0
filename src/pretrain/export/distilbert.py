"""DistilBERT weights <-> Hugging Face `DistilBertForMaskedLM` / `DistilBertModel`.

Our DistilBertEncoder uses BERT's module names and config keys; Hugging Face's DistilBERT
has its own (`transformer.layer.N.attention.q_lin`, `dim`, `n_layers` ...). The fused qkv
projection is split into q_lin/k_lin/v_lin; the MLM decoder (`vocab_projector`) is tied to
the word embeddings and keeps its own bias.
"""

from collections.abc import Mapping
from typing import Any

import torch

from pretrain.export.bert import TIED_DECODER, WORD_EMBEDDINGS
from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel
from pretrain.export.naming import (
    SENTENCE_HEAD,
    FusedQKV,
    cpu_copies,
    exported_heads,
    invert,
    renamed,
    require_hf_keys,
    require_model_keys,
    to_hf_names,
    without_compile_prefix,
)
from pretrain.models.configs import DISTILBERT_LAYER_NORM_EPS

PREFIXES = ("encoder.", "mlm_head.", "sentence_head.")
LAYER = "distilbert.transformer.layer"
# Our parameter names (with the checkpoint's module prefix) -> HF DistilBertForMaskedLM names.
RENAMES = [
    (
        r"encoder\.embeddings\.(word|position)_embeddings\.weight",
        r"distilbert.embeddings.\1_embeddings.weight",
    ),
    (r"encoder\.embeddings\.norm\.(weight|bias)", r"distilbert.embeddings.LayerNorm.\1"),
    (
        r"encoder\.layers\.(\d+)\.attention\.output\.(weight|bias)",
        LAYER + r".\1.attention.out_lin.\2",
    ),
    (r"encoder\.layers\.(\d+)\.attention_norm\.(weight|bias)", LAYER + r".\1.sa_layer_norm.\2"),
    (r"encoder\.layers\.(\d+)\.intermediate\.(weight|bias)", LAYER + r".\1.ffn.lin1.\2"),
    (r"encoder\.layers\.(\d+)\.output\.(weight|bias)", LAYER + r".\1.ffn.lin2.\2"),
    (r"encoder\.layers\.(\d+)\.output_norm\.(weight|bias)", LAYER + r".\1.output_layer_norm.\2"),
    (r"mlm_head\.dense\.(weight|bias)", r"vocab_transform.\1"),
    (r"mlm_head\.norm\.(weight|bias)", r"vocab_layer_norm.\1"),
    (r"mlm_head\.bias", r"vocab_projector.bias"),
]
INVERSE_RENAMES = invert(RENAMES)
QKV = FusedQKV(
    "encoder.layers.{layer}.attention.qkv.{kind}",
    LAYER + ".{layer}.attention.{part}_lin.{kind}",
    parts=("q", "k", "v"),
)
HF_WORD_EMBEDDINGS = "distilbert.embeddings.word_embeddings.weight"
# Our config key -> DistilBertConfig's.
CONFIG_KEYS = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim",
    "max_position_embeddings": "max_position_embeddings",
    "hidden_dropout_prob": "dropout",
    "attention_probs_dropout_prob": "attention_dropout",
    "initializer_range": "initializer_range",
}


def distilbert_to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's DistilBertEncoder/MaskedLMHead weights to HF DistilBERT's names.

    Keys outside `encoder.`/`mlm_head.` are ignored; an NSP head or an unknown key raises
    ValueError. Returns contiguous, unshared CPU tensors (the tied decoder weight included).
    """
    state_dict = exported_heads(without_compile_prefix(state_dict))
    pair_heads = [key for key in state_dict if key.startswith(SENTENCE_HEAD)]
    if pair_heads:
        raise ValueError(
            f"the checkpoint has a sentence-pair head ({pair_heads[0]}) but DistilBERT has none; "
            "train with objective.pair_task=none"
        )
    hf = to_hf_names(
        state_dict,
        RENAMES,
        PREFIXES,
        "state_dict key {key!r} has no Hugging Face DistilBERT counterpart; is "
        "model._target_ pretrain.models.distilbert.DistilBertEncoder?",
        QKV,
        skip=(TIED_DECODER,),
    )
    if HF_WORD_EMBEDDINGS not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not a DistilBertEncoder checkpoint")
    if "vocab_projector.bias" in hf:
        hf["vocab_projector.weight"] = hf[HF_WORD_EMBEDDINGS]
    return cpu_copies(hf)


def hf_config(
    model_cfg: Mapping[str, Any], vocab_size: int, pad_token_id: int, architecture: str
) -> dict[str, Any]:
    """The config.json dict of `transformers.DistilBertConfig` for our `model` config group."""
    require_model_keys(model_cfg, CONFIG_KEYS)
    if model_cfg.get("layer_norm_eps", DISTILBERT_LAYER_NORM_EPS) != DISTILBERT_LAYER_NORM_EPS:
        raise ValueError(
            f"model.layer_norm_eps = {model_cfg['layer_norm_eps']}: Hugging Face DistilBERT fixes 1e-12"
        )
    return {
        "architectures": [architecture],
        "model_type": "distilbert",
        "vocab_size": int(vocab_size),
        "pad_token_id": int(pad_token_id),
        **{hf_key: model_cfg[key] for key, hf_key in CONFIG_KEYS.items()},
        "activation": "gelu",
        "sinusoidal_pos_embds": False,
        "tie_word_embeddings": True,
    }


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's DistilBERT weights and run config -> Hugging Face `DistilBertForMaskedLM`
    (or `DistilBertModel` without an MLM head)."""
    weights = distilbert_to_hf_state_dict(state_dict)
    architecture = (
        "DistilBertForMaskedLM" if "vocab_projector.bias" in weights else "DistilBertModel"
    )
    runtime = config["model_runtime"]
    model_config = hf_config(
        config["model"], runtime["vocab_size"], runtime["pad_token_id"], architecture
    )
    return HFModel(model_config, weights)


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face DistilBERT -> (our `model` config group, state_dict under our names:
    `encoder.*`, plus `mlm_head.*` for DistilBertForMaskedLM). The inverse of `to_hf`."""
    config = hf_model.config
    require_hf_keys(config, CONFIG_KEYS.values(), "a DistilBERT")
    if config.get("activation", "gelu") != "gelu" or config.get("sinusoidal_pos_embds", False):
        raise ExportError(
            "config.json: only DistilBERT with activation 'gelu' and learned positions "
            "(sinusoidal_pos_embds false) can be imported"
        )
    model_cfg = {
        "name": "distilbert_imported",
        "_target_": "pretrain.models.distilbert.DistilBertEncoder",
        **{key: config[hf_key] for key, hf_key in CONFIG_KEYS.items()},
        "layer_norm_eps": DISTILBERT_LAYER_NORM_EPS,
    }
    ours = renamed(hf_model.weights, INVERSE_RENAMES)
    ours.update(QKV.join(hf_model.weights))
    if WORD_EMBEDDINGS not in ours:
        raise ExportError(f"the weights lack {HF_WORD_EMBEDDINGS}: not a DistilBERT model")
    if "mlm_head.bias" in ours:
        ours[TIED_DECODER] = ours[WORD_EMBEDDINGS]
    return model_cfg, ours
