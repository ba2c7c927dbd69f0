"""trainer.max_time_s: a wall-clock budget from the process's start ends the run at an
optimizer step boundary as finished (not failed, not preempted), last.ckpt saved at that
step; checked when composed."""

import json

import pytest
import torch
from conftest import cpu_run_overrides

from pretrain.config import TrainerConfig, compose_config
from pretrain.errors import ConfigError
from pretrain.runtime.run import train

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_spent_budget_stops_at_the_next_step_as_finished(prepared_corpus, tmp_path):
    run_dir = tmp_path / "run"
    overrides = ("objective=mlm", "data=full_sentences", "data.num_workers=0")
    budget = ("trainer.max_steps=1000", "trainer.max_time_s=0.001")  # spent before the start
    train(compose_config(cpu_run_overrides(prepared_corpus, run_dir, *overrides, *budget)))
    state = json.loads((run_dir / "run_state.json").read_text())
    assert (state["state"], state["step"]) == ("finished", 1)
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 1


def test_a_budget_must_be_positive():
    with pytest.raises(ConfigError, match=r"^trainer\.max_time_s = 0: must be positive"):
        TrainerConfig(max_time_s=0)
    assert TrainerConfig(max_time_s=None).max_time_s is None
