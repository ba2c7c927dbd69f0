"""A MobileBERT-style bottleneck student (Sun et al., 2020) with its MLM head.

Each layer keeps a `hidden_size`-wide body (512 in MobileBERT) and works inside an
`intra_bottleneck_size`-wide bottleneck (128): a Linear + norm projects the body into the
bottleneck (the residual stream of the layer's inner blocks), multi-head attention produces
bottleneck-wide outputs (queries and keys from a second, shared bottleneck projection, values
from the body, as the released checkpoint and transformers; or all three from the body, as
the paper's Table 1 counts them; or all three from the bottleneck, MobileBERT-tiny), `num_feedforward_networks` stacked FFNs
(4 in MobileBERT) run at bottleneck width, and a Linear + norm back to the body closes the
layer with a residual from its input (the inverted bottleneck of the teacher is this
projection's mirror). Embeddings are `embedding_size` wide (128); a kernel-3 convolution over
the neighbouring tokens ([next, this, previous] concatenated, one Linear) widens them to the
body. `normalization_type` no_norm is the paper's NoNorm (x * w + b), layer_norm LayerNorm;
`hidden_act` relu (the paper's) or gelu.

Parameter names are those of `transformers.MobileBertForMaskedLM` (`mobilebert.*`, `cls.*`),
so `to_hf` writes a directory `AutoModelForMaskedLM` loads with the same logits
(tests/unit/test_mobilebert.py), except for queries and keys from the body, which
transformers cannot express (`to_hf` says so). `trace` returns what TinyBERT's layer-wise losses read: the
embedding output, every layer's body output and its attention scores before the softmax.
"""

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.compress.trace import EncoderTrace
from pretrain.data.vocab import Vocabulary
from pretrain.errors import ConfigError
from pretrain.models.bert import key_padding_mask

NORMS = ("no_norm", "layer_norm")
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}
HF_KEYS = (
    "hidden_size",
    "embedding_size",
    "intra_bottleneck_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "num_feedforward_networks",
    "use_bottleneck_attention",
    "key_query_shared_bottleneck",
    "normalization_type",
    "hidden_act",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "layer_norm_eps",
    "initializer_range",
)


