"""Each function of `pretrain.lightning_compat` pinned against the Lightning installed: the
private attribute it reads or writes still behaves as the function says. A Lightning upgrade
that changes one fails the test named for that function, in a tiny CPU run of a bare module."""

import inspect
import signal

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from pretrain import lightning_compat as compat


class Tiny(L.LightningModule):
    """A linear layer on 8 random rows; `seen` records what each hook was told."""

    def __init__(self, record=None):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.record = record or (lambda trainer, where, batch_idx: None)
        self.seen: list = []

    def training_step(self, batch, batch_idx):
        self.log("x", float(batch_idx))
        return self.layer(batch).sum()

    def on_train_batch_start(self, batch, batch_idx):
        self.seen.append(("start", batch_idx, self.record(self.trainer, "start", batch_idx)))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(("end", batch_idx, self.record(self.trainer, "end", batch_idx)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(torch.randn(8, 2), batch_size=1)


class Rows(Logger):
    """Records the step of every metrics row Lightning writes."""

    name, version = "rows", 0

    def __init__(self):
        super().__init__()
        self.steps: list[int] = []

    def log_metrics(self, metrics, step=None):
        if "x" in metrics:
            self.steps.append(step)

    def log_hyperparams(self, *args, **kwargs):
        pass


def trainer(tmp_path, **kwargs) -> L.Trainer:
    settings = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    return L.Trainer(**settings | kwargs)


def test_should_accumulate(tmp_path):
    module = Tiny(lambda trainer, where, i: compat.should_accumulate(trainer))
    trainer(tmp_path, accumulate_grad_batches=4).fit(module)
    ends = [flag for where, _, flag in module.seen if where == "end"]
    # True inside an accumulation, False at each step's last micro-batch
    assert ends == [True, True, True, False] * 2


def test_is_log_row(tmp_path):
    rows = Rows()
    module = Tiny(lambda trainer, where, i: (trainer.global_step, compat.is_log_row(trainer)))
    trainer(tmp_path, logger=rows, log_every_n_steps=3, accumulate_grad_batches=2).fit(module)
    # at a step's last micro-batch's end, after the optimizer step: the row Lightning writes
    flagged = [
        step - 1 for where, i, (step, row) in module.seen if where == "end" and i % 2 and row
    ]
    assert flagged == rows.steps == [2]


def test_batches_done_this_epoch(tmp_path):
    module = Tiny(lambda trainer, where, i: compat.batches_done_this_epoch(trainer))
    trainer(tmp_path).fit(module)
    assert [n for where, _, n in module.seen if where == "end"] == list(range(1, 9))


def test_restart_epoch_counters(tmp_path):
    """A run saved at a batch's end resumes with batch_idx 0 when the data module restarts
    the epoch's counters (else Lightning continues the saved batch_idx)."""

    class SaveAt3(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 2:
                trainer.save_checkpoint(tmp_path / "mid.ckpt")
                trainer.should_stop = True

    trainer(tmp_path, callbacks=[SaveAt3()]).fit(Tiny())

    class Restarting(Tiny):
        def train_dataloader(self):
            compat.restart_epoch_counters(self.trainer)
            return super().train_dataloader()

    for module_class, first in ((Tiny, 3), (Restarting, 0)):
        module = module_class()
        trainer(tmp_path, max_steps=5).fit(module, ckpt_path=tmp_path / "mid.ckpt")
        assert module.seen[0][:2] == ("start", first)


def test_clear_lightning_sigterm(tmp_path):
    class Term(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1:
                signal.raise_signal(signal.SIGTERM)  # Lightning's handler records it
                assert trainer.received_sigterm
                compat.clear_lightning_sigterm(trainer)

    fitted = trainer(tmp_path, callbacks=[Term()])
    previous = signal.getsignal(signal.SIGTERM)
    try:
        fitted.fit(Tiny())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not fitted.received_sigterm and fitted.global_step == 8  # the loop went on


def test_skip_sigterm_broadcast(tmp_path):
    """Lightning's epoch loop broadcasts its SIGTERM flag each batch through the method this
    function replaces (with several ranks)."""
    fitted = trainer(tmp_path)
    loop = fitted.fit_loop.epoch_loop
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(type(loop).advance)
    compat.skip_sigterm_broadcast(fitted)
    assert loop._broadcast_sigterm_tensor() is None


def test_save_last_checkpoint(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=100)

    class SaveNow(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 2:
                compat.save_last_checkpoint(trainer, callback)

    trainer(tmp_path, callbacks=[callback, SaveNow()], enable_checkpointing=True).fit(Tiny())
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 3


@pytest.mark.parametrize(
    "given, unified", [("bf16", "bf16-mixed"), (16, "16-mixed"), ("32-true", "32-true")]
)
def test_unified_precision(given, unified):
    assert compat.unified_precision(given) == unified


def test_set_progress_bar():
    from tqdm import tqdm

    bar = tqdm(total=10, disable=False, file=open("/dev/null", "w"))
    compat.set_progress_bar(bar, 7)
    assert bar.n == 7


class Replaced(compat.ReplacesScriptLauncher, DDPStrategy):
    def local_ranks_launcher(self):
        return Started(self.cluster_environment, self.num_processes, self.num_nodes)


class Started(compat.LocalRanksLauncher):
    def start_local_ranks(self):
        self.check_can_start_local_ranks()
        self.procs = ["started"]


def test_local_ranks_launcher():
    """A strategy with the mixin gets the subclass's launcher where Lightning would run the
    command line again, and Lightning's launch starts the ranks through its hook."""
    strategy = Replaced(
        accelerator=L.pytorch.accelerators.CPUAccelerator(),
        parallel_devices=[torch.device("cpu")] * 2,
        cluster_environment=L.fabric.plugins.environments.LightningEnvironment(),
    )
    strategy._configure_launcher()  # Lightning's hook, called as its connector does
    launcher = strategy.launcher
    assert type(launcher) is Started
    assert "self._call_children_scripts()" in inspect.getsource(type(launcher).launch)
    launcher._call_children_scripts()  # as `launch` calls it on rank 0
    assert launcher.procs == ["started"]


def test_attached_trainer(tmp_path):
    module = Tiny()
    assert compat.attached_trainer(module) is None
    fitted = trainer(tmp_path, max_steps=1)
    fitted.fit(module)
    assert compat.attached_trainer(module) is fitted


def test_wandb_run_started(tmp_path):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(offline=True, save_dir=str(tmp_path))
    assert not compat.wandb_run_started(logger)
    # the attribute WandbLogger.experiment fills when it starts (or attaches to) a run
    assert "self._experiment = " in inspect.getsource(type(logger).experiment.fget)
    logger._experiment = object()
    assert compat.wandb_run_started(logger)
    compat.forget_wandb_run(logger)
    assert not compat.wandb_run_started(logger)


def test_summary_table():
    table = compat.summary_table(3, 3, 0.0, {"train": 1, "eval": 0}, [("Name", ["layer"])])
    assert "layer" in table and "Trainable params" in table
    assert "Total Flops" in table.rsplit("\n", 1)[1]  # the line ParameterSummary drops


def test_checkpoint_hooks(tmp_path):
    """Lightning's ModelCheckpoint saves, saves last and rotates through the private hooks
    that CheckpointHooks renames; `save_now` saves top-k and last; `last_saved_step` follows."""
    calls = []

    class Recorded(compat.CheckpointHooks):
        def write_checkpoint(self, trainer, filepath):
            calls.append("write")
            super().write_checkpoint(trainer, filepath)

        def write_last(self, trainer, candidates):
            calls.append("last")
            super().write_last(trainer, candidates)

        def remove_checkpoint_file(self, trainer, filepath):
            calls.append("remove")
            super().remove_checkpoint_file(trainer, filepath)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
            if batch_idx == 0:
                self.save_now(trainer)  # step 1: not a periodic save
                assert self.last_saved_step == 1

    callback = Recorded(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=2)
    trainer(tmp_path, callbacks=[callback], enable_checkpointing=True, max_steps=4).fit(Tiny())
    assert {"write", "last", "remove"} <= set(calls)  # top-1: earlier saves rotated out
    assert callback.last_saved_step == 4


def test_progress_bar_due():
    from lightning.pytorch.callbacks import TQDMProgressBar

    bar = TQDMProgressBar(refresh_rate=5)
    assert [n for n in range(1, 12) if compat.progress_bar_due(bar, n, 11)] == [5, 10, 11]
