"""The RL Zoo's tuned hyperparameters, read from the files the ``rl_zoo3`` package ships
(``rl_zoo3/hyperparams/ALGO.yml``) and turned into Stable-Baselines3 constructor kwargs.

rl_zoo3 itself ``eval``s strings such as ``policy_kwargs: "dict(net_arch=[256, 256])"``
and patches gymnasium on import; quarl reads the files without importing the package and
parses those strings as literals, mapping the few class names that appear in them
through an allow-list.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml
from pydantic import ConfigDict, Field

from quarl.envs import wrappers as env_wrappers
from quarl.envs import EnvSpec, env_family, is_atari, wrapper_names
from quarl.core.errors import QuarlError
from quarl.core.file_schema import Record, parse_record
from quarl.core.limits import check_layer_sizes, read_capped
from quarl.core.literals import parse_literal

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Trainer:
    """An algorithm ``quarl train`` runs: its Stable-Baselines3 / sb3-contrib class and the
    action spaces it takes. Its hyperparameters come from rl_zoo3's ``<name>.yml``; the
    loader reads what it saves through :data:`quarl.policies.sb3.LAYOUTS`; QAT wraps its
    acting network (:func:`quarl.training.qat_sb3.qat_targets`). A new one is one entry."""

    name: str
    module: str
    cls: str
    actions: str = "both"
    """``discrete``, ``continuous`` or ``both``."""
    qat_refused: str = ""
    """Why quantization-aware training cannot run this algorithm (empty: it can)."""

    def algo_class(self) -> type:
        return getattr(importlib.import_module(self.module), self.cls)


TRAINERS: dict[str, Trainer] = {t.name: t for t in (
    Trainer("a2c", "stable_baselines3", "A2C"),
    Trainer("ppo", "stable_baselines3", "PPO"),
    Trainer("dqn", "stable_baselines3", "DQN", "discrete"),
    Trainer("ddpg", "stable_baselines3", "DDPG", "continuous"),
    Trainer("td3", "stable_baselines3", "TD3", "continuous"),
    Trainer("sac", "stable_baselines3", "SAC", "continuous"),
    Trainer("qrdqn", "sb3_contrib", "QRDQN", "discrete"),
    Trainer("tqc", "sb3_contrib", "TQC", "continuous"),
    Trainer("trpo", "sb3_contrib", "TRPO", qat_refused=(
        "trpo's natural-gradient step needs second derivatives, which fake quantization's straight-through "
        "estimator does not give (its line search divides by zero): train trpo without --qat-bits")),
)}
TRAIN_ALGOS = tuple(TRAINERS)
"""The trainers registered at import (the checks read :data:`TRAINERS` itself)."""


def register_trainer(trainer: Trainer) -> Trainer:
    """Add an algorithm ``quarl train`` runs (its hyperparameters come from rl_zoo3's
    ``<name>.yml`` or ``--hp``); a name already taken is refused."""
    if trainer.name in TRAINERS:
        raise QuarlError(f"a trainer named {trainer.name!r} is registered already")
    if trainer.actions not in ("discrete", "continuous", "both"):
        raise QuarlError(f"trainer {trainer.name!r}: actions {trainer.actions!r} is not discrete, continuous or both")
    TRAINERS[trainer.name] = trainer
    return trainer

# Class names that appear inside the zoo's policy_kwargs strings.
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
_MINATAR_POLICY = "dict(features_extractor_class='SmallCNN', net_arch=[])"
OWN_HYPERPARAMS: dict[str, dict[str, dict[str, Any]]] = {
    # MinAtar is not in the RL Zoo: settings after the MinAtar paper's (DQN) and CleanRL's
    # Atari PPO, scaled to 10x10 games; the small CNN is MinAtar's own network
    "minatar": {
        # DQN: one update per 4 steps (the MinAtar paper made one per step; 4x faster on a CPU)
        "dqn": {"policy": "CnnPolicy", "n_timesteps": 1_000_000, "learning_rate": 2.5e-4, "buffer_size": 100_000,
                "learning_starts": 5_000, "batch_size": 32, "train_freq": 4, "gradient_steps": 1,
                "target_update_interval": 1_000, "exploration_fraction": 0.1, "exploration_final_eps": 0.01,
                "policy_kwargs": _MINATAR_POLICY},
        "qrdqn": {"policy": "CnnPolicy", "n_timesteps": 1_000_000, "learning_rate": 2.5e-4, "buffer_size": 100_000,
                  "learning_starts": 5_000, "batch_size": 32, "train_freq": 4, "gradient_steps": 1,
                  "target_update_interval": 1_000, "exploration_fraction": 0.1, "exploration_final_eps": 0.01,
                  "policy_kwargs": _MINATAR_POLICY},
        # measured here on MinAtar/Breakout-v1 at 40k steps: PPO 5.3 (2.5e-4 and 128-step rollouts: 0.4 at 30k),
        # A2C 3.6
        "ppo": {"policy": "CnnPolicy", "n_timesteps": 1_000_000, "n_envs": 8, "n_steps": 64, "n_epochs": 4,
                "batch_size": 128, "learning_rate": 1e-3, "clip_range": 0.1, "ent_coef": 0.01, "vf_coef": 0.5,
                "policy_kwargs": _MINATAR_POLICY},
        "a2c": {"policy": "CnnPolicy", "n_timesteps": 1_000_000, "n_envs": 16, "learning_rate": 1e-3, "ent_coef": 0.01,
                "vf_coef": 0.25, "policy_kwargs": _MINATAR_POLICY},
    },
}
"""quarl's own entries for env families the RL Zoo has none for (family -> algo -> entry)."""
_SCHEDULED = ("learning_rate", "clip_range", "clip_range_vf")
# Keys quarl handles itself; everything else goes to the algorithm's constructor.
_OWN_KEYS = ("n_envs", "n_timesteps", "policy", "normalize", "env_wrapper", "frame_stack", "noise_type",
             "noise_std", "callback", "env_kwargs")


