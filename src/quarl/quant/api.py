"""The one entry point: ``quantize(policy, config) -> new Policy``.

The input policy is never modified. What each precision gives:

=========  =============================================  ==============================
precision  network held by the new policy                 engine that acts
=========  =============================================  ==============================
fp32       a copy                                         PyTorch fp32 (SB3's own numbers)
fp16/bf16  a copy cast to that dtype                      PyTorch in that dtype
int8/int4  simulated reference of the chosen mode        ONNX Runtime integer kernels
           (see quarl.quant.modes)                        (mode chosen per policy)
nbit       weights rounded to n bits (+ activation        ONNX Runtime fp32 on the
           fake-quant when asked)                         rounded weights (PyTorch when
                                                          activations are quantized)
=========  =============================================  ==============================
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from quarl.errors import QuarlError
from quarl.policies.base import Policy, linear_layers
from quarl.quant.backends.onnxruntime import OrtEngine, export_onnx
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quant.config import REAL_BITS, QuantConfig
from quarl.quant.modes import Returns, BuildRequest, build_candidate, choose, get_mode, split_calibration
from quarl.quant.primitives import (  # noqa: F401 (ActivationFakeQuant: quarl.quant.api's public name)
    FLOAT_DTYPES,
    ActivationFakeQuant,
    dequantize,
    qparams_from_range,
    quantize_dequantize,
    resolve_granularity,
)


def quantize_weights(network: nn.Module, config: QuantConfig) -> nn.Module:
    """A copy of ``network`` whose Linear / Conv2d weights are rounded to ``config.bits``
    (biases stay fp32, as in the paper)."""
    net = copy.deepcopy(network)
    with torch.no_grad():
        for _, layer in linear_layers(net):
            w = layer.weight
            w.copy_(quantize_dequantize(w, config.bits, config.scheme, resolve_granularity(config.granularity, w.dim())))
    return net


def calibrate_ranges(network: nn.Module, calibration: np.ndarray) -> dict[str, tuple[float, float]]:
    """Min / max of every Linear / Conv2d output over a batch of preprocessed inputs."""
    ranges: dict[str, tuple[float, float]] = {}
    hooks = []
    for name, layer in linear_layers(network):
        def hook(_m, _inp, out, name=name):
            ranges[name] = (float(out.min()), float(out.max()))
        hooks.append(layer.register_forward_hook(hook))
    with torch.inference_mode():
        network(torch.as_tensor(calibration, dtype=torch.float32))
    for h in hooks:
        h.remove()
    return ranges


def with_activation_quant(network: nn.Module, ranges: dict[str, tuple[float, float]], bits: int) -> nn.Module:
    """``network`` with an :class:`ActivationFakeQuant` after each layer named in ``ranges``."""
    if not isinstance(network, nn.Sequential):
        raise QuarlError("activation quantization needs a sequential network")
    layers: list[nn.Module] = []
    names = dict((id(m), n) for n, m in network.named_modules())
    for module in network:
        layers.append(module)
        name = names.get(id(module))
        if name in ranges:
            lo, hi = ranges[name]
            layers.append(ActivationFakeQuant(lo, hi, bits))
    return nn.Sequential(*layers)


def quantize(policy: Policy, config: QuantConfig, calibration: np.ndarray | None = None,
             returns: Returns | None = None) -> Policy:
    """A new policy that acts at ``config``'s precision.

    ``calibration``: preprocessed observations (``policy.preprocess`` of rollout states),
    needed for automatic int8 / int4 (modes checked against fp32 on them), static ranges
    and ``activations=True``. ``returns``: mean return of a policy on calibration
    episodes, for the automatic choice's closed-loop check (see :mod:`quarl.quant.modes`)."""
    network = policy.clone_network().float()
    shape = policy.input_shape
    label = config.label
    if config.precision == "fp32":  # PyTorch, as Stable-Baselines3 runs it: the same bits, the same returns
        return policy.with_network(network, label, TorchEngine(network))
    if config.precision in ("fp16", "bf16"):
        dtype = FLOAT_DTYPES[config.precision]
        network = network.to(dtype)
        return policy.with_network(network, label, TorchEngine(network, dtype))
    if config.precision in REAL_BITS:
        return quantize_int(policy, config, calibration, returns)
    # simulated n-bit
    rounded = quantize_weights(network, config)
    if config.activations:
        if calibration is None:
            raise QuarlError("activation quantization needs calibration observations")
        rounded = with_activation_quant(rounded, calibrate_ranges(rounded, calibration), config.bits)
        return policy.with_network(rounded, label, TorchEngine(rounded))
    return policy.with_network(rounded, label, OrtEngine(export_onnx(rounded, shape)))


