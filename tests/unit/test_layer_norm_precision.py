"""model.layer_norm_impl under mixed precision (issue 58 item 8): `auto` keeps torch's LayerNorm,
which autocast keeps in fp32, rather than apex's FusedLayerNorm, which normalizes in the
autocast dtype (BERT's post-LN residual stream would run in bf16). With `tests/stubs/apex`."""

import torch
from omegaconf import OmegaConf

from pretrain.config import compose_config
from pretrain.models.build import build_encoder
from pretrain.runtime.kernels import use_layer_norm_impl
from pretrain.runtime.task import layer_norm_choice

CUDA = torch.device("cuda")  # only the device's type is read


def bert_tiny() -> torch.nn.Module:
    config = OmegaConf.to_container(compose_config(["model=bert_tiny"]).model, resolve=True)
    torch.manual_seed(0)
    return build_encoder(config, 100, 0).eval()


def fused_count(module: torch.nn.Module) -> int:
    return sum(type(m).__name__ == "FusedLayerNorm" for m in module.modules())


def test_auto_keeps_torch_layer_norm_in_fp32_under_bf16_autocast(apex_stub):
    encoder = bert_tiny()
    line = use_layer_norm_impl(encoder, layer_norm_choice("auto", "bf16-mixed"), CUDA)
    assert line == "layer norm: torch.nn.LayerNorm (torch)" and fused_count(encoder) == 0
    ids = torch.randint(5, 100, (2, 8))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert encoder(ids).dtype == torch.float32  # the residual stream stays fp32
    # apex's kernel under autocast (its CUDA path) would normalize in bf16
    from apex.normalization.fused_layer_norm import fused_layer_norm_affine

    norm = next(m for m in encoder.modules() if isinstance(m, torch.nn.LayerNorm))
    features = norm.normalized_shape
    with torch.autocast("cpu", dtype=torch.bfloat16):
        apex_out = fused_layer_norm_affine(
            torch.randn(2, *features), norm.weight, norm.bias, features
        )
    assert apex_out.dtype == torch.bfloat16


def test_apex_layer_norm_where_asked_or_without_autocast(apex_stub):
    assert layer_norm_choice("apex", "bf16-mixed") == "apex"
    encoder = bert_tiny()
    use_layer_norm_impl(encoder, layer_norm_choice("auto", "32-true"), CUDA)
    assert fused_count(encoder) > 0
