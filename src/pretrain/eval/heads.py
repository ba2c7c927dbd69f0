"""What a task head reads from the encoder: which layers (the last, the second to last, the
last four concatenated, all of them concatenated, a learned scalar mix of all) and, for a
sequence-level task, how the tokens are pooled ([CLS], XLNet's last token, or the mean over
real tokens)."""

import torch
from torch import nn

from pretrain.errors import ConfigError
from pretrain.eval.config import LAYER_CHOICES, MODES, POOLINGS

# Task kinds whose head reads every token; the others read one pooled vector per example
PER_TOKEN_KINDS = ("tagging", "qa")

__all__ = [
    "LAYER_CHOICES",
    "PER_TOKEN_KINDS",
    "MODES",
    "POOLINGS",
    "LayerSelection",
    "pool",
    "summary_positions",
]


class LayerSelection(nn.Module):
    """Hidden states of every layer (num_states tensors (batch, seq, hidden), the embeddings
    first) -> one tensor (batch, seq, output_size). `concat_all` concatenates every state,
    embeddings included (BERT's concatenated last layers for an encoder of fewer than four);
    `scalar_mix` is ELMo's gamma * sum_i softmax(w)_i * h_i, with w and gamma learned (all
    layers, embeddings included)."""

    def __init__(self, choice: str, num_states: int, hidden_size: int) -> None:
        super().__init__()
        if choice not in LAYER_CHOICES:
            raise ConfigError(
                f"eval.layers = {choice!r}: must be one of {', '.join(LAYER_CHOICES)}"
            )
        needed = {"second_to_last": 2, "concat_last4": 4}.get(choice, 1)
        if num_states < needed:
            raise ConfigError(
                f"eval.layers = {choice!r}: needs {needed} hidden states, the encoder has "
                f"{num_states} (embeddings + {num_states - 1} layers)"
            )
        self.choice = choice
        concatenated = {"concat_last4": 4, "concat_all": num_states}
        self.output_size = hidden_size * concatenated.get(choice, 1)
        if choice == "scalar_mix":
            self.weights = nn.Parameter(torch.zeros(num_states))
            self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.choice == "last":
            return states[-1]
        if self.choice == "second_to_last":
            return states[-2]
        if self.choice == "concat_last4":
            return torch.cat(states[-4:], dim=-1)  # (batch, seq, 4 * hidden)
        if self.choice == "concat_all":
            return torch.cat(states, dim=-1)  # (batch, seq, num_states * hidden)
        weights = torch.softmax(self.weights, dim=0)
        return self.gamma * torch.einsum("l,lbsh->bsh", weights, torch.stack(states))


def summary_positions(attention_mask: torch.Tensor, last_token: bool) -> torch.Tensor:
    """Index (batch,) of the token that sums up each sequence: the first ([CLS]), or with
    `last_token` (XLNet, whose <cls> ends the input) the last real token, whichever side the
    padding is on."""
    if not last_token:
        return torch.zeros(attention_mask.shape[0], dtype=torch.long, device=attention_mask.device)
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask * positions).argmax(dim=1)


def pool(
    hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str, last_token: bool = False
) -> torch.Tensor:
    """(batch, seq, features) -> (batch, features): the summary token's vector (`cls`) or the
    mean over the real tokens (`mean`; padding, where attention_mask is 0, left out)."""
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (batch, seq, 1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    if pooling != "cls":
        raise ConfigError(f"eval.pooling = {pooling!r}: must be one of {', '.join(POOLINGS)}")
    index = summary_positions(attention_mask, last_token)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]
