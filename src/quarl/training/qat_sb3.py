"""Quantization-aware training of Stable-Baselines3 agents.

:class:`QATCallback` wraps, in place, the Linear / Conv2d layers of the networks that act
(PPO / A2C: features, policy MLP and action head; DQN: the online Q-network; SAC / TD3 /
DDPG: the actor) in :class:`quarl.quant.qat.QATLayer`. Target networks and critics stay
fp32 unless ``QATConfig.critic``. Before ``quant_delay`` env steps the layers only
monitor ranges; from then on they fake-quantize weights and outputs. Since a wrapper adds
no parameters, SB3's optimizers and its Polyak target updates see the same tensors.

Saved runs hold the plain (fp32 master) weights plus ``qat.json`` (bits, scheme and the
monitored output ranges per layer name); :func:`quarl.quantization.api.from_qat_state` turns the
loaded fp32 policy into the quantized one the fake-quantized network computed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from stable_baselines3.common.callbacks import BaseCallback
from torch import nn

from quarl.core.errors import QuarlError
from quarl.core.file_schema import parse_json, parse_record
from quarl.core.limits import read_capped
from quarl.quant.primitives import resolve_granularity
from quarl.quant.qat import QATLayer, set_quantization, wrap_qat_
from quarl.quantization.config import QATConfig, QATLayerState, QATState

log = logging.getLogger(__name__)

def qat_targets(policy: nn.Module, critic: bool = False) -> dict[str, nn.Module]:
    """Name -> module of an SB3 policy's networks to fake-quantize."""
    def part(name: str) -> nn.Module:
        return policy.get_submodule(name)

    if hasattr(policy, "q_net"):
        return {"q_net": part("q_net")}
    if hasattr(policy, "quantile_net"):
        return {"quantile_net": part("quantile_net")}
    if hasattr(policy, "actor"):
        return {"actor": part("actor"), **({"critic": part("critic")} if critic else {})}
    if hasattr(policy, "action_net"):
        names = ["pi_features_extractor", "mlp_extractor.policy_net", "action_net"]
        if critic:
            names += ["vf_features_extractor", "mlp_extractor.value_net", "value_net"]
        return {name: part(name) for name in names}
    raise QuarlError(f"quarl cannot find the acting network of a {type(policy).__name__}")


def wrapped_layers(policy: nn.Module) -> dict[str, QATLayer]:
    """Every name (aliases included: SB3 registers a shared features extractor three
    times) of every QAT layer in ``policy``."""
    return {n: m for n, m in policy.named_modules(remove_duplicate=False) if isinstance(m, QATLayer)}


def wrap_policy(policy: nn.Module, settings: QATConfig) -> None:
    """Wrap the target networks' layers in place (a bare layer target such as PPO's
    ``action_net`` is replaced on the policy itself)."""
    for name, module in qat_targets(policy, settings.critic).items():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            setattr(policy, name, QATLayer(module, settings.bits, settings.scheme, _granularity(settings, module)))
        else:
            wrap_qat_(module, settings.bits, settings.scheme, settings.granularity)


def _range(layer: QATLayer, observer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (min, max) buffers of one of ``layer``'s observers."""
    module = layer.get_submodule(observer)
    return module.get_buffer("min_val"), module.get_buffer("max_val")


def qat_state(policy: nn.Module, settings: QATConfig) -> QATState:
    """Everything needed to restore the wrappers or to rebuild the quantized policy (what
    ``qat.json`` holds). Built as measured, unchecked: a range read back is checked then."""
    layers: dict[str, QATLayerState] = {}
    for name, layer in wrapped_layers(policy).items():
        (out_min, out_max), (w_min, w_max) = _range(layer, "output_observer"), _range(layer, "weight_observer")
        layers[name] = QATLayerState.model_construct(quantize=layer.quantize, out_min=float(out_min),
                                                     out_max=float(out_max), w_min=float(w_min), w_max=float(w_max))
    enabled = any(v.quantize for v in layers.values())
    return QATState.model_construct(config=settings, enabled=enabled, layers=layers)


def load_qat_state(policy: nn.Module, state: QATState) -> None:
    """Restore the wrappers of ``policy`` from :func:`read_qat_state`'s state."""
    for name, layer in wrapped_layers(policy).items():
        saved = state.layers.get(name)
        if saved is None:
            raise QuarlError(f"the saved QAT state has no layer {name!r}: it belongs to another network")
        layer.quantize = bool(saved.quantize)
        for observer, low_value, high_value in (("output_observer", saved.out_min, saved.out_max),
                                                ("weight_observer", saved.w_min, saved.w_max)):
            low, high = _range(layer, observer)
            low.fill_(low_value)
            high.fill_(high_value)


def write_qat_state(path: Path, policy: nn.Module, settings: QATConfig) -> None:
    from quarl.core.atomic import write_atomic

    write_atomic(path, json.dumps(qat_state(policy, settings).model_dump(), indent=1))


QAT_STATE_CAP = 1 << 20
"""Bytes a qat.json may have (a few hundred per layer)."""


def read_qat_state(path: Path, expected: QATConfig | None = None) -> QATState:
    """A ``qat.json`` (the final one or a checkpoint's) read and checked as a
    :class:`~quarl.quantization.config.QATState`, as :func:`load_qat_state` and
    :func:`quarl.quantization.api.from_qat_state` take it. With ``expected``, its settings must be
    those of the run resuming it (another bit width would be another run)."""
    state = parse_record(QATState, parse_json(read_capped(path, QAT_STATE_CAP, "a QAT state"), path), path)
    saved = state.config
    # the quant delay may move (its default follows the budget, which a resume may extend)
    differ = [k for k in ("bits", "scheme", "granularity", "critic") if expected is not None
              and getattr(saved, k) != getattr(expected, k)]
    if differ:
        name = differ[0]
        raise QuarlError(f"{path}: field config.{name}: the run was trained with {name}={getattr(saved, name)!r}, this "
                         f"one asks {getattr(expected, name)!r}: resume with the same QAT options")
    return state


class QATCallback(BaseCallback):
    """Wraps the acting networks at the start of training and switches fake quantization
    on once ``num_timesteps >= quant_delay`` (logged as ``qat/enabled``)."""

    def __init__(self, settings: QATConfig, restore: QATState | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.restore = restore
        self.enabled = False

    def _on_training_start(self) -> None:
        policy = self.model.policy
        if not wrapped_layers(policy):
            wrap_policy(policy, self.settings)
            if self.restore is not None:
                load_qat_state(policy, self.restore)
        self._switch()

    def _switch(self) -> None:
        on = self.num_timesteps >= self.settings.quant_delay
        if on != self.enabled:
            set_quantization(self.model.policy, on)
            self.enabled = on
            if on:
                log.info("QAT: fake quantization at %d bits from step %d", self.settings.bits, self.num_timesteps)
        self.logger.record("qat/enabled", int(on))

    def _on_step(self) -> bool:
        self._switch()
        return True


def _granularity(config: QATConfig, layer: nn.Linear | nn.Conv2d) -> str:
    return resolve_granularity(config.granularity, layer.weight.dim())