_NOTED: set[tuple[str, str]] = set()
"""(algo, env) pairs whose hyperparameter source was noted in this process."""


def zoo_hyperparams_dir() -> Path:
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise QuarlError("the rl_zoo3 package is not installed: it ships the tuned hyperparameters (pip install rl_zoo3)")
    return Path(list(spec.submodule_search_locations)[0]) / "hyperparams"


class ZooEntry(Record):
    """The keys of a zoo entry that quarl acts on itself (the others go to the algorithm's
    constructor, through :func:`check_hyperparameter`)."""

    model_config = ConfigDict(extra="allow")
    n_envs: int = Field(1, ge=1, le=1024)
    n_timesteps: int | float | None = Field(None, ge=1, le=10**10)
    policy: str = "MlpPolicy"
    normalize: bool | str = False
    frame_stack: int = Field(1, ge=1, le=64)
    env_wrapper: str | list[Any] | dict[str, Any] | None = None
    noise_type: str | None = None
    noise_std: float = Field(0.1, gt=0, le=1e6)
    env_kwargs: dict[str, Any] | None = None


ZOO_FILE_CAP = 16 << 20
"""Bytes of one rl_zoo3 hyperparameter file (the largest, ppo.yml, is ~20 kB)."""


def missing_statistics(algo: str, env_id: str, zip_name: str) -> str | None:
    """The one line to say where a bare zip plays without the VecNormalize statistics it
    was trained with: the RL Zoo's entry for ``algo`` on ``env_id`` normalizes, and a zip
    carries no statistics (they sit in its run folder's ``ENV/vecnormalize.pkl``). None
    where the zoo does not normalize (or has no entry, or rl_zoo3 is absent)."""
    try:
        raw, key = zoo_hyperparams(algo.lower(), env_id)
    except QuarlError:
        return None
    if not raw.get("normalize"):
        return None
    return (f"{zip_name} plays without observation normalization: the RL Zoo trains {algo.lower()} on {key} with "
            f"VecNormalize, whose statistics are not in the zip but in its run folder ({key}_1/{key}/vecnormalize.pkl); "
            "pass the run folder instead, or expect returns far from the trained agent's")


