"""ModernBERT weights <-> Hugging Face `ModernBertForMaskedLM` / `ModernBertModel`.

`to_hf` renames a checkpoint's weights and writes ModernBertConfig as a plain dict (explicit
`layer_types` and `rope_parameters`, so `transformers` is not needed to export); `from_hf`
is its inverse, for `init_from` an exported (or published) ModernBERT directory. Settings
that ModernBertConfig cannot express (RMSNorm, no embedding norm: NeoBERT) are refused.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel
from pretrain.export.naming import (
    check_tied,
    cpu_copies,
    invert,
    renamed,
    require_hf_keys,
    require_model_keys,
    to_hf_names,
    without_compile_prefix,
)

PREFIXES = ("encoder.", "mlm_head.")
RENAMES = [
    (r"encoder\.embeddings\.word_embeddings\.weight", r"model.embeddings.tok_embeddings.weight"),
    (r"encoder\.embeddings\.norm\.weight", r"model.embeddings.norm.weight"),
    (r"encoder\.layers\.(\d+)\.attention_norm\.weight", r"model.layers.\1.attn_norm.weight"),
    (r"encoder\.layers\.(\d+)\.attention\.qkv\.weight", r"model.layers.\1.attn.Wqkv.weight"),
    (r"encoder\.layers\.(\d+)\.attention\.output\.weight", r"model.layers.\1.attn.Wo.weight"),
    (r"encoder\.layers\.(\d+)\.mlp_norm\.weight", r"model.layers.\1.mlp_norm.weight"),
    (r"encoder\.layers\.(\d+)\.mlp\.wi\.weight", r"model.layers.\1.mlp.Wi.weight"),
    (r"encoder\.layers\.(\d+)\.mlp\.wo\.weight", r"model.layers.\1.mlp.Wo.weight"),
    (r"encoder\.final_norm\.weight", r"model.final_norm.weight"),
    (r"mlm_head\.dense\.weight", r"head.dense.weight"),
    (r"mlm_head\.norm\.weight", r"head.norm.weight"),
    (r"mlm_head\.bias", r"decoder.bias"),
]
INVERSE_RENAMES = invert(RENAMES)
TIED_DECODER = "mlm_head.decoder.weight"
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"
HF_EMBEDDINGS = "model.embeddings.tok_embeddings.weight"

# our `model` keys that ModernBertConfig carries under the same name
SAME_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "hidden_activation",
    "norm_eps",
    "local_attention",
    "embedding_dropout",
    "attention_dropout",
    "mlp_dropout",
    "initializer_range",
    "initializer_cutoff_factor",
)
THETAS = (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta"))
# ModernBertConfig's switches and the value our model has for each
FIXED = {
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "classifier_bias": False,
    "decoder_bias": True,
    "classifier_activation": "gelu",
}


def layer_types(num_layers: int, every: int) -> list[str]:
    """HF's per-layer attention kinds: full_attention at layers 0, every, 2 every, ..."""
    return [
        "full_attention" if index % every == 0 else "sliding_attention"
        for index in range(num_layers)
    ]


def special_token_ids(config: Mapping[str, Any]) -> dict[str, int | None]:
    """cls = bos ([CLS]) and sep = eos ([SEP]) ids of the run's tokenizer
    (`config.data.tokenizer_dir`, the one exported beside the weights); null when there is
    none to read (not ModernBertConfig's 50281 / 50282, outside a small vocabulary)."""
    from pretrain.data.vocab import load_vocabulary

    tokenizer_dir = config.get("data", {}).get("tokenizer_dir")
    if not tokenizer_dir or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return dict.fromkeys(("cls_token_id", "bos_token_id", "sep_token_id", "eos_token_id"))
    vocab = load_vocabulary(tokenizer_dir)
    return {
        "cls_token_id": vocab.cls,
        "bos_token_id": vocab.cls,
        "sep_token_id": vocab.sep,
        "eos_token_id": vocab.sep,
    }


