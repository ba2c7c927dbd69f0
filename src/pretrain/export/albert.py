"""ALBERT weights <-> Hugging Face `AlbertForPreTraining` / `AlbertForMaskedLM` / `AlbertModel`.

HF's ALBERT shares layers by groups: `num_hidden_groups` blocks of consecutive layers, each
group one set of weights. `share_layers=all` is one group, `none` one group per layer; the
attention-only and feed-forward-only sharing of our encoder have no HF counterpart and are
refused with an ExportError. The fused qkv projection is split into query/key/value.
"""

import re
from collections.abc import Mapping
from typing import Any

import torch

from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel

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
GROUP = "albert.encoder.albert_layer_groups.{g}.albert_layers.0."
# Our names (with {} for the block index where there is one) -> HF AlbertForPreTraining names.
RENAMES = {
    "encoder.embeddings.word_embeddings.weight": "albert.embeddings.word_embeddings.weight",
    "encoder.embeddings.position_embeddings.weight": "albert.embeddings.position_embeddings.weight",
    "encoder.embeddings.token_type_embeddings.weight": (
        "albert.embeddings.token_type_embeddings.weight"
    ),
    "encoder.embeddings.norm.{kind}": "albert.embeddings.LayerNorm.{kind}",
    "encoder.embedding_projection.{kind}": "albert.encoder.embedding_hidden_mapping_in.{kind}",
    "encoder.attention_blocks.{g}.attention.output.{kind}": GROUP + "attention.dense.{kind}",
    "encoder.attention_blocks.{g}.norm.{kind}": GROUP + "attention.LayerNorm.{kind}",
    "encoder.ffn_blocks.{g}.intermediate.{kind}": GROUP + "ffn.{kind}",
    "encoder.ffn_blocks.{g}.output.{kind}": GROUP + "ffn_output.{kind}",
    "encoder.ffn_blocks.{g}.norm.{kind}": GROUP + "full_layer_layer_norm.{kind}",
    "mlm_head.dense.{kind}": "predictions.dense.{kind}",
    "mlm_head.norm.{kind}": "predictions.LayerNorm.{kind}",
    "mlm_head.bias": "predictions.bias",
    "nsp_head.pooler.{kind}": "albert.pooler.{kind}",
    "nsp_head.classifier.{kind}": "sop_classifier.classifier.{kind}",
}
QKV_OURS = "encoder.attention_blocks.{g}.attention.qkv.{kind}"
QKV_HF = GROUP + "attention.{part}.{kind}"
QKV_PARTS = ("query", "key", "value")
WORD_EMBEDDINGS = "encoder.embeddings.word_embeddings.weight"
TIED_DECODER = "mlm_head.decoder.weight"
PREFIXES = ("encoder.", "mlm_head.", "nsp_head.")


def _pattern(template: str) -> re.Pattern:
    escaped = re.escape(
        template.replace("{g}", "\0G").replace("{kind}", "\0K").replace("{part}", "\0P")
    )
    escaped = escaped.replace("\0G", r"(?P<g>\d+)").replace("\0K", r"(?P<kind>weight|bias)")
    return re.compile(escaped.replace("\0P", r"(?P<part>query|key|value)"))


FORWARD = [(_pattern(ours), hf) for ours, hf in RENAMES.items()]
BACKWARD = [(_pattern(hf), ours) for ours, hf in RENAMES.items()]


def _rename(name: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, template in rules:
        match = pattern.fullmatch(name)
        if match:
            return template.format(**match.groupdict())
    return None


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
    names (keys outside `encoder.`, `mlm_head.`, `nsp_head.` are ignored; an unknown key
    inside them raises ValueError). Returns contiguous, unshared tensors."""
    num_hidden_groups(model_cfg)
    state_dict = {key.replace("_orig_mod.", ""): value for key, value in state_dict.items()}
    hf: dict[str, torch.Tensor] = {}
    qkv = _pattern(QKV_OURS)
    for key, tensor in state_dict.items():
        if not key.startswith(PREFIXES):
            continue
        if key == TIED_DECODER:
            if WORD_EMBEDDINGS in state_dict and not torch.equal(
                tensor, state_dict[WORD_EMBEDDINGS]
            ):
                raise ValueError(f"{TIED_DECODER} differs from {WORD_EMBEDDINGS}; cannot export")
            continue
        fused = qkv.fullmatch(key)
        if fused:
            for part, piece in zip(QKV_PARTS, tensor.chunk(3, dim=0), strict=True):
                hf[QKV_HF.format(part=part, **fused.groupdict())] = piece
            continue
        name = _rename(key, FORWARD)
        if name is None:
            raise ValueError(f"state_dict key {key!r} has no Hugging Face ALBERT counterpart")
        hf[name] = tensor
    if "albert.embeddings.word_embeddings.weight" not in hf:
        raise ValueError(f"state_dict lacks {WORD_EMBEDDINGS}: not an AlbertEncoder checkpoint")
    if "predictions.bias" in hf:
        hf["predictions.decoder.weight"] = hf["albert.embeddings.word_embeddings.weight"]
        hf["predictions.decoder.bias"] = hf["predictions.bias"]
    return {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in hf.items()}


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
    missing = [key for key in SIZE_KEYS if key not in model_cfg]
    if missing:
        raise ExportError(f"config.model lacks the key {missing[0]!r}, needed for config.json")
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
    missing = [key for key in SIZE_KEYS if key not in config]
    if missing:
        raise ExportError(f"config.json lacks {missing[0]!r}: not an ALBERT config")
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
    ours: dict[str, torch.Tensor] = {}
    qkv_hf = _pattern(QKV_HF)
    fused: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, tensor in hf_model.weights.items():
        match = qkv_hf.fullmatch(name)
        if match:
            fused.setdefault((match["g"], match["kind"]), {})[match["part"]] = tensor
            continue
        key = _rename(name, BACKWARD)
        if key is not None:
            ours[key] = tensor
    for (group, kind), parts in fused.items():
        ours[QKV_OURS.format(g=group, kind=kind)] = torch.cat([parts[p] for p in QKV_PARTS])
    if WORD_EMBEDDINGS not in ours:
        raise ExportError("the weights lack albert.embeddings.word_embeddings.weight")
    if "mlm_head.bias" in ours:
        ours[TIED_DECODER] = ours[WORD_EMBEDDINGS]
    return model_cfg, ours
