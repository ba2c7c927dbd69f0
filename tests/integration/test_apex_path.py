"""The CUDA image's apex path on a CPU (issue 58 items 1-2), with `tests/stubs/apex`: apex's
real signatures (FusedAdam's `zero_grad(self)`, its capturable mode's `grad_scaler`) computing
a plain Adam(W) update. A non-finite step is skipped with apex's optimizer, on the device
where it is capturable; torch's implementation switches never reach apex; optimizer offload
never gets apex's optimizer."""

import pytest
import torch
from hydra.utils import instantiate
from test_nonfinite import NAN_STEP, Watch, fit, tiny_config

from pretrain.config import compose_config, validate
from pretrain.errors import ConfigError
from pretrain.runtime.kernels import optimizer_settings

ADAMW = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, "weight_decay": 0.01}
CUDA = torch.device("cuda")  # only the device's type is read


def strategy(name: str):
    return validate(compose_config([f"strategy={name}"])).strategy


def test_torch_switches_do_not_reach_apex_and_it_skips_on_the_device(apex_stub) -> None:
    settings, line = optimizer_settings({**ADAMW, "fused": True}, "auto", CUDA)
    assert line == "optimizer: apex.optimizers.FusedAdam (apex, for torch.optim.AdamW)"
    assert "fused" not in settings and settings["capturable"] is True
    optimizer = instantiate(settings, _convert_="all")([torch.nn.Parameter(torch.ones(3))])
    assert type(optimizer).__module__ == "apex.optimizers"
    assert optimizer._step_supports_amp_scaling  # so the task skips on the device
    # under DeepSpeed the engine skips (its overflow check): apex's plain FusedAdam
    settings, _ = optimizer_settings(ADAMW, "auto", CUDA, strategy("deepspeed_zero2"))
    assert settings["_target_"] == "apex.optimizers.FusedAdam" and "capturable" not in settings
    settings, _ = optimizer_settings(ADAMW, "auto", CUDA, None, "16-mixed")  # GradScaler skips
    assert settings["_target_"] == "apex.optimizers.FusedAdam" and "capturable" not in settings


@pytest.mark.parametrize("name", ["deepspeed_zero2_offload", "deepspeed_zero3_offload"])
def test_offload_never_gets_apex(apex_stub, name: str) -> None:
    settings, line = optimizer_settings(ADAMW, "auto", CUDA, strategy(name))
    assert not settings["_target_"].startswith("apex.") and "apex" not in line
    assert settings["_target_"] in ("deepspeed.ops.adam.DeepSpeedCPUAdam", "torch.optim.AdamW")
    if settings["_target_"] == "deepspeed.ops.adam.DeepSpeedCPUAdam":
        assert settings["adamw_mode"] is True and "fused" not in settings
    with pytest.raises(ConfigError, match="optim.impl=apex: strategy.offload_optimizer"):
        optimizer_settings(ADAMW, "apex", CUDA, strategy(name))


@pytest.mark.parametrize("capturable", [True, False])
def test_a_nonfinite_step_is_skipped_with_apex(apex_stub, prepared_corpus, tmp_path, capturable):
    """A Lightning run with apex's FusedAdam (as `kernels` builds it on CUDA, capturable; and
    plain): an inf gradient at NAN_STEP skips that step (weights and moments untouched, the
    schedule held back) and training goes on; capturable: decided on the device."""
    cfg = tiny_config(
        prepared_corpus,
        tmp_path / "run",
        "optim.impl=torch",
        "optim.optimizer._target_=apex.optimizers.FusedAdam",
        f"+optim.optimizer.capturable={str(capturable).lower()}",
        "trainer.checkpoint_every_n_steps=100",
    )
    watch = Watch("grad")
    module = fit(cfg, watch)
    optimizer = module.optimizers().optimizer
    assert type(optimizer).__module__ == "apex.optimizers" and optimizer.capturable == capturable
    (w0, lr_steps0, m0), (w1, lr_steps1, m1) = watch.before[NAN_STEP], watch.after[NAN_STEP]
    assert all(torch.equal(a, b) for a, b in zip(w0, w1, strict=True))  # weights untouched
    assert (lr_steps1, m1) == (lr_steps0, m0) == (NAN_STEP, m0)  # schedule did not advance
    (v0, lr_a, _), (v1, lr_b, _) = watch.before[NAN_STEP + 1], watch.after[NAN_STEP + 1]
    assert not all(torch.equal(a, b) for a, b in zip(v0, v1, strict=True))  # training goes on
    assert lr_b == lr_a + 1 == NAN_STEP + 1
    assert module.skipped_steps == 1
    assert all(torch.isfinite(p).all() for p in module.parameters())
    # apex counts applied steps only (a capturable one one step late, on the device)
    step = optimizer.param_groups[0]["step"]
    assert int(step if isinstance(step, int) else step.item()) == 4 - 1
