"""ELECTRA weights <-> Hugging Face `ElectraForPreTraining` / `ElectraForMaskedLM` / `ElectraModel`.

Our names: `encoder.*` (an ElectraEncoder), `discriminator_head.*` (ReplacedTokenHead) and
`mlm_head.*` (MaskedLMHead, the generator's head). `to_hf` writes ElectraConfig as a plain
dict; `from_hf` is its inverse. A checkpoint of the ELECTRA objective holds two models
(`ElectraModule`: discriminator `encoder.*` + `discriminator_head.*`, generator `generator.*` +
`generator_head.*`, embeddings shared): `pretraining_models` exports both,
`generator_weights` imports an exported generator back under the objective's names.
"""

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from pretrain.config import component_config
from pretrain.errors import ConfigError
from pretrain.export import bert
from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel, import_hf_model
from pretrain.export.naming import (
    FusedQKV,
    check_tied,
    cpu_copies,
    invert,
    renamed,
    require_hf_keys,
    to_hf_names,
    without_compile_prefix,
)
from pretrain.models.build import DESCRIPTIVE_KEYS
from pretrain.models.configs import ElectraEncoderConfig
from pretrain.models.electra import generator_config

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
INVERSE_RENAMES = invert(RENAMES)
QKV = FusedQKV(
    "encoder.layers.{layer}.attention.qkv.{kind}",
    "electra.encoder.layer.{layer}.attention.self.{part}.{kind}",
)
TIED_DECODER = "mlm_head.decoder.weight"
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"
HF_WORD_EMBEDDINGS = "electra.embeddings.word_embeddings.weight"
HF_DECODER = "generator_lm_head.weight"

# ElectraEncoder's settings carry ElectraConfig's names: all of its config but ModelConfig's.
SIZE_KEYS = tuple(
    f.name for f in fields(ElectraEncoderConfig) if f.name not in (*DESCRIPTIVE_KEYS, "_target_")
)


def electra_to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename `encoder.*`, `discriminator_head.*` and `mlm_head.*` weights to HF's names.

    Other prefixes are ignored (an ELECTRA checkpoint's `generator.*` is exported separately);
    an unknown key under these prefixes raises ValueError. The fused qkv is split into
    query/key/value; the MLM decoder (tied to the word embeddings) is written as
    `generator_lm_head.weight`. Returns contiguous, unshared CPU tensors.
    """
    state_dict = without_compile_prefix(state_dict)
    check_tied(state_dict, TIED_DECODER, WORD_EMBEDDINGS, "cannot export")
    hf = to_hf_names(
        state_dict,
        RENAMES,
        PREFIXES,
        "state_dict key {key!r} has no Hugging Face ELECTRA counterpart; cannot export it",
        QKV,
        skip=(TIED_DECODER,),
    )
    if HF_WORD_EMBEDDINGS not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not an ElectraEncoder checkpoint")
    if "generator_lm_head.bias" in hf:
        hf[HF_DECODER] = hf[HF_WORD_EMBEDDINGS]
    return cpu_copies(hf)


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
    return bert.hf_config(
        model_cfg, vocab_size, pad_token_id, (architecture,), "electra", size_keys=SIZE_KEYS
    )


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
    require_hf_keys(hf_model.config, SIZE_KEYS, "an ELECTRA")
    model_cfg = {
        "name": "electra_imported",
        "_target_": "pretrain.models.electra.ElectraEncoder",
        **{key: hf_model.config[key] for key in SIZE_KEYS},
    }
    ours = renamed(hf_model.weights, INVERSE_RENAMES)
    ours.update(QKV.join(hf_model.weights))
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


def objective_generator_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The generator's `model` group of an ELECTRA objective's (checkpoint's) plain run
    config; settings it lacks take the objective's defaults."""
    objective = component_config("objective", config["objective"])
    return generator_config(
        config["model"], objective.generator_size_fraction, objective.generator_layer_fraction
    )


def pretraining_models(
    state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> dict[str, HFModel]:
    """An ELECTRA objective's checkpoint -> the discriminator as `ElectraForPreTraining` (the
    export directory itself, "") and the generator as `ElectraForMaskedLM` ("generator")."""
    generator_state = {}
    for key, tensor in without_compile_prefix(state_dict).items():
        if key.startswith("generator."):
            generator_state["encoder." + key.removeprefix("generator.")] = tensor
        elif key.startswith("generator_head."):
            generator_state["mlm_head." + key.removeprefix("generator_head.")] = tensor
    generator = {**config, "model": objective_generator_config(config)}
    return {"": to_hf(state_dict, config), "generator": to_hf(generator_state, generator)}


def generator_weights(
    directory: Path, generator_cfg: Mapping[str, Any], discriminator: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The weights of an exported generator (`<export>/generator`, an `ElectraForMaskedLM`)
    under the ELECTRA objective's names (`generator.*`, `generator_head.*`). Its sizes must be
    `generator_cfg`'s (the run's generator) and its embeddings the discriminator's (shared):
    ConfigError / ValueError naming the directory otherwise."""
    model_cfg, weights = import_hf_model(directory)
    for key, value in model_cfg.items():
        if key in (*DESCRIPTIVE_KEYS, "_target_"):
            continue
        if key not in generator_cfg or generator_cfg[key] != value:
            raise ConfigError(
                f"init_from={directory}: the generator's {key} is {value!r} there but "
                f"{generator_cfg[key] if key in generator_cfg else 'unset'!r} in this run; set "
                "objective.generator_size_fraction to match"
            )
    renamed_weights = {}
    for key, tensor in weights.items():
        if key.startswith("encoder.embeddings."):
            if key in discriminator and not torch.equal(tensor, discriminator[key]):
                raise ValueError(
                    f"init_from={directory}: the generator's {key} differs from the "
                    "discriminator's; ELECTRA shares its embeddings between them"
                )
            continue
        if key.startswith("encoder."):
            renamed_weights["generator." + key.removeprefix("encoder.")] = tensor
        elif key.startswith("mlm_head."):
            renamed_weights["generator_head." + key.removeprefix("mlm_head.")] = tensor
    return renamed_weights
