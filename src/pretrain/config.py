"""Typed schemas of the composed run config.

Every config group in `conf/` is checked against one of these dataclasses. OmegaConf checks
types while Hydra composes; `validate` then builds the dataclasses, whose `__post_init__`
checks values and cross-group constraints, so a bad value fails before training starts with
an error that names the key.
"""

from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

FORMATS = ("full_sentences", "doc_sentences", "segment_pair", "sentence_pair")
PAIR_FORMATS = ("segment_pair", "sentence_pair")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "64-true")


class ConfigError(ValueError):
    """A config value is wrong; the message names the key and says what would be right."""


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r}: {expected}")


def require_unit_interval(
    key: str, value: float, *, open_low: bool = True, open_high: bool = True
) -> None:
    low_ok = value > 0 if open_low else value >= 0
    high_ok = value < 1 if open_high else value <= 1
    lo, hi = "(" if open_low else "[", ")" if open_high else "]"
    require(low_ok and high_ok, key, value, f"must lie in {lo}0, 1{hi}")


@dataclass
class ModelConfig:
    """A BERT-style encoder; sizes in units of features, layers and heads."""

    name: str = "bert_tiny"
    _target_: str = "pretrain.models.bert.BertEncoder"
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            require(getattr(self, key) > 0, f"model.{key}", getattr(self, key), "must be positive")
        require(
            self.hidden_size % self.num_attention_heads == 0,
            "model.hidden_size",
            self.hidden_size,
            f"must be divisible by model.num_attention_heads ({self.num_attention_heads})",
        )
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            require_unit_interval(f"model.{key}", getattr(self, key), open_low=False)


@dataclass
class ObjectiveConfig:
    """What every objective's config has; each objective module subclasses it with its own
    settings (`<module>.config_class`), checked when the run config is validated."""

    name: str = "mlm_nsp"
    _target_: str = "pretrain.objectives.mlm.MaskedLanguageModel"
    masking: str = "dynamic"
    dupe_factor: int = 10

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

    def check_data(self, data: "DataConfig") -> None:
        """Cross-check with the data config (e.g. a sentence task needs a pair format)."""


def objective_config(values: Any) -> ObjectiveConfig:
    """Build and check the config dataclass of the objective named by `values["_target_"]`:
    types are converted and checked by OmegaConf, values by the dataclass; errors name the key."""
    from hydra.utils import get_class

    values = OmegaConf.create(values) if not isinstance(values, DictConfig) else values
    target = values.get("_target_")
    try:
        schema = get_class(target).config_class
    except Exception as error:
        raise ConfigError(
            f"objective._target_ = {target!r}: not an objective module class ({error})"
        ) from error
    known = {f.name for f in fields(schema)}
    unknown = sorted(set(values) - known)
    require(
        not unknown,
        f"objective.{unknown[0] if unknown else ''}",
        values.get(unknown[0]) if unknown else None,
        f"not a setting of {target} (its settings: {', '.join(sorted(known))})",
    )
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as error:
        raise ConfigError(f"objective.{error.full_key}: {error.msg}") from error


@dataclass
class DataConfig:
    """Where the shards are and how documents become batches. Lengths in tokens."""

    format: str = "segment_pair"
    shards_dir: str = "data/builtin"
    tokenizer_dir: str | None = None
    max_seq_length: int = 128
    short_seq_probability: float = 0.1
    nsp_random_probability: float = 0.5
    batch_size: int = 32
    num_workers: int = 0
    shuffle_buffer_documents: int = 1000
    random_document_pool: int = 100
    holdout_shards: int = 0

    def __post_init__(self) -> None:
        require(
            self.format in FORMATS,
            "data.format",
            self.format,
            f"must be one of {', '.join(FORMATS)}",
        )
        require(
            self.max_seq_length >= 8,
            "data.max_seq_length",
            self.max_seq_length,
            "must be at least 8",
        )
        require_unit_interval(
            "data.short_seq_probability", self.short_seq_probability, open_low=False
        )
        require_unit_interval("data.nsp_random_probability", self.nsp_random_probability)
        require(self.batch_size >= 1, "data.batch_size", self.batch_size, "must be at least 1")
        require(self.num_workers >= 0, "data.num_workers", self.num_workers, "must be 0 or more")
        require(
            self.shuffle_buffer_documents >= 1,
            "data.shuffle_buffer_documents",
            self.shuffle_buffer_documents,
            "must be at least 1",
        )
        require(
            self.random_document_pool >= 1,
            "data.random_document_pool",
            self.random_document_pool,
            "must be at least 1",
        )


