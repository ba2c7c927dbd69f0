"""A real Hydra multirun (`pretrain -m`, the basic launcher: every point in one process) of 3
tiny points with wandb offline: each point is its own wandb run (id from its run directory,
one group, job_type the objective) with held-out curves, `pretrain-compare` draws the 3 runs
in one report, and a resumed point continues the same wandb run id. The
offline `.wandb` files are read back record by record (LevelDB log blocks of protobuf
`Record`s, each chunk's checksum checked: the format `wandb sync` uploads), complete as soon
as a launch has returned, and `wandb sync --dry-run <run dir>/wandb` selects every launch's
file of a run directory (no server here to upload to)."""

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2

from pretrain.config import compose_config
from pretrain.eval.compare import write_report
from pretrain.runtime.run import train
from pretrain.runtime.trainer import wandb_run_id

POINT_OVERRIDES = [
    "trainer=cpu",
    "model=bert_tiny",
    "data.max_seq_length=64",
    "data.batch_size=4",
    "data.shuffle_buffer_documents=50",
    "trainer.enable_progress_bar=false",
    "trainer.max_steps=2",
    "logger=wandb",
    "data.holdout_shards=1",
    "trainer.val_check_interval=1",
    "trainer.val_batches=2",
    "trainer.log_every_n_steps=1",
    "trainer.peak_tflops=1",  # the report draws MFU
]
LEARNING_RATES = ("1e-4", "2e-4", "3e-4")


def wandb_records(path: Path) -> list:
    """The protobuf records of a `.wandb` file: a 7-byte header (`:W&B`, magic, version),
    then 32 KiB blocks of chunks (crc32 of type and data, length, type: 1 full, 2 first,
    3 middle, 4 last)."""
    data, block, pos, pending, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        left = block - pos % block
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # block trailer
            pos += left
            continue
        assert zlib.crc32(data[pos + 6 : pos + 7 + length]) == crc, (path, pos)
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def complete_wandb_file(directory: Path) -> Path:
    """The `.wandb` file of an offline run directory, checked complete: its last record is
    the `exit` one (the launch returned only after wandb-core closed the file)."""
    (path,) = directory.glob("*.wandb")
    assert wandb_records(path)[-1].WhichOneof("record_type") == "exit", path
    return path


def offline_runs(run_dir: Path) -> list[dict]:
    """For each offline wandb run under `run_dir` (oldest first): its run record's fields
    and the keys of its config and summary updates."""
    found = []
    for directory in sorted((run_dir / "wandb").glob("offline-run-*")):
        path = complete_wandb_file(directory)
        info = {"config": set(), "summary": {}}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = record.run
                info.update(
                    id=run.run_id,
                    group=run.run_group,
                    job_type=run.job_type,
                    tags=list(run.tags),
                    name=run.display_name,
                )
            elif kind == "config":
                info["config"] |= {item.key for item in record.config.update}
            elif kind == "summary":
                info["summary"].update(
                    {item.key: item.value_json for item in record.summary.update}
                )
        found.append(info)
    return found


@pytest.mark.slow
def test_sweep_points_are_separate_wandb_runs_and_resume_keeps_the_id(
    prepared_corpus, tmp_path, monkeypatch
):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    # launched by a process that used wandb (a test runner, a notebook): its service's
    # address is inherited (here one that has exited); each point still gets its own service
    env.update(
        WANDB_MODE="offline",
        OMP_NUM_THREADS="1",
        WANDB_SERVICE="3-1-unix-/nonexistent/wandb-service/socket",
    )
    command = [
        sys.executable,
        "-m",
        "pretrain.cli.train",
        "-m",
        f"data.shards_dir={prepared_corpus}",
        "experiment_name=sweep",
        "run_name=lr${optim.optimizer.lr}",  # short: all overrides would pass 255 characters
        *POINT_OVERRIDES,
        f"optim.optimizer.lr={','.join(LEARNING_RATES)}",
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dirs = sorted(p.parent for p in (tmp_path / "runs" / "sweep").glob("*/.hydra"))
    assert len(run_dirs) == 3
    runs = {run_dir: offline_runs(run_dir) for run_dir in run_dirs}
    assert all(len(found) == 1 for found in runs.values())  # one wandb run per point
    ids = {found[0]["id"] for found in runs.values()}
    assert ids == {wandb_run_id(run_dir) for run_dir in run_dirs} and len(ids) == 3
    for run_dir, (info,) in runs.items():
        assert info["group"] == "sweep" and info["job_type"] == "mlm_nsp"
        assert info["tags"] == ["bert_tiny", "mlm_nsp", "segment_pair"]
        assert info["name"] == run_dir.name
        assert {"model", "objective", "optim", "trainer"} <= info["config"]
        assert info["summary"]["trainer/global_step"] == "2"
        assert "train/mlm_loss" in info["summary"] and "val/mlm_accuracy" in info["summary"]

    result = subprocess.run(
        [sys.executable, "-m", "pretrain.eval.compare", str(tmp_path / "runs" / "sweep")],
        env=env,
        capture_output=True,
        text=True,
    )
    report = tmp_path / "runs" / "sweep" / "report"
    assert result.stdout.strip() == f"Report of 3 runs: {report / 'report.html'}"
    _, drawn = write_report(run_dirs, tmp_path / "report")
    for name, panels in drawn.items():
        assert (report / name).is_file()
        for panel, labels in panels.items():  # held-out loss too: one line per point
            assert labels == [run_dir.name for run_dir in run_dirs], (name, panel)

    # resume one point two steps further: the same wandb run id, a second offline run dir
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    point = run_dirs[1]
    lr = next(rate for rate in LEARNING_RATES if point.name == f"lr{float(rate)}")
    overrides = [o for o in POINT_OVERRIDES if not o.startswith("trainer.max_steps")]
    train(
        compose_config(
            [
                f"data.shards_dir={prepared_corpus}",
                "experiment_name=sweep",
                f"run_dir='{point}'",  # quoted: the name holds = and ,
                *overrides,
                f"optim.optimizer.lr={lr}",
                "trainer.max_steps=4",
                "optim.extend=rewarm",  # past the end of the first launch's linear decay
            ]
        )
    )
    first, resumed = offline_runs(point)
    assert resumed["id"] == first["id"] == wandb_run_id(point)
    assert resumed["summary"]["trainer/global_step"] == "4"

    # `wandb sync <run dir>/wandb` (README) would upload both launches of the point (wandb's
    # own command, run in this process: no server here to upload to)
    from click.testing import CliRunner
    from wandb.cli.cli import cli as wandb_cli

    result = CliRunner().invoke(wandb_cli, ["sync", "--dry-run", str(point / "wandb")])
    assert result.exit_code == 0 and "Would sync 2 run(s):" in result.output, result.output
    listed = {
        Path(line.split(maxsplit=1)[1]).resolve()  # relative to the working directory
        for line in result.output.splitlines()
        if line.endswith(".wandb")
    }
    assert listed == {path.resolve() for path in point.glob("wandb/offline-run-*/*.wandb")}
