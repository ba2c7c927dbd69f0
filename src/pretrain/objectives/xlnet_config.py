"""The settings of `pretrain.objectives.xlnet` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    ConfigError,
    require,
    require_unit_interval,
)
from pretrain.objectives.configs import (
    ObjectiveConfig,
    objective_schema,
)

# Input formats (`data.format`) XLNet reads
XLNET_FORMATS = (
    "xlnet_pair",
    "xlnet_memory",
    "full_sentences",
    "filled_sentences",
    "token_blocks",
    "doc_sentences",
)


@objective_schema
@dataclass
class PermutationLMConfig(ObjectiveConfig):
    """`partial_prediction_k`: K, 1/K of each sequence's candidate tokens are predicted;
    `order`: "uniform" (the paper) or "span" (targets in spans of 1..max_span_length tokens,
    the released code / HF's collator); `memory_random_b_probability`: with
    data.format=xlnet_memory, how often segment B is text of another document instead of A's
    continuation (XLNet's data_utils.py: 0.5; 0 = B always continues A)."""

    name: str = "xlnet"
    _target_: str = "pretrain.objectives.xlnet.PermutationLanguageModel"
    partial_prediction_k: float = 6.0
    order: str = "uniform"
    max_span_length: int = 5
    memory_random_b_probability: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.partial_prediction_k >= 1,
            "objective.partial_prediction_k",
            self.partial_prediction_k,
            "must be at least 1 (1 = predict every token)",
        )
        from pretrain.data.permutation import ORDERS  # numpy, no torch

        require(self.order in ORDERS, "objective.order", self.order, f"must be one of {ORDERS}")
        require(
            self.max_span_length >= 1,
            "objective.max_span_length",
            self.max_span_length,
            "must be at least 1 token",
        )
        require_unit_interval(
            "objective.memory_random_b_probability",
            self.memory_random_b_probability,
            open_low=False,
            open_high=False,
        )

    def check_data(self, data_format: str) -> None:
        if data_format not in XLNET_FORMATS:
            raise ConfigError(
                f"data.format = {data_format!r}: XLNet needs one of {', '.join(XLNET_FORMATS)} "
                "(xlnet_pair: A [SEP] B [SEP] [CLS] as in the paper; xlnet_memory: the same with "
                "a memory carried across batches)"
            )
