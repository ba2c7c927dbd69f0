"""UniLM (Dong et al., 2019): one BERT encoder trained as a bidirectional, a left-to-right, a
right-to-left and a sequence-to-sequence language model, the kind chosen per sequence by the
self-attention mask, with one cloze objective.

Corruption (`UniLMCorruption`, in the data-loader workers): each sequence of a pair format
([CLS] A [SEP] B [SEP], B the true continuation: no sentence task) draws its kind from its
key (`pretrain.data.lm_kinds`, shares by default the paper's: 1/3 bidirectional, 1/3
seq2seq, 1/6 each direction), then 15% of its maskable tokens are selected and corrupted
80/10/10 (MLM's `mask_candidates`). Maskable: the non-special real tokens, except under
seq2seq, where only the target segment's tokens are, its closing [SEP] included (the
paper's [EOS], maskable in its seq2seq fine-tuning: generation learns where to stop).
The batch gains `lm_kind` (batch,) int64.

Loss: MLM's cross-entropy over the selected positions, the encoder run under the
(batch, seq, seq) attention mask of each row's kind (`unilm_attention_mask`, built on the
device from `lm_kind`, token types and the padding mask: static shapes, no host sync).

Generation (`prepare_generation`, `pretrain-generate`): the source as segment A, the target
grown one token at a time under the seq2seq mask, each step predicting a [MASK] appended
after the target so far (greedy or beam search); [SEP] ends the target.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from pretrain.config import TrainConfig
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.lm_kinds import (
    BIDIRECTIONAL,
    LEFT_TO_RIGHT,
    RIGHT_TO_LEFT,
    SEQ2SEQ,
    draw_lm_kinds,
    lm_kind_shares,
    target_tokens,
)
from pretrain.data.masking import candidate_tokens
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError
from pretrain.models.bert import BertEncoder
from pretrain.models.generation import GenerationSetup
from pretrain.objectives.mlm import MaskedLanguageModel, MaskedLMCorruption
from pretrain.objectives.unilm_config import UniLMConfig


@dataclass(frozen=True)
class UniLMCorruption(MaskedLMCorruption):
    """MLM's corruption with a kind per sequence (see the module docstring)."""

    bidirectional_weight: float = UniLMConfig.bidirectional_weight
    left_to_right_weight: float = UniLMConfig.left_to_right_weight
    right_to_left_weight: float = UniLMConfig.right_to_left_weight
    seq2seq_weight: float = UniLMConfig.seq2seq_weight
    sep_token_id: int = -1  # the target's closing [SEP] is maskable under seq2seq

    def __call__(self, batch: dict, epoch: int) -> dict:
        hashes = key_hashes(batch["keys"])
        weights = (
            self.bidirectional_weight,
            self.left_to_right_weight,
            self.right_to_left_weight,
            self.seq2seq_weight,
        )
        kinds = draw_lm_kinds(self.seed, epoch, hashes, lm_kind_shares(weights))  # (batch,)
        ids, real = batch["input_ids"], batch["attention_mask"]
        candidates = candidate_tokens(ids, real, self.special_ids)  # (batch, seq)
        target = target_tokens(batch["token_type_ids"], real)
        target_candidates = (candidates | (ids == self.sep_token_id)) & target
        seq2seq = (kinds == SEQ2SEQ)[:, None]
        candidates = np.where(seq2seq, target_candidates, candidates)
        batch["lm_kind"] = kinds
        return self.mask_candidates(batch, epoch, hashes, candidates)


