"""optim.schedule=wsd: warm-up, a stable peak, then a linear or 1-sqrt decay to 0 over
optim.decay_fraction of the steps after the warm-up; stored, resumed and re-warmed like the
other schedules; optim=stable_adamw builds pytorch-optimizer's StableAdamW."""

import math

import pytest
import torch
from hydra.utils import instantiate

from pretrain.config import compose_config, validate
from pretrain.errors import ConfigError
from pretrain.runtime.schedule import LearningRateSchedule, extended, first_segment


def run(*overrides: str):
    return validate(compose_config(["data.shards_dir=unused", *overrides]))


def test_wsd_warms_up_holds_then_decays_as_1_sqrt():
    optim = run("optim=stable_adamw", "optim.decay_fraction=0.25").optim
    segment = first_segment(10, 110, "wsd", optim)
    assert segment["decay_steps"] == 25 and segment["decay_shape"] == "1-sqrt"
    schedule = LearningRateSchedule([segment])
    rates = [schedule(step) for step in range(111)]
    assert rates[:10] == [(s + 1) / 10 for s in range(10)]  # warm-up
    assert rates[10:86] == [1.0] * 76  # stable until the last 25 steps
    for step in range(85, 111):
        assert rates[step] == pytest.approx(1 - math.sqrt((step - 85) / 25))
    assert rates[110] == 0.0


def test_wsd_linear_decay_and_rewarm():
    optim = run("optim.schedule=wsd", "optim.decay_shape=linear", "optim.decay_fraction=0.5")
    segment = first_segment(0, 100, "wsd", optim.optim)
    schedule = LearningRateSchedule([segment])
    assert schedule(49) == 1.0 and schedule(75) == pytest.approx(0.5) and schedule(100) == 0.0
    longer = run(
        "optim.schedule=wsd",
        "optim.decay_fraction=0.5",
        "trainer.max_steps=300",
        "optim.extend=rewarm",
    )
    segments = extended([segment], 100, longer, 10)
    assert segments[1]["start"] == 100 and segments[1]["decay_steps"] == 95
    rates = LearningRateSchedule(segments)
    assert rates(104) == pytest.approx(0.5) and rates(150) == 1.0 and rates(300) == 0.0


def test_wsd_settings_are_checked_when_composed():
    with pytest.raises(ConfigError, match="optim.decay_fraction"):
        run("optim.schedule=wsd", "optim.decay_fraction=0")
    with pytest.raises(ConfigError, match="optim.decay_shape"):
        run("optim.schedule=wsd", "optim.decay_shape=cosine")


def test_stable_adamw_is_built_from_the_config_and_steps_like_adam():
    optim = run("optim=stable_adamw").optim
    assert optim.optimizer["_target_"] == "pytorch_optimizer.StableAdamW"
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = instantiate(optim.optimizer, _convert_="all")([weight])
    weight.grad = torch.tensor([1.0, -1.0, 1e-3, 0.0])
    optimizer.step()
    step = (torch.ones(4) - weight.detach()).abs()
    # Adam's first step moves every coordinate with a gradient by about lr
    assert step[:3].max() <= optim.optimizer["lr"] * 1.01 and step[0] > 0.5 * optim.optimizer["lr"]
