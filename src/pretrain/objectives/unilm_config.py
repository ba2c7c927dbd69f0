"""The settings of `pretrain.objectives.unilm` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    ConfigError,
    require,
)
from pretrain.objectives.configs import (
    objective_schema,
)
from pretrain.objectives.mlm_config import MaskedLMConfig

# the formats whose token types mark a source segment (0) and a target segment (1)
UNILM_FORMATS = ("segment_pair", "sentence_pair")


@objective_schema
@dataclass
class UniLMConfig(MaskedLMConfig):
    """UniLM's settings: MLM's (15%, 80/10/10) and the relative weights of the four kinds
    (the paper's 2 : 1 : 1 : 2, i.e. 1/3 bidirectional, 1/6 each direction, 1/3 seq2seq)."""

    name: str = "unilm"
    _target_: str = "pretrain.objectives.unilm.UniLM"
    pair_task: str = "none"
    bidirectional_weight: float = 2.0
    left_to_right_weight: float = 1.0
    right_to_left_weight: float = 1.0
    seq2seq_weight: float = 2.0

    pair_tasks = ("none",)  # B must be A's continuation: seq2seq learns to write it
    # a BERT export writes segment B after a source segment A under the seq2seq mask
    hf_generation = ("bert", "segment_pair")

    def __post_init__(self) -> None:
        super().__post_init__()
        for kind in ("bidirectional", "left_to_right", "right_to_left", "seq2seq"):
            key = f"{kind}_weight"
            require(getattr(self, key) >= 0, f"objective.{key}", getattr(self, key), "must be >= 0")
        total = sum(self.lm_kind_weights)
        require(total > 0, "objective.*_weight", total, "the four weights must not all be 0")

    @property
    def lm_kind_weights(self) -> tuple[float, float, float, float]:
        """The weights in kind-code order (`pretrain.data.lm_kinds`)."""
        return (
            self.bidirectional_weight,
            self.left_to_right_weight,
            self.right_to_left_weight,
            self.seq2seq_weight,
        )

    def check_data(self, data_format: str) -> None:
        if data_format not in UNILM_FORMATS:
            raise ConfigError(
                f"data.format = {data_format!r}: UniLM's seq2seq LM needs a source and a target "
                f"segment; use data=segment_pair or data=sentence_pair"
            )
