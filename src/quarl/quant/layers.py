"""The layers quantization acts on: a network's weight layers, found by type."""

from __future__ import annotations

from torch import nn


def linear_layers(network: nn.Module) -> list[tuple[str, nn.Linear | nn.Conv2d]]:
    """The weight layers (Linear, Conv2d) of a network, in order, with their names."""
    layers: list[tuple[str, nn.Linear | nn.Conv2d]] = []
    for name, module in network.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            layers.append((name, module))
    return layers
