"""The model and objective sections typed by the class they name: each `_target_` class
carries its settings' dataclass (`config_class`), checked here with OmegaConf's types and
the dataclass's values."""

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain.errors import ConfigError, require
from pretrain.models.configs import ModelConfig
from pretrain.objectives.configs import ObjectiveConfig

# The classes a model or objective section without `_target_` (a partial plain config) names.
DEFAULT_TARGETS = {
    "model": ModelConfig._target_,
    "objective": ObjectiveConfig._target_,
}


def component_config(
    group: str, values: "ModelConfig | ObjectiveConfig | Mapping[str, Any]"
) -> "ModelConfig | ObjectiveConfig":
    """Build and check the config dataclass of the class named by `values["_target_"]` (its
    `config_class`) for the config group `group` ("model", "objective"): types are converted
    and checked by OmegaConf, values by the dataclass; errors name the key."""
    from hydra.utils import get_class

    if is_dataclass(values) and not isinstance(values, type):  # typed while composed
        if type(values) is get_class(values._target_).config_class:
            return values
        values = OmegaConf.to_container(OmegaConf.structured(values))  # another schema's
    values = OmegaConf.create(values) if not isinstance(values, DictConfig) else values
    target = values.get("_target_")
    try:
        schema = get_class(target).config_class
    except Exception as error:
        raise ConfigError(
            f"{group}._target_ = {target!r}: not a {group} class with a config_class ({error})"
        ) from error
    known = {f.name for f in fields(schema)}
    unknown = sorted(set(values) - known)
    require(
        not unknown,
        f"{group}.{unknown[0] if unknown else ''}",
        values.get(unknown[0]) if unknown else None,
        f"not a setting of {target} (its settings: {', '.join(sorted(known))})",
    )
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as error:
        raise ConfigError(f"{group}.{error.full_key}: {error.msg}") from error