def zoo_hyperparams(algo: str, env_id: str) -> tuple[dict[str, Any], str | None]:
    """(raw zoo entry, the key it was found under) for ``algo`` on ``env_id``: the exact id,
    else the same env at another version, else the zoo's ``atari`` entry for Atari games.
    ``({}, None)`` when the zoo has none (SB3 defaults apply). The entry is checked as a
    :class:`ZooEntry` (one line naming the file, the entry and the field)."""
    path = zoo_hyperparams_dir() / f"{algo}.yml"
    if not path.exists():
        return {}, None
    try:
        table = yaml.safe_load(read_capped(path, ZOO_FILE_CAP, "the RL Zoo's hyperparameters")) or {}
    except yaml.YAMLError as exc:
        raise QuarlError(f"{path}: not YAML ({str(exc).splitlines()[0]}): reinstall rl_zoo3") from None
    if not isinstance(table, dict):
        raise QuarlError(f"{path}: a {type(table).__name__}, not a table of envs: reinstall rl_zoo3")
    found = _zoo_entry(table, env_id)
    if found is None:
        family = env_family(env_id).name
        if algo in OWN_HYPERPARAMS.get(family, {}):
            return dict(OWN_HYPERPARAMS[family][algo]), f"quarl's {family}"
        return {}, None
    entry, key = found
    parse_record(ZooEntry, entry, f"{path} [{key}]")
    return dict(entry), key


def _zoo_entry(table: dict, env_id: str) -> tuple[Any, str] | None:
    if env_id in table:
        return table[env_id], env_id
    name = env_id.rsplit("-v", 1)[0]
    versions = sorted((k for k in table if isinstance(k, str) and k.rsplit("-v", 1)[0] == name), reverse=True)
    if versions:
        return table[versions[0]], versions[0]
    if is_atari(env_id) and "atari" in table:
        return table["atari"], "atari"
    return None


@dataclass
class TrainSetup:
    """What the zoo entry (plus the user's overrides) says about one training run."""

    raw: dict[str, Any]
    """The entry as written (saved as the run's config.yml)."""
    model_kwargs: dict[str, Any]
    """Keyword arguments of the SB3 algorithm (schedules and noise objects built)."""
    policy: str = "MlpPolicy"
    n_envs: int = 1
    n_timesteps: int | None = None
    normalize: dict[str, Any] | None = None
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


def _schedule(key: str, value: Any) -> Any:
    from stable_baselines3.common.utils import LinearSchedule

    if isinstance(value, str):
        m = re.fullmatch(r"lin_([0-9.eE+-]+)", value)
        if not m:
            raise QuarlError(f"{key}={value!r} is not a schedule quarl knows: allowed a number or lin_<start>")
        return LinearSchedule(float(m.group(1)), 0.0, 1.0)
    return value


_SET_BY_QUARL = {
    "seed": "use --seed", "verbose": "quarl sets it (use -v)", "device": "quarl trains on the CPU",
    "tensorboard_log": "use --tensorboard", "action_noise": "use noise_type and noise_std",
    "rollout_buffer_class": "a class is not a --hp value", "replay_buffer_class": "a class is not a --hp value",
}
"""Constructor arguments quarl passes itself (a second value was SB3's TypeError) or that
take an object no literal can be."""
_OWN_TYPES: dict[str, Any] = {"n_envs": int, "n_timesteps": int, "frame_stack": int, "noise_std": float,
                              "noise_type": str, "normalize": bool | str | dict, "env_kwargs": dict | str}
"""The types of the keys quarl handles itself (``policy`` is checked against the algorithm's
policy names)."""


def _fits(value: Any, annotation: Any) -> bool:
    """Whether ``value`` (a literal from ``--hp``) is of SB3's ``annotation``: a whole
    number where it wants an int (``1e6`` included), a number for a float, a string for a
    schedule (``lin_<start>``) or a dict written as text; never a class or an object."""
    import collections.abc
    import types
    import typing

    if isinstance(annotation, (str, typing.ForwardRef)):
        return isinstance(annotation, str)  # a postponed annotation: not checked here (SB3 has none)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation is dict or origin is dict:
        return isinstance(value, (dict, str))  # a string is parsed as a literal dict later
    if origin is tuple:
        args = typing.get_args(annotation)
        return isinstance(value, (list, tuple)) and len(value) == len(args) and all(map(_fits, value, args))
    if annotation is collections.abc.Callable or origin is collections.abc.Callable:
        return isinstance(value, str)  # a schedule's name
    return False  # a class (type[...]) or an object (ActionNoise): nothing a literal is


