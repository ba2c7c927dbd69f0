"""BERT's pretraining heads: hidden states -> predictions. Losses live in the objectives."""

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.models.bert import init_bert_weights


class MaskedLMHead(nn.Module):
    """Masked-token prediction: transform (dense, GELU, LayerNorm), then a decoder to the vocabulary.

    The decoder's weight is the encoder's word-embedding weight (one shared Parameter, so an
    optimizer step updates both); the decoder has its own (vocab,) bias, `bias`.
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        layer_norm_eps: float,
        word_embeddings: nn.Embedding,
        initializer_range: float = 0.02,
    ) -> None:
        super().__init__()
        if tuple(word_embeddings.weight.shape) != (vocab_size, hidden_size):
            raise ValueError(
                f"word_embeddings has shape {tuple(word_embeddings.weight.shape)} but the MLM head "
                f"needs (vocab_size, hidden_size) = ({vocab_size}, {hidden_size})"
            )
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        weight = word_embeddings.weight
        # The decoder's own weight is never used: build it on "meta" (no memory), then tie.
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=False, device="meta")
        self.bias = nn.Parameter(torch.zeros(vocab_size, dtype=weight.dtype, device=weight.device))
        self.apply(lambda module: init_bert_weights(module, initializer_range))
        self.decoder.weight = weight

    def forward(self, hidden: Tensor) -> Tensor:
        """(..., hidden) hidden states -> (..., vocab) logits.

        Call it on the masked positions only, e.g. (N, hidden), to save the vocabulary projection.
        """
        hidden = self.norm(F.gelu(self.dense(hidden)))
        return F.linear(hidden, self.decoder.weight, self.bias)


class NextSentenceHead(nn.Module):
    """BERT's pooler (dense + tanh on the [CLS] vector at position 0), then a classifier over
    `num_labels` sentence relations (NSP and SOP: 2, StructBERT: 3).

    NSP: class 0 = segment B follows segment A, class 1 = segment B is random (HF's convention).
    """

    def __init__(
        self, hidden_size: int, initializer_range: float = 0.02, num_labels: int = 2
    ) -> None:
        super().__init__()
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, num_labels)
        self.apply(lambda module: init_bert_weights(module, initializer_range))

    def forward(self, sequence_output: Tensor) -> Tensor:
        """(batch, seq, hidden) sequence output -> (batch, num_labels) logits."""
        pooled = torch.tanh(self.pooler(sequence_output[:, 0]))  # (batch, hidden)
        return self.classifier(pooled)
