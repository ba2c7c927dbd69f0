"""End to end: tiny training runs, checkpoints, resume equal to an uninterrupted run."""

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import cpu_run_overrides

from pretrain.config import compose_config
from pretrain.runtime.run import prepare_run, train


def tiny_overrides(shards_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    """`cpu_run_overrides` with a 5-step warmup to lr 1e-3, then `extra`."""
    return cpu_run_overrides(
        shards_dir, run_dir, "optim.warmup_steps=5", "optim.optimizer.lr=1e-3", *extra
    )


def step_losses(run_dir: Path) -> dict[int, float]:
    """train/loss per step from every CSV version of a run."""
    losses = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("train/loss"):
                    losses[int(row["step"])] = float(row["train/loss"])
    return losses


@pytest.mark.slow
def test_tiny_run_trains_checkpoints_and_loads_weights_only(prepared_corpus, tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_config(
        tiny_overrides(
            prepared_corpus,
            run_dir,
            "trainer.max_steps=30",
            "trainer.checkpoint_every_n_steps=10",
            "trainer.log_every_n_steps=1",
            "trainer.peak_tflops=0.5",
        )
    )
    train(cfg)
    losses = step_losses(run_dir)
    assert sorted(losses) == list(range(30))
    first, last = sum(losses[s] for s in range(3)) / 3, sum(losses[s] for s in range(27, 30)) / 3
    assert last < first - 0.5, (first, last)
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    for column in (
        "train/mlm_loss",
        "train/mlm_accuracy",
        "train/nsp_loss",
        "train/nsp_accuracy",
        "train/lr",
        "train/tokens_per_s",
        "sys/host_memory_gb",  # PSS (or RSS) of the main process and its workers, GiB
        "sys/host_memory_main_gb",
        "sys/host_anon_memory_gb",  # PSS of its anonymous and shared-memory pages
    ):
        assert any(row.get(column) for row in rows), column
    module = prepare_run(cfg)[1]
    parameters = sum(p.numel() for p in module.parameters() if p.requires_grad)
    for row in (r for r in rows if r.get("train/mfu")):  # the FLOP model's, over the peak
        flops = float(row["train/model_tflops"])
        per_token = flops * 1e12 / float(row["train/tokens_per_s"])
        assert 0 < per_token < 6 * parameters  # no look-up FLOPs, the MLM head on 15%
        assert float(row["train/mfu"]) == pytest.approx(flops / 0.5, rel=1e-5)
    memory = [float(r["sys/host_memory_gb"]) for r in rows if r.get("sys/host_memory_gb")]
    assert 0.05 < min(memory) and max(memory) < 64, memory
    # read at the first log step, then at most every MEMORY_EVERY_N_STEPS (50): once in 30
    # steps, so one value (Lightning repeats a key's last value on the later rows)
    assert len(set(memory)) == 1 and rows[0].get("sys/host_memory_gb"), memory
    lrs = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
    assert lrs[0] < lrs[4] and lrs[-1] < lrs[5]  # warm-up over 5 steps, then linear decay
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step-0000020.ckpt", "step-0000030.ckpt"]  # keep_checkpoints=2
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 30
    assert checkpoint["config"]["model"]["name"] == "bert_tiny"
    assert type(checkpoint["config"]) is dict and type(checkpoint["config"]["data"]) is dict
    assert checkpoint["config"]["model_runtime"]["vocab_size"] > 100
    assert any(k.startswith("objective.encoder.") for k in checkpoint["state_dict"])


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_gives_the_losses_of_an_uninterrupted_run(prepared_corpus, tmp_path, workers):
    common = (
        "trainer.max_steps=16",
        "trainer.checkpoint_every_n_steps=7",
        "trainer.log_every_n_steps=1",
        "trainer.keep_checkpoints=5",
        f"data.num_workers={workers}",
    )
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    train(compose_config(tiny_overrides(prepared_corpus, full_dir, *common)))
    full = step_losses(full_dir)
    with open(next(full_dir.glob("csv/version_*/metrics.csv"))) as f:
        counted = [float(r["sys/workers"]) for r in csv.DictReader(f) if r.get("sys/workers")]
    assert counted and min(counted) >= workers, counted  # the data-loader workers are counted
    # The interrupted run: what the uninterrupted one had on disk after step 7, then resume=auto.
    (resumed_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(
        full_dir / "checkpoints" / "step-0000007.ckpt", resumed_dir / "checkpoints" / "last.ckpt"
    )
    train(compose_config(tiny_overrides(prepared_corpus, resumed_dir, *common)))
    resumed = step_losses(resumed_dir)
    assert sorted(resumed) == list(range(7, 16))
    for step in resumed:
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step
    a = torch.load(full_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(resumed_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_pretrain_console_script_saves_config_in_run_dir(prepared_corpus, tmp_path):
    run_dir = tmp_path / "cli-run"
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "pretrain"),
            *tiny_overrides(
                prepared_corpus, run_dir, "trainer.max_steps=3", "trainer.log_every_n_steps=1"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mlm loss:" in result.stdout
    assert "; input shapes: batch 8 x sequence 8..64 step 8 x predictions " in result.stdout
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_sweep_points_get_their_own_run_directories(prepared_corpus, tmp_path):
    """`pretrain -m` with the default run_name: each point trains in its own directory (named
    by its overrides), so no point resumes another's checkpoint."""
    overrides = [o for o in tiny_overrides(prepared_corpus, tmp_path) if "run_dir" not in o]
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "pretrain"),
            "-m",
            *overrides,
            f"run_dir={tmp_path}/runs/${{run_name}}",
            f"hydra.sweep.dir={tmp_path}/sweep",
            "trainer.max_steps=2",
            "optim.optimizer.lr=1e-3,2e-3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming" not in result.stdout
    runs = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 and runs[0] != runs[1], runs
    assert all("optim.optimizer.lr=" in name for name in runs), runs
    for name in runs:
        assert (tmp_path / "runs" / name / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_bf16_accumulation_and_clipping(prepared_corpus, tmp_path):
    run_dir = tmp_path / "bf16"
    train(
        compose_config(
            tiny_overrides(
                prepared_corpus,
                run_dir,
                "trainer.max_steps=4",
                "trainer.precision=bf16-mixed",
                "trainer.accumulate_grad_batches=3",
                "trainer.gradient_clip_val=0.5",
                "trainer.log_every_n_steps=1",
            )
        )
    )
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 4  # optimizer steps
    assert checkpoint["PretrainingDataModule"]["samples"] == 12 * 8  # micro-batches x 8 read
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())
    assert (
        checkpoint["state_dict"]["objective.encoder.embeddings.word_embeddings.weight"].dtype
        == torch.float32
    )


@pytest.mark.slow
def test_wandb_logs_offline_without_an_api_key(prepared_corpus, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "wandb-run"
    overrides = tiny_overrides(
        prepared_corpus, run_dir, "trainer.max_steps=2", "experiment_name=cmp"
    )
    overrides[overrides.index("logger=csv")] = "logger=wandb"
    train(compose_config(overrides))
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    assert (run_dir / "csv").is_dir()  # CSV always


def test_the_last_step_is_logged_and_in_the_summary(prepared_corpus, tmp_path, capsys):
    """A run whose max_steps is no multiple of trainer.log_every_n_steps still writes its last
    step's metrics row (after all of its micro-batches) and prints that step's loss (the step
    line and the summary)."""
    run_dir = tmp_path / "run"
    overrides = ("trainer.max_steps=7", "trainer.log_every_n_steps=5")
    cfg = compose_config(
        tiny_overrides(prepared_corpus, run_dir, *overrides, "trainer.accumulate_grad_batches=2")
    )
    train(cfg)
    assert sorted(step_losses(run_dir)) == [4, 6]  # Lightning's rows count steps from 0
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as f:
        samples = [float(row["train/samples_seen"]) for row in csv.DictReader(f)]
    assert samples == [5 * 2 * 8, 7 * 2 * 8]  # steps of 2 micro-batches of 8
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("step 7/7 (100%), loss ") for line in lines), lines
    assert any(line.startswith("mlm loss:") and line.endswith("at step 6") for line in lines)


def test_a_warmup_over_most_of_the_run_is_warned_about_at_start(prepared_corpus, tmp_path, capsys):
    """One stderr line naming the key (`pretrain.runtime.schedule.first_phase_warnings`)."""
    run_dir = tmp_path / "run"
    train(compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=2")))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert warnings == [
        "warning: optim.warmup_steps=5: the learning-rate warm-up takes 5 of the run's 2 "
        "optimizer steps (trainer.max_steps) (the rate never reaches its peak); lower "
        "optim.warmup_steps or raise trainer.max_steps"
    ]
