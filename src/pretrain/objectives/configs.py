"""What every objective's settings have, and where each objective's settings are found.

An objective module `pretrain/objectives/<module>.py` keeps its settings, a dataclass (its
`config_class`), beside it in `<module>_config.py`, marked `@objective_schema`;
`objective_schemas()` imports every `*_config` module of the package and returns them by name,
and `pretrain.config` registers each in Hydra's ConfigStore as `schema/objective/<name>`, so
that `conf/objective/*.yaml` start from it and give only what differs. Nothing lists the
objectives. Torch-free: `pretrain` checks these values before torch loads. A default is written
in its schema once; the corruptions and modules read these fields.
"""

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pretrain.errors import (
    ConfigError,
    require,
    require_probabilities,
    require_unit_interval,
)


@dataclass
class ObjectiveConfig:
    """What every objective's config has; each objective module subclasses it with its own
    settings (`<module>.config_class`), checked when the run config is validated."""

    name: str = "mlm_nsp"
    _target_: str = "pretrain.objectives.mlm.MaskedLanguageModel"
    # dynamic: masks drawn again every epoch. static: BERT's dupe_factor copies, the mask of
    # epoch e is the mask of copy e % dupe_factor.
    masking: str = "dynamic"
    dupe_factor: int = 10
    # Corruption settings by training progress (pretrain/data/stages.py): a list of
    # {until_tokens: N, <corruption setting>: value, ...}; a sample whose progress (tokens of
    # the global sample order before it) is below a stage's until_tokens, and not below the
    # previous stage's, is corrupted with that stage's settings; the last stage has no
    # until_tokens. Empty: the objective's own settings throughout. With data.sources a stage
    # may also set source_weights, its mix ({name: weight}; data/mixing.py's PhasedMix).
    stages: list[dict[str, Any]] = field(default_factory=list)

    # pretrain-generate: (the Hugging Face model_type whose exports this objective generates
    # with, the input format, data.format, it reads a prompt in); None: it does not.
    hf_generation: ClassVar[tuple[str, str] | None] = None

    def __post_init__(self) -> None:
        require(
            self.masking in ("dynamic", "static"),
            "objective.masking",
            self.masking,
            "must be 'dynamic' or 'static'",
        )
        require(
            self.dupe_factor >= 1, "objective.dupe_factor", self.dupe_factor, "must be at least 1"
        )
        stage_configs(self)  # checks every stage

    def check_data(self, data_format: str) -> None:
        """Cross-check with the run's input format, `data.format` (e.g. a sentence task needs a
        pair format); ConfigError naming the key."""

    @property
    def sentence_task(self) -> str:
        """The sentence-relation task a pair format labels pairs for (nsp, sop, three_way),
        or "none"; objectives with a task (`MaskedLMConfig.pair_task`) say which."""
        return "none"


# Objective settings a stage may not change: what the stream, the model or the loss use.
UNSTAGED_SETTINGS = ("name", "_target_", "masking", "dupe_factor", "stages", "seed", "pair_task")
# What a stage may set besides the corruption: a context-extension phase (checked against the
# run by `pretrain.data.run_checks.stage_context`): its samples' sequence length, the global layers'
# RoPE theta.
CONTEXT_STAGE_SETTINGS = ("max_seq_length", "global_rope_theta")
# A stage's mix of data.sources, {name: weight} (`pretrain.data.mixture_spec.mixture_mix`;
# checked against data.sources by `pretrain.data.run_checks.check_stage_mix`).
MIX_STAGE_SETTINGS = ("source_weights",)


