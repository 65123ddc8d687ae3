"""Quantization-aware training: fake quantization after the weights and the outputs of
every Linear / Conv2d, with a quantization delay (the paper's algorithm).

Calling loop::

    net = prepare_qat(policy_network, bits=4)       # a copy; observers only
    for step in range(total_steps):
        set_quantization(net, step >= quant_delay)   # TrainNoQuantMonitor... then TrainWithQuantization
        loss(net(x)).backward(); optimizer.step()
    deployable = convert(net)                        # plain modules, frozen ranges

Before the delay the network computes in fp32 while observers record weight ranges
(min / max) and activation ranges (moving average); afterwards weights are fake-quantized
from their current range and outputs from the monitored range (clamped), gradients pass straight
through (:func:`quarl.quant.primitives.fake_quantize`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from quarl.quant.observers import MinMaxObserver, MovingAverageMinMaxObserver
from quarl.quant.primitives import (
    ActivationFakeQuant,
    check_bits,
    fake_quantize,
    qparams,
    qparams_from_range,
    resolve_granularity,
)


class QATLayer(nn.Module):
    """A Linear or Conv2d with fake-quantized weights and output."""

    def __init__(self, layer: nn.Linear | nn.Conv2d, bits: int, scheme: str, granularity: str) -> None:
        super().__init__()
        self.layer = layer
        self.bits = check_bits(bits)
        self.scheme = scheme
        self.granularity = granularity
        self.weight_observer = MinMaxObserver()
        self.output_observer = MovingAverageMinMaxObserver()
        self.quantize = False

    def quantized_weight(self) -> torch.Tensor:
        w = self.layer.weight
        return fake_quantize(w, qparams(w, self.bits, self.scheme, self.granularity))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.layer.weight
        self.weight_observer(w.detach())
        if self.quantize:
            w = self.quantized_weight()
        if isinstance(self.layer, nn.Linear):
            out = nn.functional.linear(x, w, self.layer.bias)
        else:
            out = self.layer._conv_forward(x, w, self.layer.bias)
        if self.training:
            self.output_observer(out.detach())
        if self.quantize and self.output_observer.initialized:
            # clamped to the monitored range, as ActivationFakeQuant does after convert
            qp = qparams_from_range(self.output_observer.min_val, self.output_observer.max_val, self.bits, "affine")
            out = fake_quantize(out, qp)
        return out


def prepare_qat(network: nn.Module, bits: int, scheme: str = "quarl", granularity: str = "auto") -> nn.Module:
    """A copy of ``network`` whose Linear / Conv2d layers are wrapped in :class:`QATLayer`
    (quantization off until :func:`set_quantization`)."""
    return wrap_qat_(copy.deepcopy(network), bits, scheme, granularity)


def wrap_qat_(network: nn.Module, bits: int, scheme: str = "quarl", granularity: str = "auto") -> nn.Module:
    """Wrap ``network``'s Linear / Conv2d layers in place (their parameters stay the same
    objects, so an optimizer built on them keeps working). Already wrapped layers are kept."""
    for module in list(network.modules()):
        if isinstance(module, QATLayer):
            continue
        for name, child in list(module.named_children()):
            if isinstance(child, (nn.Linear, nn.Conv2d)):
                g = resolve_granularity(granularity, child.weight.dim())
                setattr(module, name, QATLayer(child, bits, scheme, g))
    return network


@contextmanager
def plain_layers(network: nn.Module) -> Iterator[None]:
    """Temporarily put the wrapped layers back (state dicts then have the plain names that
    any SB3 or quarl loader expects); the wrappers return on exit."""
    swapped = []
    for module in list(network.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, QATLayer):
                setattr(module, name, child.layer)
                swapped.append((module, name, child))
    try:
        yield
    finally:
        for module, name, child in swapped:
            setattr(module, name, child)


def qat_layers(network: nn.Module) -> list[QATLayer]:
    return [m for m in network.modules() if isinstance(m, QATLayer)]


def set_quantization(network: nn.Module, enabled: bool) -> None:
    """Switch fake quantization on (after the delay) or off (monitoring only)."""
    for layer in qat_layers(network):
        layer.quantize = enabled


def convert(network: nn.Module) -> nn.Module:
    """Plain modules for evaluation and export: each layer's weight replaced by its n-bit
    value, followed by an :class:`ActivationFakeQuant` with the monitored output range."""
    net = copy.deepcopy(network)
    for module in list(net.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, QATLayer):
                layer = child.layer
                with torch.no_grad():
                    layer.weight.copy_(child.quantized_weight())
                obs = child.output_observer
                if not obs.initialized:
                    setattr(module, name, layer)
                    continue
                act = ActivationFakeQuant(float(obs.min_val), float(obs.max_val), child.bits)
                setattr(module, name, nn.Sequential(layer, act))
    return net.eval()
