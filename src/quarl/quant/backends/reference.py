"""Simulated (reference) int8: PyTorch modules that compute what ONNX Runtime's dynamic
int8 MLP computes, in float arithmetic, from :mod:`quarl.quant.primitives`.

Per Linear layer: ``x`` rounded to uint8 with its own range (per sample, as the engine
runs rows one by one), ``W`` rounded to 8 bits per tensor (uint8 affine or int8
symmetric, as the engine was built), bias in fp32.
The real engine accumulates in int32, so the two agree up to float rounding."""

from __future__ import annotations

import copy

import torch
from torch import nn

from quarl.quant.primitives import dynamic_quantize_uint8, quantize_dequantize


class SimulatedDynamicInt8Linear(nn.Module):
    def __init__(self, layer: nn.Linear, weights: str = "asymmetric") -> None:
        super().__init__()
        scheme = {"asymmetric": "affine", "symmetric": "symmetric"}[weights]
        self.weight = nn.Parameter(quantize_dequantize(layer.weight.detach(), 8, scheme, "tensor"), False)
        self.bias = nn.Parameter(layer.bias.detach().clone(), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = [dynamic_quantize_uint8(r) for r in x.reshape(x.shape[0], -1)]
        xq = torch.stack(rows).reshape(x.shape)
        return nn.functional.linear(xq, self.weight, self.bias)


def simulate_dynamic_int8(network: nn.Module, weights: str = "asymmetric") -> nn.Module:
    """A copy of ``network`` with every Linear replaced by its simulated int8 version."""
    net = copy.deepcopy(network)
    for name, module in list(net.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, SimulatedDynamicInt8Linear(child, weights))
    return net.eval()