def _describe(annotation: Any) -> str:
    import collections.abc
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_describe(a) for a in typing.get_args(annotation)))
    names = {type(None): "null", bool: "true or false", int: "a whole number", float: "a number", str: "a string",
             dict: "a dict"}
    if annotation in names:
        return names[annotation]
    if origin is dict:
        return "a dict"
    if origin is tuple:
        return f"a list [{', '.join(getattr(a, '__name__', str(a)) for a in typing.get_args(annotation))}]"
    if annotation is collections.abc.Callable or origin is collections.abc.Callable:
        return "a schedule (lin_<start>)"
    return getattr(annotation, "__name__", str(annotation))


def check_overrides(algo: str, overrides: dict[str, Any]) -> None:
    """Every override names a constructor argument of the SB3 algorithm (or a key quarl
    handles) that quarl does not set itself, of the type SB3 declares for it (a whole number
    where it wants an int, one of its policy names for ``policy``...), within its range:
    one line otherwise, before SB3 sees any."""
    import inspect

    cls = TRAINERS[algo].algo_class()
    params = inspect.signature(cls).parameters
    allowed = sorted(({p for p in params if not p.startswith("_")} - {"self", "policy", "env"} - set(_SET_BY_QUARL))
                     | set(_OWN_KEYS))
    for key, value in overrides.items():
        if key in _SET_BY_QUARL:
            raise QuarlError(f"--hp {key}: not settable ({_SET_BY_QUARL[key]}); allowed: {', '.join(allowed)}")
        if key not in allowed:
            raise QuarlError(f"--hp {key}: not a {algo} hyperparameter; allowed: {', '.join(allowed)}")
        if key == "policy":
            check_policy_name(algo, value, "--hp policy")
            continue
        default = params[key].default if key in params else None
        annotation = _OWN_TYPES.get(key) if key in _OWN_KEYS else params[key].annotation
        if annotation is None or annotation is inspect.Parameter.empty or _fits(value, annotation):
            pass
        elif isinstance(default, (int, float)) and not isinstance(default, bool) and isinstance(value, (bool, str)):
            raise QuarlError(f"--hp {key}={value!r}: {key} is a number (default {default!r})")
        else:
            raise QuarlError(f"--hp {key}={value!r}: {algo} takes {_describe(annotation)} for {key}"
                             + (f" (default {default!r})" if key in params else ""))
        check_hyperparameter(key, value)
    kwargs = overrides.get("policy_kwargs")
    if isinstance(kwargs, str):
        kwargs = parse_literal(kwargs)
    check_net_arch(kwargs, "--hp policy_kwargs")


def check_policy_name(algo: str, value: Any, what: str) -> None:
    """``value`` is one of the algorithm's policy names (``MlpPolicy``, ``CnnPolicy``...):
    ``os.system`` or a class path never reaches SB3."""
    names = list(getattr(TRAINERS[algo].algo_class(), "policy_aliases", {}) or {})
    if not isinstance(value, str) or value not in names:
        raise QuarlError(f"{what}={value!r}: not a {algo} policy; allowed: {', '.join(names)}")


