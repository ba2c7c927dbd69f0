"""RoBERTa weights <-> Hugging Face `RobertaForMaskedLM` / `RobertaModel`.

RoBERTa's Hugging Face layout is BERT's under other prefixes (`roberta.` for `bert.`, an
`lm_head` for `cls.predictions`), so both directions go through `pretrain.export.bert` and
rename the prefixes. RoBERTa has no NSP head: a checkpoint with one cannot be exported.
"""

from collections.abc import Mapping
from typing import Any

import torch

from pretrain.export import bert
from pretrain.export.checkpoint import ExportError
from pretrain.export.hf import HFModel

# Hugging Face BERT name prefix -> Hugging Face RoBERTa name prefix.
PREFIXES = [
    ("bert.", "roberta."),
    ("cls.predictions.transform.dense.", "lm_head.dense."),
    ("cls.predictions.transform.LayerNorm.", "lm_head.layer_norm."),
    ("cls.predictions.decoder.", "lm_head.decoder."),
    ("cls.predictions.bias", "lm_head.bias"),
]
NO_COUNTERPART = ("bert.pooler.", "cls.seq_relationship.")


def _swap(name: str, pairs: list[tuple[str, str]]) -> str | None:
    for old, new in pairs:
        if name.startswith(old):
            return new + name[len(old) :]
    return None


def to_hf(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> HFModel:
    """A checkpoint's RoBERTa weights and run config -> Hugging Face `RobertaForMaskedLM`
    (or `RobertaModel` without an MLM head); `config.json` records the run's pad id, from
    which RoBERTa's position ids start."""
    bert_names = bert.bert_to_hf_state_dict(state_dict)
    pretraining = [name for name in bert_names if name.startswith(NO_COUNTERPART)]
    if pretraining:
        raise ValueError(
            f"the checkpoint has a sentence-pair head ({pretraining[0]}) but RoBERTa has none; "
            "train RoBERTa with objective=mlm (objective.pair_task=none)"
        )
    weights = {_swap(name, PREFIXES): tensor for name, tensor in bert_names.items()}
    runtime = config["model_runtime"]
    architecture = "RobertaForMaskedLM" if "lm_head.bias" in weights else "RobertaModel"
    model_config = bert.hf_config(
        config["model"], runtime["vocab_size"], runtime["pad_token_id"], (architecture,), "roberta"
    )
    return HFModel(model_config, weights)


def from_hf(hf_model: HFModel) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Hugging Face RoBERTa model -> (our `model` config group, state_dict under our names:
    `encoder.*`, plus `mlm_head.*` with an LM head). A pooler, if present, is dropped."""
    inverse = [(new, old) for old, new in PREFIXES]
    renamed = {}
    for name, tensor in hf_model.weights.items():
        bert_name = _swap(name, inverse)
        if bert_name is not None and not bert_name.startswith(NO_COUNTERPART):
            renamed[bert_name] = tensor
    if "bert.embeddings.word_embeddings.weight" not in renamed:
        raise ExportError(
            "the weights lack roberta.embeddings.word_embeddings.weight: not a RoBERTa model"
        )
    model_cfg, state_dict = bert.from_hf(HFModel(hf_model.config, renamed))
    model_cfg["name"] = "roberta_imported"
    model_cfg["_target_"] = "pretrain.models.roberta.RobertaEncoder"
    return model_cfg, state_dict
