"""A GPT-2 style decoder-only Transformer (Radford et al., 2019): token ids -> hidden states.

Learned absolute positions, pre-LayerNorm residual blocks (LayerNorm before attention and
before the feed-forward layer), a final LayerNorm `ln_f`, the tanh approximation of GELU
(GPT-2's `gelu_new`) and causal self-attention through
`torch.nn.functional.scaled_dot_product_attention`. The query, key and value projections are
one fused Linear (`qkv`, output features [query | key | value], each head-major), as GPT-2's
`c_attn`; the Hugging Face export transposes it (GPT-2 uses Conv1D, weights (in, out)).
The language-model head is the word embedding matrix itself (tied), applied by the objective.
"""

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.models.bert import BertSelfAttention, check_pad_token_id, init_bert_weights
from pretrain.models.configs import GPTConfig


class GPTEmbeddings(nn.Module):
    """Word plus learned absolute position embeddings, then dropout (no LayerNorm: the
    blocks normalise their own inputs)."""

    def __init__(self, vocab_size: int, n_embd: int, n_positions: int, embd_pdrop: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, n_embd)
        self.position_embeddings = nn.Embedding(n_positions, n_embd)
        self.dropout = nn.Dropout(embd_pdrop)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """(batch, seq) ids; positions (batch, seq) default to 0..seq-1. -> (batch, seq, n_embd)."""
        seq_len = input_ids.shape[1]
        max_positions = self.position_embeddings.num_embeddings
        if seq_len > max_positions:
            raise ValueError(
                f"input_ids has {seq_len} positions but the model has n_positions = "
                f"{max_positions}; shorten data.max_seq_length (or the prompt) or use a "
                "model with more positions"
            )
        hidden = self.word_embeddings(input_ids)  # (batch, seq, n_embd)
        if position_ids is None:
            hidden = hidden + self.position_embeddings.weight[:seq_len]  # (seq, n_embd) broadcast
        else:
            hidden = hidden + self.position_embeddings(position_ids)
        return self.dropout(hidden)


class CausalSelfAttention(BertSelfAttention):
    """Multi-head self-attention in which position i sees positions <= i (and no padding):
    BERT's fused `qkv` and `output` projections, then dropout on the output (`resid_pdrop`)."""

    def __init__(self, n_embd: int, n_head: int, attn_pdrop: float, resid_pdrop: float) -> None:
        super().__init__(n_embd, n_head, attn_pdrop)
        self.dropout = nn.Dropout(resid_pdrop)

    def forward(
        self,
        hidden: Tensor,
        attend: Tensor | None,
        causal: bool = True,
        past: "tuple[Tensor, Tensor] | None" = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """hidden: (batch, seq, n_embd); attend: boolean (batch, 1, seq, keys), True = the
        query (row) may see the key (column), or None: the plain causal mask when `causal`,
        else every key. past: the keys and values (batch, heads, p, head) of earlier positions.
        Returns the output (batch, seq, n_embd) and the keys and values of all p + seq positions."""
        batch, seq_len, n_embd = hidden.shape
        query, key, value = self.query_key_value(hidden)  # each (batch, heads, seq, head)
        if past is not None:
            key, value = torch.cat([past[0], key], dim=2), torch.cat([past[1], value], dim=2)
        dropout_p = self.attention_probs_dropout_prob if self.training else 0.0
        context = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attend,
            dropout_p=dropout_p,
            is_causal=attend is None and causal,
        )
        context = context.transpose(1, 2).reshape(batch, seq_len, n_embd)  # (batch, seq, n_embd)
        return self.dropout(self.output(context)), (key, value)


