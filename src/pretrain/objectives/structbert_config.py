"""The settings of `pretrain.objectives.structbert` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    require_unit_interval,
)
from pretrain.objectives.configs import (
    objective_schema,
)
from pretrain.objectives.mlm_config import MaskedLMConfig


@objective_schema
@dataclass
class StructBertConfig(MaskedLMConfig):
    """MLM settings + the word structural objective's share of tokens in shuffled trigrams;
    the sentence task is three-way by default."""

    name: str = "structbert"
    _target_: str = "pretrain.objectives.structbert.StructBert"
    pair_task: str = "three_way"
    shuffle_probability: float = 0.05

    pair_tasks = ("three_way", "nsp", "sop", "none")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_unit_interval("objective.shuffle_probability", self.shuffle_probability)