def quantize_int(policy: Policy, config: QuantConfig, calibration: np.ndarray | None,
                 returns: Returns | None = None) -> Policy:
    """Real int8 / int4: the mode ``config`` names, or the automatic choice (see
    :mod:`quarl.quant.modes`). The new policy's ``meta["quant"]`` says which mode runs,
    which layers stayed fp32 and how often its actions agreed with fp32 on ``calibration``."""
    config = config.resolved()
    if config.mode == "auto":
        if calibration is None:
            raise QuarlError(f"automatic {config.precision} needs calibration observations to check the modes against "
                             "fp32 (quarl.ptq.calibration_inputs)")
        best, tried = choose(policy, config.bits, calibration, config.int8_weights, config.block_size,
                             config.min_agreement, config.action_tolerance, returns)
    else:
        mode = get_mode(config.label)
        reason = mode.unsupported(policy.network)
        if reason is not None:
            raise QuarlError(reason)
        if mode.needs_calibration and calibration is None:
            raise QuarlError(f"{mode.label} needs calibration observations (static activation ranges)")
        fit, check = split_calibration(mode, calibration)
        request = BuildRequest(policy.network, export_onnx(policy.network, policy.input_shape), fit,
                               config.int8_weights, config.block_size)
        best = build_candidate(policy, mode, request, check, config.action_tolerance)
        tried = [best]
    network = best.reference if best.reference is not None else policy.clone_network()
    quantized = policy.with_network(network, config.label, best.engine)
    quantized.meta["quant"] = {**best.summary(), "int8_weights": config.int8_weights, "block_size": config.block_size,
                               "tried": [c.summary() for c in tried]}
    return quantized


def from_qat_state(policy: Policy, state: dict) -> Policy:
    """The quantized policy a QAT run computed, from its fp32 master weights: each layer's
    weights on the n-bit grid and its output fake-quantized within the monitored range,
    exactly what the fake-quantized training network did.

    ``state``: ``{"config": QATConfig fields, "enabled": bool, "layers": {name: {"quantize",
    "out_min", "out_max"}}}`` keyed by each layer's ``sb3_name`` (set by the SB3 loader)."""
    from quarl.quant.config import QATConfig
    from quarl.quant.qat import QATLayer

    config = QATConfig(**state["config"])
    if not state.get("enabled"):
        return policy
    network = policy.clone_network()
    ranges: dict[str, tuple[float, float]] = {}
    for name, layer in linear_layers(network):
        sb3_name = getattr(layer, "sb3_name", None)
        saved = state["layers"].get(sb3_name)
        if saved is None or not saved["quantize"]:
            raise QuarlError(f"the QAT state has no quantized layer for {sb3_name or name!r}")
        wrapper = QATLayer(layer, config.bits, config.scheme, resolve_granularity(config.granularity, layer.weight.dim()))
        with torch.no_grad():
            layer.weight.copy_(wrapper.quantized_weight())
        if saved["out_min"] <= saved["out_max"]:
            ranges[name] = (saved["out_min"], saved["out_max"])
    network = with_activation_quant(network, ranges, config.bits)
    quantized = policy.with_network(network, f"qat{config.bits}", TorchEngine(network))
    quantized.meta["qat"] = dict(state["config"])
    return quantized