class NoNorm(nn.Module):
    """MobileBERT's replacement of LayerNorm: an elementwise x * weight + bias."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight + self.bias


def norm(kind: str, size: int, eps: float) -> nn.Module:
    """NoNorm or LayerNorm(eps) of `size` features."""
    return NoNorm(size) if kind == "no_norm" else nn.LayerNorm(size, eps=eps)


class DenseNorm(nn.Module):
    """norm(dense(x) [+ residual]): a Linear (in, out) then its norm."""

    def __init__(self, width_in: int, width_out: int, kind: str, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(width_in, width_out)
        self.LayerNorm = norm(kind, width_out, eps)

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        out = self.dense(x)
        return self.LayerNorm(out if residual is None else out + residual)


class Dense(nn.Module):
    """A Linear under the name `dense` (the FFNs' first half)."""

    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.dense = nn.Linear(width_in, width_out)


class FeedForward(nn.Module):
    """One stacked FFN at bottleneck width: norm(x + W2 act(W1 x))."""

    def __init__(self, width: int, ffn: int, kind: str, eps: float) -> None:
        super().__init__()
        self.intermediate = Dense(width, ffn)
        self.output = DenseNorm(ffn, width, kind, eps)


class MobileBertBlock(nn.Module):
    """One MobileBERT layer (see the module docstring); `forward` returns (body output
    (batch, seq, hidden), attention scores (batch, heads, seq, seq))."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        body, inner, kind = (
            cfg["hidden_size"],
            cfg["intra_bottleneck_size"],
            cfg["normalization_type"],
        )
        eps, ffn = cfg["layer_norm_eps"], cfg["intermediate_size"]
        self.heads = cfg["num_attention_heads"]
        self.bottleneck_attention = cfg["use_bottleneck_attention"]
        self.shared_query_key = cfg["key_query_shared_bottleneck"] and not self.bottleneck_attention
        self.dropout_prob = cfg["hidden_dropout_prob"]
        self.attention_dropout_prob = cfg["attention_probs_dropout_prob"]
        self.act = ACTIVATIONS[cfg["hidden_act"]]
        self.bottleneck = nn.Module()
        self.bottleneck.input = DenseNorm(body, inner, kind, eps)
        if self.shared_query_key:
            self.bottleneck.attention = DenseNorm(body, inner, kind, eps)
        query_key_in = inner if self.bottleneck_attention or self.shared_query_key else body
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = nn.Linear(query_key_in, inner)
        self.attention.self.key = nn.Linear(query_key_in, inner)
        self.attention.self.value = nn.Linear(inner if self.bottleneck_attention else body, inner)
        self.attention.output = DenseNorm(inner, inner, kind, eps)
        if cfg["num_feedforward_networks"] > 1:
            self.ffn = nn.ModuleList(
                FeedForward(inner, ffn, kind, eps)
                for _ in range(cfg["num_feedforward_networks"] - 1)
            )
        self.intermediate = Dense(inner, ffn)
        self.output = DenseNorm(
            ffn, inner, kind, 1e-5
        )  # transformers' eps here: LayerNorm's default
        self.output.bottleneck = DenseNorm(inner, body, kind, eps)

    def split(self, x: Tensor) -> Tensor:
        """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
        batch, seq_len, _ = x.shape
        return x.view(batch, seq_len, self.heads, -1).transpose(1, 2)

    def forward(self, hidden: Tensor, visible: Tensor | None) -> tuple[Tensor, Tensor]:
        layer_input = self.bottleneck.input(hidden)  # (batch, seq, inner)
        if self.bottleneck_attention:
            query_key, value = layer_input, layer_input
        elif self.shared_query_key:
            query_key, value = self.bottleneck.attention(hidden), hidden
        else:
            query_key, value = hidden, hidden
        attention = self.attention.self
        query, key = self.split(attention.query(query_key)), self.split(attention.key(query_key))
        scores = query @ key.transpose(-1, -2) * query.shape[-1] ** -0.5
        masked = scores if visible is None else scores.masked_fill(~visible, float("-inf"))
        probs = F.dropout(F.softmax(masked, dim=-1), self.attention_dropout_prob, self.training)
        context = probs @ self.split(attention.value(value))
        context = context.transpose(1, 2).flatten(2)  # (batch, seq, inner)
        x = self.attention.output(context, layer_input)
        for block in getattr(self, "ffn", []):
            x = block.output(self.act(block.intermediate.dense(x)), x)
        x = self.output(self.act(self.intermediate.dense(x)), x)
        widened = F.dropout(self.output.bottleneck.dense(x), self.dropout_prob, self.training)
        return self.output.bottleneck.LayerNorm(widened + hidden), scores


class MobileBertEmbeddings(nn.Module):
    """Token embeddings (`embedding_size` wide), the kernel-3 convolution to the body width,
    positions and token types, norm and dropout: (batch, seq) ids -> (batch, seq, hidden)."""

    def __init__(self, cfg: dict[str, Any], vocab: Vocabulary) -> None:
        super().__init__()
        body, width = cfg["hidden_size"], cfg["embedding_size"]
        self.word_embeddings = nn.Embedding(vocab.size, width, padding_idx=vocab.pad)
        self.embedding_transformation = nn.Linear(3 * width, body)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], body)
        self.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], body)
        self.LayerNorm = norm(cfg["normalization_type"], body, cfg["layer_norm_eps"])
        self.dropout = nn.Dropout(cfg["hidden_dropout_prob"])

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None) -> Tensor:
        tokens = self.word_embeddings(input_ids)  # (batch, seq, width)
        following = F.pad(tokens[:, 1:], (0, 0, 0, 1))
        preceding = F.pad(tokens[:, :-1], (0, 0, 1, 0))
        x = self.embedding_transformation(torch.cat([following, tokens, preceding], dim=-1))
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = x + self.position_embeddings(positions)[None] + self.token_type_embeddings(types)
        return self.dropout(self.LayerNorm(x))


class MobileBertPredictions(nn.Module):
    """The MLM head: transform (Linear, act, LayerNorm) at body width, then logits against
    [word embeddings^T; `dense`] (the embedding table tied, `dense` the body's extra rows)."""

    def __init__(self, cfg: dict[str, Any], word_embeddings: nn.Embedding) -> None:
        super().__init__()
        body, width, vocab_size = (
            cfg["hidden_size"],
            cfg["embedding_size"],
            word_embeddings.num_embeddings,
        )
        self.act = ACTIVATIONS[cfg["hidden_act"]]
        self.transform = DenseNorm(body, body, "layer_norm", cfg["layer_norm_eps"])
        self.dense = nn.Linear(vocab_size, body - width, bias=False)
        self.decoder = nn.Linear(width, vocab_size)
        self.decoder.weight = word_embeddings.weight
        self.bias = self.decoder.bias

    def forward(self, hidden: Tensor) -> Tensor:
        x = self.transform.LayerNorm(self.act(self.transform.dense(hidden)))
        return x @ torch.cat([self.decoder.weight.t(), self.dense.weight], dim=0) + self.bias


