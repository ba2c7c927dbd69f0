"""The settings of `pretrain.objectives.ngram` (its `config_class`), torch-free."""

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
class NgramMaskingConfig(MaskedLMConfig):
    """MLM settings + the longest n-gram, in words."""

    name: str = "ngram"
    _target_: str = "pretrain.objectives.ngram.NgramMaskedLM"
    max_ngram: int = 3  # longest n-gram, in words

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.max_ngram >= 1,
            "objective.max_ngram",
            self.max_ngram,
            "must be at least 1 word (ALBERT uses 3; 1 is whole-word masking)",
        )
