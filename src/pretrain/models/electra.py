"""The ELECTRA encoder (Clark et al., 2020): BERT's transformer over factorised embeddings.

Word, position and token-type embeddings have their own width, `embedding_size` (E); when it
differs from `hidden_size` (H) a Linear `embeddings_project` maps E -> H before the layers
(Hugging Face's `ElectraModel`). The layers are BERT's (`pretrain.models.bert.BertLayer`).
An ELECTRA generator and discriminator share one `embeddings` module: pass the other model's
module as `embeddings` to the constructor.
"""

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.errors import ConfigError
from pretrain.models.bert import (
    BertEmbeddings,
    BertLayer,
    attention_layout,
    check_pad_token_id,
    init_bert_weights,
)
from pretrain.models.configs import ElectraEncoderConfig
from pretrain.models.unpadding import gather_real, scatter_real


def generator_config(
    model_cfg: Mapping[str, Any], size_fraction: float, layer_fraction: float
) -> dict[str, Any]:
    """The generator's `model` group (plain) from the discriminator's: hidden and intermediate
    sizes scaled by `size_fraction`, heads of the discriminator's head size (at least one),
    layers scaled by `layer_fraction` (ELECTRA's `get_generator_config`); the embedding width
    is the shared one. ConfigError naming `objective.generator_size_fraction` when the sizes
    do not make an encoder."""
    hidden = round(model_cfg["hidden_size"] * size_fraction)
    head_size = model_cfg["hidden_size"] // model_cfg["num_attention_heads"]
    heads = max(1, hidden // head_size)
    layers = round(model_cfg["num_hidden_layers"] * layer_fraction)
    if hidden < 1 or hidden % heads or layers < 1:
        raise ConfigError(
            f"objective.generator_size_fraction = {size_fraction!r}: gives a generator of "
            f"hidden size {hidden}, {heads} heads, {layers} layers for model "
            f"{model_cfg['name']}; choose a fraction that makes hidden_size a positive "
            f"multiple of the head size ({head_size}) and at least one layer"
        )
    return {
        **model_cfg,
        "name": f"{model_cfg['name']}_generator",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": round(model_cfg["intermediate_size"] * size_fraction),
        "num_hidden_layers": layers,
    }


class ElectraEncoder(nn.Module):
    """ELECTRA: (batch, seq) token ids -> (batch, seq, hidden_size) sequence output.

    Sizes in features (embedding_size, hidden_size, intermediate_size), layers and heads;
    dropout values are probabilities. `embeddings`: an existing module (of width
    `embedding_size`) to share instead of building one (the generator uses the
    discriminator's); it is neither re-initialised nor checked beyond its width.
    """

    config_class = ElectraEncoderConfig
    hf_format = "pretrain.export.electra"
    unpad = "false"  # model.unpad: auto | true | false (pretrain/models/unpadding.py)
    paper_counts_pooler = True  # ELECTRA's code builds BERT's model, pooler included

    def __init__(
        self,
        vocab_size: int,
        embedding_size: int = 128,
        hidden_size: int = 256,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 4,
        intermediate_size: int = 1024,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
        pad_token_id: int = 0,
        embeddings: BertEmbeddings | None = None,
    ) -> None:
        super().__init__()
        check_pad_token_id(pad_token_id, vocab_size)
        self.hidden_size = hidden_size
        self.embedding_size = embedding_size
        self.initializer_range = initializer_range
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
        self.embeddings_project = (
            nn.Linear(embedding_size, hidden_size) if embedding_size != hidden_size else None
        )
        self.apply(lambda module: init_bert_weights(module, initializer_range))
        if embeddings is None:
            embeddings = BertEmbeddings(
                vocab_size,
                embedding_size,
                max_position_embeddings,
                type_vocab_size,
                hidden_dropout_prob,
                layer_norm_eps,
                pad_token_id,
            )
            embeddings.apply(lambda module: init_bert_weights(module, initializer_range))
        elif embeddings.word_embeddings.weight.shape != (vocab_size, embedding_size):
            raise ValueError(
                f"shared embeddings have shape {tuple(embeddings.word_embeddings.weight.shape)}; "
                f"this encoder needs (vocab_size, embedding_size) = ({vocab_size}, {embedding_size})"
            )
        self.embeddings = embeddings

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The (vocab, embedding_size) token embedding table; MLM decoders tie to it."""
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
        attention_mask: (batch, seq), 1 = real token, 0 = padding; None attends everywhere.
        unpadded_index: as BertEncoder's (model.unpad). Returns the (batch, seq, hidden) sequence output (meaningless at padding positions).
        """
        attend = attention_layout(attention_mask, self.unpad, unpadded_index)
        hidden = gather_real(self.embeddings(input_ids, token_type_ids), attend)  # (b, s, E)
        if self.embeddings_project is not None:
            hidden = self.embeddings_project(hidden)  # (batch, seq, hidden); (tokens, hidden)
        for layer in self.layers:
            hidden = layer(hidden, attend)
        return scatter_real(hidden, attend)


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator head: dense (H -> H), GELU, dense (H -> 1): one logit per token,
    positive = the token was replaced by the generator (HF `discriminator_predictions`)."""

    def __init__(self, hidden_size: int, initializer_range: float = 0.02) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dense_prediction = nn.Linear(hidden_size, 1)
        self.apply(lambda module: init_bert_weights(module, initializer_range))

    def forward(self, hidden: Tensor) -> Tensor:
        """(..., hidden) hidden states -> (...) replaced-token logits."""
        return self.dense_prediction(F.gelu(self.dense(hidden))).squeeze(-1)