def check_config(cfg: dict[str, Any]) -> None:
    """One-line ConfigError naming the `student.*` key MobileBERT cannot build."""
    missing = [key for key in HF_KEYS if key not in cfg]
    if missing:
        raise ConfigError(f"student.{missing[0]}: missing from the MobileBERT student config")
    checks = (
        ("normalization_type", cfg["normalization_type"] in NORMS, f"one of {', '.join(NORMS)}"),
        ("hidden_act", cfg["hidden_act"] in ACTIVATIONS, f"one of {', '.join(ACTIVATIONS)}"),
        ("embedding_size", 0 < cfg["embedding_size"] <= cfg["hidden_size"], "in 1..hidden_size"),
        (
            "num_attention_heads",
            cfg["intra_bottleneck_size"] % cfg["num_attention_heads"] == 0,
            "must divide intra_bottleneck_size",
        ),
        ("num_feedforward_networks", cfg["num_feedforward_networks"] >= 1, "must be >= 1"),
    )
    for key, ok, rule in checks:
        if not ok:
            raise ConfigError(f"student.{key} = {cfg[key]!r}: {rule}")


class MobileBertWithMLM(nn.Module):
    """The MobileBERT student: (batch, seq) ids, types, mask (1 = real) -> MLM logits
    (batch, seq, vocab); `trace` for the layer-wise losses, `to_hf` for export."""

    def __init__(self, model_cfg: dict[str, Any], vocab: Vocabulary) -> None:
        super().__init__()
        check_config(model_cfg)
        self.model_cfg = dict(model_cfg)
        self.vocab = vocab
        self.mobilebert = nn.Module()
        self.mobilebert.embeddings = MobileBertEmbeddings(model_cfg, vocab)
        self.mobilebert.encoder = nn.Module()
        self.mobilebert.encoder.layer = nn.ModuleList(
            MobileBertBlock(model_cfg) for _ in range(model_cfg["num_hidden_layers"])
        )
        self.cls = nn.Module()
        self.cls.predictions = MobileBertPredictions(model_cfg, self.word_embeddings)
        self.initialise(model_cfg["initializer_range"])

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.mobilebert.embeddings.word_embeddings

    def initialise(self, std: float) -> None:
        """Linear and embedding weights ~ N(0, std), biases 0 (the pad row of the embeddings 0)."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        with torch.no_grad():
            self.word_embeddings.weight[self.vocab.pad].zero_()

    def trace(
        self, input_ids: Tensor, token_type_ids: Tensor | None, attention_mask: Tensor | None
    ) -> EncoderTrace:
        """The embedding output, each layer's body output (batch, seq, hidden) and attention
        scores (batch, heads, seq, seq)."""
        visible = key_padding_mask(attention_mask)
        hidden = self.mobilebert.embeddings(input_ids, token_type_ids)
        trace = EncoderTrace(hidden, [], [])
        for layer in self.mobilebert.encoder.layer:
            hidden, scores = layer(hidden, visible)
            trace.hidden.append(hidden)
            trace.scores.append(scores)
        return trace

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """(..., hidden) body states -> (..., vocab) MLM logits."""
        return self.cls.predictions(hidden)

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor | None, attention_mask: Tensor | None
    ) -> Tensor:
        return self.mlm_logits(self.trace(input_ids, token_type_ids, attention_mask).hidden[-1])

    def hf_config(self) -> dict[str, Any]:
        """config.json of the matching `transformers.MobileBertForMaskedLM`."""
        return {
            "architectures": ["MobileBertForMaskedLM"],
            "model_type": "mobilebert",
            **{key: self.model_cfg[key] for key in HF_KEYS},
            "vocab_size": self.vocab.size,
            "pad_token_id": self.vocab.pad,
            "trigram_input": True,
            "use_bottleneck": True,
            "tie_word_embeddings": True,
        }

    def to_hf(self):
        """This model as a `pretrain.export.hf.HFModel` (the same parameter names). Refused
        for queries and keys from the body: transformers' MobileBERT projects them from a
        bottleneck (its Linear layers are bottleneck-wide), and two independent body-wide
        projections do not factor through one shared bottleneck."""
        from pretrain.export.hf import HFModel

        cfg = self.model_cfg
        if not (cfg["use_bottleneck_attention"] or cfg["key_query_shared_bottleneck"]):
            raise ConfigError(
                f"student {cfg.get('name')}: queries and keys from the {cfg['hidden_size']}-wide "
                "body have no transformers MobileBertForMaskedLM form (it computes them from a "
                "bottleneck); set student.key_query_shared_bottleneck=true or "
                "student.use_bottleneck_attention=true to export"
            )
        weights = {name: tensor.detach() for name, tensor in self.state_dict().items()}
        return HFModel(self.hf_config(), weights)
