"""The learning-rate schedule is state of the run: saved with the scheduler, followed by a
resumed launch whatever its max_steps, and extended only when asked (`optim.extend`)."""

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from pretrain.batching import warmup_steps
from pretrain.config import compose_config, validate
from pretrain.errors import ConfigError
from pretrain.runtime.schedule import (
    LearningRateSchedule,
    extended,
    first_phase_warnings,
    first_segment,
    stored_schedule,
    warmup_then_decay,
)


def run(*overrides: str):
    return validate(compose_config(["data.shards_dir=unused", *overrides]))


def test_one_segment_is_warmup_then_decay():
    for kind in ("linear", "constant"):
        schedule = LearningRateSchedule([first_segment(10, 100, kind)])
        reference = warmup_then_decay(10, 100, kind)
        assert [schedule(s) for s in range(120)] == [reference(s) for s in range(120)]


def test_the_segments_travel_in_the_scheduler_state():
    def scheduler(segments):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        return LambdaLR(optimizer, LearningRateSchedule(segments))

    saved = scheduler([first_segment(2, 10, "linear"), first_segment(3, 30, "linear")])
    state = saved.state_dict()
    resumed = scheduler([first_segment(2, 99, "constant")])  # what a new launch configures
    resumed.load_state_dict(state)
    assert resumed.lr_lambdas[0].segments == saved.lr_lambdas[0].segments


def test_a_decaying_schedule_is_not_extended_silently():
    segments = [first_segment(5, 100, "linear")]
    assert extended(segments, 40, run("trainer.max_steps=100"), 5) == segments
    assert extended(segments, 40, run("trainer.max_steps=60"), 5) == segments  # stops early
    with pytest.raises(ConfigError, match="optim.extend=rewarm") as refused:
        extended(segments, 100, run("trainer.max_steps=200"), 5)
    assert "\n" not in str(refused.value) and "step 100" in str(refused.value)
    constant = [first_segment(5, 100, "constant")]
    assert extended(constant, 100, run("trainer.max_steps=200"), 5) == constant


def test_rewarm_warms_up_again_then_decays_to_the_new_max_steps():
    segments = [first_segment(5, 100, "linear")]
    longer = extended(segments, 100, run("trainer.max_steps=300", "optim.extend=rewarm"), 10)
    assert longer[0] == segments[0]
    assert longer[1] == {"start": 100, "warmup_steps": 10, "end": 300, "kind": "linear"}
    schedule = LearningRateSchedule(longer)
    rates = [schedule(s) for s in range(301)]
    assert rates[99] == pytest.approx(1 / 95) and rates[100] == pytest.approx(0.1)
    assert rates[100:110] == sorted(rates[100:110]) and rates[109] == 1.0  # warm-up
    assert rates[110:] == sorted(rates[110:], reverse=True) and rates[300] == 0.0  # decay
    # steps apart are never more than one warm-up step apart: no jump
    assert max(abs(b - a) for a, b in zip(rates, rates[1:], strict=False)) <= 0.2 + 1e-9


def test_checkpoints_without_a_stored_schedule_ended_at_their_max_steps():
    config = {"optim": {"warmup_steps": 3, "schedule": "linear"}, "trainer": {"max_steps": 50}}
    assert stored_schedule({"config": config}) == [first_segment(3, 50, "linear")]
    assert stored_schedule({"lr_schedule": [first_segment(1, 9, "linear")], "config": config}) == [
        first_segment(1, 9, "linear")
    ]
    assert stored_schedule({}) is None


def test_schedule_steps_and_extend_are_checked_when_composed():
    with pytest.raises(ConfigError, match="optim.extend"):
        run("optim.extend=again")
    with pytest.raises(ConfigError, match="optim.schedule_steps"):
        run("optim.schedule_steps=0")


def warnings_of(*overrides: str) -> list[str]:
    config = run(*overrides)
    return first_phase_warnings(config, warmup_steps(config.optim, config.batch_plan))


def test_a_warmup_over_half_the_run_is_warned_about_naming_its_key():
    (line,) = warnings_of("trainer.max_steps=100")  # optim=adamw: 10,000 warm-up steps
    assert line.startswith("warning: optim.warmup_steps=10000: ") and "\n" not in line
    assert "takes 10000 of the run's 100 optimizer steps" in line
    assert "never reaches its peak" in line and "raise trainer.max_steps" in line
    (line,) = warnings_of("trainer.max_steps=100", "optim.warmup_steps=51")
    assert "takes 51 of the run's 100" in line and "never" not in line
    assert warnings_of("trainer.max_steps=100", "optim.warmup_steps=50") == []  # half: fine
    (line,) = warnings_of(  # in samples: 6,400 / 32 = 200 steps
        "trainer.max_steps=300", "optim.warmup_samples=6400", "data.batch_size=32"
    )
    assert line.startswith("warning: optim.warmup_samples=6400: ") and "takes 200 of" in line


def test_a_first_stage_that_lasts_the_whole_run_is_warned_about():
    # modernbert_demo: 900 steps of 32 rows of 128 tokens, then rows of 512
    assert warnings_of("experiment=modernbert_demo") == []
    warmup, stage = warnings_of("experiment=modernbert_demo", "trainer.max_steps=100")
    assert warmup.startswith("warning: optim.warmup_steps=100: ")
    assert stage.startswith("warning: objective.stages[0].until_tokens=3686400: ")
    assert "about 900 optimizer steps (32 samples of 128 tokens each)" in stage
    assert warnings_of("experiment=modernbert_demo", "trainer.max_steps=901") == []
    (line,) = warnings_of("experiment=modernbert_demo", "trainer.max_steps=900")
    assert line.startswith("warning: objective.stages[0].until_tokens=")


def test_no_experiment_warms_up_over_half_its_run():
    from pretrain.cli.help import config_groups
    from pretrain.paths import CONF_DIR

    for name in config_groups(CONF_DIR)["experiment"]:
        assert warnings_of(f"experiment={name}") == [], name
