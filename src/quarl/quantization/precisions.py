"""The precision registry: one entry per value of ``QuantConfig.precision``.

Each :class:`Precision` says which labels name it, how it turns an fp32 policy into one
that acts at that precision, and what it needs (calibration observations, a fixed width).
:class:`~quarl.quantization.config.QuantConfig` validates against this registry,
:func:`quarl.quantization.api.quantize` dispatches through it, and ``quarl ptq`` / ``study`` /
``export`` read whether a precision runs real integer kernels from it. Adding a precision
is one :func:`register` call::

    register(Precision("fp8-sim", "fp8 weights, simulated", build=my_builder))

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
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from quarl.core.errors import QuarlError
from quarl.core.registry import Registry
from quarl.policies.base import Policy
from quarl.quant.backends.onnxruntime import OrtEngine, export_onnx
from quarl.quant.backends.torch_backend import TorchEngine
from quarl.quant.layers import linear_layers
from quarl.quant.modes import MODES, BuildRequest, get_mode
from quarl.quant.primitives import FLOAT_DTYPES, ActivationFakeQuant, quantize_dequantize, resolve_granularity
from quarl.quant.summary import CandidateSummary, QuantSummary
from quarl.quantization import choice_cache
from quarl.quantization.candidates import Candidate, build_candidate, split_calibration
from quarl.quantization.choice import Returns, choose

if TYPE_CHECKING:  # config validates labels against this registry: only annotations name it here
    from quarl.quantization.config import QuantConfig

log = logging.getLogger(__name__)

Builder = Callable[["Policy", "QuantConfig", "np.ndarray | None", "Returns | None"], "Policy"]
"""``build(policy, config, calibration, returns) -> new policy`` (the input is never modified)."""


@dataclass(frozen=True)
class Precision:
    """One way for a policy to act."""

    name: str
    """The value of ``QuantConfig.precision`` (and the label that parses to it)."""
    summary: str
    """One line for tables and help."""
    build: Builder
    bits: int | None = None
    """Fixed width (int8: 8); None where ``QuantConfig.bits`` is the width (nbit) or unused."""
    real_int: bool = False
    """Runs integer kernels whose choice depends on this CPU and runtime (stored results
    are keyed by the runtime too, and an automatic mode is checked against fp32)."""
    calibrates: Callable[[QuantConfig], bool] = lambda config: False
    """Whether a config needs calibration observations (fp32 rollout states)."""


PRECISIONS: Registry[Precision] = Registry("precision")
"""Every precision by name, in registration order (the order help lists them in)."""


def register(precision: Precision) -> Precision:
    """Add a precision (a name already taken is refused); returns it."""
    return PRECISIONS.register(precision.name, precision)


def get(name: str) -> Precision:
    """The precision named ``name``, or one line naming those allowed."""
    return PRECISIONS.lookup(name)


def needs_calibration(config: QuantConfig) -> bool:
    """Activation ranges are calibrated on observations, and every real int mode is
    checked (or chosen) against fp32 on them."""
    return get(config.precision).calibrates(config)


# ---------------------------------------------------------------- the builders


def quantize_weights(network: nn.Module, config: QuantConfig) -> nn.Module:
    """A copy of ``network`` whose Linear / Conv2d weights are rounded to ``config.bits``
    (biases stay fp32, as in the paper)."""
    net = copy.deepcopy(network)
    with torch.no_grad():
        for _, layer in linear_layers(net):
            w = layer.weight
            granularity = resolve_granularity(config.granularity, w.dim())
            w.copy_(quantize_dequantize(w, config.bits, config.scheme, granularity))
    return net


def calibrate_ranges(network: nn.Module, calibration: np.ndarray) -> dict[str, tuple[float, float]]:
    """Min / max of every Linear / Conv2d output over a batch of preprocessed inputs."""
    ranges: dict[str, tuple[float, float]] = {}
    hooks = []
    for name, layer in linear_layers(network):
        def hook(_m: nn.Module, _inp: tuple[torch.Tensor, ...], out: torch.Tensor, name: str = name) -> None:
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


def _fp32(policy: Policy, config: QuantConfig, calibration: np.ndarray | None, returns: Returns | None) -> Policy:
    network = policy.clone_network().float()  # PyTorch, as Stable-Baselines3 runs it: the same bits, the same returns
    return policy.with_network(network, config.label, TorchEngine(network))


def _float(policy: Policy, config: QuantConfig, calibration: np.ndarray | None, returns: Returns | None) -> Policy:
    dtype = FLOAT_DTYPES[config.precision]
    network = policy.clone_network().float().to(dtype)
    return policy.with_network(network, config.label, TorchEngine(network, dtype))


def _nbit(policy: Policy, config: QuantConfig, calibration: np.ndarray | None, returns: Returns | None) -> Policy:
    rounded = quantize_weights(policy.clone_network().float(), config)
    if config.activations:
        if calibration is None:
            raise QuarlError("activation quantization needs calibration observations")
        rounded = with_activation_quant(rounded, calibrate_ranges(rounded, calibration), config.bits)
        return policy.with_network(rounded, config.label, TorchEngine(rounded))
    return policy.with_network(rounded, config.label, OrtEngine(export_onnx(rounded, policy.input_shape)))


def _explain(label: str, chosen: CandidateSummary, tried: list[CandidateSummary], cached: bool) -> None:
    """What the automatic choice tried and why it chose (``quarl -v`` shows it); summaries
    as :meth:`Candidate.summary` gives them."""
    def pct(x: float | None) -> str:
        return "-" if x is None or x != x else f"{100 * x:.1f}%"

    if len(tried) > 1:
        for c in tried:
            is_chosen = c["mode"] == chosen["mode"] and c["fp32_layers"] == chosen["fp32_layers"]
            log.info("%s: tried %s (fp32 layers %s): agreement %s, %s us, %s%s", label, c["mode"], c["fp32_layers"],
                     pct(c["agreement"]), c["latency_us"],
                     f"{c['calibration_episodes']} calibration episodes: {c['calibration_verdict']}"
                     if c["calibration_episodes"] else "not played", " <- chosen" if is_chosen else "")
    log.info("%s runs %s with layers %s in fp32%s", label, chosen["mode"], chosen["fp32_layers"],
             " (the choice stored for this policy, CPU and ONNX Runtime; QUARL_CACHE=off chooses again)"
             if cached else "")


def _choice_options(config: QuantConfig, sampled: bool = False) -> dict[str, int | float | str | bool]:
    options: dict[str, int | float | str | bool] = {
        "bits": config.bits, "int8_weights": config.int8_weights, "block_size": config.block_size,
        "min_agreement": config.min_agreement, "action_tolerance": config.action_tolerance}
    return {**options, "sampled": True} if sampled else options  # a greedy choice keeps its older key


def _rebuild(policy: Policy, config: QuantConfig, calibration: np.ndarray,
             entry: choice_cache.ChoiceEntry) -> Candidate:
    """The stored choice, built again (the only mode built on a cache hit); what the first
    choice measured on episodes comes with it."""
    mode = get_mode(entry["mode"])
    fit, check = split_calibration(mode, calibration)
    request = BuildRequest(policy.network, export_onnx(policy.network, policy.input_shape), fit,
                           config.int8_weights, config.block_size, frozenset(entry["keep"]))
    best = build_candidate(policy, mode, request, check, config.action_tolerance)
    chosen = entry["chosen"]

    def measured(value: float | None) -> float:  # JSON's null: not measured
        return float("nan") if value is None else float(value)

    best.latency_us = measured(chosen["latency_us"])
    best.fp32_ort_latency_us = measured(chosen["fp32_ort_latency_us"])
    best.calibration_return = measured(chosen["calibration_return"])
    best.calibration_episodes = chosen["calibration_episodes"]
    best.calibration_verdict = chosen["calibration_verdict"]
    return best


def quantize_int(policy: Policy, config: QuantConfig, calibration: np.ndarray | None,
                 returns: Returns | None = None) -> Policy:
    """Real int8 / int4: the mode ``config`` names, or the automatic choice (see
    :mod:`quarl.quant.modes`). The new policy's ``meta["quant"]`` says which mode runs,
    which layers stayed fp32 and how often its actions agreed with fp32 on ``calibration``."""
    config = config.resolved()
    cached = False
    # calibration episodes play greedily whether a command evaluates greedily or samples (a greedy policy is kept
    # as it is: calibration episodes know it by identity); a sampling categorical policy is judged on its sampled
    # actions' agreement (candidates.sampled_agreement), a choice stored apart from the greedy one
    acting, policy = policy, policy.greedy()
    sampled = acting.stochastic and policy.categorical
    if config.mode == "auto":
        if calibration is None:
            raise QuarlError(f"automatic {config.precision} needs calibration observations to check the modes against "
                             "fp32 (quarl.evaluation.calibration.calibration_inputs)")
        key = choice_cache.choice_key(policy.fingerprint(), _choice_options(config, sampled), calibration, returns)
        entry = choice_cache.load(key, {m for m in MODES if MODES[m].bits == config.bits},
                                  len(linear_layers(policy.network)))
        if entry is not None:
            best, tried, cached = _rebuild(policy, config, calibration, entry), entry["tried"], True
        else:
            best, candidates = choose(policy, config.bits, calibration, config.int8_weights, config.block_size,
                                      config.min_agreement, config.action_tolerance, returns, sampled=sampled)
            tried = [c.summary() for c in candidates]
            choice_cache.store(key, {"mode": best.mode, "keep": list(best.keep), "chosen": best.summary(),
                                     "tried": tried})
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
        tried = [best.summary()]
    _explain(config.label, best.summary(), tried, cached)
    network = best.reference if best.reference is not None else policy.clone_network()
    assert best.engine is not None  # every built candidate has its ONNX Runtime engine
    quantized = acting.with_network(network, config.label, best.engine)
    summary: QuantSummary = {**best.summary(), "int8_weights": config.int8_weights, "block_size": config.block_size,
                             "chosen_from_cache": cached, "tried": tried}
    quantized.meta["quant"] = summary
    return quantized


register(Precision("fp32", "unchanged, PyTorch (Stable-Baselines3's own numbers)", _fp32))
register(Precision("fp16", "weights and arithmetic in fp16 (PyTorch kernels)", _float))
register(Precision("bf16", "weights and arithmetic in bf16 (PyTorch kernels)", _float))
register(Precision("int8", "real int8 execution (ONNX Runtime kernels, mode chosen per policy)", quantize_int,
                   bits=8, real_int=True, calibrates=lambda config: True))
register(Precision("int4", "real 4-bit weights (ONNX Runtime MatMulNBits, mode chosen per policy)", quantize_int,
                   bits=4, real_int=True, calibrates=lambda config: True))
register(Precision("nbit", "simulated n-bit weights (fp32 arithmetic on rounded weights), labelled simN", _nbit,
                   calibrates=lambda config: config.activations))