class GPTBlock(nn.Module):
    """One pre-LayerNorm block: x + attention(ln_1(x)), then x + feed_forward(ln_2(x))."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        n_inner: int,
        resid_pdrop: float,
        attn_pdrop: float,
        layer_norm_epsilon: float,
    ) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=layer_norm_epsilon)
        self.attention = CausalSelfAttention(n_embd, n_head, attn_pdrop, resid_pdrop)
        self.ln_2 = nn.LayerNorm(n_embd, eps=layer_norm_epsilon)
        self.fc_in = nn.Linear(n_embd, n_inner)
        self.fc_out = nn.Linear(n_inner, n_embd)
        self.dropout = nn.Dropout(resid_pdrop)

    def forward(
        self,
        hidden: Tensor,
        attend: Tensor | None,
        causal: bool = True,
        past: "tuple[Tensor, Tensor] | None" = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """(batch, seq, n_embd) -> (batch, seq, n_embd) and this layer's keys and values
        (see CausalSelfAttention.forward)."""
        attended, keys_values = self.attention(self.ln_1(hidden), attend, causal, past)
        hidden = hidden + attended
        feed_forward = self.fc_out(F.gelu(self.fc_in(self.ln_2(hidden)), approximate="tanh"))
        return hidden + self.dropout(feed_forward), keys_values


def causal_padding_mask(attention_mask: Tensor) -> Tensor:
    """(batch, seq) 1 = real token -> boolean (batch, 1, seq, seq): query i sees key j when
    j <= i and j is real. Every query also sees itself, so a padding query (whose keys may all
    be padding) gets a defined, meaningless output instead of NaN."""
    seq_len = attention_mask.shape[1]
    device = attention_mask.device
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    itself = torch.eye(seq_len, dtype=torch.bool, device=device)
    real = attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, seq): keys
    return (causal & real) | itself  # (batch, 1, seq, seq)


class GPTModel(nn.Module):
    """GPT-2: (batch, seq) token ids -> (batch, seq, n_embd) hidden states after `ln_f`.

    Output logits are `hidden @ word_embeddings.weight.T` (the tied LM head). Initialised as
    GPT-2: weights ~ normal(0, initializer_range), the projections back into the residual
    stream (`attention.output`, `fc_out`) with std initializer_range / sqrt(2 n_layer).
    `pad_token_id` only has to be a valid id: GPT-2 keeps no special padding row.
    """

    config_class = GPTConfig
    hf_format = "pretrain.export.gpt2"  # the module whose to_hf/from_hf convert the weights
    is_causal = True  # position i sees only positions <= i: fit for next-token prediction

    def __init__(
        self,
        vocab_size: int,
        n_embd: int = 768,
        n_layer: int = 12,
        n_head: int = 12,
        n_inner: int | None = None,
        n_positions: int = 1024,
        resid_pdrop: float = 0.1,
        embd_pdrop: float = 0.1,
        attn_pdrop: float = 0.1,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        pad_token_id: int = 0,
    ) -> None:
        super().__init__()
        check_pad_token_id(pad_token_id, vocab_size)
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.hidden_size = n_embd
        self.embeddings = GPTEmbeddings(vocab_size, n_embd, n_positions, embd_pdrop)
        self.layers = nn.ModuleList(
            GPTBlock(
                n_embd,
                n_head,
                n_inner or 4 * n_embd,
                resid_pdrop,
                attn_pdrop,
                layer_norm_epsilon,
            )
            for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(n_embd, eps=layer_norm_epsilon)
        self.apply(lambda module: init_bert_weights(module, initializer_range))
        residual_std = initializer_range / math.sqrt(2 * n_layer)
        for layer in self.layers:
            nn.init.normal_(layer.attention.output.weight, mean=0.0, std=residual_std)
            nn.init.normal_(layer.fc_out.weight, mean=0.0, std=residual_std)

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The (vocab, n_embd) token embedding table, also the LM head's output matrix."""
        return self.embeddings.word_embeddings

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: "KeyValueCache | None" = None,
    ) -> Tensor:
        """Decode a batch causally.

        input_ids: (batch, seq) ids. attention_mask: (batch, seq), 1 = real token, 0 = padding
        (never attended to); None = no padding (the fast causal kernel). position_ids:
        (batch, seq), default 0..seq-1 (right padding needs nothing else). cache: keys and
        values of the p positions decoded before `input_ids` (which then sit at p..p+seq-1),
        extended in place; unpadded rows only. Returns (batch, seq, n_embd); vectors at
        padding positions are defined but meaningless.
        """
        past = 0 if cache is None else cache.length
        seq_len = input_ids.shape[1]
        attend, causal = None, past == 0
        if attention_mask is not None:
            if past:
                raise ValueError(
                    "a KeyValueCache extends unpadded rows only: pass no attention_mask"
                )
            attend = causal_padding_mask(attention_mask)
        elif past and seq_len > 1:  # new query i sees the past and new keys up to i
            keys = torch.arange(past + seq_len, device=input_ids.device)
            queries = torch.arange(past, past + seq_len, device=input_ids.device)
            attend = (keys[None, :] <= queries[:, None])[None, None]  # (1, 1, seq, keys)
        if past:
            limit = self.embeddings.position_embeddings.num_embeddings
            if past + seq_len > limit:
                raise ValueError(
                    f"{past} cached + {seq_len} new positions exceed the model's n_positions = {limit}"
                )
            if position_ids is None:
                position_ids = torch.arange(past, past + seq_len, device=input_ids.device)[None]
        hidden = self.embeddings(input_ids, position_ids)
        for index, layer in enumerate(self.layers):
            hidden, keys_values = layer(
                hidden, attend, causal, None if cache is None else cache.layers[index]
            )
            if cache is not None:
                cache.layers[index] = keys_values
        return self.ln_f(hidden)

    def logits(self, hidden: Tensor) -> Tensor:
        """(..., n_embd) hidden states -> (..., vocab) next-token logits of the tied LM head."""
        return F.linear(hidden, self.word_embeddings.weight)


