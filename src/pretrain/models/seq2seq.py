"""The Transformer encoder-decoder (Vaswani et al., 2017) and BART (Lewis et al., 2020).

One class, `EncoderDecoder`, configurable enough for both:

- the original Transformer: sinusoidal positions, embeddings scaled by sqrt(d_model), no
  LayerNorm on the embeddings, ReLU, post-LayerNorm blocks (`conf/model/transformer_base.yaml`);
- BART: learned positions (Hugging Face's offset of 2 rows), GELU, a LayerNorm on the
  embeddings, post-LayerNorm blocks, unscaled embeddings (`conf/model/bart_*.yaml`).

Encoder and decoder share one word-embedding table (`embeddings.word_embeddings`), which
the output projection (`TiedLMHead`) ties to. The decoder runs causal self-attention and
cross-attention over the encoder output. Attention goes through
`scaled_dot_product_attention`. Parameter names follow Hugging Face's BART layers
(`self_attn.q_proj`, `fc1`, `final_layer_norm`, ...) so the export is a prefix rename.
"""

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.models.bert import check_pad_token_id, init_bert_weights, key_padding_mask
from pretrain.models.configs import EncoderDecoderConfig

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}
LEARNED_POSITION_OFFSET = 2  # BART's learned table has 2 extra rows; position p uses row p + 2


def sinusoidal_table(num_positions: int, dim: int) -> Tensor:
    """(num_positions, dim) fixed position encodings: sin(p / 10000^(2i/dim)) in the first
    half of the features, cos(...) of the same frequencies in the second half (the layout of
    fairseq and Hugging Face's Marian, a permutation of the paper's interleaving)."""
    half = (dim + 1) // 2
    frequencies = 10000.0 ** (-2.0 * torch.arange(half, dtype=torch.float64) / dim)  # (half,)
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * frequencies  # (pos, half)
    return torch.cat([angles.sin(), angles.cos()[:, : dim - half]], dim=1).float()


class Seq2SeqEmbeddings(nn.Module):
    """Shared word embeddings (times sqrt(d_model) when scaled) + positions (one learned table
    per side, or the fixed sinusoids), then an optional LayerNorm per side, then dropout."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        pad_token_id: int,
        max_position_embeddings: int,
        position_embedding: str,
        scale_embedding: bool,
        layernorm_embedding: bool,
        layer_norm_eps: float,
        dropout: float,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, d_model, padding_idx=pad_token_id)
        self.scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.max_positions = max_position_embeddings
        self.learned = position_embedding == "learned"
        if self.learned:
            rows = max_position_embeddings + LEARNED_POSITION_OFFSET
            self.encoder_positions = nn.Embedding(rows, d_model)
            self.decoder_positions = nn.Embedding(rows, d_model)
        else:
            table = sinusoidal_table(max_position_embeddings, d_model)
            self.register_buffer("sinusoids", table, persistent=False)
        norm = (lambda: nn.LayerNorm(d_model, eps=layer_norm_eps)) if layernorm_embedding else None
        self.encoder_norm = norm() if norm else nn.Identity()
        self.decoder_norm = norm() if norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: Tensor, side: str) -> Tensor:
        """Embed (batch, seq) ids for `side` "encoder" or "decoder"; positions 0..seq-1.
        Returns (batch, seq, d_model)."""
        seq_len = input_ids.shape[1]
        if seq_len > self.max_positions:
            raise ValueError(
                f"{side} input has {seq_len} positions but the model has max_position_embeddings"
                f" = {self.max_positions}; shorten data.max_seq_length or use more positions"
            )
        hidden = self.word_embeddings(input_ids) * self.scale
        if self.learned:
            table = self.encoder_positions if side == "encoder" else self.decoder_positions
            start = LEARNED_POSITION_OFFSET
            positions = table.weight[start : start + seq_len]
        else:
            positions = self.sinusoids[:seq_len].to(hidden.dtype)
        hidden = hidden + positions  # (seq, d_model) broadcast over the batch
        norm = self.encoder_norm if side == "encoder" else self.decoder_norm
        return self.dropout(norm(hidden))


class Attention(nn.Module):
    """Multi-head attention (self- or cross-) with separate q/k/v/out projections."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads, self.head_size, self.dropout = num_heads, d_model // num_heads, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: Tensor) -> Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_size).transpose(1, 2)

    def forward(
        self, hidden: Tensor, attend: Tensor | None, source: Tensor | None = None
    ) -> Tensor:
        """hidden: (batch, q, d) queries; source: (batch, k, d) keys/values (None = hidden);
        attend: boolean, broadcastable to (batch, heads, q, k), True = visible."""
        source = hidden if source is None else source
        query, key, value = (
            self._heads(self.q_proj(hidden)),
            self._heads(self.k_proj(source)),
            self._heads(self.v_proj(source)),
        )  # each (batch, heads, seq, head_size)
        context = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attend, dropout_p=self.dropout if self.training else 0.0
        )
        batch, _, q_len, _ = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(batch, q_len, -1))


