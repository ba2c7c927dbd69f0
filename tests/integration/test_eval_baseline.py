"""`pretrain-eval` says when a classifier learnt nothing: the majority-class baseline is
printed beside the metrics and stored in the result JSON, and a fine-tune that predicts one
class for every dev example warns in one line."""

import json

import pytest
import torch

from pretrain.cli.evaluate import constant_warning, evaluate_encoder, result_line
from pretrain.config import compose_config
from pretrain.eval.config import register_eval_schema
from pretrain.eval.metrics import constant_prediction, majority_baseline

pytest.importorskip("transformers")
register_eval_schema()

WORDS = "the python interpreter reads each line of the file and runs it".split()


def write_task(directory, train_labels: list[str], dev_labels: list[str]) -> None:
    directory.mkdir()
    for name, labels in (("train", train_labels), ("dev", dev_labels)):
        rows = [
            {"text_a": " ".join(WORDS[i % 7 : i % 7 + 5]), "label": label}
            for i, label in enumerate(labels)
        ]
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_fine_tune_that_predicts_one_class_warns_beside_its_baseline(
    tiny_encoder_checkpoint, tmp_path, capsys
):
    task = tmp_path / "task"
    write_task(task, ["neg"] * 16, ["neg", "neg", "neg", "pos"])  # it can only learn "neg"
    cfg = compose_config(
        [
            f"encoder.path={tiny_encoder_checkpoint}",
            "eval=jsonl",
            f"eval.task.path={task}",
            "eval.task.labels=[pos,neg]",
            "eval.mode=features",
            "eval.epochs=3",
            "eval.lr=1e-2",
            "eval.batch_size=8",
            "eval.max_seq_length=16",
            f"out_dir={tmp_path / 'out'}",
        ],
        "evaluate",
    )
    path = evaluate_encoder(cfg)
    result = json.loads(path.read_text())
    assert result["predictions"] == [1, 1, 1, 1]  # "neg" for all
    assert result["baseline"] == {"majority_class": "neg", "majority_accuracy": 0.75}
    assert result["constant_prediction"] == "neg"
    assert result["metrics"]["accuracy"] == 0.75
    captured = capsys.readouterr()
    assert "majority class 'neg': accuracy 0.75" in captured.out
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "'neg'" in warnings[0] and "4 dev examples" in warnings[0]


def test_the_baseline_and_constant_class_at_the_metrics_level():
    names = ("a", "b", "c")
    labels = torch.tensor([0, 2, 2, 1, 2])
    assert majority_baseline(labels, names) == {"majority_class": "c", "majority_accuracy": 0.6}
    assert constant_prediction(torch.tensor([1, 1, 1, 1, 1]), names) == "b"
    assert constant_prediction(torch.tensor([1, 1, 0, 1, 1]), names) is None


def test_a_classifier_that_varies_prints_its_baseline_without_a_warning():
    result = {
        "task": "t",
        "init": "pretrained",
        "encoder": "e",
        "dev_examples": 5,
        "metrics": {"accuracy": 0.8},
        "baseline": {"majority_class": "c", "majority_accuracy": 0.6},
        "constant_prediction": None,
    }
    assert result_line(result).endswith("accuracy 0.8  (majority class 'c': accuracy 0.6)")
    assert constant_warning(result) is None
    assert "predicted 'c'" in constant_warning({**result, "constant_prediction": "c"})
    regression = {k: v for k, v in result.items() if k not in ("baseline", "constant_prediction")}
    assert "majority" not in result_line(regression) and constant_warning(regression) is None
