"""Every config composes and validates; bad values fail at composition with the key named."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from pretrain.config import ConfigError, compose_config, validate
from pretrain.paths import CONF_DIR


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("model", group_options("model"))
def test_every_model_config_composes(model):
    config = validate(compose_config([f"model={model}"]))
    assert config.model.name == model


@pytest.mark.parametrize("experiment", group_options("experiment"))
def test_every_experiment_composes(experiment):
    validate(compose_config([f"experiment={experiment}"]))


@pytest.mark.parametrize("data", group_options("data"))
def test_every_data_format_composes(data):
    objective = "mlm_nsp" if data == "segment_pair" else "mlm"
    assert validate(compose_config([f"data={data}", f"objective={objective}"])).data.format == data


def test_run_dir_is_named_from_the_config_not_a_timestamp():
    cfg = compose_config(["experiment=demo"])
    assert cfg.run_dir == "runs/demo/bert_tiny-mlm-filled_sentences"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("objective.mlm_probability=1.5", "objective.mlm_probability"),
        ("objective.mlm_probability=0", "objective.mlm_probability"),
        (
            "objective.mask_token_probability=0.95",
            "objective.mask_token_probability + objective.random_token_probability",
        ),
        ("objective.masking=sometimes", "objective.masking"),
        ("data.max_seq_length=1024", "data.max_seq_length"),
        ("data.format=paragraphs", "data.format"),
        ("model.num_attention_heads=3", "model.hidden_size"),
        ("trainer.precision=8-bit", "trainer.precision"),
        ("trainer.num_threads=0", "trainer.num_threads"),
        ("optim.optimizer.lr=-1", "optim.optimizer.lr"),
        ("data=full_sentences", "objective.pair_task"),
    ],
)
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError) as error:
        validate(compose_config([override]))
    assert str(error.value).startswith(key)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigCompositionException, match="data.batch_size=lots") as error:
        compose_config(["data.batch_size=lots"])
    assert "could not be converted to Integer" in str(error.value.__cause__)


def test_unknown_model_lists_the_available_ones():
    with pytest.raises(MissingConfigException) as error:
        compose_config(["model=bert_huge"])
    assert "model/bert_huge" in str(error.value) and "bert_base" in str(error.value)


def test_cli_reports_a_bad_value_before_training(tmp_path, prepared_corpus):
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "pretrain"),
            "objective.mlm_probability=1.5",
            f"data.shards_dir={prepared_corpus}",  # a missing corpus is reported first
            f"run_dir={tmp_path}/r",
        ],
        capture_output=True,
        text=True,
        timeout=600,  # a guard against a hang, not a speed check
    )
    assert result.returncode == 2
    assert "objective.mlm_probability = 1.5: must lie in (0, 1)" in result.stderr
    assert not (tmp_path / "r" / "checkpoints").exists()