@dataclass
class OptimConfig:
    """Optimizer (a `_partial_` receiving the parameter groups) and learning-rate schedule."""

    optimizer: dict = field(
        default_factory=lambda: {
            "_target_": "torch.optim.AdamW",
            "_partial_": True,
            "lr": 1e-4,
            "betas": [0.9, 0.999],
            "eps": 1e-6,
            "weight_decay": 0.01,
        }
    )
    schedule: str = "linear"
    warmup_steps: int = 10000

    def __post_init__(self) -> None:
        lr = self.optimizer.get("lr", 0)
        require(lr > 0, "optim.optimizer.lr", lr, "must be positive")
        require(
            self.schedule in ("linear", "constant"),
            "optim.schedule",
            self.schedule,
            "must be 'linear' or 'constant'",
        )
        require(
            self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be 0 or more"
        )


@dataclass
class TrainerConfig:
    """Lightning Trainer settings; steps are optimizer steps."""

    accelerator: str = "auto"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_steps: int = 1000
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = 1.0
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 500
    keep_checkpoints: int = 2
    enable_progress_bar: bool = True

    def __post_init__(self) -> None:
        require(
            self.precision in PRECISIONS,
            "trainer.precision",
            self.precision,
            f"must be one of {', '.join(PRECISIONS)}",
        )
        require(self.max_steps >= 1, "trainer.max_steps", self.max_steps, "must be at least 1")
        require(
            self.accumulate_grad_batches >= 1,
            "trainer.accumulate_grad_batches",
            self.accumulate_grad_batches,
            "must be at least 1",
        )
        require(
            self.gradient_clip_val is None or self.gradient_clip_val > 0,
            "trainer.gradient_clip_val",
            self.gradient_clip_val,
            "must be positive or null (no clipping)",
        )
        require(
            self.log_every_n_steps >= 1,
            "trainer.log_every_n_steps",
            self.log_every_n_steps,
            "must be at least 1",
        )
        require(
            self.checkpoint_every_n_steps >= 1,
            "trainer.checkpoint_every_n_steps",
            self.checkpoint_every_n_steps,
            "must be at least 1",
        )
        require(
            self.keep_checkpoints >= 1,
            "trainer.keep_checkpoints",
            self.keep_checkpoints,
            "must be at least 1",
        )


@dataclass
class LoggerConfig:
    """CSV metrics are always written; wandb too when `wandb` is true."""

    wandb: bool = True
    project: str = "pretrain"
    group: str | None = None
    mode: str = "auto"

    def __post_init__(self) -> None:
        require(
            self.mode in ("auto", "online", "offline"),
            "logger.mode",
            self.mode,
            "must be auto, online or offline",
        )


@dataclass
class TrainConfig:
    """The whole run. `run_dir` is derived from names, never a timestamp, so requeued jobs find it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    objective: Any = field(
        default_factory=lambda: {"_target_": "pretrain.objectives.mlm.MaskedLanguageModel"}
    )
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 1234
    experiment_name: str = "default"
    run_name: str = "${model.name}-${objective.name}-${data.format}"
    run_dir: str = "runs/${experiment_name}/${run_name}"
    resume: str = "auto"

    def __post_init__(self) -> None:
        self.objective = objective_config(self.objective)
        self.objective.check_data(self.data)
        require(
            self.data.max_seq_length <= self.model.max_position_embeddings,
            "data.max_seq_length",
            self.data.max_seq_length,
            f"must not exceed model.max_position_embeddings ({self.model.max_position_embeddings}) of model {self.model.name}",
        )
        require(
            self.resume in ("auto", "never") or self.resume.endswith(".ckpt"),
            "resume",
            self.resume,
            "must be 'auto', 'never' or the path of a .ckpt file",
        )


def register_schemas() -> None:
    """Register the schemas so `conf/train.yaml` can name them in its defaults list."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)


def validate(cfg: DictConfig) -> TrainConfig:
    """Build the dataclasses from a composed config, running every value check."""
    return OmegaConf.to_object(cfg)


register_schemas()


def compose_config(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """Compose `conf/<config_name>.yaml` with Hydra overrides outside a Hydra app (tests,
    `pretrain-data preview`)."""
    from hydra import compose, initialize_config_dir

    from pretrain.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides or []))
