"""ALBERT's n-gram masking (Lan et al., 2020): MLM whose masking units are n-grams of whole
words, n in 1..max_ngram with p(n) proportional to 1/n.

N-grams tile each row's words and are taken in a keyed random order, never overlapping, until
round(mlm_probability * candidates) tokens are selected (`pretrain.data.span_masking.select_units`);
the 80/10/10 rule is decided once per n-gram. The sentence task is NSP by default; ALBERT's
recipe sets `objective.pair_task=sop`.
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pretrain.data.masking import word_start_flags
from pretrain.data.span_masking import select_ngrams
from pretrain.objectives.mlm import MaskedLanguageModel, MaskedLMCorruption
from pretrain.objectives.ngram_config import NgramMaskingConfig


@dataclass(frozen=True)
class NgramCorruption(MaskedLMCorruption):
    """MaskedLMCorruption whose units are word n-grams."""

    collated_fields: ClassVar = (*MaskedLMCorruption.collated_fields, "word_starts")

    max_ngram: int = NgramMaskingConfig.max_ngram

    def select(
        self, batch: dict, candidates: np.ndarray, hashes: np.ndarray, epoch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(selected (batch, seq) bool, first token of each token's n-gram (batch, seq) int64)."""
        return select_ngrams(
            word_start_flags(batch["word_starts"], candidates),
            candidates,
            hashes,
            seed=self.seed,
            epoch=epoch,
            probability=self.mlm_probability,
            max_ngram=self.max_ngram,
        )


class NgramMaskedLM(MaskedLanguageModel):
    """MLM with ALBERT's n-gram masking (+ the configured sentence task)."""

    config_class = NgramMaskingConfig
    corruption_class = NgramCorruption
