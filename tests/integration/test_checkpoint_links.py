"""Checkpoints that do not stall (issue 54 item 5): `last.ckpt` is a link to the step
checkpoint of its step, not a second write; rotation never removes what it links to; a link
out of the checkpoint directory is refused; `trainer.async_checkpoint`'s writer keeps the
atomic guarantees (SIGKILL inside a background write: the previous checkpoint resumes
exactly) and a preemption waits for it; resume memory-maps the file.

A tiny Lightning module (one Linear layer, each step's batch drawn from the step number) with
the run's own StepCheckpoint, PreemptionCheckpoint and checkpoint IO: this file also runs as a
script (`python test_checkpoint_links.py RUN_DIR MAX_STEPS`) for the kill."""

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from pretrain.checkpoint.atomic import AtomicCheckpointIO
from pretrain.checkpoint.background import BackgroundCheckpointIO
from pretrain.checkpoint.relaunch import check_relaunch, check_zero_ranks
from pretrain.checkpoint.resume import checkpoint_step, find_resume_checkpoint
from pretrain.cluster.preemption import PreemptionCheckpoint
from pretrain.errors import ConfigError
from pretrain.runtime.trainer import StepCheckpoint

WIDTH = 128  # a 64 KiB weight: a checkpoint fills a pipe's buffer


