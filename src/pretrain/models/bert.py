"""The BERT encoder (Devlin et al., 2019): token ids -> contextual hidden states.

Learned absolute positions, token types, post-LayerNorm residual blocks, exact GELU.
Attention runs through `torch.nn.functional.scaled_dot_product_attention`, which picks the
fastest kernel for the device. The query, key and value projections are one fused Linear
(`qkv`, output features ordered [query | key | value], each head-major); the Hugging Face
export splits it into BERT's three matrices. With `unpad` (model.unpad) the dense layers run
on the real tokens only (pretrain/models/unpadding.py).
"""

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.models.configs import BertEncoderConfig
from pretrain.models.unpadding import Unpadded, gather_real, scatter_real, unpadding, unpads


def check_pad_token_id(pad_token_id: int, vocab_size: int) -> None:
    """Raise ValueError unless `pad_token_id` is a row of a `vocab_size`-row token table."""
    if not 0 <= pad_token_id < vocab_size:
        raise ValueError(
            f"pad_token_id ({pad_token_id}) must lie in [0, vocab_size = {vocab_size})"
        )


def key_padding_mask(attention_mask: Tensor | None) -> Tensor | None:
    """(batch, seq) 1 = real, 0 = padding -> boolean (batch, 1, 1, seq) for attention (True =
    key is visible), or None for None; an all-padding row attends everywhere (an all-False
    row would give NaN). A (batch, seq, seq) mask says per query (dim 1) which keys (dim 2)
    it sees (UniLM's masks) -> boolean (batch, 1, seq, seq), a query that sees no key seeing
    every key."""
    if attention_mask is None:
        return None
    real = attention_mask.bool()
    if real.dim() == 3:  # (batch, query, key)
        return (real | ~real.any(dim=-1, keepdim=True))[:, None]  # (batch, 1, seq, seq)
    real = real | ~real.any(dim=-1, keepdim=True)
    return real[:, None, None, :]  # (batch, 1, 1, seq) broadcast over heads and queries


def attention_layout(
    attention_mask: Tensor | None, unpad: str, index: Tensor | None = None
) -> Tensor | Unpadded | None:
    """The layers' `attend`: the key-padding mask (`key_padding_mask`), or its Unpadded
    layout (with `index`, the batch's `unpadded_index`, when given) when the encoder's
    `unpad` setting (model.unpad) applies to this batch."""
    attend = key_padding_mask(attention_mask)
    if attend is not None and attend.shape[2] > 1:  # a mask per query: the padded grid
        return attend
    if not unpads(unpad, attention_mask, index):
        return attend
    return unpadding(attention_mask, attend, None if index is None else index.to(attend.device))


def init_bert_weights(module: nn.Module, initializer_range: float) -> None:
    """Initialise one module as BERT does (and Hugging Face's `_init_weights`).

    Linear and Embedding weights ~ normal(0, initializer_range), biases zero, LayerNorm
    weight one and bias zero, and the padding row of an Embedding with `padding_idx` zero.
    Apply to a tree with `model.apply(lambda m: init_bert_weights(m, std))`.
    """
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=initializer_range)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=initializer_range)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class BertEmbeddings(nn.Module):
    """Sum of word, absolute position and token type embeddings, then LayerNorm and dropout.

    With `type_vocab_size` 0 there is no token type table (`token_type_embeddings` is None)
    and `token_type_ids` is ignored (DistilBERT).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        type_vocab_size: int,
        hidden_dropout_prob: float,
        layer_norm_eps: float,
        pad_token_id: int,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.token_type_embeddings = (
            nn.Embedding(type_vocab_size, hidden_size) if type_vocab_size else None
        )
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(hidden_dropout_prob)

    def position_vectors(self, input_ids: Tensor) -> Tensor:
        """The position embeddings to add to (batch, seq) ids: positions 0..seq-1, (seq, hidden).

        Subclasses with other position ids (RoBERTa's, offset past the padding index) override
        this and may return (batch, seq, hidden).
        """
        seq_len = input_ids.shape[1]
        max_positions = self.position_embeddings.num_embeddings
        if seq_len > max_positions:
            raise ValueError(
                f"input_ids has {seq_len} positions but the model has max_position_embeddings = "
                f"{max_positions}; shorten data.max_seq_length or use a model with more positions"
            )
        return self.position_embeddings.weight[:seq_len]

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """Embed (batch, seq) token ids (positions from `position_vectors`). Returns (batch, seq, hidden)."""
        hidden = self.word_embeddings(input_ids)  # (batch, seq, hidden)
        types = self.token_type_embeddings
        if types is not None:
            hidden = hidden + (types.weight[0] if token_type_ids is None else types(token_type_ids))
        hidden = hidden + self.position_vectors(input_ids)  # (seq or batch, seq, hidden)
        return self.dropout(self.norm(hidden))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with a fused qkv projection and an output projection."""

    def __init__(
        self, hidden_size: int, num_attention_heads: int, attention_probs_dropout_prob: float
    ) -> None:
        super().__init__()
        if hidden_size % num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})"
            )
        self.num_heads = num_attention_heads
        self.head_size = hidden_size // num_attention_heads
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.output = nn.Linear(hidden_size, hidden_size)

    def split_heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(batch, seq, 3 hidden) -> query, key, value, each (batch, heads, seq, head)."""
        batch, seq_len, _ = qkv.shape
        qkv = qkv.view(batch, seq_len, 3, self.num_heads, self.head_size)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)

    def query_key_value(self, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(batch, seq, hidden) -> query, key, value, each (batch, heads, seq, head)."""
        return self.split_heads(self.qkv(hidden))

    def attend_grid(self, qkv: Tensor, attend: Tensor | None) -> Tensor:
        """(batch, seq, 3 hidden) projections -> (batch, seq, hidden) context (SDPA)."""
        batch, seq_len, _ = qkv.shape
        query, key, value = self.split_heads(qkv)
        dropout_p = self.attention_probs_dropout_prob if self.training else 0.0
        context = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attend, dropout_p=dropout_p
        )
        return context.transpose(1, 2).reshape(batch, seq_len, -1)  # (batch, seq, hidden)

    def forward(self, hidden: Tensor, attend: Tensor | Unpadded | None) -> Tensor:
        """hidden: (batch, seq, hidden); attend: boolean (batch, 1, 1, seq), True = key is
        visible. Unpadded: hidden is (tokens, hidden); the projections run on those rows and
        the attention on the (batch, seq) grid."""
        if isinstance(attend, Unpadded):
            context = self.attend_grid(attend.scatter(self.qkv(hidden)), attend.attend)
            return self.output(attend.gather(context))  # (tokens, hidden)
        return self.output(self.attend_grid(self.qkv(hidden), attend))


