"""A non-finite loss or gradient: the optimizer step is skipped (weights, optimizer state and
learning-rate schedule untouched, `train/skipped_steps` counts it) or the run stops with a
clear error, per `trainer.nonfinite`; a non-finite model is never checkpointed.
(Agreement across ranks is tested with 2 processes in test_distributed.py.)"""

import csv

import lightning as L
import pytest
import torch

from pretrain.config import compose_config
from pretrain.runtime.nonfinite import NonFiniteError
from pretrain.runtime.run import prepare_run
from pretrain.runtime.trainer import build_trainer

NAN_STEP = 2


def tiny_config(shards_dir, run_dir, *extra: str):
    return compose_config(
        [
            f"data.shards_dir={shards_dir}",
            f"run_dir={run_dir}",
            "logger=csv",
            "trainer=cpu",
            "model=bert_tiny",
            "data.max_seq_length=32",
            "data.batch_size=4",
            "data.shuffle_buffer_documents=20",
            "trainer.enable_progress_bar=false",
            "trainer.log_every_n_steps=1",
            "trainer.max_steps=4",
            "trainer.checkpoint_every_n_steps=1",
            "optim.warmup_steps=0",
            "optim.optimizer.lr=1e-3",
            *extra,
        ]
    )


class Watch(L.Callback):
    """Parameters, optimizer state size and scheduler step count around every batch, and
    optionally a NaN injected into the loss or into one gradient at NAN_STEP."""

    def __init__(self, inject: str):
        self.inject = inject
        self.before: dict[int, tuple] = {}
        self.after: dict[int, tuple] = {}

    def snapshot(self, trainer, module) -> tuple:
        weights = [p.detach().clone() for p in module.parameters()]
        scheduler = trainer.lr_scheduler_configs[0].scheduler
        moments = sum(len(s) for s in trainer.optimizers[0].state.values())
        return weights, scheduler.last_epoch, moments

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.before[trainer.global_step] = self.snapshot(trainer, module)
        if trainer.global_step == NAN_STEP and self.inject == "loss":
            original = module.training_step

            def nan_loss(*args, **kwargs):
                module.training_step = original
                return original(*args, **kwargs) + float("nan")  # finite gradients, NaN loss

            module.training_step = nan_loss

    def on_after_backward(self, trainer, module):
        if trainer.global_step == NAN_STEP and self.inject == "grad":
            next(module.parameters()).grad[0, 0] = float("inf")  # finite loss, one inf gradient

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.after[trainer.global_step - 1] = self.snapshot(trainer, module)


def fit(cfg, watch: Watch):
    config, module, datamodule = prepare_run(cfg)
    trainer = build_trainer(config, cfg.run_dir)
    trainer.callbacks.append(watch)
    trainer.fit(module, datamodule=datamodule)
    return module


@pytest.mark.parametrize(
    "inject, optimizer",
    [("loss", "foreach"), ("grad", "foreach"), ("grad", "fused")],
)
def test_nonfinite_step_is_skipped_and_counted(prepared_corpus, tmp_path, inject, optimizer):
    # fused: the step is skipped on the device (found_inf) and counted at the log step
    extra = ["+optim.optimizer.fused=true"] if optimizer == "fused" else []
    watch = Watch(inject)
    module = fit(tiny_config(prepared_corpus, tmp_path / "run", *extra), watch)
    assert bool(module.optimizers().optimizer.defaults["fused"]) == (optimizer == "fused")
    (w0, lr_steps0, m0), (w1, lr_steps1, m1) = watch.before[NAN_STEP], watch.after[NAN_STEP]
    assert all(torch.equal(a, b) for a, b in zip(w0, w1, strict=True))  # weights untouched
    assert (lr_steps1, m1) == (lr_steps0, m0) == (NAN_STEP, m0)  # schedule did not advance
    (v0, lr_a, _), (v1, lr_b, _) = watch.before[NAN_STEP + 1], watch.after[NAN_STEP + 1]
    assert not all(torch.equal(a, b) for a, b in zip(v0, v1, strict=True))  # training goes on
    assert lr_b == lr_a + 1 == NAN_STEP + 1
    assert module.skipped_steps == 1
    rows = list(csv.DictReader(open(next((tmp_path / "run").glob("csv/version_0/metrics.csv")))))
    skipped = {
        int(r["step"]): float(r["train/skipped_steps"])
        for r in rows
        if r.get("train/skipped_steps")
    }
    assert skipped[NAN_STEP - 1] == 0 and skipped[NAN_STEP] == 1 and skipped[NAN_STEP + 1] == 1
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["skipped_steps"] == 1
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())


