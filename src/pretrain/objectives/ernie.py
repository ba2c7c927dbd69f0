"""ERNIE 1.0 (Sun et al., 2019) knowledge masking: MLM whose masking units are annotated
phrases and entities and, outside them, whole words.

Units come from the batch's per-token `phrases` flags (a phrase or entity = its first token,
flagged 1 or 2, and the tokens flagged 3 after it; see pretrain.data.shard_format) and its
`word_starts`. Units are taken in a random order until round(mlm_probability * candidates)
tokens are selected, a unit that would overshoot being skipped; the 80/10/10 rule is decided
once per unit. Without annotations (all flags 0) this is whole-word masking. The loss, heads
and sentence task (NSP by default) are BERT's.
"""

from dataclasses import dataclass

import numpy as np

from pretrain.data.masking import phrase_unit_flags
from pretrain.objectives.mlm import MaskedLanguageModel
from pretrain.objectives.whole_word import WholeWordCorruption


@dataclass(frozen=True)
class ErnieCorruption(WholeWordCorruption):
    """Whole-unit masking whose units are annotated phrases/entities and words."""

    def units(self, batch: dict, candidates: np.ndarray) -> np.ndarray:
        return phrase_unit_flags(batch["phrases"], batch["word_starts"], candidates)


class ErnieMaskedLM(MaskedLanguageModel):
    """ERNIE 1.0's phrase- and entity-level masking with BERT's MLM (+ NSP by default)."""

    corruption_class = ErnieCorruption
