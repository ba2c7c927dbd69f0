"""The ALBERT encoder (Lan et al., 2020): token ids -> contextual hidden states.

BERT's post-LayerNorm blocks with two changes. Factorised embeddings: tokens, positions and
token types are embedded in `embedding_size` (E) features, then one Linear maps E -> H
(`embedding_projection`). Cross-layer parameter sharing (`share_layers`): `all` (ALBERT: one
attention and one feed-forward block applied `num_hidden_layers` times), `attention` or `ffn`
(only that sub-block shared), `none` (every layer its own, like BERT). Dropout defaults to 0
and the activation to `gelu_new` (the tanh approximation of GELU), as ALBERT's.
"""

from torch import Tensor, nn

from pretrain.models.bert import (
    BertEmbeddings,
    BertSelfAttention,
    attention_layout,
    check_pad_token_id,
    init_bert_weights,
)
from pretrain.models.configs import SHARE_MODES, AlbertEncoderConfig
from pretrain.models.heads import activation_fn
from pretrain.models.unpadding import gather_real, scatter_real


class AlbertAttentionBlock(nn.Module):
    """Self-attention, dropout, add & LayerNorm: (batch, seq, H) -> (batch, seq, H)."""

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        hidden_dropout_prob: float,
        attention_probs_dropout_prob: float,
        layer_norm_eps: float,
    ) -> None:
        super().__init__()
        self.attention = BertSelfAttention(
            hidden_size, num_attention_heads, attention_probs_dropout_prob
        )
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(hidden_dropout_prob)

    def forward(self, hidden: Tensor, attend: Tensor | None) -> Tensor:
        return self.norm(hidden + self.dropout(self.attention(hidden, attend)))


class AlbertFeedForwardBlock(nn.Module):
    """Linear H -> intermediate, activation, Linear back, dropout, add & LayerNorm."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        hidden_dropout_prob: float,
        layer_norm_eps: float,
    ) -> None:
        super().__init__()
        self.intermediate = nn.Linear(hidden_size, intermediate_size)
        self.output = nn.Linear(intermediate_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(hidden_dropout_prob)
        self.hidden_act = hidden_act

    def forward(self, hidden: Tensor) -> Tensor:
        feed_forward = self.output(activation_fn(self.hidden_act)(self.intermediate(hidden)))
        return self.norm(hidden + self.dropout(feed_forward))


class AlbertEncoder(nn.Module):
    """ALBERT: (batch, seq) token ids -> (batch, seq, hidden_size) sequence output.

    `attention_blocks` and `ffn_blocks` hold one block when that part is shared across
    layers, `num_hidden_layers` blocks otherwise; layer i applies block i (or the shared one).
    Parameters are counted once however often they are applied.
    """

    config_class = AlbertEncoderConfig
    hf_format = "pretrain.export.albert"
    unpad = "false"  # model.unpad: auto | true | false (pretrain/models/unpadding.py)
    paper_counts_pooler = True  # Table 1's 12M/18M include the [CLS] pooler (SOP uses it)

    def __init__(
        self,
        vocab_size: int,
        embedding_size: int = 128,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        share_layers: str = "all",
        hidden_act: str = "gelu_new",
        hidden_dropout_prob: float = 0.0,
        attention_probs_dropout_prob: float = 0.0,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
        pad_token_id: int = 0,
    ) -> None:
        super().__init__()
        check_pad_token_id(pad_token_id, vocab_size)
        if share_layers not in SHARE_MODES:
            raise ValueError(f"share_layers = {share_layers!r}: one of {', '.join(SHARE_MODES)}")
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.share_layers = share_layers
        self.embeddings = BertEmbeddings(
            vocab_size,
            embedding_size,
            max_position_embeddings,
            type_vocab_size,
            hidden_dropout_prob,
            layer_norm_eps,
            pad_token_id,
        )
        self.embedding_projection = nn.Linear(embedding_size, hidden_size)  # E -> H
        attention_count = 1 if share_layers in ("all", "attention") else num_hidden_layers
        ffn_count = 1 if share_layers in ("all", "ffn") else num_hidden_layers
        self.attention_blocks = nn.ModuleList(
            AlbertAttentionBlock(
                hidden_size,
                num_attention_heads,
                hidden_dropout_prob,
                attention_probs_dropout_prob,
                layer_norm_eps,
            )
            for _ in range(attention_count)
        )
        self.ffn_blocks = nn.ModuleList(
            AlbertFeedForwardBlock(
                hidden_size, intermediate_size, hidden_act, hidden_dropout_prob, layer_norm_eps
            )
            for _ in range(ffn_count)
        )
        self.apply(lambda module: init_bert_weights(module, initializer_range))

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The (vocab, E) token embedding table; MLM decoders tie their weight to it."""
        return self.embeddings.word_embeddings

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        unpadded_index: Tensor | None = None,
    ) -> Tensor:
        """Encode a batch: input_ids, token_type_ids (batch, seq) integer ids; attention_mask
        (batch, seq), 1 = real token, 0 = padding, None = attend everywhere; unpadded_index as
        BertEncoder's. Returns the (batch, seq, hidden_size) sequence output (meaningless at
        padding positions)."""
        attend = attention_layout(attention_mask, self.unpad, unpadded_index)
        hidden = gather_real(self.embeddings(input_ids, token_type_ids), attend)  # (b, s, E)
        hidden = self.embedding_projection(hidden)  # (b, s, H); (tokens, H) unpadded
        for layer in range(self.num_hidden_layers):
            attention = self.attention_blocks[layer % len(self.attention_blocks)]
            feed_forward = self.ffn_blocks[layer % len(self.ffn_blocks)]
            hidden = feed_forward(attention(hidden, attend))
        return scatter_real(hidden, attend)
