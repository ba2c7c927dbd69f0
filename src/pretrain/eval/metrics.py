"""Task metrics from torchmetrics (GLUE's and SQuAD's), and decoding QA spans from the
start/end scores of the windows.

Classification and tagging: accuracy, F1 (of class 1 for two classes, else the unweighted
mean over classes), Matthews correlation. Regression: Pearson and Spearman correlation,
mean squared error. QA: SQuAD exact match and token F1, in percent (a question without an
answer counts as right when the prediction is empty). Beside a classifier's metrics: the
majority-class baseline, and the class it predicts for every example if it predicts one."""

import torch
from torchmetrics.functional import (
    accuracy,
    f1_score,
    matthews_corrcoef,
    mean_squared_error,
    pearson_corrcoef,
    spearman_corrcoef,
)
from torchmetrics.functional.text import squad

from pretrain.eval.features import QAFeatures
from pretrain.eval.tasks import SpanExample


def classification_metrics(
    predictions: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> dict[str, float]:
    """{accuracy, f1, matthews} of predicted class indices against labels (both (n,)).
    Matthews correlation is 0 when the predictions or the labels are all one class, as in
    scikit-learn (GLUE's scorer); torchmetrics gives a small nonzero value there."""
    task = "binary" if num_classes == 2 else "multiclass"
    options = {} if num_classes == 2 else {"num_classes": num_classes}
    f1 = f1_score(predictions, labels, task=task, average="macro", **options)
    return {
        "accuracy": float(
            accuracy(predictions, labels, task="multiclass", num_classes=num_classes)
        ),
        "f1": float(f1),
        "matthews": 0.0
        if len(predictions.unique()) < 2 or len(labels.unique()) < 2
        else float(
            matthews_corrcoef(predictions, labels, task="multiclass", num_classes=num_classes)
        ),
    }


def majority_baseline(labels: torch.Tensor, names: tuple[str, ...]) -> dict[str, str | float]:
    """{majority_class: the most common label's name (`names[index]`), majority_accuracy: the
    accuracy of predicting it for every example} of labels (n,) class indices: what a
    classifier that learnt nothing scores."""
    counts = torch.bincount(labels, minlength=len(names))  # (classes,)
    index = int(counts.argmax())
    return {
        "majority_class": names[index] if index < len(names) else str(index),
        "majority_accuracy": float(counts[index]) / max(len(labels), 1),
    }


def constant_prediction(predictions: torch.Tensor, names: tuple[str, ...]) -> str | None:
    """The name of the one class predicted for every example (predictions (n,) class
    indices), or None when they differ (or there are none)."""
    classes = predictions.unique()
    if len(classes) != 1:
        return None
    index = int(classes[0])
    return names[index] if index < len(names) else str(index)


def regression_metrics(predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """{pearson, spearman, mse} of predicted numbers against labels (both (n,) floats)."""
    predictions, labels = predictions.double(), labels.double()
    return {
        "pearson": float(pearson_corrcoef(predictions, labels)),
        "spearman": float(spearman_corrcoef(predictions, labels)),
        "mse": float(mean_squared_error(predictions, labels)),
    }


def qa_metrics(predictions: dict[str, str], examples: list[SpanExample]) -> dict[str, float]:
    """{exact_match, f1} (percent) of predicted answer texts (by question id; "" = no
    answer) against every example's answers."""
    preds = [{"prediction_text": predictions[e.qid], "id": e.qid} for e in examples]
    target = [
        {
            "answers": {
                "text": [text for text, _ in e.answers] or [""],
                "answer_start": [start for _, start in e.answers] or [0],
            },
            "id": e.qid,
        }
        for e in examples
    ]
    scores = squad(preds, target)
    return {"exact_match": float(scores["exact_match"]), "f1": float(scores["f1"])}


def decode_answers(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    features: QAFeatures,
    examples: list[SpanExample],
    max_answer_tokens: int,
    allow_no_answer: bool,
) -> dict[str, str]:
    """The answer text per question id from the windows' scores ((windows, seq) each): the
    span (start <= end, at most `max_answer_tokens` tokens, starting on a token this window
    has the most context for) with the highest start + end score over all windows; with
    `allow_no_answer`, "" when the no-answer score (start + end at the summary token, the
    lowest over windows) beats it."""
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    max_context = features.rows.tensors["max_context"]
    for window, example_index in enumerate(features.example_index):
        context = features.offsets[window]
        starts, ends = start_logits[window], end_logits[window]
        summary_at = features.summary_positions[window]
        null_score = float(starts[summary_at] + ends[summary_at])
        null[example_index] = min(null.get(example_index, null_score), null_score)
        in_context = torch.tensor([span is not None for span in context])  # (seq,)
        positions = torch.arange(len(context))
        length = positions[None, :] - positions[:, None]  # (start, end): end - start
        allowed = (  # (seq, seq)
            max_context[window][:, None]
            & in_context[None, :]
            & (length >= 0)
            & (length < max_answer_tokens)
        )
        if not allowed.any():
            continue
        scores = (starts[:, None] + ends[None, :]).masked_fill(~allowed, float("-inf"))
        i, j = divmod(int(scores.argmax()), len(context))  # the first best: lowest start
        score = float(scores[i, j])
        if example_index not in best or score > best[example_index][0]:
            text = examples[example_index].context[context[i][0] : context[j][1]]
            best[example_index] = (score, text)
    answers = {}
    for index, example in enumerate(examples):
        score, text = best.get(index, (float("-inf"), ""))
        if allow_no_answer and null.get(index, float("-inf")) > score:
            text = ""
        answers[example.qid] = text
    return answers
