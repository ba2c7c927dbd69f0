"""GPT's objective: causal (left-to-right) language modelling, next-token prediction.

Data: FULL-SENTENCES packing (`data=full_sentences`, RoBERTa §4.2) fills every sequence with
contiguous sentences, crossing documents. The packed sequences keep their special tokens,
which serve the causal LM as GPT-2's <|endoftext|> does: [CLS] opens each sequence (BOS, never
a target: nothing precedes it) and [SEP] ends each document inside a sequence and the sequence
itself (EOS: predicted, so the model learns where documents end and generation can stop
there). `data=doc_sentences` (no sequence spans two documents) works too.

Corruption: none; the data-loader transform only writes `labels` = the input ids at real
tokens and IGNORE_INDEX at padding, unshifted, as `transformers`' `GPT2LMHeadModel(labels=)`.
Loss: cross-entropy of the logits at position t against the label at t + 1, averaged over
every non-padding target token (the tied LM head projects every position; padding is
ignored by its label, so the shapes are the batch's and the step never reads the device back).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from pretrain.config import TrainConfig
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError
from pretrain.models.build import build_encoder
from pretrain.models.flops import gpt_flops, sequence_sizes
from pretrain.models.generation import GenerationSetup
from pretrain.models.gpt import CachedDecoderStep
from pretrain.models.unpadding import encoder_mask
from pretrain.objectives.base import Losses, Objective
from pretrain.objectives.causal_lm_config import CausalLMConfig
from pretrain.objectives.predictions import masked_classification_metrics


@dataclass(frozen=True)
class CausalLMCorruption:
    """(batch, epoch) -> batch with `labels` (batch, seq): input ids at real tokens,
    IGNORE_INDEX at padding. Nothing is corrupted; the shift happens in the loss."""

    predicts_next_token: ClassVar[bool] = True  # `pretrain-data preview` shows plain text

    def __call__(self, batch: dict, epoch: int) -> dict:
        real = batch["attention_mask"].astype(bool)
        batch["labels"] = np.where(real, batch["input_ids"], IGNORE_INDEX).astype(np.int64)
        return batch


class CausalLanguageModel(Objective):
    """A decoder-only model (`encoder`, e.g. GPTModel) + its tied LM head, trained to predict
    every next token."""

    summary_metric = "lm_loss"

    config_class = CausalLMConfig
    corruption_class = CausalLMCorruption

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__(config, vocab)
        self.encoder = build_encoder(self.run.model, vocab.size, vocab.pad)
        if not getattr(self.encoder, "is_causal", False):
            raise ConfigError(
                f"model._target_ = {self.run.model._target_!r}: objective=causal_lm needs a "
                "decoder-only model that sees only the past (model=gpt_tiny, gpt_small)"
            )

    def forward_flops(self, batch: dict) -> torch.Tensor | None:
        """Forward FLOPs of a batch (`pretrain.models.flops.gpt_flops`): the blocks on the real
        tokens, the LM head on every position but the last; None (6N) for another family."""
        if not hasattr(self.run.model, "n_embd"):
            return None
        tokens, pairs = sequence_sizes(batch["attention_mask"])
        batch_size, seq_len = batch["input_ids"].shape
        rows = batch_size * (seq_len - 1)
        return gpt_flops(self.run.model, tokens, pairs, rows, self.vocab.size)

    def forward(self, batch: dict) -> Losses:
        """Next-token loss, with its accuracy and perplexity as metrics, of one batch (targets: non-padding tokens
        after the first)."""
        hidden = self.encoder(batch["input_ids"], attention_mask=encoder_mask(batch))
        targets = batch["labels"][:, 1:].flatten()  # (batch * (seq - 1),): the next tokens
        logits = self.encoder.logits(hidden[:, :-1].flatten(0, 1))  # (batch * (seq - 1), vocab)
        out = masked_classification_metrics("lm", logits, targets)
        out["lm_perplexity"] = out["lm_loss"].detach().exp()
        return Losses(out["lm_loss"], out)

    def prepare_generation(self, token_ids: torch.Tensor) -> GenerationSetup:
        """Continue a text: the prefix is [CLS] + its (1, n) token ids (no special tokens);
        generation stops at [SEP], the end of a document."""
        device = self.encoder.word_embeddings.weight.device
        bos = torch.full((token_ids.shape[0], 1), self.vocab.cls, dtype=torch.long)
        prefix = torch.cat([bos, token_ids.long()], dim=1).to(device)

        max_length = self.encoder.embeddings.position_embeddings.num_embeddings
        step = CachedDecoderStep(self.encoder)  # (rows, t) ids -> (rows, vocab) logits
        return GenerationSetup(step, prefix, eos_id=self.vocab.sep, max_length=max_length)
