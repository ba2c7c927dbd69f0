"""Preemption without SLURM: a signal mid-fit gives one checkpoint at the next optimizer-step
boundary, the run stops as preempted (not finished: exit status 75), and resuming from it ends
with the uninterrupted run's weights. Signals during start-up are held, data-loader workers
ignore them."""

import csv
import multiprocessing
import os
import signal
import subprocess
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from test_train import step_losses, tiny_overrides

import pretrain.runtime.trainer
from pretrain.cluster import signals as job_signals
from pretrain.cluster.preemption import (
    PREEMPTED_EXIT_STATUS,
    Preempted,
    PreemptionCheckpoint,
    requeue_slurm_job,
    slurm_job_id,
)
from pretrain.cluster.signals import parse_signal
from pretrain.config import ConfigError, compose_config
from pretrain.data.worker_processes import worker_context
from pretrain.runtime.run import run_or_exit, train

MAX_STEPS = 8
COMMON = (
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.checkpoint_every_n_steps=100",  # no periodic save: only preemption and the end
    "trainer.log_every_n_steps=1",
    "trainer.keep_checkpoints=5",
)


class SignalAtStep(Callback):
    """Sends this process `signum` in the middle of the optimizer step `step` (after its
    forward pass, before the optimizer updates), as a scheduler would at any moment."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_before_optimizer_step(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(prepared_corpus, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(compose_config(tiny_overrides(prepared_corpus, run_dir, *COMMON)))
    return run_dir


def test_usr1_saves_at_the_next_step_requeues_and_resume_matches(
    prepared_corpus, tmp_path, monkeypatch, uninterrupted
):
    requeued: list[str] = []
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # read only to requeue (no SLURM_NTASKS)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    preemption = PreemptionCheckpoint("USR1", requeue=lambda job: requeued.append(job) or True)
    monkeypatch.setattr(
        pretrain.runtime.trainer,
        "preemption_callbacks",
        lambda config: [preemption, SignalAtStep(3, signal.SIGUSR1)],
    )
    before = {s: signal.getsignal(s) for s in preemption.signals}
    run_dir = tmp_path / "run"
    cfg = compose_config(tiny_overrides(prepared_corpus, run_dir, *COMMON))
    with pytest.raises(Preempted, match="preempted at step 4 of 8") as stop:
        train(cfg)
    assert stop.value.step == 4 and "requeued" in str(stop.value)

    # The signal came during step index 3; the checkpoint holds the 4 completed steps.
    assert preemption.saved_step == 4
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt"]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 4
    assert checkpoint["optimizer_states"] and checkpoint["lr_schedulers"]
    assert checkpoint["PretrainingDataModule"]["samples"] == 4 * 8  # the stream's position
    assert sorted(step_losses(run_dir)) == list(range(4))  # stopped right after saving
    assert requeued == ["4242"]
    assert {s: signal.getsignal(s) for s in preemption.signals} == before  # handlers restored

    monkeypatch.undo()
    train(cfg)  # resume=auto: the same command again, as the requeued job runs it; finished
    assert sorted(step_losses(run_dir)) == list(range(MAX_STEPS))
    expected, resumed = final_weights(uninterrupted), final_weights(run_dir)
    assert expected.keys() == resumed.keys()
    for key in expected:
        torch.testing.assert_close(resumed[key], expected[key], rtol=0, atol=1e-6)


def test_sigterm_during_accumulation_saves_after_the_optimizer_step_without_requeue(
    prepared_corpus, tmp_path, monkeypatch
):
    requeued: list[str] = []
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    preemption = PreemptionCheckpoint("USR1", requeue=lambda job: requeued.append(job) or True)

    class SignalMidAccumulation(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            if batch_idx == 4:  # first micro-batch of step index 2 (2 micro-batches a step)
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(
        pretrain.runtime.trainer,
        "preemption_callbacks",
        lambda config: [preemption, SignalMidAccumulation()],
    )
    run_dir = tmp_path / "run"
    # rows on log steps (every 5th) and on the step the run stops at (index 2), which the
    # preemption callback decides after the task has logged its own metrics of the step
    overrides = (*COMMON, "trainer.accumulate_grad_batches=2", "trainer.log_every_n_steps=5")
    with pytest.raises(SystemExit) as stop:  # the console script's exit status
        run_or_exit(compose_config(tiny_overrides(prepared_corpus, run_dir, *overrides)))
    assert stop.value.code == PREEMPTED_EXIT_STATUS == 75
    assert preemption.saved_step == 3
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 3
    assert checkpoint["PretrainingDataModule"]["samples"] == 6 * 8  # whole steps only
    (metrics,) = run_dir.glob("csv/version_*/metrics.csv")
    with open(metrics) as f:
        (row,) = [row for row in csv.DictReader(f) if row.get("train/loss")]
    assert row["step"] == "2" and row["train/lr"] and float(row["train/samples_seen"]) == 6 * 8
    assert requeued == []  # SIGTERM: cancelled or preempted by SLURM, never requeued by us


def test_a_signal_during_start_up_is_held_and_saves_at_the_first_step(
    prepared_corpus, tmp_path, monkeypatch
):
    before = {s: signal.getsignal(s) for s in job_signals.PREEMPTION_SIGNALS}
    try:
        job_signals.hold_preemption_signals()  # what the entry point does first
        os.kill(os.getpid(), signal.SIGTERM)  # while torch loads, the config is composed...
        assert job_signals.take_held() == [signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGTERM)
        run_dir = tmp_path / "run"
        with pytest.raises(Preempted, match="preempted at step 1 of 8"):
            train(compose_config(tiny_overrides(prepared_corpus, run_dir, *COMMON)))
        assert torch.load(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 1
        assert job_signals.take_held() == []
        # a USR2 the run does not handle gets its default action back (ends the process)
        job_signals.hold_preemption_signals()
        PreemptionCheckpoint("USR1")._take_held_signals(dict.fromkeys([signal.SIGTERM]))
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    finally:
        job_signals.take_held()
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_sigterm_while_the_first_loader_starts_saves_at_the_first_step(
    prepared_corpus, tmp_path, monkeypatch
):
    """A SIGTERM after Lightning installed its handler and before the training loop took the
    signals back (here: as the first epoch's loader is built, whose workers a forkserver
    starts): saved at the first step and Preempted, not Lightning's exit with status 0."""
    from pretrain.data.datamodule import PretrainingDataModule

    build = PretrainingDataModule.train_dataloader

    def signalled(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return build(self)

    monkeypatch.setattr(PretrainingDataModule, "train_dataloader", signalled)
    run_dir = tmp_path / "run"
    with pytest.raises(Preempted, match="preempted at step 1 of 8"):
        train(compose_config(tiny_overrides(prepared_corpus, run_dir, *COMMON)))
    assert torch.load(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 1


def test_a_stop_at_the_last_step_is_a_finished_run():
    callback = PreemptionCheckpoint("USR1")
    callback.saved_step = 8

    class Trainer:
        max_steps = 8
        is_global_zero = True

    callback.raise_if_preempted(Trainer())  # finished: no Preempted
    Trainer.max_steps = 9
    with pytest.raises(Preempted, match="step 8 of 9.*run the same command again") as stop:
        callback.raise_if_preempted(Trainer())
    assert stop.value.report  # rank 0 says what happened, in one line for the whole job
    Trainer.is_global_zero = False
    with pytest.raises(Preempted) as stop:
        callback.raise_if_preempted(Trainer())
    assert not stop.value.report


def _worker(ready, ping) -> None:
    job_signals.ignore_in_data_worker(0)
    ready.put(True)
    while True:
        ready.put(ping.get())  # answers each ping from its main thread


def pending_signals(pid: int) -> int:
    """Bit mask (bit n-1 for signal n) of the signals pending for process `pid` (its shared
    and its main thread's, /proc/<pid>/status)."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)


@pytest.mark.parametrize("start", ["fork", "run's"])
def test_data_loader_workers_ignore_the_job_signals_but_not_their_main_process(start):
    # the run's: forked by the forkserver (`worker_processes`), whose parent is not this one
    context = multiprocessing.get_context("fork") if start == "fork" else worker_context(1)
    ready, ping = context.Queue(), context.Queue()
    worker = context.Process(target=_worker, args=(ready, ping), daemon=True)
    worker.start()
    # the forkserver imports torch and this module first: minutes on a loaded 2-core machine
    assert ready.get(timeout=180)
    # another sender (SLURM's slurmstepd, scancel, kill -TERM -PGID): ignored
    for name in ("TERM", "USR1", "USR2"):
        subprocess.run(["kill", f"-{name}", str(worker.pid)], check=True)
    # handled, not waited out: the worker's SIGTERM thread has taken the SIGTERM (USR1 and
    # USR2 may stay pending, blocked), and its main thread answers a ping sent after them
    deadline = time.monotonic() + 180
    while worker.is_alive() and pending_signals(worker.pid) & 1 << signal.SIGTERM - 1:
        assert time.monotonic() < deadline, "the worker's SIGTERM thread never took it"
        time.sleep(0.01)
    ping.put("alive")
    assert ready.get(timeout=180) == "alive"
    assert worker.is_alive()
    worker.terminate()  # the main process's own SIGTERM (DataLoader shutdown, exit): ends it
    worker.join(180)
    assert worker.exitcode == 128 + signal.SIGTERM


def test_parse_signal_names_the_key():
    assert parse_signal("USR1") == signal.SIGUSR1
    assert parse_signal("sigusr2") == signal.SIGUSR2
    assert parse_signal("15") == signal.SIGTERM
    with pytest.raises(ConfigError, match="trainer.preemption_signal = 'USR9'"):
        parse_signal("USR9")
    with pytest.raises(ConfigError, match="trainer.preemption_signal"):
        PreemptionCheckpoint("nope")


def test_preemption_signal_is_a_trainer_setting():
    cfg = compose_config(["trainer.preemption_signal=USR2"])
    assert PreemptionCheckpoint(cfg.trainer.preemption_signal).signals == (
        signal.SIGUSR2,
        signal.SIGTERM,
    )
    assert PreemptionCheckpoint(None).signals == (signal.SIGTERM,)


def test_slurm_job_id_of_array_tasks(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert slurm_job_id() == "17"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "16")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert slurm_job_id() == "16_1"


@pytest.mark.parametrize(
    ("script", "accepted"),
    [
        # SLURM cancels the job's steps as it requeues the job: the TERM reaches scontrol too,
        # before it has read SLURM's answer.
        ("kill -TERM $$; sleep 0.2; exit 0", True),
        ("echo 'Invalid job id specified' >&2; exit 1", False),
    ],
)
def test_requeue_takes_slurms_answer_even_when_the_requeue_signals_scontrol(
    script, accepted, tmp_path, monkeypatch, capsys
):
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/bash\n[ \"$1 $2\" = 'requeue 17' ] || exit 2\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert requeue_slurm_job("17") is accepted
    error = capsys.readouterr().err
    assert ("" if accepted else "scontrol requeue 17 failed (exit status 1): Invalid job") in error


def test_a_signal_the_batch_shell_noted_is_held_as_one_from_start_up(monkeypatch):
    """slurm/train.sbatch hands a warning that came before Python over in PRETRAIN_HELD_SIGNAL:
    holding takes it as received (and consumes it); a value that is no signal names the key."""
    previous = {s: signal.getsignal(s) for s in job_signals.PREEMPTION_SIGNALS}
    try:
        job_signals.take_held()
        monkeypatch.setenv(job_signals.HELD_SIGNAL_ENV, "USR1")
        job_signals.hold_preemption_signals()
        assert job_signals.take_held() == [signal.SIGUSR1]
        assert job_signals.HELD_SIGNAL_ENV not in os.environ
        monkeypatch.setenv(job_signals.HELD_SIGNAL_ENV, "USR9")
        with pytest.raises(ConfigError, match="PRETRAIN_HELD_SIGNAL = 'USR9'"):
            job_signals.hold_preemption_signals()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
