"""apex.normalization.fused_layer_norm's `fused_layer_norm_affine` (tests only): as apex does on
CUDA, under autocast it casts input, weight and bias to the autocast dtype and normalizes in
that dtype (apex's `_cast_if_autocast_enabled`, then autocast off), unlike torch's LayerNorm,
which CUDA autocast keeps in fp32."""

import torch
import torch.nn.functional as F


def fused_layer_norm_affine(
    input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False
):
    """apex's signature; the kernel is F.layer_norm in the (autocast-cast) input dtype."""
    device = input.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        input, weight, bias = (t.to(dtype) for t in (input, weight, bias))
    with torch.autocast(device, enabled=False):
        return F.layer_norm(input, normalized_shape, weight, bias, eps)