def hf_config(
    model_cfg: Mapping[str, Any],
    vocab_size: int,
    pad_token_id: int,
    heads: bool,
    special: Mapping[str, int | None] | None = None,
):
    """The config.json dict of `transformers.ModernBertConfig` for our `model` config group,
    with the tokenizer's `special` ids (`special_token_ids`); ExportError for a setting
    ModernBertConfig cannot express."""
    require_model_keys(model_cfg, (*SAME_KEYS, "norm", "embedding_norm"))
    if model_cfg["norm"] != "layer_norm" or not model_cfg["embedding_norm"]:
        raise ExportError(
            f"config.model (norm={model_cfg['norm']}, embedding_norm="
            f"{model_cfg['embedding_norm']}): transformers' ModernBERT has bias-free LayerNorms "
            "and an embedding norm only, so this model (NeoBERT's settings) cannot be exported"
        )
    return {
        "architectures": ["ModernBertForMaskedLM" if heads else "ModernBertModel"],
        "model_type": "modernbert",
        "vocab_size": int(vocab_size),
        "pad_token_id": int(pad_token_id),
        **{key: model_cfg[key] for key in SAME_KEYS},
        "layer_types": layer_types(
            model_cfg["num_hidden_layers"], model_cfg["global_attn_every_n_layers"]
        ),
        "rope_parameters": {
            kind: {"rope_type": "default", "rope_theta": float(model_cfg[key])}
            for kind, key in THETAS
        },
        **FIXED,
        "classifier_pooling": "cls",
        "classifier_dropout": 0.0,
        "tie_word_embeddings": True,
        "sparse_prediction": False,
        **(special or {}),
    }


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's ModernBERT weights and run config -> `ModernBertForMaskedLM` (or
    `ModernBertModel` without an MLM head). A sentence head has no counterpart: refused."""
    state_dict = without_compile_prefix(state_dict)
    if any(key.startswith("sentence_head.") for key in state_dict):
        raise ValueError(
            "the checkpoint has a sentence-pair head but ModernBERT has none; train it with "
            "objective=mlm (objective.pair_task=none)"
        )
    check_tied(state_dict, TIED_DECODER, WORD_EMBEDDINGS, "ModernBERT ties them, cannot export")
    weights = to_hf_names(
        state_dict,
        RENAMES,
        PREFIXES,
        "state_dict key {key!r} has no Hugging Face ModernBERT counterpart; cannot export it",
        skip=(TIED_DECODER,),
    )
    if HF_EMBEDDINGS not in weights:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not a ModernBertEncoder checkpoint")
    heads = "decoder.bias" in weights
    if heads:
        weights["decoder.weight"] = weights[HF_EMBEDDINGS]
    runtime = config["model_runtime"]
    model_config = hf_config(
        config["model"],
        runtime["vocab_size"],
        runtime["pad_token_id"],
        heads,
        special_token_ids(config),
    )
    return HFModel(model_config, cpu_copies(weights))


def global_every(types: list[str]) -> int:
    """The `global_attn_every_n_layers` that gives HF's `layer_types`; ExportError when no
    period does (global layers at 0, n, 2n, ... only)."""
    every = next((i for i, kind in enumerate(types) if i and kind == "full_attention"), len(types))
    if types != layer_types(len(types), every):
        raise ExportError(
            f"config.json layer_types {types}: only a global layer every n layers (the first "
            "included) can be imported"
        )
    return every


def rope_thetas(config: Mapping[str, Any]) -> dict[str, float]:
    """Our global/local RoPE bases from config.json's rope_parameters (or its older
    global_rope_theta / local_rope_theta keys), ModernBERT's defaults where absent."""
    rope = config.get("rope_parameters") or {}
    defaults = {"global_rope_theta": 160000.0, "local_rope_theta": 10000.0}
    return {
        key: float((rope.get(kind) or {}).get("rope_theta", config.get(key, defaults[key])))
        for kind, key in THETAS
    }


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face ModernBERT -> (our `model` config group, state_dict under our names:
    `encoder.*`, plus `mlm_head.*` with an MLM head). The inverse of `to_hf`."""
    config = hf_model.config
    require_hf_keys(
        config, ("hidden_size", "num_hidden_layers", "intermediate_size"), "a ModernBERT"
    )
    for key, value in FIXED.items():
        if config.get(key, value) != value:
            raise ExportError(
                f"config.json {key} = {config[key]!r}: this project's ModernBERT has {value!r}"
            )
    types = config.get("layer_types") or layer_types(
        config["num_hidden_layers"], config.get("global_attn_every_n_layers", 3)
    )
    defaults = {"hidden_activation": "gelu", "norm_eps": 1e-5, "local_attention": 128}
    model_cfg = {
        "name": "modernbert_imported",
        "_target_": "pretrain.models.modernbert.ModernBertEncoder",
        **{key: config.get(key, defaults.get(key, 0.0)) for key in SAME_KEYS},
        "norm": "layer_norm",
        "embedding_norm": True,
        "global_attn_every_n_layers": global_every(types),
        **rope_thetas(config),
    }
    model_cfg["initializer_cutoff_factor"] = config.get("initializer_cutoff_factor", 2.0)
    model_cfg["initializer_range"] = config.get("initializer_range", 0.02)
    model_cfg["max_position_embeddings"] = config.get("max_position_embeddings", 8192)
    ours = renamed(hf_model.weights, INVERSE_RENAMES)
    if WORD_EMBEDDINGS not in ours:
        raise ExportError(f"the weights lack {HF_EMBEDDINGS}: not a ModernBERT model")
    if "mlm_head.bias" in ours:
        ours[TIED_DECODER] = ours[WORD_EMBEDDINGS]
    return model_cfg, ours
