"""Kernel selection (`pretrain.runtime.kernels`, issue 14 item 3): optim.impl and
model.layer_norm_impl pick apex's fused kernels where apex and CUDA are there, torch's
otherwise; asking for apex where it cannot run is an error naming the key."""

import sys
import types

import pytest
import torch

from pretrain.config import compose_config, validate
from pretrain.errors import ConfigError, RunEnvironmentError
from pretrain.runtime import kernels
from pretrain.runtime.kernels import optimizer_settings, use_layer_norm_impl

ADAMW = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-4, "weight_decay": 0.01}
LAMB = {**ADAMW, "_target_": "pytorch_optimizer.Lamb"}
CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # only the device's type is read

needs_no_apex = pytest.mark.skipif(
    kernels.apex_extension_available("amp_C"), reason="apex is installed on this machine"
)


@needs_no_apex
def test_without_apex_auto_is_torch_fused_on_cuda() -> None:
    settings, line = optimizer_settings(ADAMW, "auto", CPU)
    assert settings == ADAMW and line == "optimizer: torch.optim.AdamW (torch)"
    settings, line = optimizer_settings(ADAMW, "auto", CUDA)
    assert settings["fused"] is True and line == "optimizer: torch.optim.AdamW (fused) (torch)"
    settings, _ = optimizer_settings(LAMB, "torch", CUDA)
    assert "fused" not in settings  # pytorch-optimizer's Lamb has no fused flag
    assert use_layer_norm_impl(torch.nn.LayerNorm(4), "auto", CUDA).endswith("(torch)")


@needs_no_apex
@pytest.mark.parametrize("device", [CPU, CUDA])
def test_apex_asked_for_but_absent_names_the_key(device: torch.device) -> None:
    with pytest.raises(ConfigError, match="optim.impl=apex: apex .* not installed"):
        optimizer_settings(ADAMW, "apex", device)
    with pytest.raises(ConfigError, match="model.layer_norm_impl=apex: apex .* not installed"):
        use_layer_norm_impl(torch.nn.LayerNorm(4), "apex", device)


def test_apex_selection_and_its_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "apex_extension_available", lambda extension: True)
    settings, line = optimizer_settings(ADAMW, "auto", CUDA)
    assert settings["_target_"] == "apex.optimizers.FusedAdam" and settings["adam_w_mode"]
    assert line == "optimizer: apex.optimizers.FusedAdam (apex, for torch.optim.AdamW)"
    settings, _ = optimizer_settings(LAMB, "apex", CUDA)
    assert settings["_target_"] == "apex.optimizers.FusedLAMB"
    assert settings["max_grad_norm"] == float("inf")  # Lightning clips, as on the torch path
    assert optimizer_settings(ADAMW, "auto", CPU)[0] == ADAMW  # apex kernels are CUDA-only
    assert optimizer_settings(ADAMW, "torch", CUDA)[0]["_target_"] == "torch.optim.AdamW"
    with pytest.raises(ConfigError, match="optim.impl=apex: .* CUDA only"):
        optimizer_settings(ADAMW, "apex", CPU)
    sgd = {**ADAMW, "_target_": "torch.optim.SGD"}
    with pytest.raises(ConfigError, match="optim.impl=apex: apex has no optimizer for"):
        optimizer_settings(sgd, "apex", CUDA)


def test_fused_layer_norm_takes_over_the_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    class FusedLayerNorm(torch.nn.LayerNorm):  # stands in for apex's (CUDA-only) class
        pass

    monkeypatch.setattr(kernels, "apex_extension_available", lambda extension: True)
    monkeypatch.setitem(sys.modules, "apex", types.ModuleType("apex"))
    fake = types.ModuleType("apex.normalization")
    fake.FusedLayerNorm = FusedLayerNorm
    monkeypatch.setitem(sys.modules, "apex.normalization", fake)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4, eps=1e-12))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    norm_weight = model[1].weight
    line = use_layer_norm_impl(model, "auto", CUDA)
    assert line == "layer norm: apex.normalization.FusedLayerNorm (apex, 1 modules)"
    assert type(model[1]) is FusedLayerNorm and model[1].eps == 1e-12
    assert model[1].weight is norm_weight  # the same Parameter: optimizer and names unchanged
    assert {n: p.detach() for n, p in model.named_parameters()}.keys() == before.keys()


def test_the_keys_are_checked_when_composed() -> None:
    run = validate(compose_config(["optim.impl=torch", "model.layer_norm_impl=apex"]))
    assert (run.optim.impl, run.model.layer_norm_impl) == ("torch", "apex")
    with pytest.raises(ConfigError, match="optim.impl"):
        validate(compose_config(["optim.impl=fast"]))
    with pytest.raises(ConfigError, match="model.layer_norm_impl"):
        validate(compose_config(["model.layer_norm_impl=fast"]))


def test_the_gpu_preset_composes_and_stops_clearly_without_a_gpu(tmp_path) -> None:
    run = validate(compose_config(["trainer=gpu"]))
    trainer = run.trainer
    assert (trainer.accelerator, trainer.precision) == ("gpu", "bf16-mixed")
    assert (trainer.tf32, trainer.pin_memory, trainer.compile) == (True, True, False)
    assert run.optim.impl == "auto"  # fused AdamW (torch) or apex's on CUDA
    assert validate(compose_config(["trainer=gpu", "trainer.compile=true"])).trainer.compile
    if not torch.cuda.is_available():
        from pretrain.runtime.trainer import build_trainer

        with pytest.raises(RunEnvironmentError, match="trainer.accelerator=gpu: this machine"):
            build_trainer(run, tmp_path)
