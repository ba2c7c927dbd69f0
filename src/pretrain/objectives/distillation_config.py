"""The settings of `pretrain.objectives.distillation` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    require,
)
from pretrain.objectives.configs import (
    objective_schema,
)
from pretrain.objectives.mlm_config import MaskedLMConfig


@objective_schema
@dataclass
class DistillationConfig(MaskedLMConfig):
    """MLM settings plus the teacher (path) and the loss weights; temperature T > 0."""

    name: str = "distillation"
    _target_: str = "pretrain.objectives.distillation.DistillationModule"
    pair_task: str = "none"
    teacher: str | None = None
    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    # false: the student keeps its random initialisation (the paper's ablation, Table 4)
    init_from_teacher: bool = True  # false: a random student (the paper's ablation)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.pair_task == "none",
            "objective.pair_task",
            self.pair_task,
            "must be 'none': DistilBERT has no sentence task",
        )
        require(self.temperature > 0, "objective.temperature", self.temperature, "must be positive")
        for key in ("alpha_ce", "alpha_mlm", "alpha_cos"):
            require(getattr(self, key) >= 0, f"objective.{key}", getattr(self, key), "must be >= 0")
        total = self.alpha_ce + self.alpha_mlm + self.alpha_cos
        require(
            total > 0, "objective.alpha_ce", self.alpha_ce, "the three alphas sum to 0: no loss"
        )
