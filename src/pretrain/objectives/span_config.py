"""The settings of `pretrain.objectives.span` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    ConfigError,
    require,
)
from pretrain.objectives.configs import (
    objective_schema,
)
from pretrain.objectives.mlm_config import MaskedLMConfig


@objective_schema
@dataclass
class SpanMaskingConfig(MaskedLMConfig):
    """MLM settings + span lengths (in words) + the SBO's position table size (in tokens)."""

    name: str = "span"
    _target_: str = "pretrain.objectives.span.SpanBert"
    pair_task: str = "none"
    span_geometric_p: float = 0.2  # success probability of the geometric span length (words)
    span_max_words: int = 10  # longer draws are clipped to this many words
    sbo_max_span_tokens: int = 200

    pair_tasks = ("none",)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            0 < self.span_geometric_p <= 1,
            "objective.span_geometric_p",
            self.span_geometric_p,
            "must lie in (0, 1] (the success probability of the geometric span length; SpanBERT uses 0.2)",
        )
        require(
            self.span_max_words >= 1,
            "objective.span_max_words",
            self.span_max_words,
            "must be at least 1 word (SpanBERT truncates span lengths to 1..10)",
        )
        require(
            self.sbo_max_span_tokens >= 1,
            "objective.sbo_max_span_tokens",
            self.sbo_max_span_tokens,
            "must be at least 1 (positions inside longer spans share the last embedding)",
        )

    def check_data(self, data_format: str) -> None:
        from pretrain.data.input_formats import PAIR_FORMATS

        if data_format in PAIR_FORMATS:
            raise ConfigError(
                f"data.format = {data_format!r}: objective=span (SpanBERT) trains on single "
                "segments without a sentence task; use data=full_sentences or data=doc_sentences"
            )
