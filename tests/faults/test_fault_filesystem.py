"""Filesystem faults where a run or `prepare` writes, injected on real filesystems: a full
tmpfs, a read-only remount, a directory without write permission, a directory or a file in
the way. Each is one line naming the path and what to do, exit status 2, and what was there
before (a checkpoint, a prepared corpus) is intact."""

import errno
import json
import os
import subprocess

import pytest
import torch
from fault_helpers import (
    SCRIPTS,
    fill,
    immutable,
    quota_limited,
    quota_used,
    remount_read_only,
    script_env,
    set_quota,
    tmpfs,
    unprivileged,
)
from test_train import tiny_overrides

from data_pipelines.cli import main as data_main
from pretrain.config import compose_config
from pretrain.errors import filesystem_error
from pretrain.runtime.run import run_or_exit


def one_error_line(stderr: str) -> str:
    """The only line of `stderr` that reports an error; no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "error: " in line]
    assert len(lines) == 1, stderr
    return lines[0]


def exits_2(cfg, capsys) -> str:
    """Run `cfg` in this process; expects exit status 2, returns its one error line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_or_exit(cfg)
    assert stopped.value.code == 2
    return one_error_line(capsys.readouterr().err)


def step_of(path) -> int:
    return torch.load(path, weights_only=True, map_location="cpu")["global_step"]


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (errno.ENOSPC, "no space left on device"),
        (errno.EDQUOT, "disk quota exceeded"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
        (errno.EISDIR, "a directory is in the way"),
        (errno.ENOTDIR, "a file is in the way"),
    ],
)
def test_every_filesystem_fault_is_one_line_naming_the_path(code, says):
    cause = OSError(code, os.strerror(code), "/data/run/x.ckpt")
    wrapped = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")
    wrapped.__context__ = cause  # as torch.save reports a failed write
    fault = filesystem_error(wrapped, "saving the checkpoint", "run it again")
    message = str(fault)
    assert (
        message.startswith(f"/data/run/x.ckpt: {says}")
        and " while saving the checkpoint; " in message
    )
    assert "\n" not in message and message.endswith("then run it again")
    assert filesystem_error(RuntimeError("a bug"), "x", "y") is None


def test_a_full_disk_while_saving_a_checkpoint(prepared_corpus, tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "64m") as disk:
        run_dir = disk / "run"
        base = (
            "trainer.checkpoint_every_n_steps=2",
            "trainer.keep_checkpoints=1",
            "optim.schedule_steps=8",
        )
        run_or_exit(
            compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=2", *base))
        )
        last = run_dir / "checkpoints" / "last.ckpt"
        assert step_of(last) == 2
        fill(disk, leave_bytes=64 << 10)  # a checkpoint is some MB
        cfg = compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=4", *base))
        line = exits_2(cfg, capsys)
        assert "no space left on device while saving the checkpoint" in line
        assert str(run_dir / "checkpoints") in line
        assert step_of(last) == 2  # the previous checkpoint intact
        assert not list((run_dir / "checkpoints").glob("*.partial"))


def test_a_quota_exceeded_while_saving_a_checkpoint(prepared_corpus, tmp_path, capsys):
    with quota_limited(tmp_path / "quota", "256m") as volume:
        run_dir = volume / "run"
        base = ("trainer.checkpoint_every_n_steps=2", "optim.schedule_steps=8")
        run_or_exit(
            compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=2", *base))
        )
        last = run_dir / "checkpoints" / "last.ckpt"
        before = last.read_bytes()
        set_quota(volume, quota_used(volume) + (256 << 10))  # logs fit, a checkpoint does not
        cfg = compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=4", *base))
        line = exits_2(cfg, capsys)
        assert "disk quota exceeded while saving the checkpoint" in line
        assert str(run_dir / "checkpoints") in line
        assert last.read_bytes() == before  # the previous checkpoint intact
        assert not list((run_dir / "checkpoints").glob("*.partial"))


def test_an_immutable_checkpoint_directory(prepared_corpus, tmp_path, capsys):
    """EPERM: nothing can be created in a directory flagged immutable, by root either."""
    run_dir = tmp_path / "run"
    steps = ("trainer.checkpoint_every_n_steps=2", "optim.schedule_steps=8")
    run_or_exit(
        compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=2", *steps))
    )
    checkpoints = run_dir / "checkpoints"
    before = (checkpoints / "last.ckpt").read_bytes()
    cfg = compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=4", *steps))
    with immutable(checkpoints):
        line = exits_2(cfg, capsys)
    assert "operation not permitted" in line and str(checkpoints) in line
    assert (checkpoints / "last.ckpt").read_bytes() == before


