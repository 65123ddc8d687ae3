"""PyTorch eager execution of a network in a float format (fp32, fp16, bf16)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class TorchEngine:
    """Runs ``network`` (already converted to ``dtype``) on float32 numpy batches."""

    def __init__(self, network: nn.Module, dtype: torch.dtype = torch.float32) -> None:
        self.network = network.eval()
        self.dtype = dtype

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = self.network(torch.from_numpy(np.ascontiguousarray(x)).to(self.dtype))
            return out.float().numpy()
