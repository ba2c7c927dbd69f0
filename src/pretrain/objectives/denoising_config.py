"""The settings of `pretrain.objectives.denoising` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    require,
    require_probabilities,
    require_unit_interval,
)
from pretrain.objectives.configs import (
    Seq2SeqObjectiveConfig,
    objective_schema,
)


@objective_schema
@dataclass
class DenoisingConfig(Seq2SeqObjectiveConfig):
    """BART's noise: fractions of the body's tokens (masking, deletion, infilling), fraction
    of sentences shuffled (permutation), probability of rotating (rotation)."""

    name: str = "bart"
    _target_: str = "pretrain.objectives.denoising.DenoisingAutoencoder"
    token_masking: float = 0.0
    token_deletion: float = 0.0
    text_infilling: float = 0.3
    poisson_lambda: float = 3.0  # mean span length of text infilling, in tokens
    sentence_permutation: float = 1.0
    document_rotation: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require_probabilities(
            self, ("token_masking", "token_deletion", "text_infilling"), group="objective"
        )
        for key in ("sentence_permutation", "document_rotation"):
            require_unit_interval(
                f"objective.{key}", getattr(self, key), open_low=False, open_high=False
            )
        require(
            self.poisson_lambda > 0,
            "objective.poisson_lambda",
            self.poisson_lambda,
            "must be positive (mean span length in tokens)",
        )
