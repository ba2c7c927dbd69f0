"""The schemas are the one place of the defaults: every yaml of the data, optim, trainer,
strategy and logger groups gives only what differs from its schema's defaults (or from the
yaml of its group it starts from), and so do the other commands' yamls (evaluate.yaml and
`eval/`, compress/compress.yaml and `compress/method/`, prepare.yaml), so a default changes in
one place. The model and objective groups are checked the same way in test_config_schemas.py.
Not checked: experiment/, sweep/ and sweep_point/ (overlays that may restate a value on
purpose), compress/student/ (plain model dicts with no schema of defaults: every key is the
student's) and hydra/launcher/ (Hydra plugins' schemas, the job shape spelt out)."""

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data_pipelines.prepare_config import PrepareConfig
from pretrain.compress.config import (
    CompressConfig,
    PruneMethod,
    QuantizeMethod,
    TinyBertMethod,
    register_compress_schema,
)
from pretrain.config import (
    DataConfig,
    LoggerConfig,
    OptimConfig,
    StrategyConfig,
    TrainConfig,
    TrainerConfig,
    compose_config,
)
from pretrain.config.upgrade import merged
from pretrain.eval.config import EvalConfig, EvalRunConfig, register_eval_schema
from pretrain.paths import CONF_DIR

register_eval_schema()
register_compress_schema()

SCHEMAS = {
    "data": DataConfig,
    "optim": OptimConfig,
    "trainer": TrainerConfig,
    "strategy": StrategyConfig,
    "logger": LoggerConfig,
}
YAMLS = [path for group in SCHEMAS for path in sorted((CONF_DIR / group).glob("*.yaml"))]


def own_values(path: Path) -> tuple[dict, list[str]]:
    """A yaml's own keys (read as Hydra reads them: `1e-4` a float) and its defaults list."""
    own = OmegaConf.to_container(OmegaConf.load(path)) or {}
    defaults = [d for d in own.pop("defaults", []) if d != "_self_"]
    return own, defaults


def starting_point(group: str, path: Path) -> dict:
    """What the yaml's keys would be without it: its schema's defaults, then the yaml of its
    group its defaults list names (and so on up)."""
    _, defaults = own_values(path)
    assert len(defaults) <= 1, f"{path.name}: at most one yaml of its group to start from"
    if not defaults:
        return OmegaConf.to_container(OmegaConf.structured(SCHEMAS[group]))
    parent = path.with_name(f"{defaults[0]}.yaml")
    return merged(starting_point(group, parent), own_values(parent)[0])


def repeated_keys(base: dict, own: dict, prefix: str = "") -> list[str]:
    """The keys (dotted, nested ones of dict settings included) of `own` whose value equals
    the one it starts from."""
    found = []
    for key, value in own.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict) and value:
            found += repeated_keys(base[key], value, f"{prefix}{key}.")
        elif key in base and value == base[key]:
            found.append(f"{prefix}{key} = {value!r}")
    return found


@pytest.mark.parametrize("path", YAMLS, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_a_yaml_gives_only_values_that_differ_from_its_schema(path):
    group = path.parent.name
    own, _ = own_values(path)
    base = starting_point(group, path)
    unknown = sorted(set(own) - set(base))
    assert not unknown, f"conf/{group}/{path.name}: not settings of {group}: {unknown}"
    repeated = repeated_keys(base, own)
    assert not repeated, (
        f"conf/{group}/{path.name} repeats the default it starts from (the schema's, "
        f"pretrain.config.{SCHEMAS[group].__name__}, or its parent yaml's); remove: {repeated}"
    )


def test_a_repeated_default_is_found_naming_the_key():
    base = {"lr": 1e-4, "optimizer": {"eps": 1e-6, "lr": 1e-4}, "warmup_steps": 10000}
    own = {"lr": 2e-4, "optimizer": {"eps": 1e-6}, "warmup_steps": 10000}
    assert repeated_keys(base, own) == ["optimizer.eps = 1e-06", "warmup_steps = 10000"]


def test_the_run_groups_are_the_schemas_sections():
    """Every section of TrainConfig but model and objective (checked elsewhere) is a group
    checked here, named by its field."""
    sections = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    for group, schema in SCHEMAS.items():
        assert sections[group] is schema, group


def test_the_default_run_composes_to_the_schema_defaults():
    """The defaults list's options (data=segment_pair, optim=adamw, trainer=default,
    strategy=auto, logger=wandb) are the schema's defaults themselves."""
    cfg = compose_config()
    for group, schema in SCHEMAS.items():
        assert OmegaConf.to_container(cfg[group]) == OmegaConf.to_container(
            OmegaConf.structured(schema)
        ), group


def test_train_yaml_gives_no_run_key_at_its_default():
    """conf/train.yaml's own keys of the run (seed, names, resume) are left to TrainConfig."""
    own, _ = own_values(CONF_DIR / "train.yaml")
    base = OmegaConf.to_container(OmegaConf.structured(TrainConfig))
    run_keys = {k: v for k, v in own.items() if k not in SCHEMAS and not isinstance(v, dict)}
    repeated = repeated_keys(base, run_keys)
    assert not repeated, f"conf/train.yaml repeats TrainConfig's defaults; remove: {repeated}"


METHOD_SCHEMAS = {
    "tinybert_schema": TinyBertMethod,
    "quantize_schema": QuantizeMethod,
    "prune_schema": PruneMethod,
}
# The other commands' yamls and their schemas; a method's schema is named by its defaults list.
APP_SCHEMAS = [
    (CONF_DIR / "evaluate.yaml", EvalRunConfig),
    (CONF_DIR / "compress" / "compress.yaml", CompressConfig),
    (CONF_DIR / "prepare.yaml", PrepareConfig),
    *[(path, EvalConfig) for path in sorted((CONF_DIR / "eval").glob("*.yaml"))],
    *[
        (path, METHOD_SCHEMAS[own_values(path)[1][0]])
        for path in sorted((CONF_DIR / "compress" / "method").glob("*.yaml"))
    ],
]
APP_YAMLS = [pytest.param(p, s, id=str(p.relative_to(CONF_DIR))) for p, s in APP_SCHEMAS]


@pytest.mark.parametrize("path, schema", APP_YAMLS)
def test_a_commands_yaml_gives_only_values_that_differ_from_its_schema(path, schema):
    """Hydra's own settings (`hydra:`) are not the schema's and are left out."""
    own, _ = own_values(path)
    own.pop("hydra", None)
    base = OmegaConf.to_container(OmegaConf.structured(schema))
    name = path.relative_to(CONF_DIR)
    unknown = sorted(set(own) - set(base))
    assert not unknown, f"conf/{name}: not settings of {schema.__name__}: {unknown}"
    repeated = repeated_keys(base, own)
    assert not repeated, (
        f"conf/{name} repeats {schema.__module__}.{schema.__name__}'s defaults; remove: {repeated}"
    )


def test_every_method_names_its_schema():
    for path in sorted((CONF_DIR / "compress" / "method").glob("*.yaml")):
        _, defaults = own_values(path)
        assert len(defaults) == 1 and defaults[0] in METHOD_SCHEMAS, path.name
