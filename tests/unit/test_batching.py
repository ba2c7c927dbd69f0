"""Global batch size -> accumulation, learning-rate scaling and warm-up units, and the configs
that use them (optimizers, strategies, sweeps) composed and checked by their own parsers."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from pretrain.batching import (
    batch_plan,
    count_devices,
    learning_rate,
    lr_scale,
    warmup_steps,
)
from pretrain.config import (
    ConfigError,
    DataConfig,
    TrainConfig,
    TrainerConfig,
    compose_config,
    run_config,
    validate,
)


def plain(*overrides: str) -> dict:
    cfg = compose_config(list(overrides))
    validate(cfg)
    return OmegaConf.to_container(cfg, resolve=True)


def typed(config: dict) -> TrainConfig:
    """The validated run object of a plain config, with its batch plan."""
    return run_config(config)


@pytest.mark.parametrize(
    ("global_batch", "micro", "ranks", "accumulation"),
    [(256, 32, 1, 8), (256, 32, 2, 4), (256, 32, 8, 1), (8192, 32, 16, 16), (96, 4, 3, 8)],
)
def test_accumulation_is_derived_for_any_number_of_ranks(global_batch, micro, ranks, accumulation):
    plan = batch_plan(
        DataConfig(batch_size=micro, global_batch_size=global_batch),
        TrainerConfig(accelerator="cpu", devices=ranks),
    )
    assert plan.accumulate_grad_batches == accumulation
    assert plan.micro_batch_size * plan.accumulate_grad_batches * plan.world_size == global_batch


def test_ranks_count_devices_times_nodes():
    plan = batch_plan(
        DataConfig(batch_size=8, global_batch_size=256),
        TrainerConfig(accelerator="cpu", num_nodes=4, devices=2),
    )
    assert (plan.world_size, plan.accumulate_grad_batches) == (8, 4)
    assert count_devices([0, 1, 3]) == 3
    assert count_devices("0,1") == 2
    assert count_devices("4") == 4
    assert count_devices("auto", "cpu") == 1


def test_null_global_batch_is_the_product_of_todays_keys():
    run = typed(plain("data.batch_size=16", "trainer.accumulate_grad_batches=3"))
    plan = batch_plan(run.data, run.trainer, ranks=2)
    assert (plan.global_batch_size, plan.accumulate_grad_batches) == (96, 3)


def test_indivisible_global_batch_names_the_key_at_composition():
    with pytest.raises(ConfigError, match=r"data\.global_batch_size = 100.*multiple of.*96 or 128"):
        plain("data.batch_size=32", "data.global_batch_size=100")
    with pytest.raises(
        ConfigError, match="data.global_batch_size = 256.*accumulate_grad_batches = 3"
    ):
        plain(
            "data.batch_size=32", "data.global_batch_size=256", "trainer.accumulate_grad_batches=3"
        )
    with pytest.raises(ConfigError, match="optim.lr_scaling"):
        plain("optim.lr_scaling=cubic")


def test_lr_scaling_rules():
    assert lr_scale("none", 2048, 256) == 1.0
    assert lr_scale("linear", 2048, 256) == 8.0
    assert lr_scale("sqrt", 2048, 256) == pytest.approx(math.sqrt(8))
    config = plain(
        "data.batch_size=32",
        "data.global_batch_size=1024",
        "optim.lr_scaling=linear",
        "optim.reference_batch_size=256",
        "optim.optimizer.lr=1e-4",
    )
    run = typed(config)
    assert learning_rate(run.optim, run.batch_plan) == pytest.approx(4e-4)


def test_warmup_in_samples_covers_the_same_data_at_any_batch():
    steps = {}
    for global_batch in (256, 2048, 8192):
        config = plain(
            "data.batch_size=32",
            f"data.global_batch_size={global_batch}",
            "optim.warmup_samples=2560000",
        )
        run = typed(config)
        steps[global_batch] = warmup_steps(run.optim, run.batch_plan)
    assert steps == {256: 10000, 2048: 1250, 8192: 313}
    run = typed(plain("optim.warmup_steps=7"))
    assert warmup_steps(run.optim, run.batch_plan) == 7


def test_module_uses_scaled_lr_and_derived_warmup():
    from pretrain.objectives.base import Objective
    from pretrain.runtime.task import PretrainingTask

    config = plain(
        "data.batch_size=8",
        "data.global_batch_size=64",
        "optim.lr_scaling=sqrt",
        "optim.reference_batch_size=16",
        "optim.optimizer.lr=1e-3",
        "optim.warmup_samples=640",
        "trainer.max_steps=100",
    )
    objective = Objective(config, vocab=None)
    objective.layer = torch.nn.Linear(4, 4)
    module = PretrainingTask(objective)
    setup = module.configure_optimizers()
    scheduler = setup["lr_scheduler"]["scheduler"]
    peak = 1e-3 * math.sqrt(64 / 16)
    assert scheduler.base_lrs[0] == pytest.approx(peak)
    # warm-up of 640 samples = 10 steps of 64: the first step runs at peak / 10
    assert setup["optimizer"].param_groups[0]["lr"] == pytest.approx(peak / 10)


@pytest.mark.parametrize("optim", ["adamw", "roberta_adam", "lamb"])
def test_optimizer_configs_build(optim):
    config = plain(f"optim={optim}")
    from hydra.utils import instantiate

    params = [torch.nn.Parameter(torch.ones(3, 3))]
    optimizer = instantiate(config["optim"]["optimizer"])(params)
    params[0].grad = torch.ones(3, 3)
    optimizer.step()
    assert not torch.equal(params[0].detach(), torch.ones(3, 3))
    if optim == "lamb":
        assert type(optimizer).__name__ == "Lamb"
        assert config["optim"]["optimizer"]["lr"] == 0.00176
    if optim == "roberta_adam":
        assert optimizer.defaults["betas"] == (0.9, 0.98)
        assert config["optim"]["warmup_steps"] == 24000


@pytest.mark.parametrize(
    ("sweep", "points"),
    [
        (
            "roberta_batch_size",
            {
                "roberta_bs256": (256, 1_000_000, 1e-4),
                "roberta_bs2k": (2048, 125_000, 7e-4),
                "roberta_bs8k": (8192, 31_250, 1e-3),
            },
        ),
        (
            "roberta_batch_size_tiny",
            {"tiny_bs8": (8, 160, 5e-4), "tiny_bs32": (32, 40, 2e-3), "tiny_bs64": (64, 20, 3e-3)},
        ),
    ],
)
def test_sweep_points_pair_batch_steps_and_lr_with_equal_samples(sweep, points):
    from hydra import compose, initialize_config_dir

    from pretrain.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"+sweep={sweep}"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params["+sweep_point"] == ",".join(points)
    samples, run_dirs, groups = set(), set(), set()
    for point, (batch, steps, lr) in points.items():
        config = plain(f"+sweep={sweep}", f"+sweep_point={point}")
        plan = typed(config).batch_plan
        assert (plan.global_batch_size, config["trainer"]["max_steps"]) == (batch, steps)
        assert config["optim"]["optimizer"]["lr"] == lr
        samples.add(round(batch * steps, -5))  # RoBERTa's 31K stands for 31.25K
        run_dirs.add(config["run_dir"])
        groups.add(config["logger"]["group"])
    assert len(samples) == 1 and len(run_dirs) == len(points) and len(groups) == 1