def _whole_numbers(algo: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with a whole float (``1e6``) made an int where SB3 declares an int."""
    import inspect

    params = inspect.signature(TRAINERS[algo].algo_class()).parameters
    return {k: int(v) if isinstance(v, float) and v.is_integer() and k in params
            and params[k].annotation in (int, int | None) else v for k, v in kwargs.items()}


def _space_values(space: gym.spaces.Space) -> list[tuple[int, int]]:
    """(values, bytes a value) of each array a buffer stores for ``space`` (one per key of
    a Dict space)."""
    if isinstance(space, gym.spaces.Dict):
        return [part for sub in space.spaces.values() for part in _space_values(sub)]
    if isinstance(space, gym.spaces.Discrete):
        return [(1, np.dtype(space.dtype).itemsize)]
    if isinstance(space, gym.spaces.MultiDiscrete):
        return [(int(np.prod(space.nvec.shape)), np.dtype(space.dtype).itemsize)]
    if isinstance(space, gym.spaces.MultiBinary):
        return [(int(np.prod(space.shape or (space.n,))), np.dtype(space.dtype).itemsize)]
    return [(int(np.prod(space.shape or ())), np.dtype(space.dtype or np.float32).itemsize)]


def buffer_memory(algo: str, setup: "TrainSetup", observation_space: gym.spaces.Space,
                  action_space: gym.spaces.Space) -> tuple[str, int, int, int] | None:
    """(key, its value, bytes per unit of it, bytes in all) of the buffer SB3 allocates
    for this run: the replay buffer of an off-policy algorithm (``buffer_size``
    transitions: observation and next observation in the space's dtype, unless
    ``optimize_memory_usage``; action, reward, done and timeout) or the rollout buffer of an
    on-policy one (``n_steps`` x ``n_envs`` rows of observation, action and six float32
    scalars); None for an algorithm with neither."""
    import inspect

    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    cls = TRAINERS[algo].algo_class()
    params = inspect.signature(cls).parameters
    kwargs = setup.model_kwargs
    obs = sum(n * b for n, b in _space_values(observation_space))
    actions = sum(n for n, _ in _space_values(action_space))
    action_dtype = np.dtype(action_space.dtype or np.float32)
    if issubclass(cls, OffPolicyAlgorithm):
        size = int(kwargs.get("buffer_size", params["buffer_size"].default))
        size = max(size // setup.n_envs, 1) * setup.n_envs
        copies = 1 if kwargs.get("optimize_memory_usage") else 2
        stored = 4 if action_dtype == np.float64 else action_dtype.itemsize  # SB3 stores float64 actions as float32
        unit = copies * obs + actions * stored + 3 * 4
        return "buffer_size", size, unit, size * unit
    if issubclass(cls, OnPolicyAlgorithm):
        steps = int(kwargs.get("n_steps", params["n_steps"].default))
        unit = setup.n_envs * (obs + actions * action_dtype.itemsize + 6 * 4)
        return "n_steps", steps, unit, steps * unit
    return None


def check_buffer_memory(algo: str, setup: "TrainSetup", observation_space: gym.spaces.Space,
                        action_space: gym.spaces.Space, overrides: dict[str, Any] | None = None) -> None:
    """Refuse in one line a run whose replay or rollout buffer (:func:`buffer_memory`) would
    take more than this machine's memory (``n_steps=1e10`` asked for 1.16 TiB, a
    ``buffer_size=1e10`` replay for 149 GiB), naming the value and the largest that fits."""
    from quarl.core.limits import machine_memory

    priced = buffer_memory(algo, setup, observation_space, action_space)
    if priced is None:
        return
    key, value, unit, total = priced
    memory = machine_memory()
    if total > memory:
        source = "--hp " if key in (overrides or {}) else f"the {algo} hyperparameters' "
        what = ("replay buffer" if key == "buffer_size" else
                f"rollout buffer ({setup.n_envs} env{'s' if setup.n_envs > 1 else ''})")
        raise QuarlError(f"{source}{key}={value:,}: the {what} would take {total / 2**30:,.1f} GiB "
                         f"({unit:,} bytes a {'transition' if key == 'buffer_size' else 'step'}), more than this "
                         f"machine's {memory / 2**30:,.1f} GiB of memory: refused (at most {key}={memory // unit:,})")


def check_net_arch(policy_kwargs: Any, what: str) -> None:
    """A ``net_arch`` priced before SB3 builds it (layer widths bounded by the machine's memory)."""
    arch = policy_kwargs.get("net_arch") if isinstance(policy_kwargs, dict) else None
    widths = arch.get("pi", []) + arch.get("qf", arch.get("vf", [])) if isinstance(arch, dict) else arch
    if isinstance(widths, list) and all(isinstance(w, int) and not isinstance(w, bool) for w in widths):
        check_layer_sizes((1, *widths, 1), f"{what} net_arch {arch}")


_COUNTS = {"n_envs": 1, "n_timesteps": 1, "batch_size": 1, "n_steps": 1, "n_epochs": 1, "buffer_size": 1,
           "learning_starts": 0, "target_update_interval": 1, "n_quantiles": 1, "n_critics": 1, "policy_delay": 1,
           "n_delta": 1, "cg_max_steps": 1}
"""Hyperparameters that count something, and their least value (SB3 checks few of them, late)."""
_UNIT = ("gamma", "gae_lambda", "tau", "exploration_fraction", "exploration_initial_eps", "exploration_final_eps",
         "clip_range")
_MAX_COUNT = 10**10
_MAX_OF = {"n_envs": 1024, "n_epochs": 10_000, "n_critics": 64, "n_quantiles": 10_000, "n_delta": 100_000,
           "cg_max_steps": 10_000}
"""Counts with a tighter bound: each env is a process-worth of state (100,000 envs took 1.5 GB
before a step), each critic or quantile a network's output."""


def check_hyperparameter(key: str, value: Any) -> None:
    """One line for a value SB3 would take and fail on later (or never): counts below their
    least value or absurdly large, non-finite numbers, fractions outside [0, 1], a
    non-positive learning rate."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not np.isfinite(value):
        raise QuarlError(f"--hp {key}={value}: must be a finite number")
    if key in _COUNTS:
        most = _MAX_OF.get(key, _MAX_COUNT)
        if value != int(value) or not _COUNTS[key] <= value <= most:
            raise QuarlError(f"--hp {key}={value}: must be a whole number in {_COUNTS[key]}..{most:,}")
    elif key in _UNIT and not 0 <= value <= 1:
        raise QuarlError(f"--hp {key}={value}: must be in [0, 1]")
    elif key == "learning_rate" and not value > 0:
        raise QuarlError(f"--hp {key}={value}: must be > 0")


def prepare(
    algo: str, env_id: str, action_space: gym.spaces.Space, overrides: dict[str, Any] | None = None
) -> TrainSetup:
    """The zoo's entry for ``algo`` / ``env_id`` with ``overrides`` on top, ready for SB3."""
    raw, key = zoo_hyperparams(algo, env_id)
    if (algo, env_id) not in _NOTED:  # once a process: a command checks the pair before it trains
        _NOTED.add((algo, env_id))
        if key is None:
            log.warning("note: the RL Zoo has no %s hyperparameters for %s; SB3 defaults are used", algo, env_id)
        elif key.startswith("quarl's"):
            log.warning("note: the RL Zoo has no %s hyperparameters for %s; using %s entry", algo, env_id, key)
        elif key != env_id:
            log.warning("note: using the RL Zoo's %s hyperparameters of %s for %s", algo, key, env_id)
    check_overrides(algo, overrides or {})
    raw = {**raw, **(overrides or {})}
    if "policy" in raw:
        check_policy_name(algo, raw["policy"], "--hp policy" if "policy" in (overrides or {}) else
                          f"the {algo} hyperparameters' policy")
    kwargs = _whole_numbers(algo, {k: v for k, v in raw.items() if k not in _OWN_KEYS})
    for k in _SCHEDULED:
        if k in kwargs:
            kwargs[k] = _schedule(k, kwargs[k])
    for k in ("policy_kwargs", "replay_buffer_kwargs"):
        if isinstance(kwargs.get(k), str):
            kwargs[k] = parse_literal(kwargs[k])
        if k in kwargs:
            kwargs[k] = _classes(kwargs[k], k)
    if "replay_buffer_class" in kwargs:
        raise QuarlError(f"the zoo's {algo} {env_id} entry needs replay_buffer_class {kwargs['replay_buffer_class']!r} (HER), which quarl does not train")
    if isinstance(kwargs.get("train_freq"), list):
        kwargs["train_freq"] = tuple(kwargs["train_freq"])
    if raw.get("callback"):
        log.warning("note: the zoo's callback %s is not used", raw["callback"])

    normalize = raw.get("normalize")
    norm_kwargs: dict[str, Any] | None = None
    if normalize:
        norm_kwargs = parse_literal(normalize) if isinstance(normalize, str) else {}
        if not isinstance(norm_kwargs, dict):
            norm_kwargs = {}
        if "gamma" in raw:
            norm_kwargs["gamma"] = raw["gamma"]

    noise_type = raw.get("noise_type")
    if noise_type:
        from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

        if not isinstance(action_space, gym.spaces.Box):
            raise QuarlError(f"noise_type={noise_type!r} needs a continuous action space, {env_id} has {action_space}")
        n = int(np.prod(action_space.shape))
        sigma = float(raw.get("noise_std", 0.1)) * np.ones(n)
        noise_cls = {"normal": NormalActionNoise, "ornstein-uhlenbeck": OrnsteinUhlenbeckActionNoise}.get(noise_type.strip())
        if noise_cls is None:
            raise QuarlError(f"noise_type {noise_type!r} is unknown: allowed normal, ornstein-uhlenbeck")
        kwargs["action_noise"] = noise_cls(mean=np.zeros(n), sigma=sigma)

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
