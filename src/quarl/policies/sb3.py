"""The acting network of a Stable-Baselines3 policy, rebuilt from its state dict's names
and shapes (the zip and the RL Zoo folder around it are read by :mod:`quarl.policies.zoo`).
Supported: A2C, PPO, TRPO and MaskablePPO (MLP and NatureCNN, discrete and box actions,
gSDE, ``squash_output``), DQN, QR-DQN, SAC, TQC, CrossQ (its Batch Renorm layers at their running statistics), TD3,
DDPG and ARS (linear and MLP). RecurrentPPO (LSTM) is refused with one line.

Each layout below is one entry of :data:`LAYOUTS` (:func:`register_layout` adds one).
Calling convention of the acting network per algorithm (deterministic acting)::

    a2c / ppo    features -> [shared_net] -> policy_net -> action_net   (argmax | mean, clipped)
    ars          features -> action_net (Linear [-> act -> Linear]* [-> tanh])  (argmax | clipped | unscaled)
    dqn          features -> q_net                                      (argmax)
    qrdqn        features -> quantile_net                               (argmax of quantile mean)
    sac / tqc    features -> latent_pi -> mu [-> Hardtanh] -> tanh      (unscaled to bounds)
    crossq       as sac, with Batch Renorm (running statistics) in latent_pi
    td3 / ddpg   features -> mu (ends in tanh)                          (unscaled to bounds)
"""

from __future__ import annotations

import base64
import copy
import pickletools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from pydantic import JsonValue
from torch import nn

from quarl.core.errors import QuarlError
from quarl.core.registry import Registry
from quarl.policies.base import Policy, StateNoise, check_outputs
from quarl.policies.sb3_layers import linear_from, mlp_from, set_sb3_name

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "ReLU": nn.ReLU,
    "Tanh": nn.Tanh,
    "ELU": nn.ELU,
    "LeakyReLU": nn.LeakyReLU,
    "SiLU": nn.SiLU,
    "GELU": nn.GELU,
    "Sigmoid": nn.Sigmoid,
}




# ---------------------------------------------------------------------------- network


def _features(sd: dict[str, torch.Tensor], prefix: str, obs_shape: tuple[int, ...]) -> list[nn.Module]:
    """SB3 features extractor: FlattenExtractor (no weights) or NatureCNN."""
    convs = [k for k in sd if k.startswith(prefix + "cnn.") and k.endswith(".weight")]
    if not convs:
        return [nn.Flatten()] if len(obs_shape) > 1 else []
    layers: list[nn.Module] = []
    strides = {8: 4, 4: 2, 3: 1}  # NatureCNN: 8x8/4, 4x4/2, 3x3/1
    for key in sorted(convs, key=lambda k: int(k.split(".")[-2])):
        w = sd[key]
        k = w.shape[-1]
        if k not in strides:
            raise QuarlError(f"unsupported CNN layer {key} with kernel {k}: only NatureCNN is supported")
        conv = nn.Conv2d(w.shape[1], w.shape[0], kernel_size=k, stride=strides[k])
        with torch.no_grad():
            conv.weight.copy_(w)
            assert conv.bias is not None  # a Conv2d has one unless asked otherwise
            conv.bias.copy_(sd[key[: -len("weight")] + "bias"])
        set_sb3_name(conv, key[: -len(".weight")])
        layers += [conv, nn.ReLU()]
    layers.append(nn.Flatten())
    layers += mlp_from(sd, prefix + "linear.", nn.ReLU, trailing=True)
    return layers


@dataclass(frozen=True)
class PolicyKwargs:
    """The policy keyword arguments the rebuilt network depends on (SB3's names), read from
    the zip's ``data`` and the zoo config by :meth:`read`; the others (``net_arch``...) the
    state dict's shapes already give."""

    activation_fn: object = None
    """A class name (``torch.nn.ReLU``, ``th.nn.Tanh``); None: the layout's default."""
    squash_output: bool | None = None
    """None when not given (each layout has its default)."""
    batch_norm_eps: float = 1e-3
    """CrossQ's Batch Renorm epsilon."""
    clip_mean: float = 2.0
    """gSDE's clip of SAC's mean (a Hardtanh)."""
    normalize_images: bool = True
    use_expln: bool = False
    """gSDE's std function: exp below 0, log1p above."""

    @classmethod
    def read(cls, raw: dict[str, Any]) -> PolicyKwargs:
        """From the parsed keyword arguments (a JSON / Python literal mapping)."""
        numbers: dict[str, float] = {}
        for name in ("batch_norm_eps", "clip_mean"):
            if name in raw:
                try:
                    numbers[name] = float(raw[name])
                except (TypeError, ValueError, OverflowError):
                    raise QuarlError(f"policy_kwargs {name}={str(raw[name])[:40]!r} is not a number") from None
        return cls(activation_fn=raw.get("activation_fn"),
                   squash_output=None if "squash_output" not in raw else bool(raw["squash_output"]),
                   normalize_images=bool(raw.get("normalize_images", True)), use_expln=bool(raw.get("use_expln")),
                   **numbers)


