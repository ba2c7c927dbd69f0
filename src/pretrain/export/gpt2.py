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
from pretrain.models.gpt import GPTConfig

# Our names (`encoder.` is the checkpoint's module prefix) -> HF GPT2LMHeadModel names, and
# whether the tensor is a Linear weight that GPT-2 stores transposed (Conv1D).
RENAMES = [
    (r"encoder\.embeddings\.word_embeddings\.weight", r"transformer.wte.weight", False),
    (r"encoder\.embeddings\.position_embeddings\.weight", r"transformer.wpe.weight", False),
    (r"encoder\.layers\.(\d+)\.ln_1\.(weight|bias)", r"transformer.h.\1.ln_1.\2", False),
    (r"encoder\.layers\.(\d+)\.ln_2\.(weight|bias)", r"transformer.h.\1.ln_2.\2", False),
    (
        r"encoder\.layers\.(\d+)\.attention\.qkv\.weight",
        r"transformer.h.\1.attn.c_attn.weight",
        True,
    ),
    (r"encoder\.layers\.(\d+)\.attention\.qkv\.bias", r"transformer.h.\1.attn.c_attn.bias", False),
    (
        r"encoder\.layers\.(\d+)\.attention\.output\.weight",
        r"transformer.h.\1.attn.c_proj.weight",
        True,
    ),
    (
        r"encoder\.layers\.(\d+)\.attention\.output\.bias",
        r"transformer.h.\1.attn.c_proj.bias",
        False,
    ),
    (r"encoder\.layers\.(\d+)\.fc_in\.weight", r"transformer.h.\1.mlp.c_fc.weight", True),
    (r"encoder\.layers\.(\d+)\.fc_in\.bias", r"transformer.h.\1.mlp.c_fc.bias", False),
    (r"encoder\.layers\.(\d+)\.fc_out\.weight", r"transformer.h.\1.mlp.c_proj.weight", True),
    (r"encoder\.layers\.(\d+)\.fc_out\.bias", r"transformer.h.\1.mlp.c_proj.bias", False),
    (r"encoder\.ln_f\.(weight|bias)", r"transformer.ln_f.\1", False),
]
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"
# GPTModel's settings carry GPT2Config's names: all of GPTConfig but those of ModelConfig.
SIZE_KEYS = tuple(
    f.name for f in fields(GPTConfig) if f.name not in ("name", "_target_", "reference_vocab_size")
)


def _rename(key: str, rules: list[tuple[str, str, bool]]) -> tuple[str, bool] | None:
    for pattern, replacement, transposed in rules:
        if re.fullmatch(pattern, key):
            return re.sub(pattern, replacement, key), transposed
    return None


def gpt_to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a checkpoint's `encoder.*` GPTModel weights to GPT2LMHeadModel's, transposing
    Linear weights into Conv1D layout. Other prefixes are ignored; an unknown `encoder.` key
    raises ValueError. Returns contiguous, unshared CPU tensors."""
    hf: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        key = key.replace("_orig_mod.", "")  # torch.compile's wrapper names the same weights
        if not key.startswith("encoder."):
            continue
        renamed = _rename(key, RENAMES)
        if renamed is None:
            raise ValueError(f"state_dict key {key!r} has no GPT-2 counterpart; cannot export it")
        name, transposed = renamed
        hf[name] = tensor.t() if transposed else tensor
    if "transformer.wte.weight" not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not a GPTModel checkpoint")
    return {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in hf.items()}


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
    missing = [key for key in SIZE_KEYS if key not in model_cfg]
    if missing:
        raise ExportError(f"config.model lacks the key {missing[0]!r}, needed for config.json")
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


def _inverse(ours: str, hf: str) -> tuple[str, str]:
    """Swap one (our regex, HF replacement) rule into (HF regex, our replacement)."""
    groups = iter(re.findall(r"\(.*?\)", ours))
    hf_pattern = re.sub(r"\\\\(\d)", lambda _: next(groups), re.escape(hf))
    count = iter(range(1, 10))
    replacement = re.sub(r"\(.*?\)", lambda _: f"\\{next(count)}", ours).replace("\\.", ".")
    return hf_pattern, replacement


FROM_HF = [(*_inverse(ours, hf), transposed) for ours, hf, transposed in RENAMES]


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face GPT-2 model -> (our `model` config group, `encoder.*` state_dict).
    The inverse of `to_hf`: export -> import -> export gives the same weights and config."""
    config = hf_model.config
    missing = [key for key in SIZE_KEYS if key not in config]
    if missing:
        raise ExportError(f"config.json lacks {missing[0]!r}: not a GPT-2 config")
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
        renamed = _rename(name, FROM_HF)
        if renamed is not None:
            key, transposed = renamed
            ours[key] = tensor.t().contiguous() if transposed else tensor
    if WORD_EMBEDDINGS not in ours:
        raise ExportError("the weights lack transformer.wte.weight: not a GPT-2 model")
    return model_cfg, ours
