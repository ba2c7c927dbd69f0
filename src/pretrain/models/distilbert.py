"""DistilBERT (Sanh et al., 2019): BERT's encoder without token types (and, in the objective,
without NSP or pooler), usually 6 layers initialised from a 12-layer teacher.

Word + learned absolute position embeddings, LayerNorm, then BERT's post-LayerNorm blocks
(`pretrain.models.bert`, reused). Hugging Face's `DistilBertModel` fixes every LayerNorm's
eps at 1e-12, so `model.layer_norm_eps` must be 1e-12 (kept as a key for the MLM head).
"""

from dataclasses import dataclass

from torch import Tensor, nn

from pretrain.config import ModelConfig, require, require_unit_interval
from pretrain.models.bert import BertEmbeddings, BertEncoder

DISTILBERT_LAYER_NORM_EPS = 1e-12


@dataclass
class DistilBertEncoderConfig(ModelConfig):
    """DistilBERT's settings under BERT's names (dim = hidden_size, n_layers =
    num_hidden_layers, hidden_dim = intermediate_size ...); sizes in features, layers, heads."""

    hidden_size: int = 768
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = DISTILBERT_LAYER_NORM_EPS
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            require(getattr(self, key) > 0, f"model.{key}", getattr(self, key), "must be positive")
        require(
            self.hidden_size % self.num_attention_heads == 0,
            "model.hidden_size",
            self.hidden_size,
            f"must be divisible by model.num_attention_heads ({self.num_attention_heads})",
        )
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            require_unit_interval(f"model.{key}", getattr(self, key), open_low=False)
        require(
            self.layer_norm_eps == DISTILBERT_LAYER_NORM_EPS,
            "model.layer_norm_eps",
            self.layer_norm_eps,
            "must be 1e-12: DistilBERT (and its Hugging Face export) fixes it",
        )


class DistilBertEmbeddings(BertEmbeddings):
    """Word + absolute position embeddings (positions 0..seq-1), LayerNorm, dropout; no token types."""

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
        if type_vocab_size != 0:
            raise ValueError(
                f"DistilBERT has no token types, got type_vocab_size={type_vocab_size}"
            )
        nn.Module.__init__(self)
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """Embed (batch, seq) ids -> (batch, seq, hidden); `token_type_ids` is ignored."""
        hidden = self.word_embeddings(input_ids) + self.position_vectors(input_ids)
        return self.dropout(self.norm(hidden))


class DistilBertEncoder(BertEncoder):
    """DistilBERT: (batch, seq) ids -> (batch, seq, hidden_size); token types are ignored."""

    config_class = DistilBertEncoderConfig
    hf_format = "pretrain.export.distilbert"
    embeddings_class = DistilBertEmbeddings

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int = 768,
        num_hidden_layers: int = 6,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        max_position_embeddings: int = 512,
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        layer_norm_eps: float = DISTILBERT_LAYER_NORM_EPS,
        initializer_range: float = 0.02,
        pad_token_id: int = 0,
    ) -> None:
        super().__init__(
            vocab_size,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            intermediate_size,
            max_position_embeddings,
            0,  # type_vocab_size: no token-type embeddings
            hidden_dropout_prob,
            attention_probs_dropout_prob,
            layer_norm_eps,
            initializer_range,
            pad_token_id,
        )
