"""The settings of `pretrain.objectives.mass` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    require_unit_interval,
)
from pretrain.objectives.configs import (
    Seq2SeqObjectiveConfig,
    objective_schema,
    require_replacement_split,
)


@objective_schema
@dataclass
class MassConfig(Seq2SeqObjectiveConfig):
    """MASS settings: the fragment's share of the body's tokens; the shares of the fragment's
    encoder tokens replaced by [MASK] and by a random token (the rest stay unchanged)."""

    name: str = "mass"
    _target_: str = "pretrain.objectives.mass.MaskedSeq2Seq"
    fragment_fraction: float = 0.5
    mask_token_probability: float = 0.8
    random_token_probability: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        require_unit_interval("objective.fragment_fraction", self.fragment_fraction)
        require_replacement_split(self)
