"""The settings of `pretrain.objectives.ernie` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    require,
)
from pretrain.objectives.configs import (
    objective_schema,
)
from pretrain.objectives.mlm_config import MaskedLMConfig

# ERNIE's masking units
MASKING_LEVELS = ("basic", "phrase", "entity")


@objective_schema
@dataclass
class ErnieConfig(MaskedLMConfig):
    """MLM settings + which annotations are masking units (`MASKING_LEVELS`)."""

    name: str = "ernie"
    _target_: str = "pretrain.objectives.ernie.ErnieMaskedLM"
    masking_level: str = "entity"  # units: basic (words) | phrase (+ phrases) | entity (+ entities)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.masking_level in MASKING_LEVELS,
            "objective.masking_level",
            self.masking_level,
            f"must be one of {', '.join(MASKING_LEVELS)} (ERNIE's stages: words; + phrases; "
            "+ entities)",
        )
