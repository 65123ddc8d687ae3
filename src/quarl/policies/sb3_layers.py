"""Layers of an SB3 policy rebuilt from its state dict, slot by slot, so that fp32
outputs match SB3's bit for bit (used by the SB3 loader and by ActorQ's output, which
saves the same Sequential layout)."""

from __future__ import annotations

import re

import torch
from torch import nn

SB3_NAME = "sb3_name"
"""The attribute a rebuilt layer keeps its state-dict name in (:func:`sb3_name`)."""


def sb3_name(layer: nn.Module) -> str | None:
    """The state-dict name a rebuilt layer came from (None for a layer built otherwise)."""
    name = getattr(layer, SB3_NAME, None)
    return name if isinstance(name, str) else None


def set_sb3_name(layer: nn.Module, name: str) -> None:
    """Remember ``name`` on ``layer`` (a plain attribute: not a parameter or buffer)."""
    setattr(layer, SB3_NAME, name)


def linear_from(sd: dict[str, torch.Tensor], name: str) -> nn.Linear:
    """The Linear layer stored under ``name`` in the state dict (with or without a bias);
    it remembers that name (``sb3_name``) so that per-layer state saved by name (QAT
    ranges) finds it again."""
    weight, bias = sd[f"{name}.weight"], sd.get(f"{name}.bias")
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    set_sb3_name(layer, name)
    return layer


class BatchRenormEval(nn.Module):
    """sb3-contrib's BatchRenorm1d in evaluation mode (CrossQ): its running statistics and
    affine transform, computed in the same order so that fp32 outputs match bit for bit."""

    ra_mean: torch.Tensor
    ra_var: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor

    def __init__(self, mean: torch.Tensor, var: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                 eps: float) -> None:
        super().__init__()
        self.register_buffer("ra_mean", mean.clone())
        self.register_buffer("ra_var", var.clone())
        self.register_buffer("scale", scale.clone())
        self.register_buffer("bias", bias.clone())
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.ra_mean[None]) / (self.ra_var[None] + self.eps).sqrt()
        return self.scale * x + self.bias


def mlp_from(
    sd: dict[str, torch.Tensor], prefix: str, activation: type[nn.Module], trailing: bool, eps: float = 1e-3
) -> list[nn.Module]:
    """An SB3 ``create_mlp`` Sequential at ``prefix``, rebuilt slot by slot from the state
    dict: Linear layers (with or without bias), Batch Renorm layers (CrossQ), and
    ``activation`` in every slot without parameters (plus one after the last layer when
    ``trailing``, as SB3's feature MLPs have)."""
    slots: dict[int, str] = {}
    for key, value in sd.items():
        m = re.fullmatch(re.escape(prefix) + r"(\d+)\.(weight|ra_mean)", key)
        if m and (m.group(2) == "ra_mean" or value.dim() == 2):
            slots[int(m.group(1))] = m.group(2)
    layers: list[nn.Module] = []
    for idx in range(max(slots) + 1 if slots else 0):
        name = f"{prefix}{idx}"
        if slots.get(idx) == "weight":
            layers.append(linear_from(sd, name))
        elif slots.get(idx) == "ra_mean":
            layers.append(BatchRenormEval(sd[f"{name}.ra_mean"], sd[f"{name}.ra_var"], sd[f"{name}.scale"],
                                          sd[f"{name}.bias"], eps))
        else:
            layers.append(activation())
    if trailing and slots:
        layers.append(activation())
    return layers
