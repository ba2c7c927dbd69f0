"""XLNet (Yang et al., 2019): token ids -> content-stream and query-stream hidden states.

Transformer-XL pieces: sinusoidal relative positions with the two learned biases (`r_w_bias`
for content, `r_r_bias` for position), relative segment encodings (`seg_embed`, `r_s_bias`:
only "same segment or not" matters) and segment-level recurrence (`mems`: the previous
segment's hidden states entering each layer, detached). Two-stream attention: the content
stream h sees its own token, the query stream g (started from `mask_emb`) sees only its
position; `perm_mask` and `target_mapping` say what each sees and where g is computed.
Parameter names and the arithmetic follow Hugging Face's `XLNetModel` (attention weights are
(d_model, n_head, d_head) Parameters), with the batch dimension first.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.models.bert import init_bert_weights
from pretrain.models.configs import XLNetEncoderConfig

ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}
MASKED_SCORE = 1e30  # subtracted from blocked attention scores, as in XLNet/HF (65500 in fp16)


@dataclass
class XLNetOutput:
    """content: (batch, seq, d_model) h stream; query: (batch, num_predict, d_model) g stream
    at the targets (None without target_mapping); mems: per layer (batch, mem, d_model),
    detached, and mems_mask (batch, mem) bool, True = a real token (None unless use_mems)."""

    content: Tensor
    query: Tensor | None
    mems: list[Tensor] | None = None
    mems_mask: Tensor | None = None


class XLNetEmbeddings(nn.Module):
    """The token table `word_embedding` (vocab, d_model) and the query stream's start `mask_emb`."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.word_embedding = nn.Embedding(vocab_size, d_model)
        self.mask_emb = nn.Parameter(torch.zeros(1, 1, d_model))


