"""Simulated (reference) integer execution: PyTorch modules that compute, in float
arithmetic from :mod:`quarl.quant.primitives`, what ONNX Runtime's integer kernels compute.
Every real mode in :mod:`quarl.quant.modes` is tested against its reference here.

Per Linear layer, a reference is (weights rounded once) x (activations rounded per call):

- dynamic int8: ``x`` rounded to uint8 with its own range (per sample, as the engine runs
  rows one by one), ``W`` to 8 bits per tensor or per output channel;
- block-wise n-bit (``MatMulNBits``): ``W`` rounded per block of inputs (affine), ``x``
  kept in fp32 (weight-only) or rounded to int8 per row and block (integer compute).

Biases stay fp32. The real kernels accumulate in int32 / fp32 in another order, so the two
agree up to float rounding.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from quarl.quant.primitives import (
    dynamic_quantize_uint8,
    quantize_dequantize,
    quantize_dequantize_blocks,
    quantize_dequantize_int8_blocks,
)

WEIGHT_SCHEMES = {"asymmetric": "affine", "symmetric": "symmetric"}


def _per_row_uint8(x: torch.Tensor) -> torch.Tensor:
    rows = [dynamic_quantize_uint8(r) for r in x.reshape(x.shape[0], -1)]
    return torch.stack(rows).reshape(x.shape)


class SimulatedLinear(nn.Module):
    """``linear(act(x), W_q, b)``: rounded weights, activations rounded per call."""

    def __init__(self, layer: nn.Linear, weight: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, False)
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach().clone(), False)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.act(x), self.weight, self.bias)


def simulate_dynamic_int8(network: nn.Module, weights: str = "asymmetric", per_channel: bool = False,
                          keep: frozenset[int] = frozenset()) -> nn.Module:
    """``network`` with every Linear (but the indices in ``keep``) replaced by what dynamic
    int8 computes."""
    granularity = "channel" if per_channel else "tensor"

    def make(layer: nn.Linear) -> nn.Module:
        w = quantize_dequantize(layer.weight.detach(), 8, WEIGHT_SCHEMES[weights], granularity)
        return SimulatedLinear(layer, w, _per_row_uint8)

    return _replace_linears(network, make, keep)


def simulate_nbits(network: nn.Module, bits: int, block_size: int = 32, compute_int8: bool = False,
                   keep: frozenset[int] = frozenset()) -> nn.Module:
    """``network`` with every Linear (but ``keep``) replaced by what ``MatMulNBits``
    computes (see :func:`quarl.quant.backends.onnxruntime.quantize_nbits`)."""

    def act(x: torch.Tensor) -> torch.Tensor:
        return quantize_dequantize_int8_blocks(x, block_size) if compute_int8 else x

    def make(layer: nn.Linear) -> nn.Module:
        return SimulatedLinear(layer, quantize_dequantize_blocks(layer.weight.detach(), bits, "affine", block_size), act)

    return _replace_linears(network, make, keep)


def _replace_linears(network: nn.Module, make: Callable[[nn.Linear], nn.Module], keep: frozenset[int]) -> nn.Module:
    """A copy with Linear layer ``i`` (counting Linear and Conv2d layers in module order,
    as :func:`quarl.policies.base.linear_layers` does) replaced by ``make(layer)``."""
    net = copy.deepcopy(network)
    if isinstance(net, nn.Linear):  # the network is one layer: nothing to set it on
        return net.eval() if 0 in keep else make(net).eval()
    layers = [(n, m) for n, m in net.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    for i, (name, layer) in enumerate(layers):
        if isinstance(layer, nn.Linear) and i not in keep:
            parent, _, attr = name.rpartition(".")
            setattr(net.get_submodule(parent) if parent else net, attr, make(layer))
    return net.eval()
