"""The settings of `pretrain.objectives.mlm` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    ConfigError,
    require_unit_interval,
)
from pretrain.objectives.configs import (
    ObjectiveConfig,
    objective_schema,
    require_replacement_split,
)


@objective_schema
@dataclass
class MaskedLMConfig(ObjectiveConfig):
    """MLM settings; probabilities of selection per token, of replacement per selected unit."""

    pair_task: str = "nsp"  # sentence-relation task on [CLS]: nsp | sop | none
    mlm_probability: float = 0.15
    mask_token_probability: float = 0.8
    random_token_probability: float = 0.1

    pair_tasks = ("nsp", "sop", "none")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_unit_interval("objective.mlm_probability", self.mlm_probability)
        require_replacement_split(self)
        if self.pair_task not in self.pair_tasks:
            raise ConfigError(
                f"objective.pair_task = {self.pair_task!r}: must be one of {', '.join(self.pair_tasks)}"
            )

    @property
    def sentence_task(self) -> str:
        return self.pair_task

    def check_data(self, data_format: str) -> None:
        from pretrain.data.input_formats import PAIR_FORMATS  # the formats' module: numpy

        if self.pair_task != "none" and data_format not in PAIR_FORMATS:
            raise ConfigError(
                f"objective.pair_task = {self.pair_task!r}: a sentence task needs a pair format "
                f"(data=segment_pair or data=sentence_pair; data.format is {data_format!r}); "
                "use objective=mlm for single-segment formats"
            )
