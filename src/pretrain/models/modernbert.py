"""The ModernBERT encoder (Warner et al., 2024), and NeoBERT (Le Breton et al., 2025) as a
setting of it: token ids -> contextual hidden states.

Rotary positions (RoPE, theta 160k in global layers, 10k in local ones), a gated
feed-forward (GeGLU; SwiGLU with hidden_activation silu), pre-norm blocks with a norm after
the embeddings (the first block then has no attention norm) and a final norm, no biases,
and alternating attention: every `global_attn_every_n_layers`-th layer (the first included)
attends over the whole document, the others within a `local_attention`-token sliding window.
Rows may pack several documents (`document_ids`); attention never crosses a document and
positions restart at each (pretrain/models/document_attention.py). Attention runs through
FlexAttention, whose block masks skip the blocks outside the window, other documents and
padding, or SDPA with a dense mask (`model.attention_backend`); with `model.unpad` the dense
layers run on the real tokens only (pretrain/models/unpadding.py). Weights follow `transformers.ModernBertModel`, so the
export (pretrain/export/modernbert.py) gives the same outputs.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.errors import ConfigError
from pretrain.models.bert import check_pad_token_id
from pretrain.models.configs import ModernBertEncoderConfig
from pretrain.models.document_attention import (
    block_mask,
    dense_mask,
    document_keys,
    document_positions,
    flex_attention,
    uses_flex,
)
from pretrain.models.unpadding import Unpadded, unpadding, unpads

ACTIVATIONS = {"gelu": F.gelu, "silu": F.silu}  # GeGLU (ModernBERT), SwiGLU (NeoBERT)


def make_norm(kind: str, size: int, eps: float) -> nn.Module:
    """A bias-free LayerNorm or an RMSNorm over `size` features."""
    if kind == "rms_norm":
        return nn.RMSNorm(size, eps=eps)
    return nn.LayerNorm(size, eps=eps, bias=False)


def rotary_tables(
    positions: Tensor, head_size: int, theta: float | Tensor, dtype
) -> tuple[Tensor, Tensor]:
    """(batch or 1, seq) int positions -> cos, sin (batch or 1, seq, head_size) of RoPE with
    base `theta` (a number, or a (batch,) tensor: each row's), computed in fp32 (the
    frequencies are rebuilt each call, so no buffer loses precision under bf16 weights),
    returned in `dtype`."""
    exponents = torch.arange(0, head_size, 2, dtype=torch.float32, device=positions.device)
    if isinstance(theta, Tensor):  # (batch,) -> (batch, 1, head/2)
        inv_freq = 1.0 / (theta.float()[:, None, None] ** (exponents / head_size))
    else:
        inv_freq = 1.0 / (theta ** (exponents / head_size))  # (head/2,)
    freqs = positions[..., None].float() * inv_freq  # (batch or 1, seq, head/2)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on (batch, heads, seq, head) `x` with (batch or 1, seq, head) tables, in fp32."""
    cos, sin = cos[:, None].float(), sin[:, None].float()
    xf = x.float()
    first, second = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


@dataclass
class Layout:
    """How the layers see a batch: `unpadded` (the real tokens as (tokens, hidden) rows,
    scattered onto the grid for attention) or None (the (batch, seq) grid); `flex`
    (FlexAttention with BlockMasks) or SDPA with dense masks; `kinds` maps is-global ->
    (cos, sin, mask) of that kind of layer."""

    flex: bool
    unpadded: Unpadded | None
    kinds: dict


class ModernBertAttention(nn.Module):
    """Multi-head self-attention with a fused qkv projection, RoPE and an output projection."""

    def __init__(self, hidden_size: int, num_attention_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_attention_heads
        self.head_size = hidden_size // num_attention_heads
        self.dropout = dropout
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.output = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden: Tensor, layout: Layout, is_global: bool) -> Tensor:
        """(batch, seq, hidden), or (tokens, hidden) unpadded -> the same shape."""
        cos, sin, mask = layout.kinds[is_global]
        qkv = self.qkv(hidden)
        if layout.unpadded is not None:
            qkv = layout.unpadded.scatter(qkv)  # (batch, seq, 3 hidden)
        batch, seq, _ = qkv.shape
        qkv = qkv.view(batch, seq, 3, self.num_heads, self.head_size)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (batch, heads, seq, head)
        query, key = rotate(query, cos, sin), rotate(key, cos, sin)
        if layout.flex:
            context = flex_attention(query, key, value, mask)
        else:
            dropout_p = self.dropout if self.training else 0.0
            context = F.scaled_dot_product_attention(
                query, key, value, attn_mask=mask, dropout_p=dropout_p
            )
        context = context.transpose(1, 2).reshape(batch, seq, -1)  # (batch, seq, hidden)
        if layout.unpadded is not None:
            context = layout.unpadded.gather(context)
        return self.output(context)