def test_nonfinite_stop_raises_a_clear_error_and_saves_nothing_after(prepared_corpus, tmp_path):
    cfg = tiny_config(prepared_corpus, tmp_path / "run", "trainer.nonfinite=stop")
    with pytest.raises(
        NonFiniteError, match=f"step {NAN_STEP}: non-finite.*trainer.nonfinite=stop"
    ):
        fit(cfg, Watch("loss"))
    steps = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*.ckpt"))
    assert steps[-1] == f"step-{NAN_STEP:07d}.ckpt"  # the last applied step, nothing later


def test_a_nonfinite_model_is_never_checkpointed(prepared_corpus, tmp_path):
    config, module, _ = prepare_run(tiny_config(prepared_corpus, tmp_path / "run"))
    with torch.no_grad():
        next(module.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="refusing to write a checkpoint"):
        module.on_save_checkpoint({})


def test_a_diverged_run_stops_with_status_3_and_a_warning(prepared_corpus, tmp_path, capsys):
    """optim.optimizer.lr=1e6: after the first steps every step is non-finite; the run stops
    once trainer.max_consecutive_skipped_steps were skipped in a row (exit 3, one line), the
    skips were reported, and no checkpoint follows the divergence."""
    from pretrain.runtime.run import run_or_exit

    run_dir = tmp_path / "run"
    cfg = tiny_config(
        prepared_corpus,
        run_dir,
        "optim.optimizer.lr=1e6",
        "trainer.max_steps=20",
        "trainer.checkpoint_every_n_steps=100",
        "trainer.max_consecutive_skipped_steps=3",
    )
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(cfg)
    assert stopped.value.code == 3
    captured = capsys.readouterr()
    error = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "3 optimizer steps in a row skipped" in error[0]
    assert "trainer.max_consecutive_skipped_steps=3" in error[0]
    warnings = [line for line in captured.out.splitlines() if "optimizer step skipped" in line]
    assert len(warnings) == 1  # rate-limited: one line per 30 s
    assert not list((run_dir / "checkpoints").glob("*.ckpt"))


def test_the_total_skip_budget_stops_the_run(prepared_corpus, tmp_path):
    """One skipped step is within a budget of 2 (the nan test above) and exhausts a budget
    of 1: the run stops at that step, and no checkpoint follows the last applied step."""
    cfg = tiny_config(prepared_corpus, tmp_path / "run", "trainer.max_skipped_steps=1")
    with pytest.raises(
        NonFiniteError,
        match=f"step {NAN_STEP}: 1 optimizer steps skipped.*trainer.max_skipped_steps=1",
    ):
        fit(cfg, Watch("loss"))
    steps = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*.ckpt"))
    assert steps[-1] == f"step-{NAN_STEP:07d}.ckpt"


def test_the_skip_bound_is_validated():
    from pretrain.config import validate
    from pretrain.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.max_consecutive_skipped_steps = 0"):
        validate(compose_config(["trainer.max_consecutive_skipped_steps=0"]))
    with pytest.raises(ConfigError, match="trainer.max_skipped_steps = 0"):
        validate(compose_config(["trainer.max_skipped_steps=0"]))
