"""MASS (Song et al., 2019): masked sequence-to-sequence pretraining.

Corruption: a contiguous fragment of about `fragment_fraction` (50%) of each sequence's body
is hidden in the encoder input by BERT's rule, decided per token as in MASS's code: [MASK]
with `mask_token_probability` (0.8), a uniformly random token of the vocabulary with
`random_token_probability` (0.1), else unchanged (1 and 0: the whole fragment [MASK]); the
decoder reads the fragment shifted right
(its first position a [MASK], as in the paper's figure 1) with every other position [MASK],
and predicts the fragment only (`pretrain.data.noise.mass_fragment`), keyed by (seed, epoch,
sequence key); the fragment's positions are the batch's `prediction_positions`, a static
budget whose base is ceil(fragment_fraction x data.max_seq_length)
(`pretrain.data.prediction_budget`). Model and loss are the denoising autoencoder's
(`denoising.py`).
"""

from dataclasses import dataclass

import numpy as np

from pretrain.config import TrainConfig
from pretrain.data.masking import IGNORE_INDEX, replace_selected
from pretrain.data.noise import STREAM_MASS, mass_fragment, sequence_generator
from pretrain.data.prediction_budget import prediction_widths, sequence_widths
from pretrain.data.vocab import Vocabulary
from pretrain.errors import require_unit_interval
from pretrain.objectives.denoising import (
    DenoisingAutoencoder,
    Seq2SeqObjectiveConfig,
    real_rows,
    seq2seq_batch,
)
from pretrain.objectives.mlm import require_replacement_split


@dataclass
class MassConfig(Seq2SeqObjectiveConfig):
    """MASS settings: the fragment's share of the body's tokens; the shares of the fragment's
    encoder tokens replaced by [MASK] and by a random token (the rest stay unchanged)."""

    name: str = "mass"
    _target_: str = "pretrain.objectives.mass.MaskedSeq2Seq"
    fragment_fraction: float = 0.5
    mask_token_probability: float = 0.8
    random_token_probability: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        require_unit_interval("objective.fragment_fraction", self.fragment_fraction)
        require_replacement_split(self)


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
    fragment_fraction: float = 0.5
    mask_token_probability: float = 0.8
    random_token_probability: float = 0.1
    max_length: int | None = None

    def prediction_widths(self, max_length: int) -> tuple[int, ...]:
        """The widths `prediction_positions` may have for sequences of `max_length`."""
        return prediction_widths(self.fragment_fraction * max_length, max_length)

    def shape_axes(self, max_seq_length: int) -> dict[str, tuple[int, ...]]:
        """Decoder lengths (the sequence buckets) and the fragment's prediction widths."""
        decoder = sequence_widths(max_seq_length)
        return {"decoder": decoder, "predictions": self.prediction_widths(max_seq_length)}

    def __call__(self, batch: dict, epoch: int) -> dict:
        encoder_rows, decoder_rows, label_rows = [], [], []
        for key, (ids, _) in zip(batch["keys"], real_rows(batch), strict=True):
            rng = sequence_generator(self.seed, epoch, STREAM_MASS, key)
            _, decoder, fragment = mass_fragment(ids, self.fragment_fraction, self.mask_id, rng)
            action = rng.random(len(ids))  # (seq,): the 80/10/10 decision per token
            random_ids = rng.integers(self.vocab_size, size=len(ids))  # (seq,)
            encoder, _ = replace_selected(
                ids[None],
                fragment[None],
                action[None],
                random_ids[None],
                self.mask_id,
                self.mask_token_probability,
                self.random_token_probability,
            )
            encoder_rows.append(encoder[0].astype(ids.dtype))
            decoder_rows.append(decoder)
            label_rows.append(np.where(fragment, ids, IGNORE_INDEX))
        widths = self.prediction_widths(self.max_length or batch["input_ids"].shape[1])
        return seq2seq_batch(
            batch, encoder_rows, decoder_rows, label_rows, self.pad_id, widths, self.max_length
        )


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
