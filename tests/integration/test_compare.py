"""pretrain-compare from CSV logs alone: runs found in an experiment directory, a resumed
run's launches merged, one line per run in every figure, the differing config keys as the
table's first columns, a self-contained HTML page. (With real training runs:
tests/integration/test_sweep_wandb.py.)"""

import csv
import subprocess
import sys
from pathlib import Path

import yaml

from pretrain.eval.compare import (
    FIGURES,
    LOSS_FIGURES,
    find_runs,
    read_metrics,
    write_report,
    x_values,
)


def write_run(run_dir: Path, lr: float, launches: list[list[dict]]) -> None:
    """A run directory as training leaves it: one csv/version_N per launch, with hparams."""
    for version, rows in enumerate(launches):
        folder = run_dir / "csv" / f"version_{version}"
        folder.mkdir(parents=True)
        config = {"run_dir": str(run_dir), "optim": {"optimizer": {"lr": lr}}, "seed": 1}
        (folder / "hparams.yaml").write_text(yaml.safe_dump(config))
        columns = sorted({key for row in rows for key in row})
        with open(folder / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, ["epoch", "step", *columns])
            writer.writeheader()
            writer.writerows(rows)


def training_rows(lr: float, steps: range) -> list[dict]:
    rows = []
    for step in steps:
        loss = 8 - lr * 1e3 * step
        rows.append({"epoch": 0, "step": step, "train/loss": loss, "train/lr": lr})
        rows.append({"epoch": 0, "step": step, "train/tokens_per_s": 200.0})
        mfu = {"train/model_tflops": 1.2e-6, "train/mfu": 2.4e-6}  # peak_tflops=0.5
        rows.append({"epoch": 0, "step": step, **mfu})
        rows.append({"epoch": 0, "step": step, "train/skipped_steps": 0.0})
        rows.append({"epoch": 0, "step": step, "train/tokens_seen": 100 * (step + 1)})
        rows.append({"epoch": 0, "step": step, "train/elapsed_s": 0.5 * (step + 1)})
        if (step + 1) % 2 == 0:
            rows.append({"step": step + 1, "val/loss": 9 - lr * 1e3 * step})
    return rows


def test_report_has_one_line_per_run_and_the_differing_config_keys(tmp_path):
    experiment = tmp_path / "runs" / "sweep"
    rates = (1e-4, 3e-4, 1e-3)
    for lr in rates:  # the second launch of each run resumes at step 4
        write_run(
            experiment / f"lr{lr}",
            lr,
            [training_rows(lr, range(4)), training_rows(lr, range(4, 8))],
        )
    runs = find_runs([experiment])
    assert [run.name for run in runs] == ["lr0.0001", "lr0.0003", "lr0.001"]  # numbers by value
    assert sorted(read_metrics(runs[0])["train/loss"]) == list(range(8))  # both launches
    metrics = read_metrics(runs[0])
    # a training row's tokens count its batch; a held-out row's step counts the steps taken
    assert x_values(metrics, "train/tokens_seen", [1], after=1) == [200.0]
    assert x_values(metrics, "train/tokens_seen", [2, 8], after=0) == [200.0, 800.0]
    html_path, drawn = write_report(runs, tmp_path / "report")
    assert set(drawn) == set(FIGURES)
    for name, panels in drawn.items():
        assert (tmp_path / "report" / name).stat().st_size > 1000
        for panel, labels in panels.items():
            assert labels == [run.name for run in runs], (name, panel)
    with open(tmp_path / "report" / "summary.csv") as f:
        header, *rows = list(csv.reader(f))
    # losses first, then progress, then the differing config keys (run_dir names the run)
    assert header[:4] == ["run", "status", "train/loss", "val/loss"]
    assert header[-1] == "optim.optimizer.lr" and "seed" not in header
    assert [row[1] for row in rows] == ["unknown"] * 3  # no run_state.json, no max_steps
    assert [row[header.index("step")] for row in rows] == ["8"] * 3
    assert [row[header.index("train/tokens_seen")] for row in rows] == ["800"] * 3
    assert [row[header.index("train/mfu")] for row in rows] == ["2.4e-06"] * 3
    page = html_path.read_text()
    assert page.count("data:image/png;base64,") == len(FIGURES)  # self-contained
    assert 'src="http' not in page and "optim.optimizer.lr" in page