class GatedFeedForward(nn.Module):
    """GeGLU / SwiGLU: act(x W_in) * (x W_gate), then W_out; `wi` holds [W_in | W_gate]."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str, dropout: float):
        super().__init__()
        self.activation = ACTIVATIONS[activation]
        self.wi = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.wo = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden: Tensor) -> Tensor:
        """(..., hidden) -> (..., hidden)."""
        inputs, gate = self.wi(hidden).chunk(2, dim=-1)  # (..., intermediate) each
        return self.wo(self.dropout(self.activation(inputs) * gate))


class ModernBertLayer(nn.Module):
    """One pre-norm block: x + attention(norm(x)), then x + feed-forward(norm(x))."""

    def __init__(self, config: ModernBertEncoderConfig, is_global: bool, attention_norm: bool):
        super().__init__()
        size, eps = config.hidden_size, config.norm_eps
        self.is_global = is_global
        self.attention_norm = make_norm(config.norm, size, eps) if attention_norm else nn.Identity()
        self.attention = ModernBertAttention(
            size, config.num_attention_heads, config.attention_dropout
        )
        self.mlp_norm = make_norm(config.norm, size, eps)
        self.mlp = GatedFeedForward(
            size, config.intermediate_size, config.hidden_activation, config.mlp_dropout
        )

    def forward(self, hidden: Tensor, layout: Layout) -> Tensor:
        hidden = hidden + self.attention(self.attention_norm(hidden), layout, self.is_global)
        return hidden + self.mlp(self.mlp_norm(hidden))


class ModernBertEmbeddings(nn.Module):
    """Token embeddings (no positions: RoPE), then the embedding norm and dropout."""

    def __init__(self, vocab_size: int, config: ModernBertEncoderConfig, pad_token_id: int):
        super().__init__()
        size = config.hidden_size
        self.word_embeddings = nn.Embedding(vocab_size, size, padding_idx=pad_token_id)
        norm = config.embedding_norm
        self.norm = make_norm(config.norm, size, config.norm_eps) if norm else nn.Identity()
        self.dropout = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: Tensor) -> Tensor:
        """(batch, seq) ids -> (batch, seq, hidden)."""
        return self.dropout(self.norm(self.word_embeddings(input_ids)))


def init_modernbert_weights(module: nn.Module, config: ModernBertEncoderConfig) -> None:
    """ModernBERT's initialisation (HF `_init_weights`): truncated normals of std
    initializer_range for embeddings, qkv and feed-forward inputs, std / sqrt(2 layers) for
    the attention and feed-forward outputs; norms one."""
    std = config.initializer_range
    out_std = std / math.sqrt(2.0 * config.num_hidden_layers)
    cutoff = config.initializer_cutoff_factor

    def init(weight: Tensor, scale: float) -> None:
        nn.init.trunc_normal_(weight, 0.0, scale, -cutoff * scale, cutoff * scale)

    if isinstance(module, ModernBertEmbeddings):
        init(module.word_embeddings.weight, std)
    elif isinstance(module, ModernBertAttention):
        init(module.qkv.weight, std)
        init(module.output.weight, out_std)
    elif isinstance(module, GatedFeedForward):
        init(module.wi.weight, std)
        init(module.wo.weight, out_std)


class ModernBertEncoder(nn.Module):
    """ModernBERT: (batch, seq) token ids -> (batch, seq, hidden_size) sequence output.

    Takes the keyword arguments of `ModernBertEncoderConfig` (sizes in features, layers and
    heads; `local_attention` and `max_position_embeddings` in tokens). `pad_token_id` is the
    embedding row kept out of the lookup's gradient.
    """

    config_class = ModernBertEncoderConfig
    hf_format = "pretrain.export.modernbert"  # the module whose to_hf/from_hf convert weights
    paper_counts_pooler = False  # the paper counts the encoder (149M base, 395M large)
    unpad = "false"  # model.unpad: auto | true | false (pretrain/models/unpadding.py)

    def __init__(self, vocab_size: int, pad_token_id: int = 0, **settings) -> None:
        super().__init__()
        check_pad_token_id(pad_token_id, vocab_size)
        config = ModernBertEncoderConfig(**settings)
        self.config = config
        self.hidden_size = config.hidden_size
        self.initializer_range = config.initializer_range
        self.head_size = config.hidden_size // config.num_attention_heads
        self.embeddings = ModernBertEmbeddings(vocab_size, config, pad_token_id)
        every = config.global_attn_every_n_layers
        self.layers = nn.ModuleList(
            ModernBertLayer(config, index % every == 0, index > 0 or not config.embedding_norm)
            for index in range(config.num_hidden_layers)
        )
        self.final_norm = make_norm(config.norm, config.hidden_size, config.norm_eps)
        self.apply(lambda module: init_modernbert_weights(module, config))

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The (vocab, hidden) token embedding table; MLM decoders tie their weight to it."""
        return self.embeddings.word_embeddings

    def layout(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        unpadded_index_: Tensor | None,
        document_ids: Tensor | None,
        dtype: torch.dtype,
        global_rope_theta: Tensor | None = None,
    ) -> Layout:
        """The hidden states' layout for this batch and each layer kind's RoPE tables and mask."""
        config, device = self.config, input_ids.device
        batch, seq = input_ids.shape
        if seq > config.max_position_embeddings:
            raise ValueError(
                f"input_ids has {seq} positions but model.max_position_embeddings is "
                f"{config.max_position_embeddings}; shorten data.max_seq_length or raise it"
            )
        keys = None
        if attention_mask is not None or document_ids is not None:
            keys = document_keys(attention_mask, document_ids, input_ids.shape)  # (batch, seq)
        if document_ids is not None:
            positions = document_positions(keys)  # (batch, seq)
        else:
            positions = torch.arange(seq, device=device)[None]  # (1, seq)
        flex = uses_flex(config.attention_backend, device, config.attention_dropout)
        if flex and device.type != "cuda" and self.training and torch.is_grad_enabled():
            raise ConfigError(
                "model.attention_backend=flex: torch has no FlexAttention backward on a "
                f"{device.type} device (inference only there); set model.attention_backend=auto"
            )
        unpadded = None
        if attention_mask is not None and unpads(self.unpad, attention_mask, unpadded_index_):
            unpadded = unpadding(attention_mask, None, unpadded_index_)
        half = config.local_attention // 2
        kinds = {}
        for is_global in {layer.is_global for layer in self.layers}:
            window = None if is_global or half >= seq - 1 else half
            theta = config.global_rope_theta if is_global else config.local_rope_theta
            if is_global and global_rope_theta is not None:
                theta = global_rope_theta  # (batch,): each row's stage's
            cos, sin = rotary_tables(positions, self.head_size, theta, dtype)
            if flex:
                kind_mask = block_mask(keys, window, seq, device)
            else:
                kind_mask = dense_mask(keys, window, seq, device)
            kinds[is_global] = (cos, sin, kind_mask)
        return Layout(flex, unpadded, kinds)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        unpadded_index: Tensor | None = None,
        document_ids: Tensor | None = None,
        global_rope_theta: Tensor | None = None,
    ) -> Tensor:
        """Encode a batch.

        input_ids: (batch, seq) ids; token_type_ids is ignored (ModernBERT has no segments).
        attention_mask: (batch, seq), 1 = real token, 0 = padding; None: all real.
        unpadded_index: the batch's precomputed unpadded layout (`unpadding.unpadded_index`).
        document_ids: (batch, seq) int, the document of each token of a packed row (numbered
        along the row, non-decreasing); None: one document per row. global_rope_theta:
        (batch,) the global layers' RoPE theta of each row (a context-extension stage); None:
        model.global_rope_theta. Returns (batch, seq, hidden); vectors at padding positions
        are defined but meaningless.
        """
        hidden = self.embeddings(input_ids)  # (batch, seq, hidden)
        layout = self.layout(
            input_ids, attention_mask, unpadded_index, document_ids, hidden.dtype,
            global_rope_theta,
        )  # fmt: skip
        if layout.unpadded is not None:
            hidden = layout.unpadded.gather(hidden)  # (tokens, hidden)
        for layer in self.layers:
            hidden = layer(hidden, layout)
        hidden = self.final_norm(hidden)
        return hidden if layout.unpadded is None else layout.unpadded.scatter(hidden)
