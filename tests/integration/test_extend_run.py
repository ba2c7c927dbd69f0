"""Extending a finished run is explicit: raising trainer.max_steps past the end of its
decaying schedule is refused with a one-line error naming optim.extend; with
optim.extend=rewarm the learning rate warms up again and decays to the new max_steps, never
jumping (issue 21 item 3)."""

import csv
from pathlib import Path

import pytest
import torch
from test_one_line_errors import exit_line
from test_train import tiny_overrides

from pretrain.config import compose_config
from pretrain.runtime.run import train
from pretrain.runtime.schedule import LearningRateSchedule

COMMON = ("trainer.log_every_n_steps=1", "optim.warmup_steps=2", "optim.schedule=linear")
LR = 1e-3  # tiny_overrides' optim.optimizer.lr


def logged_rates(run_dir: Path) -> dict[int, float]:
    """train/lr by optimizer step, from every CSV version of a run."""
    rates = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("train/lr"):
                    rates[int(row["step"])] = float(row["train/lr"])
    return rates


@pytest.mark.slow
def test_a_decaying_schedule_is_extended_only_when_asked(prepared_corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(compose_config(tiny_overrides(prepared_corpus, run_dir, *COMMON, "trainer.max_steps=4")))
    last = run_dir / "checkpoints" / "last.ckpt"
    saved = last.read_bytes()

    longer = tiny_overrides(prepared_corpus, run_dir, *COMMON, "trainer.max_steps=8")
    line = exit_line(capsys, compose_config(longer))  # exit status 2, one line
    assert line.startswith("error: trainer.max_steps=8: the run's learning rate decays to 0 at")
    assert "optim.extend=rewarm" in line
    assert last.read_bytes() == saved  # nothing trained, nothing written

    train(compose_config([*longer, "optim.extend=rewarm"]))
    segments = torch.load(last, weights_only=True)["lr_schedule"]
    assert segments == [
        {"start": 0, "warmup_steps": 2, "end": 4, "kind": "linear"},
        {"start": 4, "warmup_steps": 2, "end": 8, "kind": "linear"},
    ]
    rates = logged_rates(run_dir)
    want = [LR * factor for factor in (0.5, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.5)]
    assert sorted(rates) == list(range(8))
    assert [rates[step] for step in range(8)] == pytest.approx(want)
    assert [LR * LearningRateSchedule(segments)(s) for s in range(8)] == pytest.approx(want)
