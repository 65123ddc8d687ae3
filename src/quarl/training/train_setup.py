"""A zoo entry (:mod:`quarl.training.hyperparams`) with the user's ``--hp`` on top, turned
into what one training run needs: Stable-Baselines3 constructor kwargs (schedules, classes
and action noise built from the entry's literals), VecNormalize kwargs and the env's spec."""

from __future__ import annotations

import importlib
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from quarl.core.errors import QuarlError
from quarl.core.literals import parse_literal
from quarl.envs import EnvSpec, wrapper_names
from quarl.envs import wrappers as env_wrappers
from quarl.training.hp_checks import check_overrides, check_policy_name
from quarl.training.hyperparams import OWN_KEYS, TRAINERS, Hyperparams, SB3Kwargs, zoo_hyperparams

if TYPE_CHECKING:
    from stable_baselines3.common.noise import ActionNoise

log = logging.getLogger(__name__)

_CLASSES = {
    "nn.ReLU": ("torch.nn", "ReLU"),
    "nn.Tanh": ("torch.nn", "Tanh"),
    "nn.ELU": ("torch.nn", "ELU"),
    "nn.LeakyReLU": ("torch.nn", "LeakyReLU"),
    "nn.GELU": ("torch.nn", "GELU"),
    "nn.SiLU": ("torch.nn", "SiLU"),
    "th.optim.Adam": ("torch.optim", "Adam"),
    "th.optim.RMSprop": ("torch.optim", "RMSprop"),
    "RMSpropTFLike": ("stable_baselines3.common.sb2_compat.rmsprop_tf_like", "RMSpropTFLike"),
    "SmallCNN": ("quarl.policies.extractors", "SmallCNN"),
}
"""Class names that appear inside the zoo's policy_kwargs strings."""
_SCHEDULED = ("learning_rate", "clip_range", "clip_range_vf")
_CLASS_KWARGS = {"activation_fn": ("torch.nn", "Module", "an activation"),
                 "features_extractor_class": ("stable_baselines3.common.torch_layers", "BaseFeaturesExtractor",
                                              "a features extractor"),
                 "optimizer_class": ("torch.optim", "Optimizer", "an optimizer")}
"""policy_kwargs that SB3 calls as a class, and the class each must derive from."""

_NOTED: set[tuple[str, str]] = set()
"""(algo, env) pairs whose hyperparameter source was noted in this process."""


@dataclass
class TrainSetup:
    """What the zoo entry (plus the user's overrides) says about one training run."""

    raw: Hyperparams
    """The entry as written (saved as the run's config.yml)."""
    model_kwargs: SB3Kwargs
    """Keyword arguments of the SB3 algorithm (schedules and noise objects built)."""
    policy: str = "MlpPolicy"
    n_envs: int = 1
    n_timesteps: int | None = None
    normalize: SB3Kwargs | None = None
    """VecNormalize kwargs, or None for no normalization."""
    env_spec: EnvSpec = field(default_factory=lambda: EnvSpec("CartPole-v1"))