def stage_configs(objective: ObjectiveConfig) -> list[tuple[int | None, ObjectiveConfig]]:
    """(until_tokens, the objective's config with the stage's settings) of each of
    `objective.stages` (until_tokens None for the last); [] without stages. Checks that every
    stage but the last has increasing until_tokens, sets only settings of the objective's
    corruption, and that those pass the objective's own checks; errors name
    objective.stages[i].<key>."""
    if not objective.stages:
        return []
    from hydra.utils import get_class

    corruption = get_class(objective._target_).corruption_class
    settable = {f.name for f in fields(objective)} & {f.name for f in fields(corruption)}
    settable -= set(UNSTAGED_SETTINGS)
    staged, previous = [], 0
    for number, stage in enumerate(objective.stages):
        where = f"objective.stages[{number}]"
        require(isinstance(stage, Mapping), where, stage, "must be a mapping of settings")
        own = (*CONTEXT_STAGE_SETTINGS, *MIX_STAGE_SETTINGS)
        settings = {k: v for k, v in stage.items() if k not in own}
        until = settings.pop("until_tokens", None)
        if number == len(objective.stages) - 1:
            require(
                until is None,
                f"{where}.until_tokens",
                until,
                "the last stage runs to the end of training: leave its until_tokens out",
            )
        else:
            whole = isinstance(until, int) and not isinstance(until, bool)
            require(
                whole and until > previous,
                f"{where}.until_tokens",
                until,
                f"must be a whole number of tokens above the previous stage's ({previous})",
            )
        unknown = sorted(set(settings) - settable)
        require(
            not unknown,
            f"{where}.{unknown[0] if unknown else ''}",
            settings.get(unknown[0]) if unknown else None,
            f"not a corruption setting of {objective._target_} (a stage sets until_tokens "
            f"and any of: {', '.join(sorted(settable)) or 'none'})",
        )
        try:
            values = OmegaConf.merge(OmegaConf.structured(objective), settings, {"stages": []})
            typed = OmegaConf.to_object(values)
        except OmegaConfBaseException as error:
            raise ConfigError(f"{where}.{error.full_key}: {error.msg}") from error
        except ConfigError as error:
            raise ConfigError(str(error).replace("objective.", f"{where}.", 1)) from error
        staged.append((until, typed))
        previous = until
    return staged


def require_replacement_split(config) -> None:
    """Check `config`'s 80/10/10 split: objective.mask_token_probability and
    objective.random_token_probability (shares of the predicted tokens replaced by [MASK] and
    by a random token) each in [0, 1], together at most 1 (the rest stay unchanged)."""
    for key in ("mask_token_probability", "random_token_probability"):
        require_unit_interval(
            f"objective.{key}", getattr(config, key), open_low=False, open_high=False
        )
    total = config.mask_token_probability + config.random_token_probability
    if total > 1 + 1e-9:
        raise ConfigError(
            f"objective.mask_token_probability + objective.random_token_probability = {total!r}: must be at "
            "most 1 (the rest of the selected tokens stay unchanged)"
        )


@dataclass
class Seq2SeqObjectiveConfig(ObjectiveConfig):
    """What every encoder-decoder objective has: label smoothing of the target distribution."""

    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require_probabilities(self, ("label_smoothing",), group="objective")


SCHEMA_MODULE_SUFFIX = "_config"  # `<module>_config.py` holds `<module>.py`'s settings
_SCHEMAS: dict[str, type[ObjectiveConfig]] = {}  # filled by @objective_schema at import
S = TypeVar("S", bound=type[ObjectiveConfig])


def objective_schema(schema: S) -> S:
    """Class decorator: register `schema`, an `ObjectiveConfig` dataclass, under its `name`
    default (the `schema/objective/<name>` a yaml names); returns it unchanged. Two schemas of
    one name are a ConfigError naming both."""
    name = schema.name
    known = _SCHEMAS.setdefault(name, schema)
    same = (known.__module__, known.__qualname__) == (schema.__module__, schema.__qualname__)
    if not same:
        raise ConfigError(
            f"objective schema name {name!r}: claimed by {known.__module__}.{known.__qualname__}"
            f" and {schema.__module__}.{schema.__qualname__}; give one another `name` default"
        )
    _SCHEMAS[name] = schema  # a module imported again (a reload) replaces its own class
    return schema


def objective_schemas() -> dict[str, type[ObjectiveConfig]]:
    """Every objective's schema by name (sorted): imports each `*_config` module found in the
    directories of the `pretrain.objectives` package (numpy at most, no torch), whose
    `@objective_schema` classes register themselves."""
    from pretrain import objectives

    found = set()
    for module in pkgutil.iter_modules(objectives.__path__):
        if module.name.endswith(SCHEMA_MODULE_SUFFIX):
            found.add(importlib.import_module(f"{objectives.__name__}.{module.name}").__name__)
    return {name: s for name, s in sorted(_SCHEMAS.items()) if s.__module__ in found}
