"""The schemas in Hydra's ConfigStore, and composing `conf/` outside a Hydra app."""

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from pretrain.config.run_schema import TrainConfig
from pretrain.config.sweep import sweep_suffix
from pretrain.models.configs import MODEL_SCHEMAS
from pretrain.objectives.configs import objective_schemas


def register_schemas() -> None:
    """Register the schemas so `conf/train.yaml` can name them in its defaults list, and the
    `${sweep_suffix:}` resolver."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for group, schemas in (("model", MODEL_SCHEMAS), ("objective", objective_schemas())):
        for name, schema in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=schema)
    OmegaConf.register_new_resolver("sweep_suffix", sweep_suffix, replace=True)


def compose_config(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """Compose `conf/<config_name>.yaml` with Hydra overrides outside a Hydra app (tests,
    `pretrain-data preview`)."""
    from hydra import compose, initialize_config_dir

    from pretrain.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides or []))
