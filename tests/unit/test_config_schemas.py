"""The schemas of the model families and objectives are the one place of their defaults: every
conf/model and conf/objective yaml starts from its schema (or from another yaml of its group)
and gives only what differs, and a bad value is refused by the schema with the key's name
before anything else of the run is built."""

import ast
import dataclasses
import sys
from pathlib import Path

import pytest
import yaml

from pretrain.config import check_component_sections, compose_config
from pretrain.errors import ConfigError
from pretrain.models import configs as model_configs
from pretrain.models.configs import MODEL_SCHEMAS
from pretrain.objectives import configs
from pretrain.objectives.configs import objective_schemas
from pretrain.paths import CONF_DIR

YAMLS = sorted((CONF_DIR / "objective").glob("*.yaml")) + sorted(
    (CONF_DIR / "model").glob("*.yaml")
)


def schema_default(schema: type, key: str) -> object:
    (item,) = [f for f in dataclasses.fields(schema) if f.name == key]
    if item.default is not dataclasses.MISSING:
        return item.default
    return item.default_factory()


OBJECTIVE_SCHEMAS = objective_schemas()
SCHEMAS = {"model": MODEL_SCHEMAS, "objective": OBJECTIVE_SCHEMAS}


def starting_point(group: str, path: Path) -> tuple[dict, type]:
    """What a yaml's keys would be without it, read as Hydra composes its defaults list (the
    schema's defaults, then each yaml of the chain above it): the values, and the schema."""
    own = yaml.safe_load(path.read_text())
    defaults = [d for d in own.get("defaults", []) if d != "_self_"]
    assert len(defaults) == 1, f"{path.name}: name its schema or one yaml of its group first"
    if defaults[0].startswith(f"/schema/{group}/"):
        schema = SCHEMAS[group][defaults[0].split("/")[3].split("@")[0]]
        return {f.name: schema_default(schema, f.name) for f in dataclasses.fields(schema)}, schema
    parent = path.with_name(f"{defaults[0]}.yaml")
    values, schema = starting_point(group, parent)
    given = {k: v for k, v in yaml.safe_load(parent.read_text()).items() if k != "defaults"}
    return values | given, schema


@pytest.mark.parametrize("path", YAMLS, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_a_yaml_gives_only_values_that_differ_from_its_schema_or_parent(path):
    group = path.parent.name
    given = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"}
    base, schema = starting_point(group, path)
    root = model_configs.ModelConfig if group == "model" else configs.ObjectiveConfig
    assert issubclass(schema, root)
    assert set(given) <= set(base), f"{path.name}: not settings of {schema.__name__}"
    repeated = {k: v for k, v in given.items() if v == base[k]}
    assert not repeated, f"{path.name} repeats the values it starts from: {repeated}"
    assert (base | given)["name"] == path.stem  # the option's name is the section's


def test_every_schema_is_the_config_class_of_its_class():
    from hydra.utils import get_class

    for name, schema in OBJECTIVE_SCHEMAS.items():
        assert get_class(schema._target_).config_class is schema, name
    for name, schema in MODEL_SCHEMAS.items():
        assert get_class(schema._target_).config_class is schema, name


def test_the_activation_names_are_those_the_modules_implement():
    from pretrain.models import heads, modernbert, seq2seq, xlnet

    assert set(model_configs.BERT_ACTIVATIONS) == set(heads.ACTIVATIONS)
    assert set(model_configs.GLU_ACTIVATIONS) == set(modernbert.ACTIVATIONS)
    assert set(model_configs.XLNET_ACTIVATIONS) == set(xlnet.ACTIVATIONS)
    assert set(model_configs.SEQ2SEQ_ACTIVATIONS) == set(seq2seq.ACTIVATIONS)


def test_a_bad_value_names_its_key():
    cfg = compose_config(["objective=span", "objective.span_geometric_p=1.5"])
    with pytest.raises(ConfigError, match=r"^objective\.span_geometric_p = 1\.5: must lie in"):
        check_component_sections(cfg)
    cfg = compose_config(["model=bert_mini", "model.num_attention_heads=3"])
    with pytest.raises(ConfigError, match=r"^model\.hidden_size"):
        check_component_sections(cfg)
    model, objective = check_component_sections(
        compose_config(["model=roberta_tiny", "objective=span", "objective.span_max_words=4"])
    )
    assert (type(model).__name__, model.hidden_size, model.max_position_embeddings) == (
        "RobertaEncoderConfig",
        128,
        514,
    )
    assert (type(objective).__name__, objective.span_max_words, objective.span_geometric_p) == (
        "SpanMaskingConfig",
        4,
        0.2,
    )


SCHEMA_MODULES = [configs, model_configs] + [
    sys.modules[schema.__module__] for schema in OBJECTIVE_SCHEMAS.values()
]


@pytest.mark.parametrize("module", SCHEMA_MODULES, ids=lambda m: m.__name__)
def test_the_schemas_modules_import_no_torch(module):
    """What `pretrain` checks before torch loads: the modules' own imports, at their top
    (an objective's schema module may import the shared schemas and another's)."""
    tree = ast.parse(Path(module.__file__).read_text())
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    schemas = {name for name in imported if name.startswith("pretrain.objectives.")}
    assert all(name.endswith(("_config", ".configs")) for name in schemas), schemas
    assert imported - schemas <= {
        "collections.abc",
        "dataclasses",
        "importlib",
        "pkgutil",
        "typing",
        "omegaconf",
        "omegaconf.errors",
        "pretrain.errors",
    }, imported


def test_the_generating_objectives_are_what_their_schemas_declare():
    """pretrain-generate's HF families come from the schemas' `hf_generation`, and each names
    an objective that generates (has `prepare_generation`)."""
    from hydra.utils import get_class

    from pretrain.cli.generate import HF_OBJECTIVES

    assert HF_OBJECTIVES == {
        "gpt2": ("pretrain.objectives.causal_lm.CausalLanguageModel", "full_sentences"),
        "bert": ("pretrain.objectives.unilm.UniLM", "segment_pair"),
    }
    for target, _ in HF_OBJECTIVES.values():
        assert hasattr(get_class(target), "prepare_generation"), target