class BertLayer(nn.Module):
    """One post-LayerNorm transformer block: attention, add & norm, feed-forward, add & norm."""

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        intermediate_size: int,
        hidden_dropout_prob: float,
        attention_probs_dropout_prob: float,
        layer_norm_eps: float,
    ) -> None:
        super().__init__()
        self.attention = BertSelfAttention(
            hidden_size, num_attention_heads, attention_probs_dropout_prob
        )
        self.attention_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.intermediate = nn.Linear(hidden_size, intermediate_size)
        self.output = nn.Linear(intermediate_size, hidden_size)
        self.output_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(hidden_dropout_prob)

    def forward(self, hidden: Tensor, attend: Tensor | Unpadded | None) -> Tensor:
        """(batch, seq, hidden) -> (batch, seq, hidden); (tokens, hidden) when unpadded."""
        hidden = self.attention_norm(hidden + self.dropout(self.attention(hidden, attend)))
        feed_forward = self.output(F.gelu(self.intermediate(hidden)))
        return self.output_norm(hidden + self.dropout(feed_forward))


class BertEncoder(nn.Module):
    """BERT: (batch, seq) token ids -> (batch, seq, hidden_size) sequence output.

    Sizes are in features (hidden_size, intermediate_size), layers and heads; dropout values
    are probabilities. `pad_token_id` is the row of the word embeddings kept at zero at
    initialisation and receiving no gradient from the embedding lookup (as in BERT/HF).
    """

    config_class = BertEncoderConfig
    hf_format = "pretrain.export.bert"  # the module whose to_hf/from_hf convert the weights
    paper_counts_pooler = True  # the paper's parameter count includes the [CLS] pooler
    embeddings_class = BertEmbeddings  # subclasses change positions or token types
    unpad = "false"  # model.unpad: auto | true | false (pretrain/models/unpadding.py)

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
        pad_token_id: int = 0,
    ) -> None:
        super().__init__()
        check_pad_token_id(pad_token_id, vocab_size)
        self.hidden_size = hidden_size
        self.initializer_range = initializer_range
        self.embeddings = self.embeddings_class(
            vocab_size,
            hidden_size,
            max_position_embeddings,
            type_vocab_size,
            hidden_dropout_prob,
            layer_norm_eps,
            pad_token_id,
        )
        self.layers = nn.ModuleList(
            BertLayer(
                hidden_size,
                num_attention_heads,
                intermediate_size,
                hidden_dropout_prob,
                attention_probs_dropout_prob,
                layer_norm_eps,
            )
            for _ in range(num_hidden_layers)
        )
        self.apply(lambda module: init_bert_weights(module, initializer_range))

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The (vocab, hidden) token embedding table; MLM decoders tie their weight to it."""
        return self.embeddings.word_embeddings

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        unpadded_index: Tensor | None = None,
    ) -> Tensor:
        """Encode a batch.

        input_ids, token_type_ids: (batch, seq) integer ids (token types default to 0).
        attention_mask: (batch, seq), 1 = real token, 0 = padding (keys that are never attended
        to), or (batch, seq, seq), True where a query (dim 1) sees a key (dim 2), which runs
        padded; None attends to every position. unpadded_index: the batch's precomputed layout
        when unpadded (`unpadding.unpadded_index`). Returns the (batch, seq, hidden) sequence
        output; vectors at padding positions are defined but meaningless.
        """
        attend = attention_layout(attention_mask, self.unpad, unpadded_index)
        hidden = gather_real(self.embeddings(input_ids, token_type_ids), attend)
        for layer in self.layers:
            hidden = layer(hidden, attend)
        return scatter_real(hidden, attend)
