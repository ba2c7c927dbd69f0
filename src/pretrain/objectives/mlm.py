"""BERT's objective: masked language modelling (+ next-sentence prediction).

Corruption: `MaskedLMCorruption` selects 15% of the non-special tokens of each sequence and
applies the 80/10/10 rule, keyed by (seed, epoch, sequence key); static masking uses
epoch % dupe_factor. Loss: cross-entropy over the selected positions only (the head projects
to the vocabulary only there) + NSP cross-entropy on [CLS].
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pretrain.data.keyed_rng import key_hashes
from pretrain.data.masking import IGNORE_INDEX, mask_tokens
from pretrain.data.vocab import Vocabulary
from pretrain.models import build_encoder
from pretrain.models.heads import MaskedLMHead, NextSentenceHead
from pretrain.objectives.base import PretrainingModule


@dataclass(frozen=True)
class MaskedLMCorruption:
    """(batch, epoch) -> batch with corrupted input_ids and labels (IGNORE_INDEX = not predicted)."""

    seed: int
    vocab_size: int
    mask_token_id: int
    special_ids: tuple[int, ...]
    mlm_probability: float = 0.15
    mask_token_probability: float = 0.8
    random_token_probability: float = 0.1
    masking: str = "dynamic"
    dupe_factor: int = 10

    def __call__(self, batch: dict, epoch: int) -> dict:
        mask_epoch = epoch % self.dupe_factor if self.masking == "static" else epoch
        ids = batch["input_ids"]
        candidates = batch["attention_mask"].astype(bool) & ~np.isin(ids, self.special_ids)
        batch["input_ids"], batch["labels"] = mask_tokens(
            ids,
            candidates,
            key_hashes(batch["keys"]),
            seed=self.seed,
            epoch=mask_epoch,
            vocab_size=self.vocab_size,
            mask_token_id=self.mask_token_id,
            mlm_probability=self.mlm_probability,
            mask_token_probability=self.mask_token_probability,
            random_token_probability=self.random_token_probability,
        )
        return batch


class MaskedLanguageModel(PretrainingModule):
    """Encoder + tied MLM head (+ NSP head when objective.nsp)."""

    def __init__(self, config: dict, vocab: Vocabulary):
        super().__init__(config, vocab)
        model = config["model"]
        self.encoder = build_encoder(model, vocab.size, vocab.pad)
        init = model["initializer_range"]
        self.mlm_head = MaskedLMHead(
            model["hidden_size"],
            vocab.size,
            model["layer_norm_eps"],
            self.encoder.word_embeddings,
            initializer_range=init,
        )
        self.nsp_head = (
            NextSentenceHead(model["hidden_size"], init) if config["objective"]["nsp"] else None
        )

    @classmethod
    def build_corruption(cls, config: dict, vocab: Vocabulary) -> MaskedLMCorruption:
        o = config["objective"]
        return MaskedLMCorruption(
            seed=config["seed"],
            vocab_size=vocab.size,
            mask_token_id=vocab.mask,
            special_ids=vocab.special_ids,
            mlm_probability=o["mlm_probability"],
            mask_token_probability=o["mask_token_probability"],
            random_token_probability=o["random_token_probability"],
            masking=o["masking"],
            dupe_factor=o["dupe_factor"],
        )

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """Losses and accuracies of one batch."""
        hidden = self.encoder(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        )  # (batch, seq, hidden)
        selected = batch["labels"] != IGNORE_INDEX
        targets = batch["labels"][selected]  # (n_masked,)
        logits = self.mlm_head(hidden[selected])  # (n_masked, vocab)
        mlm_loss = F.cross_entropy(logits.float(), targets)
        out = {"mlm_loss": mlm_loss, "mlm_accuracy": (logits.argmax(-1) == targets).float().mean()}
        loss = mlm_loss
        if self.nsp_head is not None:
            nsp_logits = self.nsp_head(hidden).float()  # (batch, 2)
            nsp_labels = batch["next_sentence_label"]
            out["nsp_loss"] = F.cross_entropy(nsp_logits, nsp_labels)
            out["nsp_accuracy"] = (nsp_logits.argmax(-1) == nsp_labels).float().mean()
            loss = loss + out["nsp_loss"]
        out["loss"] = loss
        return out

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self(batch)
        self.log_step(out, batch)
        return out["loss"]
