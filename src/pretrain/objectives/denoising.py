"""BART's objective (Lewis et al., 2020): reconstruct a document from a noised copy, and the
Transformer (Vaswani et al., 2017) trained the same way.

Corruption (data-loader workers, numpy): the packed `[CLS] body [SEP]` sequences of a batch
are noised together by `pretrain.data.noise.apply_noise` (default: text infilling of 30% of
the tokens with Poisson(3) spans + sentence permutation), each row's draws keyed by (seed,
epoch, sequence key) only. The encoder
reads the noised sequence; the decoder reads the original shifted right after a start token
([SEP], as BART starts with </s>) and predicts the original. Both sides are padded to the
run's sequence buckets (`prediction_budget.sequence_widths`).
Loss: cross-entropy over the non-padding target tokens, label-smoothed by
`objective.label_smoothing` (0.1 in the Transformer's recipe). The head projects every decoder
position (BART predicts every real token; padding is ignored by its label), or, when the batch
has `prediction_positions` (MASS: only the fragment), the positions listed there (a static
budget, `pretrain.data.prediction_budget`).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from pretrain.config import TrainConfig
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.masking import IGNORE_INDEX
from pretrain.data.noise import NoiseSettings, RowDraws, apply_noise
from pretrain.data.prediction_budget import (
    sequence_width,
    sequence_widths,
)
from pretrain.data.vocab import Vocabulary
from pretrain.models.build import build_encoder
from pretrain.models.flops import seq2seq_flops
from pretrain.models.generation import GenerationSetup, beam_search, greedy_search
from pretrain.models.seq2seq import TiedLMHead
from pretrain.objectives.base import Losses, Objective, objective_settings
from pretrain.objectives.denoising_config import DenoisingConfig
from pretrain.objectives.predictions import (
    gather_positions,
    gather_targets,
    masked_classification_metrics,
    masked_mean,
)


def fit_width(array: np.ndarray, width: int, fill) -> np.ndarray:
    """(batch, seq) `array` cut or padded with `fill` to (batch, width)."""
    if array.shape[1] >= width:
        return array[:, :width]
    out = np.full((array.shape[0], width), fill, array.dtype)
    out[:, : array.shape[1]] = array
    return out


def pad_noised(
    ids: np.ndarray, lengths: np.ndarray, pad_id: int, max_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Noised rows (batch, width) of real `lengths` -> (ids, attention mask) (batch, L) int64
    padded with `pad_id` to the sequence bucket of the longest (`sequence_width`); a row that
    insertions made longer than `max_length` keeps its first max_length - 1 tokens and its
    last."""
    cut = np.minimum(lengths, max_length)
    width = sequence_width(int(cut.max()), max_length)
    real = np.arange(width) < cut[:, None]
    out = np.full(real.shape, pad_id, np.int64)
    shared = min(width, ids.shape[1])  # a row's real tokens lie within both widths
    np.copyto(out[:, :shared], ids[:, :shared], where=real[:, :shared])
    long = np.flatnonzero(lengths > max_length)
    if len(long):  # rare: keep their last token
        out[long, max_length - 1] = ids[long, lengths[long] - 1]
    return out, real.astype(np.int64)


@dataclass(frozen=True)
class DenoisingCorruption:
    """(collated batch, epoch) -> encoder-decoder batch; see the module docstring."""

    seed: int
    pad_id: int
    mask_id: int
    start_id: int
    max_length: int
    noise: NoiseSettings = NoiseSettings()
    # the collated arrays it reads (`reading.collate`): token types, words, phrases unused
    collated_fields: ClassVar = ("input_ids", "attention_mask", "sentence_starts")

    def shape_axes(self, max_seq_length: int) -> dict[str, tuple[int, ...]]:
        """Decoder lengths: the sequence buckets, like the encoder's (`sequence`)."""
        return {"decoder": sequence_widths(max_seq_length)}

    def __call__(self, batch: dict, epoch: int) -> dict:
        """The rows noised together (`apply_noise`, keyed uniforms per row); the decoder
        inputs and labels, the original shifted right and the original."""
        lengths = batch["attention_mask"].sum(axis=1)
        starts = batch.get("sentence_starts")
        if starts is None:
            starts = np.zeros(batch["input_ids"].shape, bool)
        draws = RowDraws(self.seed, epoch, key_hashes(batch["keys"]))
        noised, noised_lengths = apply_noise(
            batch["input_ids"], lengths, starts, self.noise, self.mask_id, draws
        )
        input_ids, attention_mask = pad_noised(noised, noised_lengths, self.pad_id, self.max_length)
        real = batch["attention_mask"].astype(bool)
        width = sequence_width(int(lengths.max()), self.max_length)
        ids = fit_width(batch["input_ids"], width, self.pad_id)
        real = fit_width(real, width, False)
        decoder_input_ids = np.full_like(ids, self.pad_id)
        decoder_input_ids[:, 0] = self.start_id
        decoder_input_ids[:, 1:] = np.where(real[:, 1:], ids[:, :-1], self.pad_id)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": real.astype(np.int64),
            "labels": np.where(real, ids, IGNORE_INDEX),
            "next_sentence_label": batch["next_sentence_label"],
            "keys": batch["keys"],
        }


