"""The settings of `pretrain.objectives.causal_lm` (its `config_class`), torch-free."""

from dataclasses import dataclass

from pretrain.errors import (
    ConfigError,
)
from pretrain.objectives.configs import (
    ObjectiveConfig,
    objective_schema,
)

# Input formats (`data.format`) the causal LM reads
CAUSAL_FORMATS = ("full_sentences", "filled_sentences", "token_blocks", "doc_sentences")


@objective_schema
@dataclass
class CausalLMConfig(ObjectiveConfig):
    """Causal LM settings: none of its own beyond the objective's name."""

    name: str = "causal_lm"
    _target_: str = "pretrain.objectives.causal_lm.CausalLanguageModel"
    dupe_factor: int = 1  # nothing is masked: masking and dupe_factor have no effect

    hf_generation = ("gpt2", "full_sentences")  # a GPT-2 continues single segments

    def check_data(self, data_format: str) -> None:
        if data_format not in CAUSAL_FORMATS:
            raise ConfigError(
                f"data.format = {data_format!r}: the causal LM reads single-segment sequences; "
                "use data=full_sentences (GPT-2 style packing) or data=doc_sentences"
            )
