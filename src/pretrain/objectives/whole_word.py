"""Whole-word masking (BERT-wwm; Chinese BERT-wwm, whose word starts come from jieba when the
corpus is prepared): MLM whose masking units are whole words.

Words are taken in a random order until round(mlm_probability * candidates) tokens are
selected, a word that would overshoot being skipped (BERT's create_pretraining_data); every
token of a chosen word is predicted and the 80/10/10 rule is decided once per word. The loss,
heads and sentence task (NSP by default, like BERT-wwm) are BERT's.
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pretrain.data.keyed_rng import keyed_uniform
from pretrain.data.masking import STREAM_MASK_UNIT_ORDER, select_whole_units, word_start_flags
from pretrain.objectives.mlm import MaskedLanguageModel, MaskedLMCorruption


@dataclass(frozen=True)
class WholeWordCorruption(MaskedLMCorruption):
    """MaskedLMCorruption whose units are whole words (from the batch's `word_starts`)."""

    collated_fields: ClassVar = (*MaskedLMCorruption.collated_fields, "word_starts")

    def units(self, batch: dict, candidates: np.ndarray) -> np.ndarray:
        """(batch, seq) bool: the tokens that start a masking unit (here: words)."""
        return word_start_flags(batch["word_starts"], candidates)

    def select(
        self, batch: dict, candidates: np.ndarray, hashes: np.ndarray, epoch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(selected (batch, seq) bool, first token of each token's unit (batch, seq) int64)."""
        uniform = keyed_uniform(
            self.seed, epoch, STREAM_MASK_UNIT_ORDER, hashes, candidates.shape[1]
        )
        return select_whole_units(
            self.units(batch, candidates), candidates, uniform, self.mlm_probability
        )


class WholeWordMaskedLM(MaskedLanguageModel):
    """BERT (MLM + NSP by default) with whole-word masking."""

    corruption_class = WholeWordCorruption