@dataclass(frozen=True)
class LayoutInput:
    """What a layout's builder reads: the state dict and the policy's settings."""

    sd: dict[str, torch.Tensor]
    obs_shape: tuple[int, ...]
    activation: type[nn.Module]
    policy_kwargs: PolicyKwargs
    action_space: gym.spaces.Space[Any]

    @property
    def continuous(self) -> bool:
        return isinstance(self.action_space, gym.spaces.Box)


@dataclass(frozen=True)
class Acting:
    """A layout's acting network: its layers and the head that turns outputs into actions."""

    layers: list[nn.Module]
    head: str
    """``argmax``, ``quantile_argmax``, ``clip`` or ``unscale`` (see :class:`Policy`)."""
    n_quantiles: int = 0


@dataclass(frozen=True)
class Layout:
    """How one family of SB3 policies keeps its acting network in the state dict (the
    algorithms that share a policy class share a layout: A2C, PPO and TRPO; SAC, TQC
    and CrossQ; TD3 and DDPG). Adding a layout is one :func:`register_layout` call."""

    name: str
    """Also the algorithm's name when the checkpoint does not say it."""
    matches: Callable[[dict[str, torch.Tensor]], bool]
    """Whether a state dict has this layout (asked newest registered first)."""
    build: Callable[[LayoutInput], Acting]
    default_activation: type[nn.Module] = nn.ReLU
    """The activation SB3 uses when ``policy_kwargs`` names none."""
    algos: tuple[str, ...] = ()
    """SB3 / sb3-contrib algorithm names saved with this layout (as their policy module names them)."""


LAYOUTS: Registry[Layout] = Registry("policy layout", newest_first=True)


def register_layout(layout: Layout) -> Layout:
    """Add a layout, asked before those registered earlier; returns it."""
    return LAYOUTS.register(layout.name, layout)


def algos() -> tuple[str, ...]:
    """Every algorithm name a registered layout loads."""
    return tuple(dict.fromkeys(a for layout in reversed(tuple(LAYOUTS.values())) for a in (*layout.algos, layout.name)))


def layout_of(sd: dict[str, torch.Tensor]) -> Layout:
    """The first registered layout whose marker the state dict has; recurrent ones refused."""
    keys = set(sd)
    if any(k.startswith(("lstm_actor.", "lstm_critic.")) for k in keys):
        raise QuarlError(
            "recurrent policies (RecurrentPPO, LSTM) are not supported: their actions depend on a hidden state "
            "that quarl's stateless engines do not carry"
        )
    for layout in LAYOUTS.values():
        if layout.matches(sd):
            return layout
    raise QuarlError(
        f"unsupported policy layout: the state dict matches none of {', '.join(LAYOUTS)} "
        f"(keys: {', '.join(sorted(keys)[:6])}...)"
    )


def _has_prefix(prefix: str) -> Callable[[dict[str, torch.Tensor]], bool]:
    return lambda sd: any(k.startswith(prefix) for k in sd)


def _dqn(x: LayoutInput) -> Acting:
    return Acting(_features(x.sd, "q_net.features_extractor.", x.obs_shape)
                  + mlp_from(x.sd, "q_net.q_net.", x.activation, False),
                  "argmax")


