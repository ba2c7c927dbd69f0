"""The objectives' schemas are the one place of their defaults: every conf/objective yaml
starts from its schema and gives only what differs, and a bad value is refused by the schema
with the key's name before anything else of the run is built."""

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from pretrain.config import check_objective_section, compose_config
from pretrain.errors import ConfigError
from pretrain.objectives import configs
from pretrain.objectives.configs import OBJECTIVE_SCHEMAS
from pretrain.paths import CONF_DIR

OBJECTIVE_YAMLS = sorted((CONF_DIR / "objective").glob("*.yaml"))


def schema_default(schema: type, key: str) -> object:
    (item,) = [f for f in dataclasses.fields(schema) if f.name == key]
    if item.default is not dataclasses.MISSING:
        return item.default
    return item.default_factory()


@pytest.mark.parametrize("path", OBJECTIVE_YAMLS, ids=lambda path: path.stem)
def test_an_objective_yaml_gives_only_values_its_schema_does_not_default_to(path):
    given = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"}
    composed = compose_config([f"objective={path.stem}"]).objective
    schema = OmegaConf.get_type(composed)
    assert issubclass(schema, configs.ObjectiveConfig)
    repeated = {k: v for k, v in given.items() if v == schema_default(schema, k)}
    assert not repeated, f"{path.name} repeats {schema.__name__}'s defaults {repeated}"
    assert composed.name == path.stem  # the option's name is the objective's


def test_every_schema_is_the_config_class_of_its_objective():
    from hydra.utils import get_class

    for name, schema in OBJECTIVE_SCHEMAS.items():
        assert get_class(schema._target_).config_class is schema, name
        assert compose_config([f"objective={name}"]).objective._target_ == schema._target_


def test_a_bad_objective_value_names_its_key():
    cfg = compose_config(["objective=span", "objective.span_geometric_p=1.5"])
    with pytest.raises(ConfigError, match=r"^objective\.span_geometric_p = 1\.5: must lie in"):
        check_objective_section(cfg)
    good = check_objective_section(compose_config(["objective=span", "objective.span_max_words=4"]))
    assert (type(good).__name__, good.span_max_words, good.span_geometric_p) == (
        "SpanMaskingConfig",
        4,
        0.2,
    )


def test_the_schemas_module_imports_no_torch():
    """What `pretrain` checks before torch loads: the module's own imports, at its top."""
    tree = ast.parse(Path(configs.__file__).read_text())
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported <= {
        "collections.abc",
        "dataclasses",
        "typing",
        "omegaconf",
        "omegaconf.errors",
        "pretrain.errors",
    }, imported
