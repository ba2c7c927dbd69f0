"""Downstream evaluation, part 2: `pretrain-eval` fine-tunes with Lightning and writes
eval/<task>.json; the metrics equal a direct computation on the predictions it wrote."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.eval.config import register_eval_schema

pytest.importorskip("transformers")
register_eval_schema()

# 64 training and 32 dev examples of 32 tokens, one epoch: a couple of seconds each.
SMALL = [
    "eval.task.train_size=64",
    "eval.task.dev_size=32",
    "eval.max_seq_length=32",
    "eval.doc_overlap_tokens=8",
    "eval.epochs=2",
    "eval.batch_size=16",
    "eval.lr=1e-3",
]


def run_eval(checkpoint: Path, *overrides: str) -> tuple[dict, Path]:
    from pretrain.eval.run import evaluate

    cfg = compose_config([f"encoder.path={checkpoint}", *SMALL, *overrides], "evaluate")
    return evaluate(OmegaConf.to_object(cfg))


def matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
    tp = np.sum((predictions == 1) & (labels == 1))
    tn = np.sum((predictions == 0) & (labels == 0))
    fp = np.sum((predictions == 1) & (labels == 0))
    fn = np.sum((predictions == 0) & (labels == 1))
    denominator = np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    return float((tp * tn - fp * fn) / denominator) if denominator else 0.0


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 0, tied values sharing their mean rank (as Spearman's correlation needs)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def assert_binary_metrics(result: dict) -> None:
    predictions, labels = np.array(result["predictions"]), np.array(result["references"])
    tp = np.sum((predictions == 1) & (labels == 1))
    precision = tp / max(np.sum(predictions == 1), 1)
    recall = tp / max(np.sum(labels == 1), 1)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    metrics = result["metrics"]
    assert metrics["accuracy"] == pytest.approx(np.mean(predictions == labels), abs=1e-6)
    assert metrics["f1"] == pytest.approx(f1, abs=1e-6)
    assert metrics["matthews"] == pytest.approx(matthews(predictions, labels), abs=1e-5)


@pytest.mark.parametrize("task", ["builtin_order", "builtin_next"])
def test_classification_writes_metrics_of_its_predictions(tiny_encoder_checkpoint, task):
    result, path = run_eval(tiny_encoder_checkpoint, f"eval={task}")
    assert path == tiny_encoder_checkpoint.parent.parent / "eval" / f"{task}.json"
    assert json.loads(path.read_text()) == result
    assert result["kind"] == ("classification" if task == "builtin_order" else "pair")
    assert len(result["predictions"]) == len(result["references"]) == 32
    assert set(result["predictions"]) <= {0, 1}
    assert_binary_metrics(result)


def test_regression_writes_correlations_of_its_predictions(tiny_encoder_checkpoint, tmp_path):
    result, path = run_eval(tiny_encoder_checkpoint, "eval=builtin_overlap", f"out_dir={tmp_path}")
    assert path == tmp_path / "eval" / "builtin_overlap.json"
    predictions, labels = np.array(result["predictions"]), np.array(result["references"])
    assert len(set(predictions.round(6))) > 1  # one number per example, not a constant
    ranks = [average_ranks(values) for values in (predictions, labels)]
    metrics = result["metrics"]
    assert metrics["pearson"] == pytest.approx(np.corrcoef(predictions, labels)[0, 1], abs=1e-5)
    assert metrics["spearman"] == pytest.approx(np.corrcoef(*ranks)[0, 1], abs=1e-5)
    assert metrics["mse"] == pytest.approx(np.mean((predictions - labels) ** 2), abs=1e-6)


def test_bad_setting_is_one_line_naming_the_key(tiny_encoder_checkpoint):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain.cli.evaluate",
            f"encoder.path={tiny_encoder_checkpoint}",
            "eval.layers=first",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("pretrain-eval: eval.layers = 'first'")
