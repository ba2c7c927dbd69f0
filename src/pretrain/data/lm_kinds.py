"""UniLM's language-model kinds (Dong et al., 2019, section 2.3): which self-attention mask a
sequence is trained under, drawn per sequence from its key.

Kinds, as the int64 codes the batch carries in `lm_kind` (batch,):
- BIDIRECTIONAL: every token sees every token (BERT's cloze);
- LEFT_TO_RIGHT: a token sees itself and the tokens before it;
- RIGHT_TO_LEFT: a token sees itself and the tokens after it;
- SEQ2SEQ: source tokens (token type 0: [CLS] A [SEP]) see the whole source, target tokens
  (token type 1: B [SEP]) see the source and the target up to themselves.

A sequence's kind is a function of (seed, epoch, sequence key) only (`keyed_uniform`), so it
is drawn again every epoch and does not depend on the number of ranks or workers.
"""

import numpy as np

from pretrain.data.keyed_rng import keyed_uniform

BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ = 0, 1, 2, 3
LM_KIND_NAMES = ("bidirectional", "left_to_right", "right_to_left", "seq2seq")  # by code

STREAM_LM_KIND = 40  # keyed_rng stream of the kind draws (counter 0 of each sequence)


def lm_kind_shares(weights: tuple[float, float, float, float]) -> np.ndarray:
    """Probabilities (4,) float64 of the kinds, in code order, from non-negative weights
    (bidirectional, left-to-right, right-to-left, seq2seq) with a positive sum."""
    weights = np.asarray(weights, dtype=np.float64)
    return weights / weights.sum()


def draw_lm_kinds(seed: int, epoch: int, hashes: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Each sequence's kind, (batch,) int64 codes: the kind whose cumulative share interval
    holds the sequence's uniform draw; hashes (batch,) uint64 key hashes, shares (4,) summing
    to 1 (`lm_kind_shares`)."""
    uniform = keyed_uniform(seed, epoch, STREAM_LM_KIND, hashes, 1)[:, 0]  # (batch,)
    bounds = np.cumsum(shares)[:-1]  # the last interval ends at 1, past every draw
    return np.searchsorted(bounds, uniform, side="right").astype(np.int64)


def target_tokens(token_type_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """The tokens of the target segment (real tokens of token type 1), (batch, seq) bool."""
    return (token_type_ids == 1) & attention_mask.astype(bool)
