"""BERT's objective: masked language modelling (+ a sentence-relation task), and the base of
every MLM-family objective.

Corruption: `MaskedLMCorruption` selects 15% of the non-special tokens of each sequence and
applies the 80/10/10 rule, keyed by (seed, epoch, sequence key), where the stream passes the
epoch that seeds the masks (under static masking epoch % dupe_factor). Subclasses change only `select` (which tokens, grouped in which units).
The batch also gains `prediction_positions` (batch, width): each row's selected positions,
padded with -1 to a width from a fixed set (`pretrain.data.prediction_budget`; the base budget
is ceil(mlm_probability x data.max_seq_length), like BERT's max_predictions_per_seq).
Loss: cross-entropy over the selected positions only (the head projects to the vocabulary
only at the gathered positions; ignored slots do not count) + the sentence task on [CLS]
(NSP or SOP: 2 classes) + the loss of a subclass's `extra_losses`.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from pretrain.config import TrainConfig
from pretrain.data.keyed_rng import STREAM_MASK_SELECT, key_hashes, keyed_uniform
from pretrain.data.masking import candidate_tokens, corrupt_selected, select_exact_fraction
from pretrain.data.prediction_budget import prediction_positions, prediction_widths
from pretrain.data.vocab import Vocabulary
from pretrain.models.build import build_encoder
from pretrain.models.document_attention import document_inputs
from pretrain.models.flops import (
    bert_family,
    embedding_size,
    encoder_flops,
    mlm_head_flops,
    sentence_head_flops,
    sequence_sizes,
)
from pretrain.models.heads import MaskedLMHead, NextSentenceHead
from pretrain.models.unpadding import encoder_mask, unpadded_inputs
from pretrain.objectives.base import Losses, Objective
from pretrain.objectives.mlm_config import MaskedLMConfig
from pretrain.objectives.predictions import (
    gather_positions,
    gather_targets,
    masked_classification_metrics,
    predicted_positions,
)

SENTENCE_TASK_LABELS = {"nsp": 2, "sop": 2, "three_way": 3}


@dataclass(frozen=True)
class MaskedLMCorruption:
    """(batch, epoch) -> batch with corrupted input_ids, labels (IGNORE_INDEX = not
    predicted) and prediction_positions (see the module docstring). `max_seq_length`: the
    run's data.max_seq_length, which sizes the prediction budget (None: the batch's width)."""

    seed: int
    vocab_size: int
    mask_token_id: int
    special_ids: tuple[int, ...]
    mlm_probability: float = MaskedLMConfig.mlm_probability
    mask_token_probability: float = MaskedLMConfig.mask_token_probability
    random_token_probability: float = MaskedLMConfig.random_token_probability
    max_seq_length: int | None = None
    # the collated arrays it reads (`reading.collate`); units of words or phrases add theirs
    collated_fields: ClassVar = ("input_ids", "token_type_ids", "attention_mask")

    def prediction_widths(self, max_seq_length: int) -> tuple[int, ...]:
        """The widths `prediction_positions` may have for sequences of `max_seq_length`."""
        return prediction_widths(self.mlm_probability * max_seq_length, max_seq_length)

    def shape_axes(self, max_seq_length: int) -> dict[str, tuple[int, ...]]:
        """The batch axes this corruption sizes (`prediction_budget.shape_set`)."""
        return {"predictions": self.prediction_widths(max_seq_length)}

    def select(
        self, batch: dict, candidates: np.ndarray, hashes: np.ndarray, epoch: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Which tokens to predict, (batch, seq) bool, and the first token of each one's masking
        unit, (batch, seq) int64, or None when every token is its own unit. Token level:
        exactly round(p * candidates) tokens per row."""
        uniform = keyed_uniform(self.seed, epoch, STREAM_MASK_SELECT, hashes, candidates.shape[1])
        return select_exact_fraction(uniform, candidates, self.mlm_probability), None

    def __call__(self, batch: dict, epoch: int) -> dict:
        hashes = key_hashes(batch["keys"])
        candidates = candidate_tokens(batch["input_ids"], batch["attention_mask"], self.special_ids)
        return self.mask_candidates(batch, epoch, hashes, candidates)

    def mask_candidates(
        self, batch: dict, epoch: int, hashes: np.ndarray, candidates: np.ndarray
    ) -> dict:
        """`__call__` given the rows' key hashes (batch,) uint64 and the tokens that may be
        predicted, candidates (batch, seq) bool (`masking.candidate_tokens`)."""
        ids = batch["input_ids"]
        selected, unit_start = self.select(batch, candidates, hashes, epoch)
        batch["input_ids"], batch["labels"] = corrupt_selected(
            ids,
            selected,
            unit_start,
            hashes,
            seed=self.seed,
            epoch=epoch,
            vocab_size=self.vocab_size,
            mask_token_id=self.mask_token_id,
            mask_token_probability=self.mask_token_probability,
            random_token_probability=self.random_token_probability,
        )
        length = self.max_seq_length or ids.shape[1]
        batch["prediction_positions"] = prediction_positions(  # labels are set where selected
            selected, self.prediction_widths(length)
        )
        return batch