class FeedForward(nn.Module):
    """fc1, activation, activation dropout, fc2."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str, activation_dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.activation = ACTIVATIONS[activation]
        self.activation_dropout = nn.Dropout(activation_dropout)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(hidden))))


class EncoderLayer(nn.Module):
    """Post-LN block: self-attention, add & norm, feed-forward, add & norm."""

    def __init__(self, d_model, heads, ffn_dim, activation, dropouts, eps) -> None:
        super().__init__()
        dropout, attention_dropout, activation_dropout = dropouts
        self.self_attn = Attention(d_model, heads, attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.ffn = FeedForward(d_model, ffn_dim, activation, activation_dropout)
        self.final_layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden: Tensor, attend: Tensor | None) -> Tensor:
        """(batch, seq, d) -> (batch, seq, d)."""
        hidden = self.self_attn_layer_norm(hidden + self.dropout(self.self_attn(hidden, attend)))
        return self.final_layer_norm(hidden + self.dropout(self.ffn(hidden)))


class DecoderLayer(EncoderLayer):
    """Post-LN block: causal self-attention, cross-attention over the encoder output and
    feed-forward, each followed by add & norm."""

    def __init__(self, d_model, heads, ffn_dim, activation, dropouts, eps) -> None:
        super().__init__(d_model, heads, ffn_dim, activation, dropouts, eps)
        self.encoder_attn = Attention(d_model, heads, dropouts[1])
        self.encoder_attn_layer_norm = nn.LayerNorm(d_model, eps=eps)

    def forward(
        self, hidden: Tensor, attend: Tensor | None, memory: Tensor, memory_attend: Tensor | None
    ) -> Tensor:
        """hidden (batch, tgt, d), memory = encoder output (batch, src, d) -> (batch, tgt, d)."""
        hidden = self.self_attn_layer_norm(hidden + self.dropout(self.self_attn(hidden, attend)))
        cross = self.encoder_attn(hidden, memory_attend, source=memory)
        hidden = self.encoder_attn_layer_norm(hidden + self.dropout(cross))
        return self.final_layer_norm(hidden + self.dropout(self.ffn(hidden)))


class EncoderDecoder(nn.Module):
    """(batch, src) encoder ids + (batch, tgt) decoder ids -> (batch, tgt, d_model) decoder
    hidden states; `encode` and `decode` run the halves (generation encodes once)."""

    config_class = EncoderDecoderConfig
    hf_format = "pretrain.export.bart"

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 768,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        encoder_attention_heads: int = 12,
        decoder_attention_heads: int = 12,
        encoder_ffn_dim: int = 3072,
        decoder_ffn_dim: int = 3072,
        max_position_embeddings: int = 1024,
        position_embedding: str = "learned",
        activation: str = "gelu",
        scale_embedding: bool = False,
        layernorm_embedding: bool = True,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        layer_norm_eps: float = 1e-5,
        init_std: float = 0.02,
        pad_token_id: int = 0,
    ) -> None:
        super().__init__()
        check_pad_token_id(pad_token_id, vocab_size)
        self.d_model = d_model
        self.embeddings = Seq2SeqEmbeddings(
            vocab_size,
            d_model,
            pad_token_id,
            max_position_embeddings,
            position_embedding,
            scale_embedding,
            layernorm_embedding,
            layer_norm_eps,
            dropout,
        )
        dropouts = (dropout, attention_dropout, activation_dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(
                d_model,
                encoder_attention_heads,
                encoder_ffn_dim,
                activation,
                dropouts,
                layer_norm_eps,
            )
            for _ in range(encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(
                d_model,
                decoder_attention_heads,
                decoder_ffn_dim,
                activation,
                dropouts,
                layer_norm_eps,
            )
            for _ in range(decoder_layers)
        )
        self.apply(lambda module: init_bert_weights(module, init_std))

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The shared (vocab, d_model) token embeddings; the output projection ties to them."""
        return self.embeddings.word_embeddings

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(batch, src) ids, mask 1 = real / 0 = padding -> (batch, src, d_model)."""
        attend = key_padding_mask(attention_mask)
        hidden = self.embeddings(input_ids, "encoder")
        for layer in self.encoder_layers:
            hidden = layer(hidden, attend)
        return hidden

    def decode(
        self,
        decoder_input_ids: Tensor,
        encoder_hidden: Tensor,
        encoder_attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
    ) -> Tensor:
        """(batch, tgt) decoder ids over the (batch, src, d_model) encoder output ->
        (batch, tgt, d_model). Position t sees decoder positions <= t (and not padding)."""
        tgt = decoder_input_ids.shape[1]
        causal = torch.ones(tgt, tgt, dtype=torch.bool, device=decoder_input_ids.device).tril()
        attend = causal[None, None]  # (1, 1, tgt, tgt)
        padding = key_padding_mask(decoder_attention_mask)
        if padding is not None:
            attend = attend & padding  # (batch, 1, tgt, tgt)
            attend = attend | ~attend.any(dim=-1, keepdim=True)
        memory_attend = key_padding_mask(encoder_attention_mask)
        hidden = self.embeddings(decoder_input_ids, "decoder")
        for layer in self.decoder_layers:
            hidden = layer(hidden, attend, encoder_hidden, memory_attend)
        return hidden

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        decoder_input_ids: Tensor,
        decoder_attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Encode, then decode; returns the (batch, tgt, d_model) decoder hidden states."""
        memory = self.encode(input_ids, attention_mask)
        return self.decode(decoder_input_ids, memory, attention_mask, decoder_attention_mask)


class TiedLMHead(nn.Module):
    """Output projection to the vocabulary with the shared word-embedding matrix as weight
    (one Parameter) and its own (vocab,) bias (BART's `final_logits_bias`)."""

    def __init__(self, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        weight = word_embeddings.weight
        self.decoder = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        self.decoder.weight = weight
        self.bias = nn.Parameter(
            torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        )

    def forward(self, hidden: Tensor) -> Tensor:
        """(..., d_model) -> (..., vocab) logits."""
        return F.linear(hidden, self.decoder.weight, self.bias)