class DenoisingAutoencoder(Objective):
    """Encoder-decoder (`encoder`, e.g. `EncoderDecoder`) + the tied output projection
    (`lm_head`); the loss is label-smoothed cross-entropy over the predicted target tokens."""

    summary_metric = "lm_loss"

    config_class = DenoisingConfig
    corruption_class = DenoisingCorruption

    def __init__(self, config: TrainConfig | Mapping, vocab: Vocabulary):
        super().__init__(config, vocab)
        self.encoder = build_encoder(self.run.model, vocab.size, vocab.pad)
        self.lm_head = TiedLMHead(self.encoder.word_embeddings)
        self.label_smoothing = float(self.run.objective.label_smoothing)

    @classmethod
    def corruption_inputs(cls, config: TrainConfig, vocab: Vocabulary) -> dict:
        return {
            "pad_id": vocab.pad,
            "mask_id": vocab.mask,
            "start_id": vocab.sep,
            "max_length": config.data.max_seq_length,
            "noise": objective_settings(NoiseSettings, config.objective),
        }

    def forward_flops(self, batch: dict) -> torch.Tensor:
        """Forward FLOPs of a batch (`pretrain.models.flops.seq2seq_flops`): encoder and decoder on
        their real tokens, the LM head on the prediction slots (or every decoder position)."""
        source = batch["attention_mask"].sum(dim=1, dtype=torch.float32)  # (batch,)
        mask = batch.get("decoder_attention_mask")
        target = (
            mask.sum(dim=1, dtype=torch.float32)
            if mask is not None
            else torch.full_like(source, batch["decoder_input_ids"].shape[1])
        )
        rows = batch.get("prediction_positions", batch["decoder_input_ids"]).numel()
        return seq2seq_flops(self.run.model, source, target, rows, self.vocab.size)

    def forward(self, batch: dict) -> Losses:
        """Loss (label-smoothed cross-entropy) and metrics (it as `lm_loss`, the plain
        cross-entropy `nll`, `accuracy`) of one batch."""
        hidden = self.encoder(
            batch["input_ids"],
            batch["attention_mask"],
            batch["decoder_input_ids"],
            batch["decoder_attention_mask"],
        )  # (batch, tgt, d_model)
        if "prediction_positions" in batch:  # (batch, width), -1 = ignored slot
            positions = batch["prediction_positions"]
            targets = gather_targets(batch["labels"], positions)  # (batch * width,)
            hidden = gather_positions(hidden, positions)  # (batch * width, d_model)
        else:  # every decoder position; padding has the label IGNORE_INDEX
            targets, hidden = batch["labels"].flatten(), hidden.flatten(0, 1)
        logits = self.lm_head(hidden).float()  # (n, vocab)
        smoothed = masked_classification_metrics("lm", logits, targets, self.label_smoothing)
        loss = smoothed["lm_loss"]
        with torch.no_grad():
            real = targets != IGNORE_INDEX
            nll = masked_classification_metrics("lm", logits, targets)["lm_loss"]
            accuracy = masked_mean(logits.argmax(-1) == targets, real)
        return Losses(loss, {"lm_loss": loss, "nll": nll, "accuracy": accuracy})

    def prepare_generation(
        self, token_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> GenerationSetup:
        """Reconstruct noised encoder inputs (batch, src) (with their [CLS]/[SEP]): the
        source is encoded once, the decoder starts from [SEP] and stops at [SEP]."""
        device = self.lm_head.bias.device
        token_ids = token_ids.long().to(device)
        mask = None if attention_mask is None else attention_mask.to(device)
        memory = self.encoder.encode(token_ids, mask)  # (batch, src, d_model)
        prefix = torch.full(
            (token_ids.shape[0], 1), self.vocab.sep, dtype=torch.long, device=device
        )

        def step(ids: torch.Tensor) -> torch.Tensor:
            beams = ids.shape[0] // memory.shape[0]  # beam search runs batch x beams rows
            source = memory.repeat_interleave(beams, dim=0)
            source_mask = None if mask is None else mask.repeat_interleave(beams, dim=0)
            hidden = self.encoder.decode(ids, source, source_mask)[:, -1]  # (rows, d_model)
            return self.lm_head(hidden)  # (rows, vocab)

        max_length = self.run.model.max_sequence_tokens
        return GenerationSetup(step, prefix, eos_id=self.vocab.sep, max_length=max_length)

    @torch.no_grad()
    def reconstruct(
        self,
        token_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        num_beams: int = 1,
        max_new_tokens: int | None = None,
    ) -> torch.Tensor:
        """What the model makes of noised inputs (batch, src): greedy (num_beams=1) or beam
        search. Returns (batch, n) generated ids after the start token, ending at [SEP]."""
        was_training = self.training
        self.eval()
        setup = self.prepare_generation(token_ids, attention_mask)
        limit = setup.max_length - 1 if setup.max_length else 2 * token_ids.shape[1]
        new_tokens = min(max_new_tokens or limit, limit)
        if num_beams == 1:
            out = greedy_search(setup.step, setup.prefix, new_tokens, setup.eos_id, self.vocab.pad)
        else:
            out = beam_search(
                setup.step, setup.prefix, num_beams, new_tokens, setup.eos_id, pad_id=self.vocab.pad
            )
        self.train(was_training)
        return out[:, 1:]
