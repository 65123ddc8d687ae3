"""Simulated (reference) integer execution: PyTorch modules that compute, in float
arithmetic from :mod:`quarl.quant.primitives`, what ONNX Runtime's integer kernels compute.
Every real mode in :mod:`quarl.quant.modes` is tested against its reference here.

Per Linear layer, a reference is (weights rounded once) x (activations rounded per call):

- dynamic int8: ``x`` rounded to uint8 with its own range (per sample, as the engine runs
  rows one by one), ``W`` to 8 bits per tensor or per output channel;
- block-wise n-bit (``MatMulNBits``): ``W`` rounded per block of inputs (affine), ``x``
  kept in fp32 (weight-only) or rounded to int8 per row and block (integer compute);
- static (QDQ) int8 and the mixed CNN mode: the model's own dequantized weights and
  calibrated input grids (:func:`simulate_qdq`), read back from the built model.

Biases stay fp32. The real kernels accumulate in int32 / fp32 in another order, so the two
agree up to float rounding.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from quarl.quant.primitives import (
    QParams,
    dequantize,
    dynamic_quantize_uint8,
    quantize,
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
        return SimulatedLinear(layer, quantize_dequantize_blocks(layer.weight.detach(), bits, "affine", block_size),
                               act)

    return _replace_linears(network, make, keep)


def _replace_linears(network: nn.Module, make: Callable[[nn.Linear], nn.Module], keep: frozenset[int]) -> nn.Module:
    """A copy with Linear layer ``i`` (counting Linear and Conv2d layers in module order,
    as :func:`quarl.quant.layers.linear_layers` does) replaced by ``make(layer)``."""
    net = copy.deepcopy(network)
    if isinstance(net, nn.Linear):  # the network is one layer: nothing to set it on
        return net.eval() if 0 in keep else make(net).eval()
    layers = [(n, m) for n, m in net.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    for i, (name, layer) in enumerate(layers):
        if isinstance(layer, nn.Linear) and i not in keep:
            parent, _, attr = name.rpartition(".")
            setattr(net.get_submodule(parent) if parent else net, attr, make(layer))
    return net.eval()


class _QDQLayer(nn.Module):
    """A layer between 8-bit grids: its input rounded to the calibrated grid in front of it
    and its output to the grid behind it (QuantizeLinear then DequantizeLinear: saturating,
    round half to even), either absent where the model has none."""

    def __init__(self, layer: nn.Module, inp: QParams | None, out: QParams | None) -> None:
        super().__init__()
        self.layer = layer
        self.inp = inp
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inp is not None:
            x = dequantize(quantize(x, self.inp), self.inp)
        y = self.layer(x)
        return y if self.out is None else dequantize(quantize(y, self.out), self.out)


def simulate_qdq(network: nn.Module, model: bytes, matmul_nbits: Callable[[nn.Linear], nn.Module] | None = None
                 ) -> nn.Module:
    """What a static (QDQ) ONNX model of ``network`` computes, in PyTorch: its weight
    layers (Conv / Gemm / MatMul / MatMulNBits nodes, in graph order = the network's
    Linear and Conv2d layers in order) read back from the model. A layer whose weights come
    through a DequantizeLinear gets those dequantized weights and bias, its input rounded
    to the grid of the DequantizeLinear in front of it and its output to the grid of the
    QuantizeLinear behind it (a fused ReLU is that grid starting at 0). A ``MatMulNBits`` layer is
    ``matmul_nbits(layer)``; any other layer stays fp32 (kept layers). The activation ranges are ONNX Runtime's
    calibrator's, so only the model says them: this is the static modes' reference."""
    import onnx
    from onnx import helper, numpy_helper

    graph = onnx.load_from_string(model).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}

    def dequantized(name: str) -> torch.Tensor | None:
        node = producer.get(name)
        if name in inits:
            return torch.from_numpy(inits[name].astype(np.float32))
        if node is None or node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            return None
        q, scale = inits[node.input[0]].astype(np.float64), inits[node.input[1]].astype(np.float64)
        zero = inits[node.input[2]].astype(np.float64) if len(node.input) > 2 and node.input[2] else 0.0
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
        if np.ndim(scale) == 1 and q.ndim > 1:
            shape = [1] * q.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), np.reshape(zero, shape) if np.ndim(zero) else zero
        return torch.from_numpy(((q - zero) * scale).astype(np.float32))

    def grid(node: onnx.NodeProto | None) -> QParams | None:
        if node is None or node.op_type not in ("QuantizeLinear", "DequantizeLinear") or node.input[0] in inits:
            return None
        zero = inits[node.input[2]]
        info = np.iinfo(zero.dtype)
        return QParams(torch.tensor(float(inits[node.input[1]])), torch.tensor(float(zero)), 8, "affine",
                       int(info.min), int(info.max))

    weight_nodes = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul", "MatMulNBits")]
    net = copy.deepcopy(network).eval()
    layers = [(n, m) for n, m in net.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    if len(layers) != len(weight_nodes):
        raise ValueError(f"the model has {len(weight_nodes)} weight nodes, the network {len(layers)} layers")
    for (name, layer), node in zip(layers, weight_nodes, strict=True):
        if node.op_type == "MatMulNBits":
            if matmul_nbits is None:
                raise ValueError(f"{node.name} is MatMulNBits: pass its simulation")
            assert isinstance(layer, nn.Linear)  # MatMulNBits replaces MatMul nodes: Linear layers
            new: nn.Module = matmul_nbits(layer)
        else:
            weight = dequantized(node.input[1])
            if node.input[1] in inits or weight is None:
                continue  # an fp32 layer (kept): as the network has it
            layer = copy.deepcopy(layer)
            bias = dequantized(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            with torch.no_grad():
                layer.weight.copy_(weight.reshape(layer.weight.shape))
                if bias is not None and layer.bias is not None:
                    layer.bias.copy_(bias.reshape(layer.bias.shape))
            after = next((n for n in graph.node if node.output[0] in n.input and n.op_type == "QuantizeLinear"), None)
            new = _QDQLayer(layer, grid(producer.get(node.input[0])), grid(after))
        parent, _, attr = name.rpartition(".")
        setattr(net.get_submodule(parent) if parent else net, attr, new)
    return net