def _qrdqn(x: LayoutInput) -> Acting:
    layers = _features(x.sd, "quantile_net.features_extractor.", x.obs_shape)
    layers += mlp_from(x.sd, "quantile_net.quantile_net.", x.activation, False)
    if not isinstance(x.action_space, gym.spaces.Discrete):
        raise QuarlError("a qrdqn network with box actions is not supported")
    last = layers[-1] if layers else None
    if not isinstance(last, nn.Linear):
        raise QuarlError("a qrdqn network that does not end in a Linear layer is not supported")
    return Acting(layers, "quantile_argmax", last.out_features // int(x.action_space.n))


def _ars(x: LayoutInput) -> Acting:
    layers = _features(x.sd, "features_extractor.", x.obs_shape) + mlp_from(x.sd, "action_net.", x.activation, False)
    if x.continuous and x.policy_kwargs.squash_output in (None, True):  # ARS's MLP squashes unless told
        return Acting([*layers, nn.Tanh()], "unscale")
    return Acting(layers, "clip" if x.continuous else "argmax")


def _sac(x: LayoutInput) -> Acting:
    sd = x.sd
    # CrossQ's latent_pi has Batch Renorm slots and no trailing activation after them
    crossq = any(k.startswith("actor.latent_pi.") and k.endswith(".ra_mean") for k in sd)
    latent = mlp_from(sd, "actor.latent_pi.", x.activation, not crossq, x.policy_kwargs.batch_norm_eps)
    layers = _features(sd, "actor.features_extractor.", x.obs_shape) + latent
    if "actor.mu.0.weight" in sd:  # gSDE: mu = Sequential(Linear, Hardtanh(-clip_mean, clip_mean))
        clip_mean = x.policy_kwargs.clip_mean
        layers += [linear_from(sd, "actor.mu.0"), nn.Hardtanh(-clip_mean, clip_mean)]
    else:
        layers.append(linear_from(sd, "actor.mu"))
    return Acting([*layers, nn.Tanh()], "unscale")


def _td3(x: LayoutInput) -> Acting:
    layers = (_features(x.sd, "actor.features_extractor.", x.obs_shape)
              + mlp_from(x.sd, "actor.mu.", x.activation, False))
    return Acting([*layers, nn.Tanh()], "unscale")


def _actor_critic(x: LayoutInput) -> Acting:
    sd = x.sd
    fe = "pi_features_extractor." if any(k.startswith("pi_features_extractor.") for k in sd) else "features_extractor."
    layers = _features(sd, fe, x.obs_shape)
    layers += mlp_from(sd, "mlp_extractor.shared_net.", x.activation, True)
    layers += mlp_from(sd, "mlp_extractor.policy_net.", x.activation, True)
    layers.append(linear_from(sd, "action_net"))
    if x.continuous and x.policy_kwargs.squash_output:
        return Acting([*layers, nn.Tanh()], "unscale")
    return Acting(layers, "clip" if x.continuous else "argmax")


# asked newest first: the later registrations below are the more specific markers
register_layout(Layout("ars", lambda sd: "action_net.0.weight" in sd, _ars))
register_layout(Layout("ppo", lambda sd: "action_net.weight" in sd, _actor_critic, nn.Tanh,
                       ("a2c", "trpo", "ppo_mask")))
register_layout(Layout("td3", _has_prefix("actor.mu."), _td3, algos=("ddpg",)))
register_layout(Layout("sac", _has_prefix("actor.latent_pi."), _sac, algos=("tqc", "crossq")))
register_layout(Layout("qrdqn", _has_prefix("quantile_net.quantile_net."), _qrdqn))
register_layout(Layout("dqn", _has_prefix("q_net.q_net."), _dqn))


def _activation(policy_kwargs: PolicyKwargs, layout: Layout) -> type[nn.Module]:
    name = policy_kwargs.activation_fn
    if name is None:  # SB3 defaults: tanh for on-policy actor-critic, ReLU elsewhere (ARS too)
        return layout.default_activation
    short = str(name).rsplit(".", 1)[-1]
    if short not in ACTIVATIONS:
        raise QuarlError(f"activation {name!r} is not supported: allowed {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[short]


MULTI_HEADS: dict[type[gym.spaces.Space[Any]], str] = {gym.spaces.MultiDiscrete: "multi_argmax",
                                                       gym.spaces.MultiBinary: "bernoulli"}
"""Action spaces of several discrete distributions, and the head that acts in each."""


def build_policy(
    sd: dict[str, torch.Tensor],
    observation_space: gym.spaces.Space[Any],
    action_space: gym.spaces.Space[Any],
    policy_kwargs: PolicyKwargs,
    algo: str | None = None,
) -> Policy:
    """Rebuild the acting network of an SB3 policy from its state dict (through the
    first :data:`LAYOUTS` entry that matches it)."""
    layout = layout_of(sd)
    obs_shape = tuple(observation_space.shape or ())
    continuous = isinstance(action_space, gym.spaces.Box)
    multi = MULTI_HEADS.get(type(action_space))
    if not continuous and multi is None and not isinstance(action_space, gym.spaces.Discrete):
        raise QuarlError(f"action space {action_space} is not supported: allowed Box, Discrete, MultiDiscrete and "
                         "MultiBinary")
    if multi is not None and layout.name != "ppo":
        raise QuarlError(f"a {layout.name} network with {type(action_space).__name__} actions is not supported: "
                         "A2C / PPO / TRPO ones are")
    acting = layout.build(LayoutInput(sd, obs_shape, _activation(policy_kwargs, layout), policy_kwargs, action_space))
    if continuous != (acting.head in ("clip", "unscale")):
        raise QuarlError(f"a {layout.name} network with {'box' if continuous else 'discrete'} actions is not supported")
    if multi is not None:  # the same logits, split per sub-action or per bit
        acting = Acting(acting.layers, multi)
    image = len(obs_shape) == 3 and np.issubdtype(observation_space.dtype, np.integer)
    policy = Policy(
        network=nn.Sequential(*acting.layers),
        observation_space=observation_space,
        action_space=action_space,
        head=acting.head,
        algo=algo or layout.name,
        scale_images=image and policy_kwargs.normalize_images,
        n_quantiles=acting.n_quantiles,
    )
    _check_shapes(policy)
    return policy


def _check_shapes(policy: Policy) -> None:
    check_outputs(policy, "the checkpoint's network")


def _policy_class(data: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """The readable fields of a zip's ``policy_class`` (none where it holds no object)."""
    entry = data.get("policy_class")
    return entry if isinstance(entry, dict) else {}


def algo_from_data(data: dict[str, JsonValue], family: str) -> str:
    """The algorithm's name; where several share a policy class, told apart by the
    hyperparameters they save (PPO's clip range; DDPG is TD3 without delay or noise).
    ``data``: an SB3 zip's ``data`` entry as JSON holds it."""
    module = str(_policy_class(data).get("__module__", ""))
    m = re.match(r"(?:stable_baselines3|sb3_contrib)\.(\w+)\.policies", module)
    algo = m.group(1) if m and m.group(1) in algos() else family
    if algo == "ppo":  # A2C, PPO and TRPO share ActorCriticPolicy
        return "ppo" if "clip_range" in data else "trpo" if "cg_max_steps" in data else "a2c"
    if algo == "td3" and data.get("policy_delay") == 1 and data.get("target_noise_clip") == 0.0:
        return "ddpg"
    return algo


def policy_class_name(data: dict[str, JsonValue]) -> str | None:
    """The policy class's name, read from the opcodes of its pickled reference (never
    unpickled): ``ARSLinearPolicy`` and ``ARSPolicy`` differ only in their defaults."""
    blob = _policy_class(data).get(":serialized:")
    if not isinstance(blob, str):
        return None
    try:
        strings = [arg for op, arg, _ in pickletools.genops(base64.b64decode(blob)) if isinstance(arg, str)]
    except Exception:  # not a pickle we can read: the defaults stay unknown
        return None
    return strings[-1] if strings else None


def state_noise(
    sd: dict[str, torch.Tensor], policy_kwargs: PolicyKwargs, policy: Policy, what: str
) -> StateNoise | None:
    """The state-dependent noise head of an SAC / TQC / CrossQ actor or a gSDE policy, built
    from the state dict as SB3 samples with it (None for other heads): its network is the
    acting network's layers up to the action layer (the latent), plus SAC's log-std layer."""
    if policy.head not in ("clip", "unscale") or not isinstance(policy.network, nn.Sequential):
        return None
    layers = list(policy.network)
    linears = [(i, m) for i, m in enumerate(layers) if isinstance(m, nn.Linear)]
    if not linears:
        return None
    action_layer, action = linears[-1]
    latent = copy.deepcopy(nn.Sequential(*layers[:action_layer]))
    width = action.in_features
    if "actor.log_std.weight" in sd:  # SAC without gSDE: log_std = Linear(latent_pi), clamped in sampling
        head = linear_from(sd, "actor.log_std")
        if head.in_features != width or head.out_features != int(np.prod(policy.action_space.shape or ())):
            raise QuarlError(f"{what}: actor.log_std of shape {tuple(head.weight.shape)} does not fit the actor")
        return StateNoise("squashed_gaussian", nn.Sequential(*latent, head).eval().requires_grad_(False))
    log_std = sd.get("actor.log_std", sd.get("log_std"))
    if not isinstance(log_std, torch.Tensor) or log_std.ndim != 2:
        return None
    n_actions = int(np.prod(policy.action_space.shape or ()))
    if log_std.shape[0] != width or log_std.shape[1] not in (1, n_actions):
        raise QuarlError(f"{what}: gSDE's log_std of shape {tuple(log_std.shape)} does not fit a latent of {width} "
                         f"and {n_actions} actions")
    if float(log_std.abs().max()) > MAX_ABS_LOG_STD:
        raise QuarlError(f"{what}: gSDE's log_std reaches {float(log_std.abs().max()):.4g}, beyond +-{MAX_ABS_LOG_STD}")
    raw = log_std.double()
    if policy_kwargs.use_expln:  # SB3's expln: exp below 0, log1p(x) + 1 above (kept > 0, slow growth)
        std = torch.where(raw <= 0, torch.exp(raw), torch.log1p(raw.clamp(min=0) + 1e-6) + 1.0)
    else:
        std = torch.exp(raw)
    std = std.expand(width, n_actions)  # full_std=False keeps one column, broadcast as SB3's get_std does
    return StateNoise("gsde", latent.eval().requires_grad_(False), std=std.numpy().copy(),
                      squash=policy.head == "unscale")


MAX_ABS_LOG_STD = 20.0
"""A Gaussian's log std beyond this (std above 5e8 or below 2e-9) is not a trained policy's."""
