"""Building an encoder from its model config (`build_encoder`), and counting its parameters."""

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from pretrain.models.unpadding import set_unpadding

if TYPE_CHECKING:
    from pretrain.models.configs import ModelConfig

RUNTIME_KEYS = ("vocab_size", "pad_token_id")
# of ModelConfig, not constructor arguments (layer_norm_impl: pretrain.runtime.kernels swaps LayerNorms;
# unpad: an attribute of the encoder, set by build_encoder)
DESCRIPTIVE_KEYS = ("name", "reference_vocab_size", "layer_norm_impl", "unpad")


def _plain(model_cfg: "ModelConfig | Mapping[str, Any]") -> dict:
    if isinstance(model_cfg, DictConfig):
        return OmegaConf.to_container(model_cfg, resolve=True)
    if dataclasses.is_dataclass(model_cfg) and not isinstance(model_cfg, type):
        return dataclasses.asdict(model_cfg)
    if isinstance(model_cfg, Mapping):
        return dict(model_cfg)
    raise TypeError(
        f"model config must be a mapping (the `model` group), got {type(model_cfg).__name__}"
    )


def build_encoder(model_cfg: Mapping, vocab_size: int, pad_token_id: int) -> nn.Module:
    """Instantiate the encoder named by `model_cfg["_target_"]` (a `conf/model/*.yaml` group).

    The keys `name`, `reference_vocab_size` and `layer_norm_impl` are dropped, `unpad` is
    handed to `set_unpadding`; `vocab_size` and `pad_token_id` come from the tokenizer at run
    time and must not be in the config. Accepts a DictConfig, a dict or the ModelConfig dataclass.
    """
    kwargs = _plain(model_cfg)
    unpad = kwargs.get("unpad", "auto")
    for key in DESCRIPTIVE_KEYS:
        kwargs.pop(key, None)
    if "_target_" not in kwargs:
        raise KeyError(
            "model._target_ is missing: the model config must name the encoder class, "
            "e.g. `_target_: pretrain.models.bert.BertEncoder` in conf/model/<name>.yaml"
        )
    clashes = [key for key in RUNTIME_KEYS if key in kwargs]
    if clashes:
        raise KeyError(
            f"model.{clashes[0]} must not be set in the model config: it comes from the tokenizer at run time"
        )
    encoder = instantiate(kwargs, vocab_size=vocab_size, pad_token_id=pad_token_id, _convert_="all")
    set_unpadding(encoder, unpad)
    return encoder


def count_parameters(module: nn.Module) -> int:
    """Number of scalar parameters in `module`, each shared (tied) Parameter counted once."""
    unique = {
        id(parameter): parameter for _, parameter in module.named_parameters(remove_duplicate=False)
    }
    return sum(parameter.numel() for parameter in unique.values())
