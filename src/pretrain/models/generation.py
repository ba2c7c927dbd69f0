"""Greedy and beam search over any model that scores the next token.

A model is seen through `step(ids) -> logits`: ids (rows, t) LongTensor of the sequences so
far, logits (rows, vocab) for the token after each row. A causal LM's step runs the decoder
on the whole row; an encoder-decoder's step closes over the encoded source and runs the
decoder. The simplest step recomputes the whole prefix. An incremental step (a key/value
cache, e.g. `pretrain.models.gpt.CachedDecoderStep`) may also define `reorder(rows)`:
beam search calls it with the (rows,) index of the row each new row extends, before the next
call, whose ids then extend the previous call's rows by one token each.

`beam_search` follows `transformers`' beam search (generate(num_beams=N), v4.50+ / v5)
decision for decision, so the same model gives the same tokens: 2 x num_beams candidates per
step, a hypothesis finished at EOS (or at the length limit) scored
sum(log p) / (generated tokens ** length_penalty), only candidates among the top num_beams
may finish, and the same stopping rules (`early_stopping` True, False or "never").
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

Step = Callable[[Tensor], Tensor]
BIG = 1.0e9  # the penalty transformers adds to rule a candidate out


@dataclass
class GenerationSetup:
    """What an objective module's `prepare_generation(token_ids)` returns: the step function,
    the (batch, t) prefix to continue, the token that ends a sequence (None: none does) and
    the longest sequence the model accepts in tokens (None: unbounded)."""

    step: Step
    prefix: Tensor
    eos_id: int | None = None
    max_length: int | None = None


def greedy_search(
    step: Step,
    prefix: Tensor,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int | None = None,
) -> Tensor:
    """Append the most likely next token up to `max_new_tokens` times.

    prefix: (batch, t) ids. A row that has produced `eos_id` is finished: it gets `pad_id`
    (default `eos_id`) from then on, and the loop stops once every row is finished.
    Returns (batch, t + generated) ids, generated <= max_new_tokens.
    """
    sequences = prefix.long()
    fill = eos_id if pad_id is None else pad_id
    unfinished = torch.ones(prefix.shape[0], dtype=torch.bool, device=prefix.device)
    for _ in range(max_new_tokens):
        next_ids = step(sequences).argmax(dim=-1)  # (batch,)
        if eos_id is not None:
            next_ids = torch.where(unfinished, next_ids, torch.full_like(next_ids, fill))
            unfinished = unfinished & (next_ids != eos_id)
        sequences = torch.cat([sequences, next_ids[:, None]], dim=1)
        if not unfinished.any():
            break
    return sequences


def _gather(tensor: Tensor, index: Tensor) -> Tensor:
    """tensor (batch, beams, ...) rows picked by index (batch, k) -> (batch, k, ...)."""
    while index.ndim < tensor.ndim:
        index = index.unsqueeze(-1)
    return torch.take_along_dim(tensor, index, dim=1)


def beam_search(
    step: Step,
    prefix: Tensor,
    num_beams: int,
    max_new_tokens: int,
    eos_id: int | None,
    length_penalty: float = 1.0,
    early_stopping: bool | str = True,
    pad_id: int | None = None,
) -> Tensor:
    """The best of `num_beams` hypotheses per row of `prefix` (batch, t).

    A hypothesis ends at `eos_id` or after `max_new_tokens` tokens; its score is its summed
    log-probability / (generated tokens ** length_penalty) (0: plain sum; > 0 favours longer
    ones). early_stopping=True stops a row once num_beams hypotheses are finished.
    Returns (batch, t + n) ids, n the longest best hypothesis, shorter ones padded with
    `pad_id` (default `eos_id`, or 0 when there is none).
    """
    if num_beams < 1 or max_new_tokens < 1:
        raise ValueError(
            f"num_beams ({num_beams}) and max_new_tokens ({max_new_tokens}) must be at least 1"
        )
    batch, prompt_len = prefix.shape
    device = prefix.device
    max_length = prompt_len + max_new_tokens
    fill = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
    keep = 2 * num_beams  # candidates per step, so num_beams survive when the top ones end
    in_top = torch.arange(keep, device=device) < num_beams  # (keep,)

    running = torch.full((batch, num_beams, max_length), fill, dtype=torch.long, device=device)
    running[:, :, :prompt_len] = prefix[:, None, :]
    running_scores = torch.zeros(batch, num_beams, device=device)
    running_scores[:, 1:] = -BIG  # at first every beam is the prefix: expand only one
    done = running.clone()  # finished hypotheses, best first
    done_scores = torch.full((batch, num_beams), -BIG, device=device)
    done_lengths = torch.zeros(batch, num_beams, dtype=torch.long, device=device)
    is_done = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)

    reorder = getattr(step, "reorder", None)
    row_offset = torch.arange(batch, device=device)[:, None] * num_beams
    cur = prompt_len
    while True:
        rows = running[:, :, :cur].reshape(batch * num_beams, cur)
        log_probs = F.log_softmax(step(rows).float(), dim=-1)  # (batch * beams, vocab)
        vocab = log_probs.shape[-1]
        totals = log_probs.view(batch, num_beams, vocab) + running_scores[:, :, None]
        top_scores, top_index = torch.topk(totals.view(batch, -1), keep)  # (batch, keep)
        candidates = _gather(running, top_index // vocab)  # (batch, keep, max_length)
        tokens = top_index % vocab
        candidates[:, :, cur] = tokens
        ends = torch.full_like(tokens, cur + 1 >= max_length, dtype=torch.bool)
        if eos_id is not None:
            ends = ends | (tokens == eos_id)

        # the best num_beams candidates that go on
        go_on = top_scores + ends.float() * -BIG
        survivors = torch.topk(go_on, num_beams).indices
        running, running_scores = _gather(candidates, survivors), _gather(go_on, survivors)
        if reorder is not None:  # a caching step follows its rows to their new places
            source = _gather(top_index // vocab, survivors)  # (batch, beams): beam extended
            reorder((source + row_offset).reshape(-1))

        # finished candidates among the top num_beams join the finished hypotheses
        just_done = ends & in_top[None, :]
        scores = top_scores / ((cur + 1 - prompt_len) ** length_penalty)
        full = is_done.all(dim=-1, keepdim=True) & (early_stopping is True)
        scores = scores + full.float() * -BIG
        scores = scores + (~improvable).float() * -BIG
        scores = scores + (~just_done).float() * -BIG
        lengths = torch.full_like(tokens, cur + 1 - prompt_len)
        best = torch.topk(torch.cat([done_scores, scores], dim=1), num_beams).indices
        done = _gather(torch.cat([done, candidates], dim=1), best)
        done_scores = _gather(torch.cat([done_scores, scores], dim=1), best)
        done_lengths = _gather(torch.cat([done_lengths, lengths], dim=1), best)
        is_done = _gather(torch.cat([is_done, just_done], dim=1), best)

        cur += 1
        # can a running hypothesis still beat the worst finished one?
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = max_length - prompt_len
        else:
            best_length = cur - prompt_len
        best_running = running_scores[:, :1] / (best_length**length_penalty)
        worst_done = torch.where(is_done, done_scores.min(dim=1, keepdim=True).values, -BIG)
        improvable = improvable & (best_running > worst_done).any(dim=-1, keepdim=True)
        all_full = bool(is_done.all()) and early_stopping is True
        if not improvable.any() or all_full or bool(ends.all()):
            break

    generated = int(done_lengths[:, 0].max())
    return done[:, 0, : prompt_len + generated]


def sequence_log_prob(step: Step, sequences: Tensor, prompt_len: int, eos_id: int | None) -> Tensor:
    """Summed log-probability (batch,) of each row's tokens after `prompt_len`, up to and
    including its first `eos_id` (the padding after it is not scored)."""
    total = torch.zeros(sequences.shape[0], device=sequences.device)
    alive = torch.ones(sequences.shape[0], dtype=torch.bool, device=sequences.device)
    for t in range(prompt_len, sequences.shape[1]):
        log_probs = F.log_softmax(step(sequences[:, :t]).float(), dim=-1)  # (batch, vocab)
        token = sequences[:, t]
        total = total + torch.where(alive, log_probs.gather(1, token[:, None])[:, 0], 0.0)
        if eos_id is not None:
            alive = alive & (token != eos_id)
    return total
