"""MASS (Song et al., 2019): masked sequence-to-sequence pretraining.

Corruption: a contiguous fragment of about `fragment_fraction` (50%) of each sequence's body
is hidden in the encoder input by BERT's rule, decided per token as in MASS's code: [MASK]
with `mask_token_probability` (0.8), a uniformly random token of the vocabulary with
`random_token_probability` (0.1), else unchanged (1 and 0: the whole fragment [MASK]); the
decoder reads the fragment shifted right
(its first position a [MASK], as in the paper's figure 1) with every other position [MASK],
and predicts the fragment only (`mass_batch`), each row's draws keyed uniforms of (seed,
epoch, sequence key) (`pretrain.data.noise.mass_draws`); the fragment's positions are the batch's `prediction_positions`, a static
budget whose base is ceil(fragment_fraction x data.max_seq_length)
(`pretrain.data.prediction_budget`). Model and loss are the denoising autoencoder's
(`denoising.py`).
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pretrain.config import TrainConfig
from pretrain.data.keyed_rng import key_hashes
from pretrain.data.masking import replace_selected
from pretrain.data.noise import RowDraws, mass_draws
from pretrain.data.prediction_budget import (
    prediction_widths,
    sequence_width,
    sequence_widths,
    width_for,
)
from pretrain.data.vocab import Vocabulary
from pretrain.objectives.denoising import (
    DenoisingAutoencoder,
    fit_width,
)
from pretrain.objectives.mass_config import MassConfig


@dataclass(frozen=True)
class MassCorruption:
    """(collated batch, epoch) -> encoder-decoder batch with MASS's fragment masking.
    `max_length`: the run's data.max_seq_length, which sizes the prediction budget (None: the
    batch's width). The fragment's encoder tokens follow the 80/10/10 rule per token
    (`mask_token_probability`, `random_token_probability`; random ids uniform in
    [0, vocab_size))."""

    seed: int
    pad_id: int
    mask_id: int
    vocab_size: int
    fragment_fraction: float = MassConfig.fragment_fraction
    mask_token_probability: float = MassConfig.mask_token_probability
    random_token_probability: float = MassConfig.random_token_probability
    max_length: int | None = None
    collated_fields: ClassVar = ("input_ids", "attention_mask")  # what it reads of `collate`'s

    def prediction_widths(self, max_length: int) -> tuple[int, ...]:
        """The widths `prediction_positions` may have for sequences of `max_length`."""
        return prediction_widths(self.fragment_fraction * max_length, max_length)

    def shape_axes(self, max_seq_length: int) -> dict[str, tuple[int, ...]]:
        """Decoder lengths (the sequence buckets) and the fragment's prediction widths."""
        decoder = sequence_widths(max_seq_length)
        return {"decoder": decoder, "predictions": self.prediction_widths(max_seq_length)}

    def __call__(self, batch: dict, epoch: int) -> dict:
        """Every row's draws as keyed uniforms (`noise.mass_draws`: the fragment's start, the
        80/10/10 decision and a random id per token); the masks, encoder and decoder inputs
        and labels for the whole batch at once (`mass_batch`)."""
        lengths = batch["attention_mask"].sum(axis=1)  # (batch,) [CLS] and [SEP] included
        width = sequence_width(int(lengths.max()), self.max_length)
        fragments = fragment_length(lengths - 2, self.fragment_fraction)
        draws = RowDraws(self.seed, epoch, key_hashes(batch["keys"]))
        starts, action, random_ids = mass_draws(lengths, fragments, self.vocab_size, draws, width)
        widths = self.prediction_widths(self.max_length or batch["input_ids"].shape[1])
        return mass_batch(self, batch, lengths, starts, fragments, action, random_ids, widths)


def fragment_length(body: np.ndarray, fraction: float) -> np.ndarray:
    """MASS's fragment lengths (batch,) for bodies of `body` tokens: round(fraction x body),
    at least 1, at most the body."""
    return np.minimum(body, np.maximum(1, np.rint(fraction * body))).astype(np.int64)


def mass_batch(
    corruption: MassCorruption,
    batch: dict,
    lengths: np.ndarray,
    starts: np.ndarray,
    fragments: np.ndarray,
    action: np.ndarray,
    random_ids: np.ndarray,
    widths: tuple[int, ...],
) -> dict:
    """The encoder-decoder batch of MASS's fragment + the 80/10/10 rule applied to every
    row (fragment of row r: tokens starts[r] .. starts[r] + fragments[r] - 1; action and
    random_ids (batch, width) its draws, width the sequence bucket of the longest row);
    each side padded to that width."""
    width = action.shape[1]
    ids = fit_width(batch["input_ids"], width, corruption.pad_id)
    positions = np.arange(width)
    real = positions < lengths[:, None]
    inside = positions - starts[:, None]  # (batch, width) offset in the fragment
    fragment = (inside >= 0) & (inside < fragments[:, None])
    encoder, labels = replace_selected(
        ids,
        fragment,
        action,
        random_ids,
        corruption.mask_id,
        corruption.mask_token_probability,
        corruption.random_token_probability,
    )
    previous = np.empty_like(ids)  # token t - 1 at position t
    previous[:, 0] = corruption.mask_id
    previous[:, 1:] = ids[:, :-1]
    # the decoder reads the fragment shifted right, [MASK] at its first position and outside
    decoder = np.where(fragment & (inside > 0), previous, corruption.mask_id)
    pad = corruption.pad_id
    count = width_for(int(fragments.max(initial=0)), widths)
    offsets = np.arange(count)  # the fragment's positions, then -1
    attention_mask = real.astype(np.int64)
    return {
        "prediction_positions": np.where(
            offsets < fragments[:, None], starts[:, None] + offsets, -1
        ),
        "input_ids": np.where(real, encoder, pad).astype(np.int64, copy=False),
        "attention_mask": attention_mask,
        "decoder_input_ids": np.where(real, decoder, pad).astype(np.int64, copy=False),
        "decoder_attention_mask": attention_mask.copy(),
        "labels": labels.astype(np.int64, copy=False),
        "next_sentence_label": batch["next_sentence_label"],
        "keys": batch["keys"],
    }


class MaskedSeq2Seq(DenoisingAutoencoder):
    """MASS: the denoising autoencoder's model and loss on MASS's fragment corruption."""

    config_class = MassConfig
    corruption_class = MassCorruption

    @classmethod
    def corruption_inputs(cls, config: TrainConfig, vocab: Vocabulary) -> dict:
        return {
            "pad_id": vocab.pad,
            "mask_id": vocab.mask,
            "vocab_size": vocab.size,
            "max_length": config.data.max_seq_length,
        }
