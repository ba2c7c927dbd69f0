"""Downstream evaluation, part 4: extractive QA (windows with a document stride, max
context, SQuAD v2 no-answer) and token tagging, end to end; metrics against a direct
computation on the written predictions."""

import re
import string
from collections import Counter

import numpy as np
import pytest
import torch
from test_eval_finetune import assert_binary_metrics, run_eval

from pretrain.eval.builtin_tasks import builtin_task
from pretrain.eval.encoder import load_encoder
from pretrain.eval.features import IGNORE_INDEX, tagging_features, window_features
from pretrain.eval.metrics import decode_answers
from pretrain.eval.tasks import SpanExample

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tiny_encoder_checkpoint):
    return load_encoder(tiny_encoder_checkpoint).tokenizer


def long_example() -> SpanExample:
    words = [f"w{i}" for i in range(60)]
    context = " ".join(words)
    start = context.index("w47")
    return SpanExample("q", "w44 w45 w46", context, (("w47 w48", start),))


def test_windows_cover_a_long_context_and_point_at_the_answer(tokenizer):
    example = long_example()
    features = window_features(tokenizer, [example], max_seq_length=32, doc_overlap_tokens=8)
    rows = features.rows.tensors
    assert len(features.example_index) > 2  # the context needs several windows
    hits = 0
    for window in range(len(features.example_index)):
        start, end = int(rows["start_positions"][window]), int(rows["end_positions"][window])
        offsets = features.offsets[window]
        if start == features.summary_positions[window]:
            assert end == start  # no answer in this window
            continue
        hits += 1
        assert example.context[offsets[start][0] : offsets[end][1]] == "w47 w48"
    assert hits >= 1
    # every context token is scored in exactly one window (the one with most context)
    scored = Counter()
    for window in range(len(features.example_index)):
        for i in rows["max_context"][window].nonzero().flatten().tolist():
            scored[features.offsets[window][i][0]] += 1
    every = {o[0] for offsets in features.offsets for o in offsets if o is not None}
    assert set(scored) == every and set(scored.values()) == {1}


def test_a_question_longer_than_a_window_is_cut(tokenizer):
    """A question of 40 words in windows of 32 tokens sharing 8: cut so that every window
    keeps more than 8 context tokens, and the answer is still found."""
    example = long_example()
    question = " ".join(f"q{i}" for i in range(40))
    long_question = SpanExample("q", question, example.context, example.answers)
    features = window_features(tokenizer, [long_question], max_seq_length=32, doc_overlap_tokens=8)
    contexts = [sum(o is not None for o in offsets) for offsets in features.offsets]
    assert min(contexts) > 8
    rows = features.rows.tensors
    found = [
        example.context[features.offsets[w][s][0] : features.offsets[w][e][1]]
        for w, (s, e) in enumerate(
            zip(rows["start_positions"].tolist(), rows["end_positions"].tolist(), strict=True)
        )
        if s != features.summary_positions[w]
    ]
    assert found and set(found) == {"w47 w48"}


def test_decoding_picks_the_best_span_or_no_answer(tokenizer):
    example = long_example()
    features = window_features(tokenizer, [example], max_seq_length=32, doc_overlap_tokens=8)
    rows = features.rows.tensors
    window = next(
        w
        for w in range(len(features.example_index))
        if int(rows["start_positions"][w]) != features.summary_positions[w]
    )
    start_logits = torch.zeros(len(features.example_index), 32)
    end_logits = torch.zeros_like(start_logits)
    start_logits[window, rows["start_positions"][window]] = 5.0
    end_logits[window, rows["end_positions"][window]] = 5.0
    answers = decode_answers(start_logits, end_logits, features, [example], 30, True)
    assert answers == {"q": "w47 w48"}
    for w, summary in enumerate(features.summary_positions):
        start_logits[w, summary] = end_logits[w, summary] = 6.0
    assert decode_answers(start_logits, end_logits, features, [example], 30, True) == {"q": ""}
    assert decode_answers(start_logits, end_logits, features, [example], 30, False) == {
        "q": "w47 w48"
    }


def test_decoding_finds_the_best_span_of_every_question(tokenizer):
    """Against a direct search: every start this window has the most context for, every end
    in the context at most `max_answer_tokens` tokens on, the best start + end over windows."""
    task = builtin_task("builtin_qa", train_size=1, dev_size=12, seed=2)
    features = window_features(tokenizer, task.dev, max_seq_length=48, doc_overlap_tokens=8)
    windows = len(features.example_index)
    generator = torch.Generator().manual_seed(0)
    start_logits, end_logits = torch.randn(2, windows, 48, generator=generator)
    best = {}
    for w, index in enumerate(features.example_index):
        offsets = features.offsets[w]
        for i in features.rows.tensors["max_context"][w].nonzero().flatten().tolist():
            for j in range(i, min(i + 3, 48)):
                score = float(start_logits[w, i] + end_logits[w, j])
                if offsets[j] is not None and score > best.get(index, (-np.inf, ""))[0]:
                    best[index] = (score, task.dev[index].context[offsets[i][0] : offsets[j][1]])
    answers = decode_answers(start_logits, end_logits, features, task.dev, 3, False)
    assert answers == {e.qid: best[index][1] for index, e in enumerate(task.dev)}


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, articles or extra spaces."""
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def squad_f1(prediction: str, truth: str) -> float:
    predicted, true = normalize(prediction).split(), normalize(truth).split()
    if not predicted or not true:
        return float(predicted == true)
    common = sum((Counter(predicted) & Counter(true)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(true)
    return 2 * precision * recall / (precision + recall)


def test_qa_writes_squad_scores_of_its_answers(tiny_encoder_checkpoint, tmp_path):
    result, _ = run_eval(
        tiny_encoder_checkpoint, "eval=builtin_qa", f"out_dir={tmp_path}", "eval.max_seq_length=48"
    )
    predictions, references = result["predictions"], result["references"]
    assert len(predictions) == len(references) == 32
    truths = [refs or [""] for refs in references]
    exact = [
        max(float(normalize(p) == normalize(t)) for t in ts)
        for p, ts in zip(predictions, truths, strict=True)
    ]
    f1 = [max(squad_f1(p, t) for t in ts) for p, ts in zip(predictions, truths, strict=True)]
    assert result["metrics"]["exact_match"] == pytest.approx(100 * np.mean(exact), abs=1e-4)
    assert result["metrics"]["f1"] == pytest.approx(100 * np.mean(f1), abs=1e-4)


def test_tagging_labels_first_pieces_and_scores_words(tiny_encoder_checkpoint, tokenizer, tmp_path):
    task = builtin_task("builtin_replaced", train_size=8, dev_size=4)
    rows = tagging_features(tokenizer, task.train, max_seq_length=64).tensors
    for row, example in enumerate(task.train):
        labelled = rows["labels"][row][rows["labels"][row] != IGNORE_INDEX]
        assert labelled.tolist() == list(example.tags)[: len(labelled)]
    result, _ = run_eval(tiny_encoder_checkpoint, "eval=builtin_replaced", f"out_dir={tmp_path}")
    assert result["kind"] == "tagging"
    assert len(result["predictions"]) > 32  # one per scored word
    assert_binary_metrics(result)


def test_windows_need_an_overlap_under_half_a_window(tokenizer):
    from pretrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"eval.doc_overlap_tokens = 16: QA windows need"):
        window_features(tokenizer, [long_example()], max_seq_length=32, doc_overlap_tokens=16)