def test_cli_starts_without_plotting_libraries_and_names_an_empty_directory(tmp_path):
    code = (
        "import sys; from pretrain.eval import compare; "
        "assert 'matplotlib' not in sys.modules and 'numpy' not in sys.modules; "
        "compare.main([sys.argv[1]])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"error: no run directory (one with csv/) in {tmp_path}"
    )


def loss_run(run_dir: Path, objective: str, losses: dict[str, float], config: dict) -> None:
    """A one-launch run of `objective` that logged `losses` at steps 0-3."""
    folder = run_dir / "csv" / "version_0"
    folder.mkdir(parents=True)
    full = {"objective": {"_target_": objective}, **config}
    (folder / "hparams.yaml").write_text(yaml.safe_dump(full))
    with open(folder / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["epoch", "step", *losses])
        writer.writeheader()
        writer.writerows({"epoch": 0, "step": s, **losses} for s in range(4))


def test_losses_of_different_objectives_get_their_own_axes_and_runs_their_state(tmp_path):
    from pretrain.eval.compare import loss_panels, read_config, summary_table
    from pretrain.runtime.run_state import write_run_state

    both = {"train/loss": 9.0, "train/mlm_loss": 8.0, "train/nsp_loss": 1.0}
    training = {"trainer": {"max_steps": 10, "log_every_n_steps": 5}, "data": {"num_workers": 2}}
    loss_run(tmp_path / "bert", "MaskedLanguageModel/nsp", both, training)
    other = {"trainer": {"max_steps": 10, "log_every_n_steps": 1}, "data": {"num_workers": 0}}
    loss_run(
        tmp_path / "roberta",
        "MaskedLanguageModel/none",
        {"train/loss": 8.5, "train/mlm_loss": 8.5},
        other,
    )
    write_run_state(tmp_path / "bert", "preempted", 4, 10)
    write_run_state(tmp_path / "roberta", "finished", 10, 10)
    runs = [tmp_path / "bert", tmp_path / "roberta"]
    metrics = [read_metrics(run) for run in runs]
    configs = [read_config(run) for run in runs]
    # an MLM+NSP total beside an MLM-only one compares nothing: no total axis, one per kind
    panels = loss_panels(metrics, [c["objective._target_"] for c in configs])
    assert [column for _, column in panels] == ["train/mlm_loss", "train/nsp_loss"]
    same = loss_panels(metrics, ["MaskedLanguageModel", "MaskedLanguageModel"])
    assert [column for _, column in same][0] == "train/loss"
    # an MLM-only run's total is its MLM loss: one axis, not two with the same line
    alone = loss_panels(metrics[1:], ["MaskedLanguageModel"])
    assert [column for _, column in alone] == ["train/mlm_loss"]
    page, drawn = write_report(runs, tmp_path / "report")
    assert drawn["loss_vs_tokens.png"] == {
        "training mlm loss": ["bert", "roberta"],
        "training nsp loss": ["bert"],
    }
    # figures of columns no run logged (throughput, learning rate) are left out, files too
    assert set(drawn) == set(LOSS_FIGURES)
    assert not (tmp_path / "report" / "lr.png").exists()
    assert page.read_text().count("data:image/png;base64,") == len(LOSS_FIGURES)
    # the differing config key has its own table, after the metrics'
    metrics_table, settings_table = page.read_text().split("<table>")[1:]
    assert "train/<wbr>mlm_loss" in metrics_table and "objective._target_" not in metrics_table
    assert "objective._target_" in settings_table and "mlm_loss" not in settings_table
    with open(tmp_path / "report" / "summary.csv") as f:
        header, *rows = list(csv.reader(f))
    assert [row[1] for row in rows] == ["preempted (step 4 of 10)", "finished"]
    assert header[2:5] == ["train/loss", "train/mlm_loss", "train/nsp_loss"]  # bert's total
    mlm_only = {"train/loss": 2.0, "train/mlm_loss": 2.0, "step": 3.0}  # a total = its term
    assert summary_table(["r"], ["finished"], [{}], [mlm_only])[0][2:] == ["train/mlm_loss", "step"]
    # logging and worker settings differ too, but do not change what is trained
    assert header[-1] == "objective._target_"
    assert "trainer.log_every_n_steps" not in header and "data.num_workers" not in header
    finals = [{"step": 4.0}]
    header, rows, split = summary_table(["x"], ["failed (step 4 of 10)"], [{}], finals)
    assert rows == [["x", "failed (step 4 of 10)", "4"]] and split == len(header)  # no config keys
