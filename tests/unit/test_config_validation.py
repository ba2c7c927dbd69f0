"""The run config is data: the schemas check their own values only, `validate_run` is the one
pass of checks across sections, and what is built from the config (the stream, a
corruption) takes each setting from its key by name, so a renamed key fails loudly."""

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import pretrain.config
from pretrain.config import ConfigError, compose_config, validate, validate_run
from pretrain.data.reading import StreamSpec, stream_spec
from pretrain.objectives.base import objective_settings
from pretrain.objectives.configs import ObjectiveConfig

CONFIG_DIR = Path(pretrain.config.__file__).parent
PLACE_FIELDS = {"storage", "rank", "world_size", "accumulation", "sources", "mix"}  # facts


def test_stream_spec_has_no_defaults_for_settings():
    """The config's schema is the one place of the stream's defaults (seed, lengths, ...)."""
    with_default = {
        f.name
        for f in dataclasses.fields(StreamSpec)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    assert with_default == PLACE_FIELDS


def test_stream_spec_takes_each_setting_from_its_key():
    run = validate(
        compose_config(
            [
                "data=full_sentences",
                "data.max_seq_length=96",
                "data.batch_size=6",
                "data.short_seq_probability=0.25",
                "data.nsp_random_probability=0.3",
                "data.shuffle_buffer_documents=77",
                "data.random_document_pool=9",
                "data.bad_shards=skip",
                "data.document_masks=true",
                "model=modernbert_tiny",
                "objective=mlm",
                "objective.masking=static",
                "objective.dupe_factor=3",
                "seed=7",
            ]
        )
    )
    spec = stream_spec(
        run,
        shard_paths=("a.tar",),
        shard_tokens=(5,),
        stream_partitions=4,
        vocab=None,
        corruption=None,
    )
    data = run.data
    assert (spec.format, spec.max_seq_length, spec.batch_size, spec.seed) == (
        "full_sentences",
        96,
        6,
        7,
    )
    assert (spec.short_seq_probability, spec.nsp_random_probability) == (0.25, 0.3)
    assert (spec.shuffle_buffer_documents, spec.random_document_pool) == (77, 9)
    assert (spec.bad_shards, spec.document_masks, spec.tokens_per_batch) == ("skip", True, None)
    assert (spec.masking, spec.dupe_factor, spec.pair_task) == (
        "static",
        3,
        run.objective.sentence_task,
    )
    assert (tuple(spec.shard_paths), spec.shard_tokens, spec.stream_partitions) == (
        ("a.tar",),
        (5,),
        4,
    )
    for name in ("format", "max_seq_length", "batch_size", "bad_shards", "random_document_pool"):
        assert getattr(spec, name) == getattr(data, name), name


@dataclasses.dataclass
class RenamedCorruption:
    seed: int
    masking: str
    mask_share: float = 0.8  # a setting the objective's schema does not have


def test_a_corruption_field_without_a_setting_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"^RenamedCorruption\.mask_share: not a setting of"):
        objective_settings(RenamedCorruption, ObjectiveConfig(), seed=1)
    built = objective_settings(RenamedCorruption, ObjectiveConfig(), seed=1, mask_share=0.5)
    assert built == RenamedCorruption(seed=1, masking="dynamic", mask_share=0.5)
    with pytest.raises(TypeError, match="has no field 'rate'"):
        objective_settings(RenamedCorruption, ObjectiveConfig(), seed=1, mask_share=0.5, rate=2)


def test_the_schemas_leave_checks_across_sections_to_validate_run():
    """Built without validate_run, a run whose sections disagree is accepted; validate_run
    refuses it naming the key, types the model and objective sections and plans the batch."""
    cfg = compose_config(["data.document_masks=true", "data.global_batch_size=64"])
    run = OmegaConf.to_object(cfg)
    assert not hasattr(run, "batch_plan")
    with pytest.raises(ConfigError, match=r"^data\.document_masks = True: needs rows that pack"):
        validate_run(run)
    run = validate_run(OmegaConf.to_object(compose_config(["data.global_batch_size=64"])))
    assert run.batch_plan.accumulate_grad_batches == 2
    assert type(run.objective).__name__ != "ObjectiveConfig"  # the objective's own schema


ALLOWED_IMPORTS = {
    "collections.abc",
    "dataclasses",
    "math",
    "typing",
    "hydra.core.config_store",
    "omegaconf",
    "omegaconf.errors",
    "pretrain.batching",
    "pretrain.data.partitions",
    "pretrain.errors",
    "pretrain.models.configs",
    "pretrain.objectives.configs",
}


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.py")), ids=lambda p: p.name)
def test_the_config_modules_import_nothing_heavy_at_their_top(path):
    """Config stays low in the layers: no torch, runtime or data module beyond the torch-free
    partitions at import (validate_run imports the components it calls when it runs)."""
    tree = ast.parse(path.read_text())
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    ours = {name for name in imported if name.startswith("pretrain.config.")}
    assert imported - ours <= ALLOWED_IMPORTS, path.name
    assert len(path.read_text().splitlines()) <= 400, f"{path.name}: split it by concept"