def _classes(value: Any, where: str) -> Any:
    """Replace allow-listed class names (kept as strings by parse_literal) by classes."""
    if isinstance(value, dict):
        return {k: _classes(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_classes(v, where) for v in value]
    if isinstance(value, str) and (value in _CLASSES or re.fullmatch(r"(nn|th)\.[\w.]+", value)):
        if value not in _CLASSES:
            raise QuarlError(f"{where} names {value!r}, which quarl does not map: allowed {', '.join(_CLASSES)}")
        module, attr = _CLASSES[value]
        return getattr(importlib.import_module(module), attr)
    return value


def check_policy_classes(policy_kwargs: object, where: str) -> None:
    """Each of ``policy_kwargs``' class arguments (``activation_fn``...) is, once
    :func:`_classes` mapped it, a class of the kind SB3 calls: a name it does not map
    (``'os.system'``, kept as text) reached SB3 as a string and died in a TypeError
    traceback when the network was built."""
    if not isinstance(policy_kwargs, dict):
        return
    for key, (module, base_name, kind) in _CLASS_KWARGS.items():
        if key not in policy_kwargs:
            continue
        value = policy_kwargs[key]
        base = getattr(importlib.import_module(module), base_name)
        extractor = importlib.import_module("stable_baselines3.common.torch_layers").BaseFeaturesExtractor

        def fits(cls: object) -> bool:  # an activation is a module, not a features extractor
            return isinstance(cls, type) and issubclass(cls, base) and (base is extractor or
                                                                        not issubclass(cls, extractor))

        if not fits(value):
            names = [name for name, (mod, attr) in _CLASSES.items()
                     if fits(getattr(importlib.import_module(mod), attr))]
            raise QuarlError(f"{where} {key}={value!r}: not {kind} quarl maps; allowed {', '.join(names)}")


def _schedule(key: str, value: object) -> object:
    from stable_baselines3.common.utils import LinearSchedule

    if isinstance(value, str):
        m = re.fullmatch(r"lin_([0-9.eE+-]+)", value)
        if not m:
            raise QuarlError(f"{key}={value!r} is not a schedule quarl knows: allowed a number or lin_<start>")
        return LinearSchedule(float(m.group(1)), 0.0, 1.0)
    return value


def _whole_numbers(algo: str, kwargs: Hyperparams) -> Hyperparams:
    """``kwargs`` with a whole float (``1e6``) made an int where SB3 declares an int."""
    import inspect

    params = inspect.signature(TRAINERS[algo].algo_class()).parameters
    return {k: int(v) if isinstance(v, float) and v.is_integer() and k in params
            and params[k].annotation in (int, int | None) else v for k, v in kwargs.items()}


def _note_source(algo: str, env_id: str, key: str | None) -> None:
    """Say, once a process, where the hyperparameters come from (a command checks the pair
    before it trains)."""
    if (algo, env_id) in _NOTED:
        return
    _NOTED.add((algo, env_id))
    if key is None:
        log.warning("note: the RL Zoo has no %s hyperparameters for %s; SB3 defaults are used", algo, env_id)
    elif key.startswith("quarl's"):
        log.warning("note: the RL Zoo has no %s hyperparameters for %s; using %s entry", algo, env_id, key)
    elif key != env_id:
        log.warning("note: using the RL Zoo's %s hyperparameters of %s for %s", algo, key, env_id)


def _model_kwargs(algo: str, env_id: str, raw: Hyperparams) -> SB3Kwargs:
    """The algorithm's constructor kwargs of the entry ``raw``: whole numbers as ints,
    schedules and allow-listed classes built from their literals."""
    kwargs = _whole_numbers(algo, {k: v for k, v in raw.items() if k not in OWN_KEYS})
    for k in _SCHEDULED:
        if k in kwargs:
            kwargs[k] = _schedule(k, kwargs[k])
    for k in ("policy_kwargs", "replay_buffer_kwargs"):
        if isinstance(kwargs.get(k), str):
            kwargs[k] = parse_literal(kwargs[k])
        if k in kwargs:
            kwargs[k] = _classes(kwargs[k], k)
    if "replay_buffer_class" in kwargs:
        raise QuarlError(f"the zoo's {algo} {env_id} entry needs replay_buffer_class "
                         f"{kwargs['replay_buffer_class']!r} (HER), which quarl does not train")
    if isinstance(kwargs.get("train_freq"), list):
        kwargs["train_freq"] = tuple(kwargs["train_freq"])
    if raw.get("callback"):
        log.warning("note: the zoo's callback %s is not used", raw["callback"])
    return kwargs


def _normalize_kwargs(raw: Hyperparams) -> SB3Kwargs | None:
    """VecNormalize's kwargs of the entry's ``normalize`` (its gamma, the algorithm's), or
    None for no normalization."""
    normalize = raw.get("normalize")
    if not normalize:
        return None
    parsed = parse_literal(normalize) if isinstance(normalize, str) else {}
    norm_kwargs: SB3Kwargs = parsed if isinstance(parsed, dict) else {}
    if "gamma" in raw:
        norm_kwargs["gamma"] = raw["gamma"]
    return norm_kwargs


def _action_noise(raw: Hyperparams, env_id: str, action_space: gym.spaces.Space[Any]) -> ActionNoise | None:
    """The exploration noise the entry's ``noise_type`` / ``noise_std`` name, or None."""
    noise_type = raw.get("noise_type")
    if not noise_type:
        return None
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    if not isinstance(action_space, gym.spaces.Box):
        raise QuarlError(f"noise_type={noise_type!r} needs a continuous action space, {env_id} has {action_space}")
    n = int(np.prod(action_space.shape))
    sigma = float(raw.get("noise_std", 0.1)) * np.ones(n)
    noise_classes: dict[str, type[NormalActionNoise | OrnsteinUhlenbeckActionNoise]] = {
        "normal": NormalActionNoise, "ornstein-uhlenbeck": OrnsteinUhlenbeckActionNoise}
    noise_cls = noise_classes.get(noise_type.strip())
    if noise_cls is None:
        raise QuarlError(f"noise_type {noise_type!r} is unknown: allowed normal, ornstein-uhlenbeck")
    return noise_cls(mean=np.zeros(n), sigma=sigma)


def prepare(
    algo: str, env_id: str, action_space: gym.spaces.Space[Any], overrides: Hyperparams | None = None
) -> TrainSetup:
    """The zoo's entry for ``algo`` / ``env_id`` with ``overrides`` on top, ready for SB3."""
    raw, key = zoo_hyperparams(algo, env_id)
    _note_source(algo, env_id, key)
    check_overrides(algo, overrides or {})
    raw = {**raw, **(overrides or {})}
    if "policy" in raw:
        check_policy_name(algo, raw["policy"], "--hp policy" if "policy" in (overrides or {}) else
                          f"the {algo} hyperparameters' policy")
    kwargs = _model_kwargs(algo, env_id, raw)
    check_policy_classes(kwargs.get("policy_kwargs"), "--hp policy_kwargs" if "policy_kwargs" in (overrides or {})
                         else f"the {algo} hyperparameters' policy_kwargs")
    norm_kwargs = _normalize_kwargs(raw)
    noise = _action_noise(raw, env_id, action_space)
    if noise is not None:
        kwargs["action_noise"] = noise
    spec = EnvSpec(
        env_id,
        env_kwargs=dict(raw.get("env_kwargs") or {}),
        wrappers=wrapper_names(raw.get("env_wrapper")),
        frame_stack=raw.get("frame_stack") or 1,
    )
    steps = raw.get("n_timesteps")
    return TrainSetup(
        raw=raw,
        model_kwargs=kwargs,
        policy=str(raw.get("policy", "CnnPolicy" if env_wrappers.has(spec.wrappers, "atari") else "MlpPolicy")),
        n_envs=int(raw.get("n_envs", 1)),
        n_timesteps=int(float(steps)) if steps is not None else None,
        normalize=norm_kwargs,
        env_spec=spec,
    )
