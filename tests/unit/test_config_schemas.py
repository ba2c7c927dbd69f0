"""The schemas of the model families and objectives are the one place of their defaults: every
conf/model and conf/objective yaml starts from its schema (or from another yaml of its group)
and gives only what differs, and a bad value is refused by the schema with the key's name
before anything else of the run is built."""

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from pretrain.config import check_objective_section, compose_config
from pretrain.errors import ConfigError
from pretrain.models import configs as model_configs
from pretrain.models.configs import MODEL_SCHEMAS
from pretrain.objectives import configs
from pretrain.objectives.configs import OBJECTIVE_SCHEMAS
from pretrain.paths import CONF_DIR

YAMLS = sorted((CONF_DIR / "objective").glob("*.yaml")) + sorted(
    (CONF_DIR / "model").glob("*.yaml")
)


def schema_default(schema: type, key: str) -> object:
    (item,) = [f for f in dataclasses.fields(schema) if f.name == key]
    if item.default is not dataclasses.MISSING:
        return item.default
    return item.default_factory()


def base_values(group: str, path: Path) -> tuple[dict, type]:
    """What the yaml's keys would be without it: the composed values of the yaml its defaults
    list names first, else its schema's defaults; and the composed section's schema."""
    defaults = yaml.safe_load(path.read_text()).get("defaults", [])
    composed = compose_config([f"{group}={path.stem}"])[group]
    schema = OmegaConf.get_type(composed)
    parents = [d for d in defaults if d != "_self_" and not d.startswith("/schema/")]
    if parents:
        return dict(compose_config([f"{group}={parents[0]}"])[group]), schema
    named = [d for d in defaults if d.startswith(f"/schema/{group}/")]
    assert named, f"{path.name}: its defaults list names neither its schema nor another yaml"
    return {f.name: schema_default(schema, f.name) for f in dataclasses.fields(schema)}, schema


@pytest.mark.parametrize("path", YAMLS, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_a_yaml_gives_only_values_that_differ_from_its_schema_or_parent(path):
    group = path.parent.name
    given = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"}
    base, schema = base_values(group, path)
    root = model_configs.ModelConfig if group == "model" else configs.ObjectiveConfig
    assert issubclass(schema, root)
    repeated = {k: v for k, v in given.items() if k in base and v == base[k]}
    assert not repeated, f"{path.name} repeats the values it starts from: {repeated}"
    assert compose_config([f"{group}={path.stem}"])[group].name == path.stem


def test_every_schema_is_the_config_class_of_its_class():
    from hydra.utils import get_class

    for name, schema in OBJECTIVE_SCHEMAS.items():
        assert get_class(schema._target_).config_class is schema, name
        assert compose_config([f"objective={name}"]).objective._target_ == schema._target_
    for name, schema in MODEL_SCHEMAS.items():
        assert get_class(schema._target_).config_class is schema, name


def test_the_activation_names_are_those_the_modules_implement():
    from pretrain.models import heads, modernbert, seq2seq, xlnet

    assert set(model_configs.BERT_ACTIVATIONS) == set(heads.ACTIVATIONS)
    assert set(model_configs.GLU_ACTIVATIONS) == set(modernbert.ACTIVATIONS)
    assert set(model_configs.XLNET_ACTIVATIONS) == set(xlnet.ACTIVATIONS)
    assert set(model_configs.SEQ2SEQ_ACTIVATIONS) == set(seq2seq.ACTIVATIONS)


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


@pytest.mark.parametrize("module", [configs, model_configs], ids=lambda m: m.__name__)
def test_the_schemas_modules_import_no_torch(module):
    """What `pretrain` checks before torch loads: the modules' own imports, at their top."""
    tree = ast.parse(Path(module.__file__).read_text())
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
