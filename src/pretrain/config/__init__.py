"""Typed schemas of the composed run config, and its validation.

Every config group in `conf/` is checked against one of these dataclasses: OmegaConf checks
types while Hydra composes; `validate` then builds the dataclasses, whose `__post_init__`
checks each section's own values, and runs `validate_run`, the one pass that checks what
spans sections (each check kept with the component that owns it) and derives the batch plan.

    data_schema, optim_schema, trainer_schema   the sections' schemas (types, defaults, checks)
    run_schema     TrainConfig, the whole run
    components     the model and objective sections, typed by the class they name
    validation     validate, validate_run, run_config, plain_config
    store          the schemas in Hydra's ConfigStore; compose_config
    sweep          the ${sweep_suffix:} resolver
    upgrade        a checkpoint's saved config brought up to the current schema
"""

from pretrain.config.components import DEFAULT_TARGETS, component_config
from pretrain.config.data_schema import DataConfig
from pretrain.config.optim_schema import OptimConfig
from pretrain.config.run_schema import TrainConfig
from pretrain.config.store import compose_config, register_schemas
from pretrain.config.trainer_schema import LoggerConfig, StrategyConfig, TrainerConfig
from pretrain.config.upgrade import with_schema_defaults
from pretrain.config.validation import (
    RUNTIME_SECTIONS,
    check_component_sections,
    check_known_keys,
    plain_config,
    run_config,
    validate,
    validate_run,
)
from pretrain.errors import ConfigError

__all__ = [
    "DEFAULT_TARGETS",
    "RUNTIME_SECTIONS",
    "ConfigError",
    "DataConfig",
    "LoggerConfig",
    "OptimConfig",
    "StrategyConfig",
    "TrainConfig",
    "TrainerConfig",
    "check_component_sections",
    "check_known_keys",
    "component_config",
    "compose_config",
    "plain_config",
    "register_schemas",
    "run_config",
    "validate",
    "validate_run",
    "with_schema_defaults",
]

register_schemas()
