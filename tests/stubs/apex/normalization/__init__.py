"""apex.normalization.FusedLayerNorm with apex's signature; forward is F.layer_norm, which
apex itself falls back to for a tensor not on CUDA."""

import numbers

import torch
import torch.nn.functional as F
from torch.nn import Parameter, init


class FusedLayerNorm(torch.nn.Module):
    """apex's FusedLayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True,
    memory_efficient=False)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = torch.Size(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        if self.elementwise_affine:
            self.weight = Parameter(torch.empty(*normalized_shape))
            self.bias = Parameter(torch.empty(*normalized_shape))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.elementwise_affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
