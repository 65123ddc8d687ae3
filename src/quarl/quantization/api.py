"""The one entry point: ``quantize(policy, config) -> new Policy``.

The input policy is never modified. Each precision is an entry of
:mod:`quarl.quantization.precisions` (the table of what each gives is there).
"""

from __future__ import annotations

import numpy as np
import torch

from quarl.core.errors import QuarlError
from quarl.policies.base import Policy
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quant.layers import linear_layers
from quarl.quant.primitives import resolve_granularity
from quarl.quantization.choice import Returns
from quarl.quantization.config import QATState, QuantConfig
from quarl.quantization.precisions import get, with_activation_quant


def quantize(policy: Policy, config: QuantConfig, calibration: np.ndarray | None = None,
             returns: Returns | None = None) -> Policy:
    """A new policy that acts at ``config``'s precision (see :mod:`quarl.quantization.precisions`).

    ``calibration``: preprocessed observations (``policy.preprocess`` of rollout states),
    needed for automatic int8 / int4 (modes checked against fp32 on them), static ranges
    and ``activations=True``. ``returns``: mean return of a policy on calibration
    episodes, for the automatic choice's closed-loop check (see :mod:`quarl.quant.modes`)."""
    return get(config.precision).build(policy, config, calibration, returns)


def from_qat_state(policy: Policy, state: QATState) -> Policy:
    """The quantized policy a QAT run computed, from its fp32 master weights: each layer's
    weights on the n-bit grid and its output fake-quantized within the monitored range,
    exactly what the fake-quantized training network did.

    ``state``: ``qat.json`` as read (:class:`~quarl.quantization.config.QATState`), its layers keyed
    by each layer's ``sb3_name`` (set by the SB3 loader)."""
    from quarl.quant.qat import QATLayer

    config = state.config
    if not state.enabled:
        return policy
    network = policy.clone_network()
    ranges: dict[str, tuple[float, float]] = {}
    for name, layer in linear_layers(network):
        sb3_name = getattr(layer, "sb3_name", None)
        saved = state.layers.get(sb3_name) if sb3_name is not None else None
        if saved is None or not saved.quantize:
            raise QuarlError(f"the QAT state has no quantized layer for {sb3_name or name!r}")
        granularity = resolve_granularity(config.granularity, layer.weight.dim())
        wrapper = QATLayer(layer, config.bits, config.scheme, granularity)
        with torch.no_grad():
            layer.weight.copy_(wrapper.quantized_weight())
        if saved.out_min <= saved.out_max:
            ranges[name] = (saved.out_min, saved.out_max)
    network = with_activation_quant(network, ranges, config.bits)
    return policy.with_network(network, f"qat{config.bits}", TorchEngine(network))
