"""The whole run's config (`TrainConfig`): its sections and the run's own keys; types,
defaults and the checks of single values. The checks across sections, and what is derived
from the config (the batch plan, ...), run once in `pretrain.config.validation.validate_run`.
"""

from dataclasses import dataclass, field

from pretrain.config.data_schema import DataConfig
from pretrain.config.optim_schema import OptimConfig
from pretrain.config.trainer_schema import LoggerConfig, StrategyConfig, TrainerConfig
from pretrain.errors import require
from pretrain.models.configs import ModelConfig
from pretrain.objectives.configs import ObjectiveConfig


@dataclass
class TrainConfig:
    """The whole run. `run_dir` is derived from names, never a timestamp, so requeued jobs find it."""

    # Typed while Hydra composes: each model yaml starts from its family's schema
    # (`pretrain.models.configs.MODEL_SCHEMAS`), each objective yaml from its objective's
    # (`pretrain.objectives.configs.objective_schemas()`: each `objectives/*_config.py`).
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    seed: int = 1234  # the stream's order, the corruption's draws, the initial weights
    experiment_name: str = "default"
    # In a sweep (-m) each job appends its overrides (`${sweep_suffix:}`), so points never
    # share a run.
    run_name: str = "${model.name}-${objective.name}-${data.format}${sweep_suffix:}"
    # Derived from names, not a timestamp, so a relaunched or requeued job finds its checkpoints.
    run_dir: str = "runs/${experiment_name}/${run_name}"
    # auto: continue from the newest complete checkpoint in ${run_dir}/checkpoints, refused
    # (exit 2) when the config changed what is trained; force: continue it anyway; never: start
    # over (old checkpoints move to checkpoints.previous/); or a .ckpt path.
    resume: str = "auto"
    # A Hugging Face directory or a `pretrain` .ckpt whose weights initialise a new run
    # (continued pretraining); an error when the run directory holds a checkpoint of a run
    # that did not start from it (pretrain.checkpoint.relaunch.check_init_from).
    init_from: str | None = None

    def __post_init__(self) -> None:
        require(
            self.resume in ("auto", "never", "force") or self.resume.endswith(".ckpt"),
            "resume",
            self.resume,
            "must be 'auto', 'never', 'force' or the path of a .ckpt file",
        )
