"""GPT weights <-> Hugging Face `GPT2LMHeadModel`.

`to_hf` renames a checkpoint's `encoder.*` weights (our `GPTModel`) to GPT-2's and writes
GPT2Config as a plain dict (so `transformers` is not needed to export); `from_hf` is its
inverse. GPT-2's projections are `Conv1D` layers whose weight is (in, out), the transpose of a
Linear's (out, in): every Linear weight is transposed on the way out and back. The LM head is
tied to `transformer.wte.weight`, so `lm_head.weight` is not written (as `save_pretrained`).
"""

import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel
from pretrain.export.naming import (
    cpu_copies,
    invert,
    rename,
    require_hf_keys,
    require_model_keys,
    to_hf_names,
    without_compile_prefix,
)
from pretrain.models.build import DESCRIPTIVE_KEYS
from pretrain.models.configs import GPTConfig

# Our names (`encoder.` is the checkpoint's module prefix) -> HF GPT2LMHeadModel names.
RENAMES = [
    (r"encoder\.embeddings\.word_embeddings\.weight", r"transformer.wte.weight"),
    (r"encoder\.embeddings\.position_embeddings\.weight", r"transformer.wpe.weight"),
    (r"encoder\.layers\.(\d+)\.ln_1\.(weight|bias)", r"transformer.h.\1.ln_1.\2"),
    (r"encoder\.layers\.(\d+)\.ln_2\.(weight|bias)", r"transformer.h.\1.ln_2.\2"),
    (r"encoder\.layers\.(\d+)\.attention\.qkv\.(weight|bias)", r"transformer.h.\1.attn.c_attn.\2"),
    (
        r"encoder\.layers\.(\d+)\.attention\.output\.(weight|bias)",
        r"transformer.h.\1.attn.c_proj.\2",
    ),
    (r"encoder\.layers\.(\d+)\.fc_in\.(weight|bias)", r"transformer.h.\1.mlp.c_fc.\2"),
    (r"encoder\.layers\.(\d+)\.fc_out\.(weight|bias)", r"transformer.h.\1.mlp.c_proj.\2"),
    (r"encoder\.ln_f\.(weight|bias)", r"transformer.ln_f.\1"),
]
FROM_HF = invert(RENAMES)
# The HF names of Linear weights that GPT-2 stores transposed, as Conv1D (in, out).
CONV1D = re.compile(
    r"transformer\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight"
)
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"
# GPTModel's settings carry GPT2Config's names: all of GPTConfig but those of ModelConfig.
SIZE_KEYS = tuple(
    f.name for f in fields(GPTConfig) if f.name not in (*DESCRIPTIVE_KEYS, "_target_")
)


def gpt_to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's `encoder.*` GPTModel weights to GPT2LMHeadModel's, transposing
    Linear weights into Conv1D layout. Other prefixes are ignored; an unknown `encoder.` key
    raises ValueError. Returns contiguous, unshared CPU tensors."""
    hf = to_hf_names(
        without_compile_prefix(state_dict),
        RENAMES,
        ("encoder.",),
        "state_dict key {key!r} has no GPT-2 counterpart; cannot export it",
    )
    hf = {name: tensor.t() if CONV1D.fullmatch(name) else tensor for name, tensor in hf.items()}
    if "transformer.wte.weight" not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not a GPTModel checkpoint")
    return cpu_copies(hf)


def _special_ids(config: Mapping[str, Any]) -> dict[str, int | None]:
    """bos = [CLS], eos = [SEP] of the run's tokenizer (the causal LM's document start and
    end), when the tokenizer directory is at hand; null otherwise (not GPT2Config's 50256)."""
    from pretrain.data.vocab import load_vocabulary

    tokenizer_dir = config.get("data", {}).get("tokenizer_dir")
    if not tokenizer_dir or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return {"bos_token_id": None, "eos_token_id": None}
    vocab = load_vocabulary(tokenizer_dir)
    return {"bos_token_id": vocab.cls, "eos_token_id": vocab.sep}


def hf_config(
    model_cfg: Mapping[str, Any],
    vocab_size: int,
    pad_token_id: int,
    special: Mapping[str, int | None],
) -> dict[str, Any]:
    """The config.json dict of `transformers.GPT2Config` for our `model` config group."""
    require_model_keys(model_cfg, SIZE_KEYS)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": int(vocab_size),
        "pad_token_id": int(pad_token_id),
        **dict(special),
        **{key: model_cfg[key] for key in SIZE_KEYS},
        "activation_function": "gelu_new",
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
        "use_cache": True,
    }


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's GPT weights and run config -> the Hugging Face GPT2LMHeadModel."""
    runtime = config["model_runtime"]
    model_config = hf_config(
        config["model"], runtime["vocab_size"], runtime["pad_token_id"], _special_ids(config)
    )
    return HFModel(model_config, gpt_to_hf_state_dict(state_dict))


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face GPT-2 model -> (our `model` config group, `encoder.*` state_dict).
    The inverse of `to_hf`: export -> import -> export gives the same weights and config."""
    config = hf_model.config
    require_hf_keys(config, SIZE_KEYS, "a GPT-2")
    activation = config.get("activation_function", "gelu_new")
    if activation != "gelu_new" or config.get("scale_attn_by_inverse_layer_idx"):
        raise ExportError(
            f"config.json: activation_function={activation!r}, scale_attn_by_inverse_layer_idx="
            f"{config.get('scale_attn_by_inverse_layer_idx')!r}; GPTModel implements GPT-2's "
            "gelu_new with plain 1/sqrt(head) scaling only"
        )
    model_cfg = {
        "name": "gpt_imported",
        "_target_": "pretrain.models.gpt.GPTModel",
        **{key: config[key] for key in SIZE_KEYS},
    }
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in hf_model.weights.items():
        if not name.startswith("transformer."):
            name = "transformer." + name  # a GPT2Model directory (no LM head) names h.0...
        key = rename(name, FROM_HF)
        if key is not None:
            ours[key] = tensor.t().contiguous() if CONV1D.fullmatch(name) else tensor
    if WORD_EMBEDDINGS not in ours:
        raise ExportError("the weights lack transformer.wte.weight: not a GPT-2 model")
    return model_cfg, ours
