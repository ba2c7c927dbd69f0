"""Failures a user can cause or meet end in one line naming the file or key, exit status 2
(issue 12 item 5): a full disk while saving, resuming another model size, a checkpoint that
weights_only refuses, a non-numeric or non-finite learning rate, an accelerator the machine
lacks, and `pretrain-data preview` with an objective the data format does not fit."""

import errno
import os
import sys

import pytest
import torch
from test_train import tiny_overrides

from pretrain.checkpoint import atomic
from pretrain.checkpoint.atomic import AtomicCheckpointIO
from pretrain.config import compose_config, validate
from pretrain.data.shard_blocks import ShardError
from pretrain.errors import ConfigError, RunEnvironmentError, report_error
from pretrain.runtime import preview
from pretrain.runtime.run import run_or_exit
from pretrain.runtime.trainer import check_accelerator


def exit_line(capsys, cfg) -> str:
    """Run `cfg`; expects exit status 2 and returns its one error line."""
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(cfg)
    assert stopped.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in errors if line.startswith("error:")]
    assert len(errors) == 1, errors
    return errors[0]


def test_a_full_disk_while_saving_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 1}, path)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(RunEnvironmentError) as refused:
        AtomicCheckpointIO().save_checkpoint({"global_step": 2}, path)
    monkeypatch.undo()
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{path}: no space left on device")
    assert torch.load(path, weights_only=True)["global_step"] == 1  # the previous is intact
    assert not (path.parent / "last.ckpt.partial").exists()


def test_a_full_disk_during_a_run_exits_2(prepared_corpus, tmp_path, monkeypatch, capsys):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    run_dir = tmp_path / "run"
    cfg = compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=1"))
    line = exit_line(capsys, cfg)
    assert "no space left on device" in line and str(run_dir / "checkpoints") in line


def test_resuming_another_model_size_names_the_key_and_shapes(prepared_corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_or_exit(compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=1")))
    capsys.readouterr()
    bigger = tiny_overrides(
        prepared_corpus, run_dir, "trainer.max_steps=1", "model=bert_mini", "resume=force"
    )
    line = exit_line(capsys, compose_config(bigger))
    assert "another model than this run's (model.hidden_size " in line and ".ckpt: " in line
    assert "weight shape(s) differ: objective.encoder." in line


def test_a_checkpoint_weights_only_refuses_exits_2(prepared_corpus, tmp_path, capsys):
    crafted = tmp_path / "crafted.ckpt"
    torch.save({"global_step": 1, "odd": os.stat_result((0,) * 10)}, crafted)
    cfg = compose_config(tiny_overrides(prepared_corpus, tmp_path / "run", f"resume={crafted}"))
    line = exit_line(capsys, cfg)
    assert str(crafted) in line and "refused" in line


@pytest.mark.parametrize("lr", [".nan", ".inf", "fast", "0"])
def test_the_learning_rate_must_be_a_finite_positive_number(lr):
    with pytest.raises(ConfigError, match="optim.optimizer.lr = .*finite positive number"):
        validate(compose_config([f"optim.optimizer.lr={lr}"]))


def test_an_accelerator_the_machine_lacks(prepared_corpus, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RunEnvironmentError, match="trainer.accelerator=gpu"):
        check_accelerator("gpu")
    check_accelerator("cpu")
    check_accelerator("auto")
    cfg = compose_config(
        tiny_overrides(prepared_corpus, tmp_path / "run", "trainer.accelerator=gpu")
    )
    assert "trainer.accelerator=gpu: this machine has no such device" in exit_line(capsys, cfg)


def test_pretrain_verbose_adds_the_traceback(prepared_corpus, tmp_path, capsys, monkeypatch):
    cfg = compose_config(tiny_overrides(prepared_corpus, tmp_path / "run", "data.format=nope"))
    assert "data.format = 'nope'" in exit_line(capsys, cfg)  # no traceback by default
    monkeypatch.setenv("PRETRAIN_VERBOSE", "1")
    with pytest.raises(SystemExit):
        run_or_exit(cfg)
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ConfigError" in err
    assert err.strip().splitlines()[-1].startswith("error: data.format = 'nope'")


def test_preview_with_an_unfit_objective_is_one_line(prepared_corpus, capsys):
    status = preview.main(["objective=span", "n=4", f"data.shards_dir={prepared_corpus}"])
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("pretrain-data preview: error: data.format")
    assert "data=full_sentences" in err


def test_a_killed_data_loader_worker_is_one_line(prepared_corpus, tmp_path):
    """kill -9 of a data-loader worker (as the kernel's OOM killer does) mid-run: exit 2,
    one line saying what died and what to do, the checkpoints written before it intact."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        prepared_corpus,
        run_dir,
        "trainer.max_steps=100000",
        "data.num_workers=2",
        "trainer.checkpoint_every_n_steps=2",
    )
    pretrain = str(Path(sys.executable).parent / "pretrain")
    run = subprocess.Popen([pretrain, *overrides], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240  # a guard against a test that would hang
    while not list((run_dir / "checkpoints").glob("step-*.ckpt")):
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.5)
    # the workers: children of the forkserver the run started (`worker_processes`)
    servers = [
        p for p in psutil.Process(run.pid).children() if any("forkserver" in a for a in p.cmdline())
    ]
    workers = [worker for server in servers for worker in server.children()]
    assert workers, "no data-loader worker found"
    workers[0].kill()
    _, stderr = run.communicate(timeout=240)
    assert run.returncode == 2, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "a data-loader worker died" in errors[0], stderr[-3000:]
    assert "Traceback" not in stderr
    saved = sorted((run_dir / "checkpoints").glob("step-*.ckpt"))[-1]
    assert torch.load(saved, weights_only=True)["global_step"] >= 2


def test_an_error_line_is_one_write(monkeypatch):
    """Ranks and data-loader workers share stderr: each error line goes out in one write with
    its newline, or two ranks' lines printed at once come out joined on one line."""
    writes = []

    class Stream:
        write = writes.append

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    report_error(ShardError("shard-000002.tar: sha256 differs"))
    report_error(ConfigError("optim.lr: not a number"), prog="pretrain")
    assert writes == [
        "error: shard-000002.tar: sha256 differs\n",
        "pretrain: error: optim.lr: not a number\n",
    ]