def unilm_attention_mask(
    lm_kind: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Which keys each query sees, (batch, seq, seq) bool (dim 1 the query, dim 2 the key),
    from each row's kind lm_kind (batch,) int64 (`pretrain.data.lm_kinds` codes), its token
    types (batch, seq) (0 = source, 1 = target) and its padding mask (batch, seq) 1 = real.
    Real queries: bidirectional every real key; left-to-right the real keys at or before
    them; right-to-left at or after them; seq2seq a source query the source, a target query
    the source and the target up to itself. A padding query sees every real key (its output
    is never read; no row of the softmax is empty)."""
    real = attention_mask.bool()  # (batch, seq)
    seq_len = real.shape[1]
    position = torch.arange(seq_len, device=real.device)
    at_or_before = position[None, :] <= position[:, None]  # (query, key)
    keys = real[:, None, :]  # (batch, 1, key)
    source = (token_type_ids == 0) & real
    seq2seq = source[:, None, :] | (at_or_before[None] & ~source[:, :, None])
    by_kind = {
        BIDIRECTIONAL: keys.expand(-1, seq_len, -1),
        LEFT_TO_RIGHT: at_or_before[None] & keys,
        RIGHT_TO_LEFT: at_or_before.T[None] & keys,
        SEQ2SEQ: seq2seq & keys,
    }
    kind = lm_kind[:, None, None]
    visible = torch.zeros_like(by_kind[BIDIRECTIONAL])
    for code, mask in by_kind.items():
        visible = visible | ((kind == code) & mask)
    return torch.where(real[:, :, None], visible, keys)  # (batch, seq, seq)


class UniLM(MaskedLanguageModel):
    """A BERT-family encoder + tied MLM head, trained under UniLM's four attention masks."""

    config_class = UniLMConfig
    corruption_class = UniLMCorruption

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__(config, vocab)
        if not isinstance(self.encoder, BertEncoder):
            raise ConfigError(
                f"model.name = {self.run.model.name!r}: UniLM needs a BERT-family encoder "
                "(a BertEncoder), whose attention takes a mask per query"
            )

    @classmethod
    def corruption_inputs(cls, config: TrainConfig, vocab: Vocabulary) -> dict:
        return {**super().corruption_inputs(config, vocab), "sep_token_id": vocab.sep}

    def encode(self, batch: dict) -> torch.Tensor:
        """The encoder's (batch, seq, hidden) states under each row's attention mask (run
        padded: the per-query mask has no unpadded path)."""
        mask = unilm_attention_mask(
            batch["lm_kind"], batch["token_type_ids"], batch["attention_mask"]
        )
        return self.encoder(batch["input_ids"], batch["token_type_ids"], mask)

    def prepare_generation(self, token_ids: torch.Tensor) -> GenerationSetup:
        """Seq2seq generation from a source text, token_ids (rows, n) without special
        tokens: the prefix is [CLS] source [SEP]; a step appends [MASK] to the sequence so
        far and returns the MLM head's logits (rows, vocab) there, under the seq2seq mask
        (the source, token type 0, and the target so far, token type 1). [SEP] ends the
        target; [PAD], [CLS], [MASK] and [UNK] are never predicted."""
        device = self.encoder.word_embeddings.weight.device
        rows = token_ids.shape[0]
        cls = torch.full((rows, 1), self.vocab.cls, dtype=torch.long)
        sep = torch.full((rows, 1), self.vocab.sep, dtype=torch.long)
        prefix = torch.cat([cls, token_ids.long(), sep], dim=1).to(device)
        source_length = prefix.shape[1]
        banned = [self.vocab.pad, self.vocab.cls, self.vocab.mask, self.vocab.unk]

        def step(ids: torch.Tensor) -> torch.Tensor:
            count, length = ids.shape
            masked = torch.full((count, 1), self.vocab.mask, dtype=torch.long, device=device)
            inputs = torch.cat([ids, masked], dim=1)  # (rows, t + 1)
            types = (torch.arange(length + 1, device=device) >= source_length).long()
            types = types[None].expand(count, -1)
            real = torch.ones_like(inputs)
            kinds = torch.full((count,), SEQ2SEQ, dtype=torch.long, device=device)
            hidden = self.encoder(inputs, types, unilm_attention_mask(kinds, types, real))
            logits = self.mlm_head(hidden[:, -1]).float()  # (rows, vocab)
            logits[:, banned] = float("-inf")
            return logits

        max_length = self.run.data.max_seq_length  # the length the model was trained on
        return GenerationSetup(step, prefix, eos_id=self.vocab.sep, max_length=max_length)
