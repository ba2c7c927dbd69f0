"""Task examples -> token tensors, with the encoder's own (fast) tokenizer.

Sequences are padded to `max_seq_length` tokens. Extractive QA cuts a long context into
windows (`window_features`): consecutive windows share `doc_overlap_tokens` tokens of
context (the document stride), and each context token is scored only in the window where it
has the most context on both sides (BERT's "max context")."""

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from pretrain.errors import ConfigError
from pretrain.eval.tasks import SpanExample, TaggingExample, TextExample

IGNORE_INDEX = -100  # label of a position the loss and the metrics skip


class TensorRows(Dataset):
    """Rows of equally long tensors: row i is {name: tensor[i]}."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: tensor[index] for name, tensor in self.tensors.items()}


def _model_inputs(encoded, tokenizer) -> dict[str, torch.Tensor]:
    return {
        name: torch.tensor(encoded[name]) for name in tokenizer.model_input_names if name in encoded
    }


def text_features(
    tokenizer, examples: list[TextExample], max_seq_length: int, regression: bool = False
) -> TensorRows:
    """Tokenize one text or a pair per example (truncated to `max_seq_length` tokens);
    `labels` are class indices (long) or, with `regression`, numbers (float)."""
    first = [e.text_a for e in examples]
    second = [e.text_b for e in examples] if examples and examples[0].text_b is not None else None
    encoded = tokenizer(
        first, second, truncation=True, max_length=max_seq_length, padding="max_length"
    )
    tensors = _model_inputs(encoded, tokenizer)
    dtype = torch.float if regression else torch.long
    tensors["labels"] = torch.tensor([e.label for e in examples], dtype=dtype)
    return TensorRows(tensors)


def tagging_features(tokenizer, examples: list[TaggingExample], max_seq_length: int) -> TensorRows:
    """Tokenize the words of each example; `labels` (batch, seq) hold a word's tag at its
    first token and IGNORE_INDEX elsewhere (later pieces, specials, padding). Words cut off by
    truncation get no label and are not scored."""
    encoded = tokenizer(
        [list(e.words) for e in examples],
        is_split_into_words=True,
        truncation=True,
        max_length=max_seq_length,
        padding="max_length",
    )
    labels = torch.full((len(examples), max_seq_length), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(examples):
        previous = None
        for position, word in enumerate(encoded.word_ids(row)):
            if word is not None and word != previous:
                labels[row, position] = example.tags[word]
            previous = word
    tensors = _model_inputs(encoded, tokenizer)
    tensors["labels"] = labels
    return TensorRows(tensors)


@dataclass
class QAFeatures:
    """Windows of QA examples: `rows` (input tensors, start/end_positions: the answer's first
    and last token, or the summary token when the window holds no answer; `max_context`
    (batch, seq) bool: the context tokens this window scores), `example_index` of each
    window, `offsets`: per window, per token, its (start, end) characters in the context
    or None outside the context, and `summary_positions`: per window, the token whose
    start and end scores say "no answer"."""

    rows: TensorRows
    example_index: list[int]
    offsets: list[list[tuple[int, int] | None]]
    summary_positions: list[int]


def clipped_questions(tokenizer, questions: list[str], max_tokens: int) -> list[str]:
    """`questions` cut after their first `max_tokens` tokens (BERT's max_query_length), so
    that a window keeps more context tokens than consecutive windows share."""
    offsets = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    return [
        question if len(spans) <= max_tokens else question[: spans[max_tokens - 1][1]]
        for question, spans in zip(questions, offsets["offset_mapping"], strict=True)
    ]


def window_features(
    tokenizer,
    examples: list[SpanExample],
    max_seq_length: int,
    doc_overlap_tokens: int,
    last_token_summary: bool = False,
) -> QAFeatures:
    """Tokenize (question, context) pairs into windows of `max_seq_length` tokens; the
    context is cut into windows sharing `doc_overlap_tokens` tokens. A window without the
    answer (or an example without one) points both positions at the summary token ([CLS];
    XLNet's last real token with `last_token_summary`): "no answer". A question too long to
    leave a window more than `doc_overlap_tokens` context tokens is cut (clipped_questions)."""
    if not 0 <= doc_overlap_tokens < max_seq_length // 2:
        raise ConfigError(
            f"eval.doc_overlap_tokens = {doc_overlap_tokens}: QA windows need it in "
            f"[0, max_seq_length / 2) = [0, {max_seq_length // 2})"
        )
    room = max_seq_length - tokenizer.num_special_tokens_to_add(pair=True) - doc_overlap_tokens
    encoded = tokenizer(
        clipped_questions(tokenizer, [e.question for e in examples], room - 1),
        [e.context for e in examples],
        truncation="only_second",
        max_length=max_seq_length,
        stride=doc_overlap_tokens,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )
    windows = len(encoded["input_ids"])
    starts, ends, example_index, offsets, scores, summaries = [], [], [], [], [], []
    for window in range(windows):
        example = examples[encoded["overflow_to_sample_mapping"][window]]
        mask = encoded["attention_mask"][window]
        real = [i for i, m in enumerate(mask) if m]
        summary = real[-1] if last_token_summary else real[0]
        sequence_ids = encoded.sequence_ids(window)
        context = [i for i, s in enumerate(sequence_ids) if s == 1]
        spans = [
            tuple(encoded["offset_mapping"][window][i]) if sequence_ids[i] == 1 else None
            for i in range(len(sequence_ids))
        ]
        start = end = summary
        if example.answers and context:
            text, first_char = example.answers[0]
            last_char = first_char + len(text)
            if spans[context[0]][0] <= first_char and spans[context[-1]][1] >= last_char:
                start = next(i for i in context if spans[i][1] > first_char)
                end = next(i for i in reversed(context) if spans[i][0] < last_char)
        summaries.append(summary)
        starts.append(start)
        ends.append(end)
        example_index.append(encoded["overflow_to_sample_mapping"][window])
        offsets.append(spans)
        scores.append(
            {i: min(i - context[0], context[-1] - i) + 0.01 * len(context) for i in context}
        )
    best: dict[tuple[int, int], float] = {}
    for window in range(windows):
        for i, score in scores[window].items():
            key = (example_index[window], offsets[window][i][0])
            best[key] = max(best.get(key, -1.0), score)
    max_context = torch.zeros(windows, max_seq_length, dtype=torch.bool)
    for window in range(windows):
        for i, score in scores[window].items():
            max_context[window, i] = score == best[(example_index[window], offsets[window][i][0])]
    tensors = _model_inputs(encoded, tokenizer)
    tensors["start_positions"] = torch.tensor(starts)
    tensors["end_positions"] = torch.tensor(ends)
    tensors["max_context"] = max_context
    return QAFeatures(TensorRows(tensors), example_index, offsets, summaries)
