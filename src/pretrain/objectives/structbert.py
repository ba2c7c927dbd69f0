"""StructBERT (Wang et al., 2019): MLM + the word structural objective + the three-way
sentence structural objective.

Word structure: after token masking, trigrams of unmasked tokens covering
`shuffle_probability` of a sequence's tokens are shuffled (each by one of the five
non-identity permutations of three); the model predicts the original token at every
shuffled position through the MLM head (at `shuffle_positions`, (batch, width) padded with -1
to a width from a fixed set whose base is ceil(shuffle_probability x data.max_seq_length + 2),
`pretrain.data.prediction_budget`). Sentence structure: `pair_task: three_way` (B is the
next segment, the previous one, or from another document, a third each; see formats.py).
"""

from dataclasses import dataclass

import numpy as np
import torch

from pretrain.data.keyed_rng import (
    STREAM_MASK_SELECT,
    key_hashes,
    keyed_uniform,
    keyed_uniform_at,
)
from pretrain.data.masking import IGNORE_INDEX, candidate_tokens, select_exact_fraction
from pretrain.data.prediction_budget import listed_positions, prediction_widths
from pretrain.models.flops import embedding_size, mlm_head_flops
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
from pretrain.objectives.structbert_config import StructBertConfig

STREAM_TRIGRAMS = 30  # shuffle_batch_trigrams' default ranks; the corruption ranks by MLM's
STREAM_TRIGRAM_ORDER = 31
RANKS_KEY = "_select_uniforms"  # MLM's selection uniforms, from `select` to the trigrams
# The five orders of three positions other than the identity.
PERMUTATIONS = np.array([(0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])


def shuffle_batch_trigrams(
    ids: np.ndarray,
    free: np.ndarray,
    fraction: float,
    hashes: np.ndarray,
    seed: int,
    epoch: int,
    ranks: np.ndarray | None = None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Shuffle round(fraction x free tokens / 3) non-overlapping trigrams of `free` tokens per
    row (fewer when the row has no room for them), each by one of the five non-identity
    permutations. ids, free (batch, seq); hashes (batch,) uint64 (`key_hashes`). A trigram
    start (three free tokens from it) ranks by `ranks` (batch, seq) uniforms (by default
    `keyed_uniform(seed, epoch, STREAM_TRIGRAMS)`) at its position; a start ranked first among
    the starts up to 2 tokens either side of it is eligible (so eligible trigrams never
    overlap) and the row's first-ranked eligible ones are shuffled, by the permutation
    `keyed_uniform(seed, epoch, STREAM_TRIGRAM_ORDER)` picks at the same position: a row's
    shuffle depends only on (seed, epoch, key) and its tokens.
    Returns (shuffled ids (batch, seq), (rows, columns) of the shuffled positions)."""
    batch, length = ids.shape
    wanted = np.rint(fraction * np.count_nonzero(free, axis=1) / 3).astype(np.int64)
    if length < 3 or not wanted.any():
        return ids, (np.zeros(0, np.int64), np.zeros(0, np.int64))
    starts = free[:, :-2] & free[:, 1:-1] & free[:, 2:]  # (batch, seq - 2)
    if ranks is None:
        ranks = keyed_uniform(seed, epoch, STREAM_TRIGRAMS, hashes, length)
    padded = np.full((batch, length + 2), 2.0)  # two non-starts either side
    mine = padded[:, 2:-2]
    np.copyto(mine, ranks[:, :-2], where=starts)
    pairs = np.minimum(padded[:, :-1], padded[:, 1:])  # pairs[i]: min of mine[i - 2], [i - 1]
    nearby = np.minimum(pairs[:, : length - 2], pairs[:, 3:])  # the lowest 1 or 2 tokens away
    score = np.where(mine < nearby, mine, 2.0)  # the eligible starts' ranks (< 1)
    # wanted <= round(length / 3) <= length - 2 columns of `score`: no upper clip needed
    kth = np.sort(score, axis=1)[np.arange(batch), np.maximum(wanted - 1, 0)]
    kth = np.where(wanted > 0, np.minimum(kth, 1.0), -1.0)  # no row takes a 2.0
    rows, chosen = np.divmod(np.flatnonzero(score <= kth[:, None]), length - 2)
    permutation = keyed_uniform_at(seed, epoch, STREAM_TRIGRAM_ORDER, hashes, rows, chosen)
    which = (permutation * len(PERMUTATIONS)).astype(np.int64)
    first = rows * length + chosen  # flat index of each trigram's first token
    positions = (first[:, None] + np.arange(3)).ravel()  # (trigrams x 3,) row-major
    shuffled = ids.copy()
    shuffled.ravel()[positions] = ids.ravel()[(first[:, None] + PERMUTATIONS[which]).ravel()]
    return shuffled, np.divmod(positions, length)


@dataclass(frozen=True)
class StructBertCorruption(MaskedLMCorruption):
    shuffle_probability: float = StructBertConfig.shuffle_probability

    def shuffle_widths(self, max_seq_length: int) -> tuple[int, ...]:
        """The widths `shuffle_positions` may have: whole trigrams overshoot the fraction of a
        row by at most 1.5 tokens."""
        return prediction_widths(self.shuffle_probability * max_seq_length + 2, max_seq_length)

    def shape_axes(self, max_seq_length: int) -> dict[str, tuple[int, ...]]:
        """MLM's axes and the word-order positions' widths."""
        return super().shape_axes(max_seq_length) | {
            "word_order": self.shuffle_widths(max_seq_length)
        }

    def select(
        self, batch: dict, candidates: np.ndarray, hashes: np.ndarray, epoch: int
    ) -> tuple[np.ndarray, None]:
        """MLM's token-level selection, keeping its uniforms (batch, seq) in batch[RANKS_KEY]:
        they rank the trigram starts too. Given the selection, the unselected tokens' uniforms
        are i.i.d. (above the selected ones), so the starts' order stays uniformly random."""
        batch[RANKS_KEY] = keyed_uniform(
            self.seed, epoch, STREAM_MASK_SELECT, hashes, candidates.shape[1]
        )
        return select_exact_fraction(batch[RANKS_KEY], candidates, self.mlm_probability), None

    def __call__(self, batch: dict, epoch: int) -> dict:
        original = batch["input_ids"]  # MLM corrupts a copy
        hashes = key_hashes(batch["keys"])
        candidates = candidate_tokens(original, batch["attention_mask"], self.special_ids)
        batch = self.mask_candidates(batch, epoch, hashes, candidates)
        free = candidates & (batch["labels"] == IGNORE_INDEX)
        batch["input_ids"], (rows, columns) = shuffle_batch_trigrams(
            batch["input_ids"],
            free,
            self.shuffle_probability,
            hashes,
            self.seed,
            epoch,
            ranks=batch.pop(RANKS_KEY),
        )
        flat = rows * original.shape[1] + columns  # increasing: trigrams never overlap
        batch["shuffle_labels"] = np.full_like(original, IGNORE_INDEX)
        batch["shuffle_labels"].ravel()[flat] = original.ravel()[flat]
        widths = self.shuffle_widths(self.max_seq_length or original.shape[1])
        counts = np.bincount(rows, minlength=original.shape[0])
        batch["shuffle_positions"] = listed_positions(flat, counts, original.shape[1], widths)
        return batch


class StructBert(MaskedLanguageModel):
    """MLM + word structural objective (+ the three-way sentence objective by default)."""

    config_class = StructBertConfig
    corruption_class = StructBertCorruption

    def extra_head_flops(self, batch: dict) -> int:
        """The MLM head again, on the shuffled positions' slots."""
        model = self.run.model
        rows = predicted_positions(batch, "shuffle_labels", "shuffle_positions").numel()
        return mlm_head_flops(model.hidden_size, embedding_size(model), self.vocab.size, rows)

    def extra_losses(self, hidden: torch.Tensor, batch: dict) -> Losses:
        """The word-order loss, with its loss and accuracy as metrics, over the shuffled
        positions (0 in a batch without)."""
        positions = predicted_positions(batch, "shuffle_labels", "shuffle_positions")
        targets = gather_targets(batch["shuffle_labels"], positions)  # (batch * width,)
        logits = self.mlm_head(gather_positions(hidden, positions))  # (batch * width, vocab)
        metrics = masked_classification_metrics("word_order", logits, targets)
        return Losses(metrics["word_order_loss"], metrics)
