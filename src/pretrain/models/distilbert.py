"""DistilBERT (Sanh et al., 2019): BERT's encoder without token types (and, in the objective,
without NSP or pooler), usually 6 layers initialised from a 12-layer teacher.

Word + learned absolute position embeddings, LayerNorm, then BERT's post-LayerNorm blocks
(`pretrain.models.bert`, reused). Hugging Face's `DistilBertModel` fixes every LayerNorm's
eps at 1e-12, so `model.layer_norm_eps` must be 1e-12 (kept as a key for the MLM head).
"""

from pretrain.models.bert import BertEncoder
from pretrain.models.configs import DISTILBERT_LAYER_NORM_EPS, DistilBertEncoderConfig


class DistilBertEncoder(BertEncoder):
    """DistilBERT: (batch, seq) ids -> (batch, seq, hidden_size); token types are ignored
    (BertEmbeddings without a token type table: word + position, LayerNorm, dropout)."""

    config_class = DistilBertEncoderConfig
    hf_format = "pretrain.export.distilbert"
    paper_counts_pooler = False  # DistilBERT has no pooler (66M)

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
