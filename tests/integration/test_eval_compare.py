"""Evaluation results where runs are compared: `pretrain-eval -m` over the checkpoints of two
pretraining runs prints one table, logs each result to its run's wandb group (offline) and
`pretrain-compare` shows the results as columns of its final-metrics table."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pretrain.eval.compare import eval_results, find_runs, write_report
from pretrain.eval.tracking import pretraining_logger, should_log, wandb_metrics

pytest.importorskip("transformers")
SMALL = [
    "eval.task.train_size=32",
    "eval.task.dev_size=16",
    "eval.max_seq_length=32",
    "eval.epochs=1",
    "eval.batch_size=16",
]
GROUP = "pretraining-group-7"


def pretraining_run(run_dir: Path, checkpoint: Path, lr: float, wandb: bool = True) -> Path:
    """A run directory as `pretrain` leaves it: its checkpoint, CSV metrics and the saved
    config (logger settings, one differing key); returns the checkpoint's path."""
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(checkpoint, run_dir / "checkpoints" / "last.ckpt")
    version = run_dir / "csv" / "version_0"
    version.mkdir(parents=True)
    logger = {"wandb": wandb, "project": "pretrain", "group": GROUP, "mode": "offline"}
    config = {"logger": logger, "experiment_name": "exp", "optim": {"lr": lr}}
    (version / "hparams.yaml").write_text(yaml.safe_dump(config))
    rows = [{"epoch": 0, "step": s, "train/loss": 7.0 - s} for s in range(3)]
    with open(version / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["epoch", "step", "train/loss"])
        writer.writeheader()
        writer.writerows(rows)
    return run_dir / "checkpoints" / "last.ckpt"


def test_wandb_follows_the_pretraining_runs_logger(tiny_encoder_checkpoint, tmp_path):
    logged = pretraining_run(tmp_path / "a", tiny_encoder_checkpoint, 1e-3).parent.parent
    plain = pretraining_run(tmp_path / "b", tiny_encoder_checkpoint, 1e-3, wandb=False)
    assert pretraining_logger(logged) == {
        "wandb": True,
        "project": "pretrain",
        "group": GROUP,
        "mode": "offline",
    }
    assert should_log("auto", logged) and not should_log("auto", plain.parent.parent)
    assert should_log("always", plain.parent.parent) and not should_log("never", logged)
    # an export directory (no saved config): group "eval", logged only when asked
    assert pretraining_logger(tmp_path / "export")["group"] == "eval"
    result = {"task": "t", "metrics": {"accuracy": 0.5}}
    assert wandb_metrics(result) == {"eval/t/accuracy": 0.5}


@pytest.mark.slow
def test_sweep_over_two_runs_is_one_table_in_wandb_and_compare(
    tiny_encoder_checkpoint, tmp_path, monkeypatch
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    runs = [tmp_path / "runs" / name for name in ("lr1e-3", "lr3e-3")]
    checkpoints = [
        pretraining_run(run, tiny_encoder_checkpoint, lr)
        for run, lr in zip(runs, (1e-3, 3e-3), strict=True)
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain.cli.evaluate",
            "-m",
            f"encoder.path={checkpoints[0]},{checkpoints[1]}",
            "eval=builtin_order",
            "result_name=builtin_order",  # one per run directory: no sweep suffix needed
            *SMALL,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((run / "eval" / "builtin_order.json").read_text()) for run in runs]
    # one table of both points, their accuracies in it
    table = done.stdout[done.stdout.index("2 results:") :].splitlines()[1:]
    assert table[0].startswith("| result | task | encoder | init | mode | accuracy |")
    rows = [line for line in table[2:] if line.startswith("| builtin_order |")]
    assert [row.split(" | ")[2] for row in rows] == [str(c) for c in checkpoints]
    for row, result in zip(rows, results, strict=True):
        assert f"| {result['metrics']['accuracy']:.4g} |" in row
    # each result is a wandb run (offline) of its pretraining run's group, job_type eval
    for run in runs:
        (offline,) = (run / "wandb").glob("offline-run-*")
        (records,) = offline.glob("*.wandb")
        data = records.read_bytes()
        assert GROUP.encode() in data and b"eval/builtin_order/accuracy" in data
    # pretrain-compare: the results are columns of the final-metrics table
    assert eval_results(runs[0])["eval/builtin_order/accuracy"] == results[0]["metrics"]["accuracy"]
    write_report(find_runs([tmp_path / "runs"]), tmp_path / "report")
    with open(tmp_path / "report" / "summary.csv") as f:
        header, *lines = list(csv.reader(f))
    assert header[:2] == ["run", "status"] and header[-1] == "optim.lr"
    column = header.index("eval/builtin_order/accuracy")
    assert header.index("train/loss") < column < header.index("optim.lr")
    assert [line[column] for line in lines] == [f"{r['metrics']['accuracy']:.4g}" for r in results]
