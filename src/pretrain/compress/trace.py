"""A BERT encoder's forward pass layer by layer, keeping what layer-wise distillation and
head pruning read: the embedding output, every layer's output and attention scores, with
optional per-head gates (Michel et al., 2019's head mask).

The encoder's own forward runs attention through SDPA, which never forms the attention
matrix; this pass forms it from the same modules (`qkv`, `output`, the norms), so its last
hidden state equals `encoder(...)` up to float rounding (tests/unit/test_compress_losses.py).
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from pretrain.models.bert import BertEncoder, BertLayer, BertSelfAttention, key_padding_mask


@dataclass
class EncoderTrace:
    """embeddings: (batch, seq, hidden) embedding output; hidden: each layer's output,
    (batch, seq, hidden); scores: each layer's attention scores q.k / sqrt(head size) before
    the padding mask and softmax, (batch, heads, seq, seq)."""

    embeddings: Tensor
    hidden: list[Tensor]
    scores: list[Tensor]


def attention_with_scores(
    attention: BertSelfAttention, hidden: Tensor, visible: Tensor | None, gate: Tensor | None
) -> tuple[Tensor, Tensor]:
    """(batch, seq, hidden) -> (output (batch, seq, hidden), scores (batch, heads, seq, seq)).
    `visible`: boolean (batch, 1, 1, seq) keys, True = attended; `gate`: (heads,) factors
    on each head's context (1 keeps a head, 0 removes it)."""
    query, key, value = attention.query_key_value(hidden)  # each (batch, heads, seq, head)
    scores = query @ key.transpose(-1, -2) / math.sqrt(attention.head_size)
    masked = scores if visible is None else scores.masked_fill(~visible, float("-inf"))
    probs = F.softmax(masked, dim=-1)
    if attention.training and attention.attention_probs_dropout_prob > 0:
        probs = F.dropout(probs, attention.attention_probs_dropout_prob)
    context = probs @ value  # (batch, heads, seq, head)
    if gate is not None:
        context = context * gate[None, :, None, None]
    batch, _, seq_len, _ = context.shape
    return attention.output(context.transpose(1, 2).reshape(batch, seq_len, -1)), scores


def layer_with_scores(
    layer: BertLayer, hidden: Tensor, visible: Tensor | None, gate: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One BertLayer as its forward computes it, returning (output, attention scores)."""
    attended, scores = attention_with_scores(layer.attention, hidden, visible, gate)
    hidden = layer.attention_norm(hidden + layer.dropout(attended))
    feed_forward = layer.output(F.gelu(layer.intermediate(hidden)))
    return layer.output_norm(hidden + layer.dropout(feed_forward)), scores


def trace_encoder(
    encoder: BertEncoder,
    input_ids: Tensor,
    token_type_ids: Tensor | None = None,
    attention_mask: Tensor | None = None,
    head_gates: Tensor | None = None,
) -> EncoderTrace:
    """Run `encoder` on (batch, seq) ids, types and mask (1 = real); `head_gates`
    (layers, heads) multiplies each head's context. Returns the EncoderTrace."""
    visible = key_padding_mask(attention_mask)
    hidden = encoder.embeddings(input_ids, token_type_ids)  # (batch, seq, hidden)
    trace = EncoderTrace(hidden, [], [])
    for index, layer in enumerate(encoder.layers):
        gate = None if head_gates is None else head_gates[index]
        hidden, scores = layer_with_scores(layer, hidden, visible, gate)
        trace.hidden.append(hidden)
        trace.scores.append(scores)
    return trace


def real_tokens(attention_mask: Tensor | None, input_ids: Tensor) -> Tensor:
    """(batch, seq) bool: True at real tokens (all True without a mask)."""
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.bool)
    return attention_mask.bool()
