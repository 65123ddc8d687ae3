"""Range monitors: they watch tensors go by and remember their min / max."""

from __future__ import annotations

import torch
from torch import nn


class MinMaxObserver(nn.Module):
    """Running min / max of everything seen (weights: their current range)."""

    min_val: torch.Tensor  # buffers (state dicts carry them)
    max_val: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))

    @property
    def initialized(self) -> bool:
        return bool(torch.isfinite(self.min_val))

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.min_val.copy_(torch.minimum(self.min_val, x.min()))
        self.max_val.copy_(torch.maximum(self.max_val, x.max()))
        return x


class MovingAverageMinMaxObserver(MinMaxObserver):
    """Exponential moving average of each batch's min / max (activations), as in
    TensorFlow's quantization-aware training: ``r <- (1 - c) * r + c * r_batch``."""

    def __init__(self, averaging_constant: float = 0.01) -> None:
        super().__init__()
        if not 0.0 < averaging_constant <= 1.0:
            raise ValueError(f"averaging_constant={averaging_constant} must be in (0, 1]")
        self.c = averaging_constant

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi = x.min(), x.max()
        if not self.initialized:
            self.min_val.copy_(lo)
            self.max_val.copy_(hi)
        else:
            self.min_val.mul_(1 - self.c).add_(self.c * lo)
            self.max_val.mul_(1 - self.c).add_(self.c * hi)
        return x
