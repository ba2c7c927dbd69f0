"""ELECTRA weights <-> Hugging Face `ElectraForPreTraining` / `ElectraForMaskedLM` / `ElectraModel`.

Our names: `encoder.*` (an ElectraEncoder), `discriminator_head.*` (ReplacedTokenHead) and
`mlm_head.*` (MaskedLMHead, the generator's head). `to_hf` writes ElectraConfig as a plain
dict; `from_hf` is its inverse. An ELECTRA checkpoint holds two models: the objective
(`pretrain.objectives.electra.ElectraModule.hf_exports`) calls `to_hf` once for each.
"""

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch

from pretrain.export.bert import _inverse
from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel
from pretrain.models.electra import ElectraEncoderConfig

PREFIXES = ("encoder.", "discriminator_head.", "mlm_head.")

# Our names (with the module prefix) -> HF names.
RENAMES = [
    (
        r"encoder\.embeddings\.(word|position|token_type)_embeddings\.weight",
        r"electra.embeddings.\1_embeddings.weight",
    ),
    (r"encoder\.embeddings\.norm\.(weight|bias)", r"electra.embeddings.LayerNorm.\1"),
    (r"encoder\.embeddings_project\.(weight|bias)", r"electra.embeddings_project.\1"),
    (
        r"encoder\.layers\.(\d+)\.attention\.output\.(weight|bias)",
        r"electra.encoder.layer.\1.attention.output.dense.\2",
    ),
    (
        r"encoder\.layers\.(\d+)\.attention_norm\.(weight|bias)",
        r"electra.encoder.layer.\1.attention.output.LayerNorm.\2",
    ),
    (
        r"encoder\.layers\.(\d+)\.intermediate\.(weight|bias)",
        r"electra.encoder.layer.\1.intermediate.dense.\2",
    ),
    (
        r"encoder\.layers\.(\d+)\.output\.(weight|bias)",
        r"electra.encoder.layer.\1.output.dense.\2",
    ),
    (
        r"encoder\.layers\.(\d+)\.output_norm\.(weight|bias)",
        r"electra.encoder.layer.\1.output.LayerNorm.\2",
    ),
    (r"discriminator_head\.dense\.(weight|bias)", r"discriminator_predictions.dense.\1"),
    (
        r"discriminator_head\.dense_prediction\.(weight|bias)",
        r"discriminator_predictions.dense_prediction.\1",
    ),
    (r"mlm_head\.dense\.(weight|bias)", r"generator_predictions.dense.\1"),
    (r"mlm_head\.norm\.(weight|bias)", r"generator_predictions.LayerNorm.\1"),
    (r"mlm_head\.bias", r"generator_lm_head.bias"),
]
INVERSE_RENAMES = [_inverse(pattern, replacement) for pattern, replacement in RENAMES]
FUSED_QKV = re.compile(r"encoder\.layers\.(\d+)\.attention\.qkv\.(weight|bias)")
HF_QKV = re.compile(
    r"electra\.encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)"
)
TIED_DECODER = "mlm_head.decoder.weight"
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"
HF_WORD_EMBEDDINGS = "electra.embeddings.word_embeddings.weight"
HF_DECODER = "generator_lm_head.weight"

# ElectraEncoder's settings carry ElectraConfig's names: all of its config but ModelConfig's.
SIZE_KEYS = tuple(
    f.name
    for f in fields(ElectraEncoderConfig)
    if f.name not in ("name", "_target_", "reference_vocab_size")
)


def _rename(key: str, rules: list[tuple[str, str]]) -> str | None:
    for pattern, replacement in rules:
        if re.fullmatch(pattern, key):
            return re.sub(pattern, replacement, key)
    return None


