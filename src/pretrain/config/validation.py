"""From a composed config to the typed run object, in one validation pass.

OmegaConf checks types while Hydra composes; `validate` builds the dataclasses (each
section's `__post_init__` checks its own values), then `validate_run` runs every check across
sections, each from the component that owns it, and derives the run's batch plan, so a bad
value fails before training starts with an error that names the key.
"""

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain.batching import batch_plan
from pretrain.config.components import DEFAULT_TARGETS, component_config
from pretrain.config.run_schema import TrainConfig
from pretrain.errors import ConfigError
from pretrain.models.configs import ModelConfig
from pretrain.objectives.configs import ObjectiveConfig

# Sections a plain run config holds beside the schema's, added when the corpus is opened:
# facts of the run's tokenizer (`model_runtime`: vocab_size, pad_token_id) and of its corpus
# (`data_runtime`: corpus_sha256, the manifest's content hash).
RUNTIME_SECTIONS = ("model_runtime", "data_runtime")


def validate(cfg: DictConfig) -> TrainConfig:
    """Build the dataclasses from a composed config, running every value check
    (`validate_run`); the result is the run object that components receive their typed
    sections of. A key the schema has no place for (added with `+key=...` on the command
    line) is a ConfigError naming it."""
    check_known_keys(cfg)
    return validate_run(OmegaConf.to_object(cfg))


def validate_run(run: TrainConfig) -> TrainConfig:
    """The one pass over the typed run that checks what spans sections, each check kept
    with the component that owns it, and derives the run's facts; returns `run`, its model
    and objective sections typed by their classes and `run.batch_plan` (the global batch,
    accumulation and learning-rate scale, `pretrain.batching.BatchPlan`: derived once per
    launch, not a field, so never part of the plain config) set. ConfigError naming the key
    at the first check that fails."""
    # Late imports: these read data's format registry, and DeepSpeed's check imports torch.
    from pretrain.data.batch_warmup import batch_size_warmup
    from pretrain.data.partitions import memory_partitions
    from pretrain.data.run_checks import check_data_against_run, stage_context
    from pretrain.deepspeed_json import check_strategy

    run.model = component_config("model", run.model)
    run.objective = component_config("objective", run.objective)
    run.objective.check_data(run.data.format)
    check_data_against_run(run)  # document masks, warm-up, lengths against model and format
    stage_context(run)  # the stages' context extension: lengths and RoPE thetas
    run.batch_plan = batch_plan(run.data, run.trainer)  # the global batch for the ranks
    batch_size_warmup(run)  # the warm-up's start: whole micro-batches on every rank
    memory_partitions(run)  # XLNet's memory: one partition per slot of the global batch
    check_strategy(run)  # the DeepSpeed JSON, by DeepSpeed's parser
    return run


def check_component_sections(cfg: DictConfig) -> tuple[ModelConfig, ObjectiveConfig]:
    """The composed config's `model` and `objective` sections built into their schemas (typed
    while Hydra composed them), running their value checks without importing torch (but
    with objective.stages, which asks the objective's corruption what a stage may set); a bad
    value is a ConfigError naming the key."""
    sections = []
    for group in ("model", "objective"):
        try:
            sections.append(OmegaConf.to_object(cfg[group]))
        except OmegaConfBaseException as error:
            raise ConfigError(f"{group}.{error.full_key}: {error.msg}") from error
    return sections[0], sections[1]


def check_known_keys(node: object, prefix: str = "") -> None:
    """ConfigError naming the first key of `node` (a composed config, or a section of it) that
    its schema dataclass has no field for; open places (fields typed `dict` or `Any`: the
    optimizer's arguments, `strategy.deepspeed`; `model` and `objective`, which
    `component_config` checks against their own classes) take any key. Hydra's own node
    (`hydra`, present with return_hydra_config) is left alone."""
    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    if schema is None or not is_dataclass(schema):
        return
    known = {item.name: item for item in fields(schema)}
    for key in node.keys():
        if prefix == "" and key == "hydra":
            continue
        if key not in known:
            section = prefix.rstrip(".") or "the run config"
            raise ConfigError(
                f"{prefix}{key}: not a setting of {section} (its settings: "
                f"{', '.join(sorted(known))}); check the spelling, or leave the key out"
            )
        value = node._get_node(key)
        if isinstance(value, DictConfig) and is_dataclass(OmegaConf.get_type(value)):
            check_known_keys(value, f"{prefix}{key}.")


def run_config(config: "TrainConfig | Mapping[str, Any] | DictConfig") -> TrainConfig:
    """The typed, validated run config of `config`: itself when typed and validated already,
    else a plain run config (a checkpoint's, possibly partial) merged over the schema's
    defaults and validated; `RUNTIME_SECTIONS` are left out."""
    if isinstance(config, TrainConfig):
        return config if hasattr(config, "batch_plan") else validate_run(config)
    values = {k: v for k, v in config.items() if k not in RUNTIME_SECTIONS}
    for group in ("model", "objective"):  # their defaults (names: run_name) from the schema
        if group in values:
            given = {"_target_": DEFAULT_TARGETS[group], **values[group]}
            values[group] = OmegaConf.structured(component_config(group, given))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), values)
    except OmegaConfBaseException as error:
        raise ConfigError(f"{error.full_key}: {error.msg}") from error
    return validate(merged)


def plain_config(run: TrainConfig) -> dict:
    """`run` as plain containers (dicts, lists, scalars): what checkpoints store and loggers
    record."""
    return OmegaConf.to_container(OmegaConf.structured(run), resolve=True)