class XLNetRelativeAttention(nn.Module):
    """Two-stream relative multi-head attention, post-LayerNorm (HF's XLNetRelativeAttention)."""

    def __init__(self, d_model: int, n_head: int, dropout: float, layer_norm_eps: float) -> None:
        super().__init__()
        d_head = d_model // n_head
        self.scale = 1 / d_head**0.5
        for name in ("q", "k", "v", "o", "r"):
            setattr(self, name, nn.Parameter(torch.zeros(d_model, n_head, d_head)))
        self.r_r_bias = nn.Parameter(torch.zeros(n_head, d_head))
        self.r_s_bias = nn.Parameter(torch.zeros(n_head, d_head))
        self.r_w_bias = nn.Parameter(torch.zeros(n_head, d_head))
        self.seg_embed = nn.Parameter(torch.zeros(2, n_head, d_head))
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    @staticmethod
    def rel_shift(x: Tensor, klen: int) -> Tensor:
        """(batch, heads, qlen, klen + qlen) scores by relative distance -> (batch, heads, qlen,
        klen) by key position (Transformer-XL's shift)."""
        b, n, i, r = x.shape
        x = x.reshape(b, n, r, i)[:, :, 1:, :].reshape(b, n, i, r - 1)
        return x[:, :, :, :klen]

    def attend(
        self,
        q_head: Tensor,
        k_head_h: Tensor,
        v_head_h: Tensor,
        k_head_r: Tensor,
        seg_mat: Tensor | None,
        blocked: Tensor | None,
    ) -> Tensor:
        """q_head (batch, qlen, heads, d_head); k/v (batch, klen, heads, d_head); k_head_r
        (klen + qlen, heads, d_head), or (2, klen + qlen, heads, d_head) with bi_data: the
        forward positions for the first half of the batch, the backward ones for the second;
        seg_mat (batch, qlen, klen, 2) one-hot "other segment"; blocked (batch, qlen, klen)
        float, 1 = not visible. Returns (batch, qlen, heads, d_head)."""
        ac = torch.einsum("bind,bjnd->bnij", q_head + self.r_w_bias, k_head_h)
        q_r = q_head + self.r_r_bias
        if k_head_r.dim() == 3:
            bd = torch.einsum("bind,jnd->bnij", q_r, k_head_r)
        else:  # bi_data: the first half of the batch forward, the second backward
            halves = zip(q_r.chunk(2, dim=0), k_head_r, strict=True)
            bd = torch.cat([torch.einsum("bind,jnd->bnij", q, r) for q, r in halves])
        score = ac + self.rel_shift(bd, ac.shape[3])
        if seg_mat is not None:
            ef = torch.einsum("bind,snd->bins", q_head + self.r_s_bias, self.seg_embed)
            score = score + torch.einsum("bijs,bins->bnij", seg_mat, ef)
        score = score * self.scale
        if blocked is not None:
            big = 65500 if score.dtype == torch.float16 else MASKED_SCORE
            score = score - big * blocked[:, None].to(score.dtype)
        prob = self.dropout(F.softmax(score, dim=3))
        return torch.einsum("bnij,bjnd->bind", prob, v_head_h)

    def post_attention(self, residual: Tensor, attn_vec: Tensor) -> Tensor:
        """(batch, len, heads, d_head) -> output projection, dropout, residual, LayerNorm."""
        out = torch.einsum("bind,hnd->bih", attn_vec, self.o)
        return self.layer_norm(self.dropout(out) + residual)

    def forward(
        self,
        h: Tensor,
        g: Tensor | None,
        blocked_h: Tensor | None,
        blocked_g: Tensor | None,
        r: Tensor,
        seg_mat: Tensor | None,
        mem: Tensor | None,
        target_mapping: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """h (batch, qlen, d_model); g (batch, num_predict, d_model) or None; r (klen + qlen,
        d_model) relative position embeddings, or (2, klen + qlen, d_model) forward and
        backward ones with bi_data; mem (batch, mlen, d_model) or None."""
        cat = h if mem is None else torch.cat([mem, h], dim=1)  # (batch, klen, d_model)
        k_head_h = torch.einsum("bih,hnd->bind", cat, self.k)
        v_head_h = torch.einsum("bih,hnd->bind", cat, self.v)
        k_head_r = torch.einsum("...ih,hnd->...ind", r, self.r)
        q_head_h = torch.einsum("bih,hnd->bind", h, self.q)
        args = (k_head_h, v_head_h, k_head_r, seg_mat)
        output_h = self.post_attention(h, self.attend(q_head_h, *args, blocked_h))
        if g is None:
            return output_h, None
        q_head_g = torch.einsum("bih,hnd->bind", g, self.q)
        if target_mapping is not None:  # move each prediction's query to its position
            q_head_g = torch.einsum("bmnd,bml->blnd", q_head_g, target_mapping)
            attn_vec_g = self.attend(q_head_g, *args, blocked_g)
            attn_vec_g = torch.einsum("blnd,bml->bmnd", attn_vec_g, target_mapping)
        else:
            attn_vec_g = self.attend(q_head_g, *args, blocked_g)
        return output_h, self.post_attention(g, attn_vec_g)


class XLNetFeedForward(nn.Module):
    """layer_1, activation, dropout, layer_2, dropout, residual, LayerNorm."""

    def __init__(
        self, d_model: int, d_inner: int, activation: str, dropout: float, layer_norm_eps: float
    ) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.layer_1 = nn.Linear(d_model, d_inner)
        self.layer_2 = nn.Linear(d_inner, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        """(..., d_model) -> (..., d_model)."""
        out = self.dropout(self.layer_2(self.dropout(self.activation(self.layer_1(x)))))
        return self.layer_norm(out + x)


class XLNetLayer(nn.Module):
    """Relative two-stream attention then the feed-forward block, applied to both streams."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_inner: int,
        activation: str,
        dropout: float,
        layer_norm_eps: float,
    ) -> None:
        super().__init__()
        self.rel_attn = XLNetRelativeAttention(d_model, n_head, dropout, layer_norm_eps)
        self.ff = XLNetFeedForward(d_model, d_inner, activation, dropout, layer_norm_eps)

    def forward(self, h: Tensor, g: Tensor | None, *args) -> tuple[Tensor, Tensor | None]:
        h, g = self.rel_attn(h, g, *args)
        return self.ff(h), (None if g is None else self.ff(g))


class XLNetEncoder(nn.Module):
    """XLNet: (batch, seq) token ids -> XLNetOutput (content stream, query stream, memory)."""

    config_class = XLNetEncoderConfig
    hf_format = "pretrain.export.xlnet"

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 768,
        n_layer: int = 12,
        n_head: int = 12,
        d_inner: int = 3072,
        ff_activation: str = "gelu",
        attn_type: str = "bi",
        mem_len: int | None = None,
        reuse_len: int | None = None,
        bi_data: bool = False,
        clamp_len: int = -1,
        dropout: float = 0.1,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
        pad_token_id: int = 0,
    ) -> None:
        super().__init__()
        if attn_type != "bi":
            raise ValueError(f"attn_type = {attn_type!r}: only 'bi' is implemented")
        self.d_model, self.mem_len, self.reuse_len = d_model, mem_len, reuse_len
        self.clamp_len, self.bi_data = clamp_len, bi_data
        self.pad_token_id = pad_token_id
        self.embeddings = XLNetEmbeddings(vocab_size, d_model)
        self.layer = nn.ModuleList(
            XLNetLayer(d_model, n_head, d_inner, ff_activation, dropout, layer_norm_eps)
            for _ in range(n_layer)
        )
        self.dropout = nn.Dropout(dropout)
        self.apply(lambda module: init_bert_weights(module, initializer_range))
        for name, parameter in self.named_parameters():
            if name.startswith("layer.") and ".rel_attn." in name and "layer_norm" not in name:
                nn.init.normal_(parameter, std=initializer_range)
        nn.init.normal_(self.embeddings.mask_emb, std=initializer_range)

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The (vocab, d_model) token table; the LM head's weight is tied to it."""
        return self.embeddings.word_embedding

    def relative_positions(self, qlen: int, klen: int, device: torch.device) -> Tensor:
        """Sinusoid embeddings of the relative distances klen, klen-1, ..., -qlen+1:
        (klen + qlen, d_model), [sin | cos] halves as in Transformer-XL; with bi_data
        (2, klen + qlen, d_model): those and the backward distances -klen, ..., qlen-1
        (XLNet's `relative_positional_encoding`)."""
        freq = torch.arange(0, self.d_model, 2, dtype=torch.int64, device=device).float()
        inv_freq = 1 / torch.pow(10000, freq / self.d_model)
        pos = torch.arange(klen, -qlen, -1, dtype=torch.int64, device=device).float()
        if self.bi_data:
            pos = torch.stack([pos, -pos])
        if self.clamp_len > 0:
            pos = pos.clamp(-self.clamp_len, self.clamp_len)
        angles = pos[..., None] * inv_freq
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)

    def cache(self, hidden: Tensor, mem: Tensor | None) -> Tensor:
        """The next memory of one layer: its input's first reuse_len tokens appended to the
        old memory, the last mem_len kept, detached. (batch, tokens, d_model)."""
        if self.reuse_len:
            hidden = hidden[:, : self.reuse_len]
        new = hidden if mem is None else torch.cat([mem, hidden], dim=1)
        return new[:, -self.mem_len :].detach() if self.mem_len else new.detach()

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        perm_mask: Tensor | None = None,
        target_mapping: Tensor | None = None,
        mems: list[Tensor] | None = None,
        mems_mask: Tensor | None = None,
        use_mems: bool = False,
    ) -> XLNetOutput:
        """Encode a batch (HF XLNetModel's semantics, batch first).

        input_ids, token_type_ids: (batch, seq); only equality of token types matters.
        attention_mask: (batch, seq), 1 = real token, 0 = padding (never attended to).
        perm_mask: (batch, seq, seq), 1/True where token i may NOT see token j (the query
        stream; the content stream also sees itself). target_mapping: (batch, num_predict,
        seq) one-hot rows: where the query stream is computed. mems: per layer (batch, mlen,
        d_model) from a previous call; mems_mask: (batch, mlen), False = memory slot not to be
        attended to (padding, another document); None = all visible. use_mems: return the
        next memory (needs mem_len or returns everything).
        """
        batch, qlen = input_ids.shape
        if self.bi_data and batch % 2:
            raise ValueError(
                f"model.bi_data: a batch of {batch} rows cannot be split into a forward and a "
                "backward half; use an even data.batch_size"
            )
        mlen = mems[0].shape[1] if mems is not None else 0
        dtype = self.embeddings.word_embedding.weight.dtype
        blocked = None  # (batch, qlen, klen) float: 1 = query stream may not see the key
        if attention_mask is not None or perm_mask is not None or mems_mask is not None:
            blocked = torch.zeros(batch, qlen, mlen + qlen, device=input_ids.device, dtype=dtype)
            if attention_mask is not None:
                blocked[:, :, mlen:] += (1 - attention_mask.to(dtype))[:, None, :]
            if perm_mask is not None:
                blocked[:, :, mlen:] += perm_mask.to(dtype)
            if mems_mask is not None and mlen:
                blocked[:, :, :mlen] += (~mems_mask.bool()).to(dtype)[:, None, :]
            blocked = (blocked > 0).to(dtype)
        blocked_h = None
        if blocked is not None:  # the content stream sees its own token
            eye = torch.eye(qlen, device=blocked.device, dtype=dtype)
            blocked_h = blocked.clone()
            blocked_h[:, :, mlen:] = ((blocked[:, :, mlen:] - eye) > 0).to(dtype)
        h = self.dropout(self.embeddings.word_embedding(input_ids))  # (batch, qlen, d_model)
        g = None
        if target_mapping is not None:
            target_mapping = target_mapping.to(dtype)
            g = self.dropout(self.embeddings.mask_emb.expand(batch, target_mapping.shape[1], -1))
        seg_mat = None
        if token_type_ids is not None:
            cat_ids = F.pad(token_type_ids, (mlen, 0), value=0)  # memory: segment 0, as HF
            other = token_type_ids[:, :, None] != cat_ids[:, None, :]  # (batch, qlen, klen)
            seg_mat = torch.stack((~other, other), dim=-1).to(dtype)  # one-hot; no host read
        r = self.dropout(self.relative_positions(qlen, mlen + qlen, input_ids.device).to(dtype))
        new_mems = []
        for index, layer in enumerate(self.layer):
            mem = None if mems is None else mems[index]
            if use_mems:
                new_mems.append(self.cache(h, mem))
            h, g = layer(h, g, blocked_h, blocked, r, seg_mat, mem, target_mapping)
        out = XLNetOutput(self.dropout(h), None if g is None else self.dropout(g))
        if use_mems:
            out.mems = new_mems
            out.mems_mask = self.next_mems_mask(mems_mask, attention_mask, batch, mlen, qlen)
            out.mems_mask = out.mems_mask[:, -new_mems[0].shape[1] :]
        return out

    def next_mems_mask(
        self,
        mems_mask: Tensor | None,
        attention_mask: Tensor | None,
        batch: int,
        mlen: int,
        qlen: int,
    ) -> Tensor:
        """Which entries of the next memory are real tokens: (batch, mlen + reused) bool,
        before the cut to mem_len."""
        device = self.embeddings.mask_emb.device
        old = torch.ones(batch, mlen, dtype=torch.bool, device=device)
        if mems_mask is not None:
            old = mems_mask.bool()
        new = torch.ones(batch, qlen, dtype=torch.bool, device=device)
        if attention_mask is not None:
            new = attention_mask.bool()
        if self.reuse_len:
            new = new[:, : self.reuse_len]
        return torch.cat([old, new], dim=1)


class XLNetLMHead(nn.Module):
    """XLNet's `lm_loss`: logits = hidden @ word_embedding^T + bias (weight tied, own bias)."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: Tensor, embedding_weight: Tensor) -> Tensor:
        """(..., d_model) hidden states and the (vocab, d_model) table -> (..., vocab) logits."""
        return F.linear(hidden, embedding_weight, self.bias)