class KeyValueCache:
    """The keys and values of the positions a GPTModel has decoded, per layer, each
    (rows, heads, positions, head), so the next token costs one position, not the prefix."""

    def __init__(self, num_layers: int) -> None:
        self.layers: list[tuple[Tensor, Tensor] | None] = [None] * num_layers

    @property
    def length(self) -> int:
        """Positions cached."""
        return 0 if self.layers[0] is None else self.layers[0][0].shape[2]

    def reorder(self, rows: Tensor) -> None:
        """Keep rows `rows` (new row r = old row rows[r]), as beam search reorders its beams."""
        self.layers = [None if kv is None else (kv[0][rows], kv[1][rows]) for kv in self.layers]


class CachedDecoderStep:
    """A generation step (`pretrain.models.generation`) over a GPTModel with a key/value cache:
    called with ids (rows, t) that extend the previous call's rows by one token, it runs only
    that token; any other ids are decoded from scratch. Beam search calls `reorder(rows)`
    when it reorders its beams. Returns (rows, vocab) next-token logits."""

    def __init__(self, model: GPTModel) -> None:
        self.model = model
        self.cache: KeyValueCache | None = None
        self.seen: Tensor | None = None  # the ids the cache holds, (rows, t)

    def __call__(self, ids: Tensor) -> Tensor:
        extends = (
            self.seen is not None
            and self.seen.shape == (ids.shape[0], ids.shape[1] - 1)
            and torch.equal(self.seen, ids[:, :-1])
        )
        if not extends:
            self.cache = KeyValueCache(len(self.model.layers))
        new = ids[:, -1:] if extends else ids
        hidden = self.model(new, cache=self.cache)  # (rows, new, n_embd)
        self.seen = ids
        return self.model.logits(hidden[:, -1])

    def reorder(self, rows: Tensor) -> None:
        if self.cache is not None and self.seen is not None:
            self.cache.reorder(rows)
            self.seen = self.seen[rows]