class Steps(IterableDataset):
    def __iter__(self):
        while True:
            yield 0


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(WIDTH, WIDTH)

    def training_step(self, batch, batch_idx):
        generator = torch.Generator().manual_seed(self.trainer.global_step)
        x = torch.randn(4, WIDTH, generator=generator)
        return (self.layer(x) - x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        return DataLoader(Steps(), batch_size=1)


def fit(run_dir: Path, max_steps: int, io=None, callbacks=(), every=2, keep=1, resume=True):
    """Fit Tiny to `max_steps`, saving every `every` steps into run_dir/checkpoints."""
    checkpoints = StepCheckpoint(
        dirpath=str(run_dir / "checkpoints"),
        filename="step-{step:07d}",
        auto_insert_metric_name=False,
        monitor="step",
        mode="max",
        save_top_k=keep,
        save_last=True,
        every_n_train_steps=every,
        enable_version_counter=False,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        callbacks=[checkpoints, *callbacks],
        plugins=[io or AtomicCheckpointIO()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
    )
    ckpt_path = find_resume_checkpoint(run_dir, "auto") if resume else None
    module = Tiny()
    trainer.fit(module, ckpt_path=ckpt_path)
    return module, trainer


class RemovalLog(AtomicCheckpointIO):
    """The run's IO, recording where last.ckpt linked whenever a checkpoint was removed."""

    def __init__(self) -> None:
        super().__init__()
        self.removals: list[tuple[str, str]] = []

    def remove_checkpoint(self, path) -> None:
        last = Path(path).parent / "last.ckpt"
        self.removals.append((Path(path).name, os.readlink(last) if last.is_symlink() else ""))
        super().remove_checkpoint(path)


@pytest.mark.parametrize("io", [RemovalLog, BackgroundCheckpointIO])
def test_last_links_the_step_checkpoint_and_rotation_keeps_its_target(tmp_path, io):
    plugin = io()
    fit(tmp_path, 6, plugin, keep=1)
    directory = tmp_path / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == ["last.ckpt", "step-0000006.ckpt"]
    assert os.readlink(directory / "last.ckpt") == "step-0000006.ckpt"  # not a second write
    assert find_resume_checkpoint(tmp_path, "auto") == str(directory / "last.ckpt")
    assert checkpoint_step(directory / "last.ckpt") == 6
    if isinstance(plugin, RemovalLog):  # each removed only once last.ckpt linked elsewhere
        assert plugin.removals == [
            ("step-0000002.ckpt", "step-0000004.ckpt"),
            ("step-0000004.ckpt", "step-0000006.ckpt"),
        ]


class SignalAtStep(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_before_optimizer_step(self, trainer, *_) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class SlowWriter(BackgroundCheckpointIO):
    """The background writer, each write starting a while after it is queued (a slow disk)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        super().after_writes(lambda: select.select([], [], [], 0.5))
        super().save_checkpoint(checkpoint, path, storage_options)


class LastOnDisk(L.Callback):
    """Records the step stored in last.ckpt right after the preemption callback's save."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.seen = directory, None

    def on_train_batch_end(self, trainer, *_) -> None:
        if trainer.should_stop:
            last = self.directory / "last.ckpt"
            self.seen = checkpoint_step(last) if last.is_file() else None


def test_a_save_of_last_alone_is_written_in_full_and_a_preemption_waits_for_it(tmp_path):
    preemption = PreemptionCheckpoint(None)
    on_disk = LastOnDisk(tmp_path / "checkpoints")
    fit(tmp_path, 8, SlowWriter(), [preemption, SignalAtStep(2), on_disk], every=4)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert preemption.saved_step == 3 and on_disk.seen == 3  # on disk before the stop
    assert not last.is_symlink() and checkpoint_step(last) == 3  # no step-3: the only copy
    module, _ = fit(tmp_path, 8, SlowWriter(), every=4)  # resumes at 3, saves 4 and 8
    assert os.readlink(last) == "step-0000008.ckpt"
    expected, _ = fit(tmp_path / "uninterrupted", 8, every=4)
    torch.testing.assert_close(module.layer.weight, expected.layer.weight, rtol=0, atol=0)


def test_a_link_out_of_the_checkpoint_directory_is_refused(tmp_path):
    fit(tmp_path, 2)
    directory = tmp_path / "checkpoints"
    outside = tmp_path / "elsewhere.ckpt"
    os.replace(directory / "step-0000002.ckpt", outside)
    (directory / "last.ckpt").unlink()
    for target in (outside, Path("..") / outside.name):
        os.symlink(target, directory / "last.ckpt")
        with pytest.raises(ConfigError, match="last.ckpt: a link to .*elsewhere.ckpt, not to"):
            find_resume_checkpoint(tmp_path, "auto")
        (directory / "last.ckpt").unlink()


def test_resume_memory_maps_the_checkpoint(tmp_path):
    fit(tmp_path, 2)
    path = tmp_path / "checkpoints" / "last.ckpt"
    state = AtomicCheckpointIO().load_checkpoint(path)
    address = state["state_dict"]["layer.weight"].data_ptr()
    lines = Path("/proc/self/maps").read_text().splitlines()
    ranges = [line.split()[0].split("-") for line in lines if line.endswith(str(path.resolve()))]
    assert any(int(a, 16) <= address < int(b, 16) for a, b in ranges)  # the file's own pages


def test_a_zero_checkpoint_on_another_number_of_ranks_is_refused_naming_the_conversion(tmp_path):
    zero = tmp_path / "last.ckpt"
    (zero / "global_step4").mkdir(parents=True)
    (zero / "latest").write_text("global_step4")
    saved = {"strategy": {"name": "deepspeed"}, "trainer": {"devices": 2, "num_nodes": 1}}
    check_zero_ranks(saved, saved, str(zero))  # the same ranks
    for devices, nodes in ((1, 1), (2, 2), ([0, 1, 2], 1)):
        now = {**saved, "trainer": {"devices": devices, "num_nodes": nodes}}
        with pytest.raises(ConfigError) as refused:
            check_relaunch(saved, now, str(zero), "force")
        line = str(refused.value)
        assert "\n" not in line and "of 2 data-parallel ranks" in line
        assert f"ds_to_universal --input_folder {zero / 'global_step4'} --output_folder" in line
    ddp = {**saved, "strategy": {"name": "ddp"}}
    check_zero_ranks(ddp, {**ddp, "trainer": {"devices": 1, "num_nodes": 1}}, str(zero))


@pytest.mark.slow
def test_sigkill_inside_a_background_write_resumes_from_the_previous_checkpoint(tmp_path):
    """The step-4 write blocks in a pipe (its `.partial` is a FIFO the test reads 64 KiB
    from), the training thread goes on; SIGKILL. Rotation (keep 1) has not removed step 2
    nor moved last.ckpt: both wait behind the write. The same run again ends as if never
    stopped."""
    directory = tmp_path / "run" / "checkpoints"
    directory.mkdir(parents=True)
    fifo = directory / "step-0000004.ckpt.partial"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    script = [sys.executable, __file__, str(tmp_path / "run"), "6"]
    child = subprocess.Popen(script, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert select.select([reader], [], [], 120)[0], "the step-4 write never started"
        assert len(os.read(reader, 1 << 16)) > 0
        assert os.readlink(directory / "last.ckpt") == "step-0000002.ckpt"
        child.kill()
        child.wait()
    finally:
        os.close(reader)
        child.kill()
    assert not (directory / "step-0000004.ckpt").exists()
    assert find_resume_checkpoint(tmp_path / "run", "auto") == str(directory / "last.ckpt")
    assert checkpoint_step(directory / "last.ckpt") == 2 and not fifo.exists()
    module, _ = fit(tmp_path / "run", 6, BackgroundCheckpointIO())
    expected, _ = fit(tmp_path / "uninterrupted", 6)
    torch.testing.assert_close(module.layer.weight, expected.layer.weight, rtol=0, atol=0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    fit(Path(sys.argv[1]), int(sys.argv[2]), BackgroundCheckpointIO(), resume=False)
