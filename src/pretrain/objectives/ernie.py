"""ERNIE 1.0 (Sun et al., 2019) knowledge masking: MLM whose masking units are annotated
phrases and entities and, outside them, whole words.

Units come from the batch's per-token `phrases` flags (a phrase or entity = its first token,
flagged 1 or 2, and the tokens flagged 3 after it; see pretrain.data.shard_format) and its
`word_starts`. `objective.masking_level` says which annotations are units, cumulatively as in
ERNIE's three learning stages: `basic` none (every word a unit), `phrase` phrases, `entity`
phrases and entities (the default); the tokens of an annotation that is not a unit are masked
word by word. ERNIE's recipe runs the three in turn (`objective.stages`, pretrain/data/
stages.py). Units are taken in a random order until round(mlm_probability * candidates)
tokens are selected, a unit that would overshoot being skipped; the 80/10/10 rule is decided
once per unit. Without annotations (all flags 0) this is whole-word masking. The loss, heads
and sentence task (NSP by default) are BERT's.
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pretrain.data.masking import INSIDE_SPAN, PHRASE_START, phrase_unit_flags, unit_start_index
from pretrain.objectives.ernie_config import ErnieConfig
from pretrain.objectives.mlm import MaskedLanguageModel
from pretrain.objectives.whole_word import WholeWordCorruption


def level_annotations(phrases: np.ndarray, masking_level: str) -> np.ndarray:
    """The `phrases` flags (batch, seq) uint8 that are units at `masking_level`: all of them
    (entity), those of phrases (phrase: an entity's run of flags is cleared, as is an inside
    run whose start was cut off), or none (basic)."""
    if masking_level == "entity":
        return phrases
    if masking_level == "basic":
        return np.zeros_like(phrases)
    run_start = unit_start_index(phrases != INSIDE_SPAN)  # (batch, seq): the run's first token
    kind = np.take_along_axis(phrases, run_start, axis=1)
    return np.where(kind == PHRASE_START, phrases, 0).astype(phrases.dtype)


@dataclass(frozen=True)
class ErnieCorruption(WholeWordCorruption):
    """Whole-unit masking whose units are annotated phrases/entities (per `masking_level`)
    and words."""

    masking_level: str = ErnieConfig.masking_level
    collated_fields: ClassVar = (*WholeWordCorruption.collated_fields, "phrases")

    def units(self, batch: dict, candidates: np.ndarray) -> np.ndarray:
        phrases = level_annotations(batch["phrases"], self.masking_level)
        return phrase_unit_flags(phrases, batch["word_starts"], candidates)


class ErnieMaskedLM(MaskedLanguageModel):
    """ERNIE 1.0's phrase- and entity-level masking with BERT's MLM (+ NSP by default)."""

    config_class = ErnieConfig
    corruption_class = ErnieCorruption