def electra_to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename `encoder.*`, `discriminator_head.*` and `mlm_head.*` weights to HF's names.

    Other prefixes are ignored (an ELECTRA checkpoint's `generator.*` is exported separately);
    an unknown key under these prefixes raises ValueError. The fused qkv is split into
    query/key/value; the MLM decoder (tied to the word embeddings) is written as
    `generator_lm_head.weight`. Returns contiguous, unshared CPU tensors.
    """
    hf: dict[str, torch.Tensor] = {}
    state_dict = {key.replace("_orig_mod.", ""): value for key, value in state_dict.items()}
    for key, tensor in state_dict.items():
        if not key.startswith(PREFIXES):
            continue
        if key == TIED_DECODER:
            embeddings = state_dict.get(WORD_EMBEDDINGS)
            if embeddings is not None and not torch.equal(tensor, embeddings):
                raise ValueError(f"{TIED_DECODER} differs from {WORD_EMBEDDINGS}; cannot export")
            continue
        fused = FUSED_QKV.fullmatch(key)
        if fused:
            layer, kind = fused.groups()
            for part, name in zip(tensor.chunk(3, dim=0), ("query", "key", "value"), strict=True):
                hf[f"electra.encoder.layer.{layer}.attention.self.{name}.{kind}"] = part
            continue
        name = _rename(key, RENAMES)
        if name is None:
            raise ValueError(
                f"state_dict key {key!r} has no Hugging Face ELECTRA counterpart; cannot export it"
            )
        hf[name] = tensor
    if HF_WORD_EMBEDDINGS not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not an ElectraEncoder checkpoint")
    if "generator_lm_head.bias" in hf:
        hf[HF_DECODER] = hf[HF_WORD_EMBEDDINGS]
    return {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in hf.items()}


def architecture(hf_state_dict: Mapping[str, torch.Tensor]) -> str:
    """The HF class the weights fill: ElectraForPreTraining (discriminator head),
    ElectraForMaskedLM (generator head) or ElectraModel (neither)."""
    discriminator = "discriminator_predictions.dense.weight" in hf_state_dict
    generator = "generator_lm_head.bias" in hf_state_dict
    if discriminator and generator:
        raise ValueError(
            "the weights hold both a discriminator and a generator head; export each model "
            "on its own (ELECTRA's generator is `generator.*` in the checkpoint)"
        )
    if discriminator:
        return "ElectraForPreTraining"
    return "ElectraForMaskedLM" if generator else "ElectraModel"


def hf_config(
    model_cfg: Mapping[str, Any], vocab_size: int, pad_token_id: int, architecture: str
) -> dict[str, Any]:
    """The config.json dict of `transformers.ElectraConfig` for our `model` config group."""
    missing = [key for key in SIZE_KEYS if key not in model_cfg]
    if missing:
        raise ExportError(f"config.model lacks the key {missing[0]!r}, needed for config.json")
    return {
        "architectures": [architecture],
        "model_type": "electra",
        "vocab_size": int(vocab_size),
        "pad_token_id": int(pad_token_id),
        **{key: model_cfg[key] for key in SIZE_KEYS},
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
        "classifier_dropout": None,
        "tie_word_embeddings": True,
        "is_decoder": False,
        "add_cross_attention": False,
        "use_cache": False,
    }


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's ELECTRA weights (`encoder.*` and at most one head) and run config (its
    `model` group describing that encoder) -> the Hugging Face model they make."""
    weights = electra_to_hf_state_dict(state_dict)
    runtime = config["model_runtime"]
    model_config = hf_config(
        config["model"], runtime["vocab_size"], runtime["pad_token_id"], architecture(weights)
    )
    return HFModel(model_config, weights)


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face ELECTRA model -> (our `model` config group, state_dict under our names:
    `encoder.*`, plus `discriminator_head.*` or `mlm_head.*` when the model has that head).
    The inverse of `to_hf`: export -> import -> export gives the same weights and config."""
    missing = [key for key in SIZE_KEYS if key not in hf_model.config]
    if missing:
        raise ExportError(f"config.json lacks {missing[0]!r}: not an ELECTRA config")
    model_cfg = {
        "name": "electra_imported",
        "_target_": "pretrain.models.electra.ElectraEncoder",
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
        renamed = _rename(name, INVERSE_RENAMES)
        if renamed is not None:
            ours[renamed] = tensor
    for (layer, kind), parts in qkv.items():
        ours[f"encoder.layers.{layer}.attention.qkv.{kind}"] = torch.cat(
            [parts["query"], parts["key"], parts["value"]], dim=0
        )
    if WORD_EMBEDDINGS not in ours:
        raise ExportError(f"the weights lack {HF_WORD_EMBEDDINGS}: not an ELECTRA model")
    if "mlm_head.bias" in ours:
        decoder = hf_model.weights.get(HF_DECODER)
        if decoder is not None and not torch.equal(decoder, ours[WORD_EMBEDDINGS]):
            raise ExportError(
                f"{HF_DECODER} differs from {HF_WORD_EMBEDDINGS}: an untied generator head "
                "cannot be imported (our MLM head ties them)"
            )
        ours[TIED_DECODER] = ours[WORD_EMBEDDINGS]
    return model_cfg, ours
