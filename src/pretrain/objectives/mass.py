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
from pretrain.data.keyed_rng import keyed_generators
from pretrain.data.masking import IGNORE_INDEX, replace_selected
from pretrain.data.noise import STREAM_MASS
from pretrain.data.prediction_budget import (
    prediction_positions,
    prediction_widths,
    sequence_width,
    sequence_widths,
)
from pretrain.data.vocab import Vocabulary
from pretrain.errors import require_unit_interval
from pretrain.objectives.denoising import DenoisingAutoencoder, Seq2SeqObjectiveConfig
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
        """Each row's draws from its keyed generator, in `mass_fragment`'s order (the
        fragment's start, then the 80/10/10 decision and a random id per token); the masks,
        encoder and decoder inputs and labels for the whole batch at once (`mass_batch`)."""
        lengths = batch["attention_mask"].sum(
            axis=1
        )  # (batch,) real tokens, [CLS] and [SEP] included
        width = batch["input_ids"].shape[1]
        starts = np.zeros(len(lengths), np.int64)
        fragments = np.zeros(len(lengths), np.int64)
        action = np.zeros((len(lengths), width))
        random_ids = np.zeros((len(lengths), width), np.int64)
        generators = keyed_generators(self.seed, epoch, STREAM_MASS, batch["keys"])
        for row, (rng, n) in enumerate(zip(generators, lengths.tolist(), strict=True)):
            fragments[row] = fragment_length(n - 2, self.fragment_fraction)
            starts[row] = 1 + int(rng.integers(n - 2 - fragments[row] + 1))
            action[row, :n] = rng.random(n)
            random_ids[row, :n] = rng.integers(self.vocab_size, size=n)
        widths = self.prediction_widths(self.max_length or width)
        return mass_batch(self, batch, lengths, starts, fragments, action, random_ids, widths)


def fragment_length(body: int, fraction: float) -> int:
    """MASS's fragment length for a body of `body` tokens (`mass_fragment`)."""
    return min(body, max(1, round(fraction * body)))


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
    """The encoder-decoder batch of `mass_fragment` + the 80/10/10 rule applied to every
    row (fragment of row r: tokens starts[r] .. starts[r] + fragments[r] - 1; action and
    random_ids (batch, seq) its draws); each side padded to the sequence bucket of the
    longest row (`pad_rows`)."""
    ids = batch["input_ids"]
    positions = np.arange(ids.shape[1])
    real = positions < lengths[:, None]
    fragment = (positions >= starts[:, None]) & (positions < (starts + fragments)[:, None])
    encoder, _ = replace_selected(
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
    decoder = np.where(fragment, previous, corruption.mask_id)
    decoder[np.arange(len(ids)), starts] = corruption.mask_id  # the fragment's first input
    width = sequence_width(int(lengths.max()), corruption.max_length)
    pad = corruption.pad_id

    def padded(array: np.ndarray, fill: int) -> np.ndarray:
        out = np.full((len(ids), width), fill, np.int64)
        keep = min(width, array.shape[1])
        out[:, :keep] = np.where(real, array, fill)[:, :keep]
        return out

    labels = padded(np.where(fragment, ids, IGNORE_INDEX), IGNORE_INDEX)
    attention_mask = padded(np.ones_like(ids), 0)
    return {
        "prediction_positions": prediction_positions(labels != IGNORE_INDEX, widths),
        "input_ids": padded(encoder, pad),
        "attention_mask": attention_mask,
        "decoder_input_ids": padded(decoder, pad),
        "decoder_attention_mask": attention_mask.copy(),
        "labels": labels,
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
