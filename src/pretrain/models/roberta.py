"""RoBERTa (Liu et al., 2019): BERT's encoder with positions offset past the padding index.

As in fairseq and Hugging Face's `RobertaModel`, a real token's position id is
pad_token_id + 1 + (number of real tokens before it), a padding token's is pad_token_id:
padded positions share one embedding row and shift nothing. With max_position_embeddings
= 514 and pad id 1 (RoBERTa's), sequences hold at most 512 tokens. One token type, LayerNorm
eps 1e-5. Everything else is BERT's (`pretrain.models.bert`), reused.
"""

import torch
from torch import Tensor, nn

from pretrain.models.bert import BertEmbeddings, BertEncoder
from pretrain.models.configs import RobertaEncoderConfig

# Position rows before the first real token: RoBERTa's padding index (1) and the one below it.


def roberta_position_ids(input_ids: Tensor, pad_token_id: int) -> Tensor:
    """(batch, seq) ids -> (batch, seq) int64 position ids: pad_token_id + 1, + 2, ... over
    the real tokens, pad_token_id at padding (`create_position_ids_from_input_ids` in HF)."""
    real = input_ids.ne(pad_token_id).int()
    return (torch.cumsum(real, dim=1) * real).long() + pad_token_id


class RobertaEmbeddings(BertEmbeddings):
    """BERT's embeddings with RoBERTa's position ids; the position row of the padding index
    starts at zero and gets no gradient (it is `padding_idx`), as in Hugging Face."""

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
        super().__init__(
            vocab_size,
            hidden_size,
            max_position_embeddings,
            type_vocab_size,
            hidden_dropout_prob,
            layer_norm_eps,
            pad_token_id,
        )
        if pad_token_id >= max_position_embeddings:
            raise ValueError(
                f"pad_token_id ({pad_token_id}) must be below max_position_embeddings "
                f"({max_position_embeddings}): RoBERTa's positions start past the padding index"
            )
        self.pad_token_id = pad_token_id
        self.position_embeddings = nn.Embedding(
            max_position_embeddings, hidden_size, padding_idx=pad_token_id
        )

    def position_vectors(self, input_ids: Tensor) -> Tensor:
        """(batch, seq) ids -> (batch, seq, hidden) embeddings of `roberta_position_ids`."""
        positions = roberta_position_ids(input_ids, self.pad_token_id)
        rows = self.position_embeddings.num_embeddings
        longest = input_ids.shape[1] + self.pad_token_id + 1
        if longest > rows:
            raise ValueError(
                f"input_ids has {input_ids.shape[1]} positions; with pad_token_id "
                f"{self.pad_token_id} RoBERTa needs max_position_embeddings >= {longest} "
                f"(the model has {rows}); shorten data.max_seq_length"
            )
        return self.position_embeddings(positions)


class RobertaEncoder(BertEncoder):
    """RoBERTa: (batch, seq) token ids -> (batch, seq, hidden_size); BertEncoder's arguments,
    RoBERTa's defaults (514 positions, one token type, LayerNorm eps 1e-5)."""

    config_class = RobertaEncoderConfig
    hf_format = "pretrain.export.roberta"
    embeddings_class = RobertaEmbeddings

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        max_position_embeddings: int = 514,
        type_vocab_size: int = 1,
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        layer_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        pad_token_id: int = 1,
    ) -> None:
        super().__init__(
            vocab_size,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            intermediate_size,
            max_position_embeddings,
            type_vocab_size,
            hidden_dropout_prob,
            attention_probs_dropout_prob,
            layer_norm_eps,
            initializer_range,
            pad_token_id,
        )
