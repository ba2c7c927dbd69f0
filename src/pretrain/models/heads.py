"""BERT's pretraining heads: hidden states -> predictions. Losses live in the objectives."""

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pretrain.models.bert import init_bert_weights

# Hugging Face `hidden_act` names -> functions: `gelu` is exact GELU (BERT), `gelu_new`
# (ALBERT, GPT-2) and `gelu_pytorch_tanh` its tanh approximation.
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def activation_fn(name: str):
    """The activation function of the Hugging Face `hidden_act` name (see ACTIVATIONS)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act = {name!r}: one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class MaskedLMHead(nn.Module):
    """Masked-token prediction: transform (dense, activation `hidden_act`: exact GELU by
    default, LayerNorm), then a decoder to the vocabulary.

    The decoder's weight is the encoder's word-embedding weight (one shared Parameter, so an
    optimizer step updates both); the decoder has its own (vocab,) bias, `bias`. The transform
    maps hidden_size to the embedding width E (E = hidden_size in BERT, smaller in ALBERT).
    `bias`: whether the transform's dense layer and LayerNorm have biases (ModernBERT's none).
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        layer_norm_eps: float,
        word_embeddings: nn.Embedding,
        initializer_range: float = 0.02,
        hidden_act: str = "gelu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        activation_fn(hidden_act)  # fails early on an unknown name
        self.hidden_act = hidden_act
        if word_embeddings.weight.shape[0] != vocab_size:
            raise ValueError(
                f"word_embeddings has shape {tuple(word_embeddings.weight.shape)} but the MLM head "
                f"needs vocab_size = {vocab_size} rows"
            )
        embedding_size = word_embeddings.weight.shape[1]
        self.dense = nn.Linear(hidden_size, embedding_size, bias=bias)
        self.norm = nn.LayerNorm(embedding_size, eps=layer_norm_eps, bias=bias)
        weight = word_embeddings.weight
        # The decoder's own weight is never used: build it on "meta" (no memory), then tie.
        self.decoder = nn.Linear(embedding_size, vocab_size, bias=False, device="meta")
        self.bias = nn.Parameter(torch.zeros(vocab_size, dtype=weight.dtype, device=weight.device))
        self.apply(lambda module: init_bert_weights(module, initializer_range))
        self.decoder.weight = weight

    def forward(self, hidden: Tensor) -> Tensor:
        """(..., hidden) hidden states -> (..., vocab) logits.

        Call it on the masked positions only, e.g. (N, hidden), to save the vocabulary projection.
        """
        hidden = self.norm(activation_fn(self.hidden_act)(self.dense(hidden)))
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


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective head: predict a token inside a span from the hidden
    states just outside it and its position inside the span.

    For a token at position i of the span s..e: [x_{s-1}; x_{e+1}; p_{i-s}] -> (Linear, GELU,
    LayerNorm) twice -> decoder to the vocabulary. Positions are 0-based and clipped to
    `max_span_length - 1` (in tokens). The decoder's weight is the encoder's word-embedding
    weight (as MaskedLMHead's, so the MLM and SBO decoders share it); its bias is its own.
    """

    def __init__(
        self,
        hidden_size: int,
        max_span_length: int,
        layer_norm_eps: float,
        word_embeddings: nn.Embedding,
        initializer_range: float = 0.02,
    ) -> None:
        super().__init__()
        if word_embeddings.weight.shape[1] != hidden_size:
            raise ValueError(
                f"word_embeddings has shape {tuple(word_embeddings.weight.shape)} but the span "
                f"boundary head needs (vocab_size, hidden_size = {hidden_size})"
            )
        if max_span_length < 1:
            raise ValueError(f"max_span_length = {max_span_length}: must be at least 1 token")
        weight = word_embeddings.weight
        self.position_embeddings = nn.Embedding(max_span_length, hidden_size)
        self.dense1 = nn.Linear(3 * hidden_size, hidden_size)
        self.norm1 = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dense2 = nn.Linear(hidden_size, hidden_size)
        self.norm2 = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, weight.shape[0], bias=False, device="meta")
        self.bias = nn.Parameter(
            torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        )
        self.apply(lambda module: init_bert_weights(module, initializer_range))
        self.decoder.weight = weight

    def forward(self, left: Tensor, right: Tensor, position: Tensor) -> Tensor:
        """left, right (N, hidden) boundary hidden states, position (N,) int64 0-based
        positions inside the spans -> (N, vocab) logits."""
        position = position.clamp(0, self.position_embeddings.num_embeddings - 1)
        hidden = torch.cat([left, right, self.position_embeddings(position)], dim=-1)  # (N, 3H)
        hidden = self.norm1(F.gelu(self.dense1(hidden)))
        hidden = self.norm2(F.gelu(self.dense2(hidden)))
        return F.linear(hidden, self.decoder.weight, self.bias)
