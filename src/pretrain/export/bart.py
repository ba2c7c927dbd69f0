"""Encoder-decoder weights <-> Hugging Face `BartForConditionalGeneration`.

Our `EncoderDecoder` (checkpoint prefix `encoder.`) and `TiedLMHead` (`lm_head.`) name their
layers as BART does, so the conversion is a prefix rename. Only the BART shape exports:
learned positions, a LayerNorm on the embeddings, LayerNorm eps 1e-5. The sinusoidal
Transformer has no Hugging Face BART counterpart and raises ExportError.
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

WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"
TIED_DECODER = "lm_head.decoder.weight"
# (our name, HF name) regex pairs; each has at most the layer number and the rest as groups.
RENAMES = [
    (r"encoder\.embeddings\.word_embeddings\.weight", "model.shared.weight"),
    (r"encoder\.embeddings\.encoder_positions\.weight", "model.encoder.embed_positions.weight"),
    (r"encoder\.embeddings\.decoder_positions\.weight", "model.decoder.embed_positions.weight"),
    (r"encoder\.embeddings\.encoder_norm\.(weight|bias)", r"model.encoder.layernorm_embedding.\1"),
    (r"encoder\.embeddings\.decoder_norm\.(weight|bias)", r"model.decoder.layernorm_embedding.\1"),
    (r"encoder\.encoder_layers\.(\d+)\.ffn\.(fc1|fc2)\.(.+)", r"model.encoder.layers.\1.\2.\3"),
    (r"encoder\.decoder_layers\.(\d+)\.ffn\.(fc1|fc2)\.(.+)", r"model.decoder.layers.\1.\2.\3"),
    (r"encoder\.encoder_layers\.(\d+)\.(.+)", r"model.encoder.layers.\1.\2"),
    (r"encoder\.decoder_layers\.(\d+)\.(.+)", r"model.decoder.layers.\1.\2"),
]
INVERSE_RENAMES = invert(RENAMES)
# Our config keys that BartConfig names alike.
SAME_KEYS = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "init_std",
    "scale_embedding",
)
# What BART fixes and our config leaves open.
BART_SHAPE = {"position_embedding": "learned", "layernorm_embedding": True, "layer_norm_eps": 1e-5}


def check_bart_shape(model_cfg: Mapping[str, Any]) -> None:
    """Raise ExportError unless `model_cfg` is an encoder-decoder BART can hold."""
    for key, value in BART_SHAPE.items():
        if model_cfg.get(key) != value:
            raise ExportError(
                f"model.{key} = {model_cfg.get(key)!r}: Hugging Face BART needs {value!r}; "
                f"model {model_cfg.get('name')!r} (e.g. the sinusoidal Transformer) has no BART "
                "counterpart, so it cannot be exported (its checkpoint stays usable with `pretrain`)"
            )
    require_model_keys(model_cfg, (*SAME_KEYS, "activation"))


def special_token_ids(config: Mapping[str, Any]) -> dict[str, int]:
    """bos ([CLS]), eos ([SEP]; also the decoder's start token) and mask ids of the run's
    tokenizer (`config.data.tokenizer_dir`), or {} when there is none to read."""
    from pretrain.data.vocab import load_vocabulary

    tokenizer_dir = config.get("data", {}).get("tokenizer_dir")
    if not tokenizer_dir or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return {}
    vocab = load_vocabulary(tokenizer_dir)
    return {
        "bos_token_id": vocab.cls,
        "eos_token_id": vocab.sep,
        "decoder_start_token_id": vocab.sep,
        "forced_eos_token_id": vocab.sep,
    }


def hf_config(
    model_cfg: Mapping[str, Any], vocab_size: int, pad_token_id: int, special: Mapping[str, int]
) -> dict[str, Any]:
    """The config.json dict of `transformers.BartConfig` for our `model` config group."""
    check_bart_shape(model_cfg)
    return {
        "architectures": ["BartForConditionalGeneration"],
        "model_type": "bart",
        "vocab_size": int(vocab_size),
        "pad_token_id": int(pad_token_id),
        **{key: model_cfg[key] for key in SAME_KEYS},
        "activation_function": model_cfg["activation"],
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "is_encoder_decoder": True,
        "tie_word_embeddings": True,
        "use_cache": True,
        **special,
    }


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's encoder-decoder weights (`encoder.*`, `lm_head.*`) and run config ->
    `BartForConditionalGeneration`. Keys outside those prefixes are ignored; an unknown key
    inside them raises ValueError."""
    runtime = config["model_runtime"]
    model_config = hf_config(
        config["model"], runtime["vocab_size"], runtime["pad_token_id"], special_token_ids(config)
    )
    state_dict = without_compile_prefix(state_dict)
    check_tied(state_dict, TIED_DECODER, WORD_EMBEDDINGS, "BART ties them")
    hf = to_hf_names(
        state_dict,
        RENAMES,
        ("encoder.",),
        "state_dict key {key!r} has no Hugging Face BART counterpart",
    )
    if "model.shared.weight" not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not an encoder-decoder checkpoint")
    bias = state_dict.get("lm_head.bias")
    vocab = hf["model.shared.weight"].shape[0]
    hf["final_logits_bias"] = torch.zeros(1, vocab) if bias is None else bias[None, :]  # (1, vocab)
    hf["lm_head.weight"] = hf["model.shared.weight"]
    weights = cpu_copies(hf)
    return HFModel(model_config, weights)


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face BART model -> (our `model` config group, state_dict under our names:
    `encoder.*` and `lm_head.*`). The inverse of `to_hf`."""
    config = hf_model.config
    require_hf_keys(config, SAME_KEYS, "a BART")
    model_cfg = {
        "name": "bart_imported",
        "_target_": "pretrain.models.seq2seq.EncoderDecoder",
        **{key: config[key] for key in SAME_KEYS},
        "activation": config.get("activation_function", "gelu"),
        **BART_SHAPE,
    }
    ours = renamed(hf_model.weights, INVERSE_RENAMES)
    if WORD_EMBEDDINGS not in ours:
        raise ExportError("the weights lack model.shared.weight: not a BART model")
    vocab = ours[WORD_EMBEDDINGS].shape[0]
    bias = hf_model.weights.get("final_logits_bias", torch.zeros(1, vocab))
    ours["lm_head.bias"] = bias[0]
    ours[TIED_DECODER] = ours[WORD_EMBEDDINGS]
    return model_cfg, ours