def test_a_run_directory_on_a_read_only_file_system(prepared_corpus, tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "64m") as disk:
        run_dir = disk / "run"
        steps = "optim.schedule_steps=8"
        run_or_exit(
            compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=2", steps))
        )
        last = run_dir / "checkpoints" / "last.ckpt"
        before = last.read_bytes()
        remount_read_only(disk)
        cfg = compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=4", steps))
        line = exits_2(cfg, capsys)
        assert "read-only file system" in line and str(run_dir) in line
        assert last.read_bytes() == before


def test_a_new_run_directory_on_a_read_only_file_system(prepared_corpus, tmp_path):
    """Hydra creates the run directory before the run starts: its error is one line too."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        remount_read_only(disk)
        run_dir = disk / "run"
        done = subprocess.run(
            [str(SCRIPTS / "pretrain"), *tiny_overrides(prepared_corpus, run_dir)],
            capture_output=True,
            text=True,
            env=script_env(),
            cwd=tmp_path,
            timeout=300,
        )
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert line.startswith(f"error: {run_dir}: read-only file system while creating the run")


def test_a_directory_where_the_checkpoint_file_goes(prepared_corpus, tmp_path, capsys):
    """A directory named last.ckpt (a ZeRO checkpoint, or anything else) under a strategy that
    saves files is refused before training, not met at the next save."""
    run_dir = tmp_path / "run"
    zero_dir = run_dir / "checkpoints" / "last.ckpt"
    (zero_dir / "global_step2").mkdir(parents=True)
    line = exits_2(
        compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=2")), capsys
    )
    assert line.startswith(f"error: {zero_dir}: a directory, where strategy.name=auto saves a file")
    assert zero_dir.is_dir()


def test_a_file_where_the_checkpoint_directory_goes(prepared_corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("in the way\n")
    line = exits_2(
        compose_config(tiny_overrides(prepared_corpus, run_dir, "trainer.max_steps=2")), capsys
    )
    assert str(run_dir / "checkpoints") in line and "in the way" in line
    assert (run_dir / "checkpoints").read_text() == "in the way\n"


def prepare_args(out_dir, *extra) -> list[str]:
    return ["prepare", "inputs=[builtin]", f"out_dir={out_dir}", "docs_per_shard=64", *extra]


def test_prepare_into_a_read_only_directory_keeps_the_old_corpus(tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "16m") as disk:
        out_dir = disk / "corpus"
        assert data_main(prepare_args(out_dir)) == 0
        manifest = (out_dir / "manifest.json").read_text()
        remount_read_only(disk)
        capsys.readouterr()
        assert data_main(prepare_args(out_dir, "overwrite=true")) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"pretrain-data prepare: error: {disk}/.corpus.partial: read-only")
        assert (out_dir / "manifest.json").read_text() == manifest
        assert json.loads(manifest)["shards"]


def test_prepare_into_a_full_disk(tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "300k") as disk:
        capsys.readouterr()
        assert data_main(prepare_args(disk / "corpus")) == 2
        line = one_error_line(capsys.readouterr().err)
        assert "no space left on device while running pretrain-data prepare" in line
        assert not any(disk.iterdir())  # nothing half-written left behind


def test_prepare_over_its_quota(tmp_path, capsys):
    with quota_limited(tmp_path / "quota", "300k") as volume:
        capsys.readouterr()
        assert data_main(prepare_args(volume / "corpus")) == 2
        line = one_error_line(capsys.readouterr().err)
        assert "disk quota exceeded while running pretrain-data prepare" in line
        assert str(volume) in line
        assert not any(volume.iterdir())  # nothing half-written left behind


def test_prepare_into_an_immutable_directory(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    with immutable(tmp_path / "out"):
        capsys.readouterr()
        assert data_main(prepare_args(tmp_path / "out" / "corpus")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"pretrain-data prepare: error: {tmp_path}/out/.corpus.partial: op")
    assert "operation not permitted" in line and not any((tmp_path / "out").iterdir())


def test_prepare_under_a_file(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file\n")
    assert data_main(prepare_args(tmp_path / "taken" / "corpus")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(tmp_path / "taken") in line and "a file is in the way" in line


def test_prepare_without_write_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    command = [str(SCRIPTS / "pretrain-data"), *prepare_args(locked / "corpus")]
    done = subprocess.run(
        unprivileged(command), capture_output=True, text=True, env=script_env(), timeout=300
    )
    locked.chmod(0o755)
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert line.startswith(
        f"pretrain-data prepare: error: {locked}/.corpus.partial: permission denied"
    )
    assert not any(locked.iterdir())
