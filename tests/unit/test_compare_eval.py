"""pretrain-compare shows the downstream results `pretrain-eval` wrote in each run
(`<run>/eval/<name>.json`) as columns of its final-metrics table."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from pretrain.eval.compare import eval_results, write_report


def write_run(run_dir: Path, lr: float, results: dict[str, dict[str, float]]) -> None:
    """A run directory with CSV logs, its config and the given {name: metrics} results."""
    folder = run_dir / "csv" / "version_0"
    folder.mkdir(parents=True)
    (folder / "hparams.yaml").write_text(yaml.safe_dump({"optim": {"lr": lr}}))
    with open(folder / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["epoch", "step", "train/loss", "val/loss"])
        writer.writeheader()
        writer.writerows([{"epoch": 0, "step": s, "train/loss": 5.0 - s} for s in range(3)])
        writer.writerow({"step": 3, "val/loss": 4.5})
    for name, metrics in results.items():
        path = run_dir / "eval" / f"{name}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"task": name, "metrics": metrics}))


def test_eval_results_are_columns_after_the_losses(tmp_path):
    write_run(tmp_path / "a", 1e-3, {"builtin_next": {"accuracy": 0.61234}, "qa": {"f1": 30.5}})
    write_run(tmp_path / "b", 3e-3, {"builtin_next": {"accuracy": 0.5}})
    assert eval_results(tmp_path / "a") == {
        "eval/builtin_next/accuracy": 0.61234,
        "eval/qa/f1": 30.5,
    }
    write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "report")
    with open(tmp_path / "report" / "summary.csv") as f:
        header, *rows = list(csv.reader(f))
    assert header[2:6] == ["train/loss", "val/loss", "eval/builtin_next/accuracy", "eval/qa/f1"]
    assert [row[4:6] for row in rows] == [["0.6123", "30.5"], ["0.5", ""]]  # blank: none
    assert header[-1] == "optim.lr"  # the config keys that differ come last
    assert "eval/<wbr>qa/<wbr>f1" in (tmp_path / "report" / "report.html").read_text()


def test_a_file_that_is_not_a_result_names_itself(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "notes.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match=r"eval/notes.json: not a pretrain-eval result"):
        eval_results(tmp_path)
