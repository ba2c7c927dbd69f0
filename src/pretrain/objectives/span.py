"""SpanBERT (Joshi et al., 2020): span masking + the span boundary objective (SBO), on single
segments without a sentence task.

Corruption: spans of whole words, lengths ~ Geometric(span_geometric_p) truncated to
1..`span_max_words` words and renormalised (SpanBERT's sampler: mean 3.8 words at 0.2 and
10), starting at uniformly drawn words, never overlapping, until round(mlm_probability *
candidates) tokens are covered (`pretrain.data.span_masking.select_spans`);
the 80/10/10 rule is decided once per span. The batch gains `span_left`, `span_right` (the
token indices just before and after each predicted token's span) and `span_position` (0-based
position inside the span), all (batch, seq) int64, 0 where labels is IGNORE_INDEX.
Loss: MLM + SBO (`SpanBoundaryHead`, decoder tied to the word embeddings).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from pretrain.config import TrainConfig
from pretrain.data.masking import word_start_flags
from pretrain.data.span_masking import select_spans, span_boundaries
from pretrain.data.vocab import Vocabulary
from pretrain.models.heads import SpanBoundaryHead
from pretrain.objectives.base import Losses
from pretrain.objectives.mlm import (
    MaskedLanguageModel,
    MaskedLMCorruption,
)
from pretrain.objectives.predictions import (
    gather_positions,
    gather_targets,
    masked_classification_metrics,
    predicted_positions,
)
from pretrain.objectives.span_config import SpanMaskingConfig


@dataclass(frozen=True)
class SpanCorruption(MaskedLMCorruption):
    """MaskedLMCorruption whose units are SpanBERT spans; adds the SBO targets to the batch."""

    collated_fields: ClassVar = (*MaskedLMCorruption.collated_fields, "word_starts")

    span_geometric_p: float = SpanMaskingConfig.span_geometric_p
    span_max_words: int = SpanMaskingConfig.span_max_words

    def select(
        self, batch: dict, candidates: np.ndarray, hashes: np.ndarray, epoch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(selected (batch, seq) bool, first token of each token's span (batch, seq) int64).
        Also writes span_left, span_right, span_position into `batch` (see the module)."""
        selected, unit_start = select_spans(
            word_start_flags(batch["word_starts"], candidates),
            candidates,
            hashes,
            seed=self.seed,
            epoch=epoch,
            probability=self.mlm_probability,
            geometric_p=self.span_geometric_p,
            max_span_words=self.span_max_words,
        )
        batch["span_left"], batch["span_right"], batch["span_position"] = span_boundaries(
            selected, unit_start
        )
        return selected, unit_start


class SpanBert(MaskedLanguageModel):
    """Encoder + tied MLM head + span boundary head; loss = MLM + SBO."""

    config_class = SpanMaskingConfig
    corruption_class = SpanCorruption

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__(config, vocab)
        model = self.run.model
        self.sbo_head = SpanBoundaryHead(
            model.hidden_size,
            self.run.objective.sbo_max_span_tokens,
            model.layer_norm_eps,
            self.encoder.word_embeddings,
            initializer_range=model.initializer_range,
        )

    def extra_head_flops(self, batch: dict) -> int:
        """The SBO head on the prediction slots: 3h -> h, h -> h, h -> vocabulary."""
        hidden = self.run.model.hidden_size
        rows = predicted_positions(batch).numel()
        return 2 * rows * (3 * hidden * hidden + hidden * hidden + hidden * self.vocab.size)

    def extra_losses(self, hidden: torch.Tensor, batch: dict) -> Losses:
        """The SBO loss, with its loss and accuracy as metrics, over the predicted tokens (the MLM's prediction positions);
        hidden (batch, seq, hidden)."""
        positions = predicted_positions(batch)  # (batch, width), -1 = ignored slot
        width = positions.shape[1]
        left = gather_positions(batch["span_left"], positions).view(-1, width)  # (batch, width)
        right = gather_positions(batch["span_right"], positions).view(-1, width)
        where = gather_positions(batch["span_position"], positions)  # (batch * width,)
        logits = self.sbo_head(
            gather_positions(hidden, left), gather_positions(hidden, right), where
        )  # (batch * width, vocab)
        metrics = masked_classification_metrics(
            "sbo", logits, gather_targets(batch["labels"], positions)
        )
        return Losses(metrics["sbo_loss"], metrics)