def mlm_corruption_inputs(vocab: Vocabulary, config: TrainConfig) -> dict:
    """The vocabulary's part of a `MaskedLMCorruption` (its size, [MASK] and special ids) and
    the run's data.max_seq_length, which sizes the prediction budget."""
    return {
        "vocab_size": vocab.size,
        "mask_token_id": vocab.mask,
        "special_ids": vocab.special_ids,
        "max_seq_length": config.data.max_seq_length,
    }


def classification_metrics(
    name: str, logits: torch.Tensor, targets: torch.Tensor
) -> dict[str, torch.Tensor]:
    """{name_loss: cross-entropy (in fp32), name_accuracy} of logits (n, classes), targets (n,)."""
    logits = logits.float()
    return {
        f"{name}_loss": F.cross_entropy(logits, targets),
        f"{name}_accuracy": (logits.argmax(-1) == targets).float().mean(),
    }


class MaskedLanguageModel(Objective):
    """Encoder + tied MLM head (+ a sentence-relation head when objective.pair_task is set)."""

    config_class = MaskedLMConfig
    corruption_class = MaskedLMCorruption

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__(config, vocab)
        model = self.run.model
        init = model.initializer_range
        self.encoder = build_encoder(model, vocab.size, vocab.pad)
        self.mlm_head = MaskedLMHead(
            model.hidden_size,
            vocab.size,
            model.layer_norm_eps,
            self.encoder.word_embeddings,
            initializer_range=init,
            hidden_act=model.head_activation,
            bias=model.head_bias,
        )
        self.pair_task = self.run.objective.pair_task
        head = None
        if self.pair_task != "none":
            head = NextSentenceHead(model.hidden_size, init, SENTENCE_TASK_LABELS[self.pair_task])
        self.sentence_head = head

    @classmethod
    def corruption_inputs(cls, config: TrainConfig, vocab: Vocabulary) -> dict:
        return mlm_corruption_inputs(vocab, config)

    def extra_losses(self, hidden: torch.Tensor, batch: dict) -> Losses | None:
        """What a subclass adds to MLM (e.g. SpanBERT's SBO): its loss, added to the MLM
        loss, and its metrics; None: nothing."""
        return None

    def forward_flops(self, batch: dict) -> torch.Tensor | None:
        """Forward FLOPs of a batch (`pretrain.models.flops`): the encoder on its real tokens, the
        MLM head on the prediction budget's slots (the sparse head), the sentence head on one
        row a sequence, and the subclass's `extra_head_flops`; None (the 6N rule) for an
        encoder outside the BERT family."""
        model = self.run.model
        if not bert_family(model):
            return None
        tokens, pairs = sequence_sizes(batch["attention_mask"])
        hidden, embedding = model.hidden_size, embedding_size(model)
        rows = predicted_positions(batch).numel()
        flops = encoder_flops(model, tokens, pairs)
        flops = flops + mlm_head_flops(hidden, embedding, self.vocab.size, rows)
        if self.sentence_head is not None:
            labels = self.sentence_head.classifier.out_features
            flops = flops + sentence_head_flops(hidden, labels, batch["input_ids"].shape[0])
        return flops + self.extra_head_flops(batch)

    def extra_head_flops(self, batch: dict) -> int:
        """Forward FLOPs of the heads `extra_losses` runs (0: none)."""
        return 0

    def encode(self, batch: dict) -> torch.Tensor:
        """The encoder's (batch, seq, hidden) states of a batch (its padding mask, unpadded
        when the batch brings an `unpadded_index`); UniLM passes its attention masks."""
        return self.encoder(
            batch["input_ids"],
            batch["token_type_ids"],
            encoder_mask(batch),
            **unpadded_inputs(batch),
            **document_inputs(batch),
        )

    def forward(self, batch: dict) -> Losses:
        """Loss (MLM + the sentence task + `extra_losses`) and metrics (each part's loss and
        accuracy) of one batch."""
        hidden = self.encode(batch)  # (batch, seq, hidden)
        positions = predicted_positions(batch)  # (batch, width), -1 = ignored slot
        targets = gather_targets(batch["labels"], positions)  # (batch * width,)
        logits = self.mlm_head(gather_positions(hidden, positions))  # (batch * width, vocab)
        metrics = masked_classification_metrics("mlm", logits, targets)
        loss = metrics["mlm_loss"]
        if self.sentence_head is not None:
            sentence = self.sentence_head(hidden)
            labels = batch["next_sentence_label"]
            metrics.update(classification_metrics(self.pair_task, sentence, labels))
            loss = loss + metrics[f"{self.pair_task}_loss"]
        extra = self.extra_losses(hidden, batch)
        if extra is not None:
            metrics.update(extra.metrics)
            loss = loss + extra.loss
        return Losses(loss, metrics)
