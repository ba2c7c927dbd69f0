"""The settings of `pretrain.objectives.electra` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    require,
    require_positive,
    require_unit_interval,
)
from pretrain.objectives.configs import (
    objective_schema,
)
from pretrain.objectives.mlm_config import MaskedLMConfig


@objective_schema
@dataclass
class ElectraObjectiveConfig(MaskedLMConfig):
    """ELECTRA's settings. Fractions are of the discriminator's sizes; `temperature` divides
    the generator's logits before sampling; `discriminator_weight` is the paper's lambda."""

    name: str = "electra"
    _target_: str = "pretrain.objectives.electra.ElectraModule"
    pair_task: str = "none"
    mask_token_probability: float = 1.0
    random_token_probability: float = 0.0
    generator_size_fraction: float = 0.25
    generator_layer_fraction: float = 1.0
    discriminator_weight: float = 50.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.pair_task == "none",
            "objective.pair_task",
            self.pair_task,
            "ELECTRA has no sentence task: must be 'none'",
        )
        for key in ("generator_size_fraction", "generator_layer_fraction"):
            require_unit_interval(f"objective.{key}", getattr(self, key), open_high=False)
        require_positive(self, ("discriminator_weight", "temperature"), group="objective")
