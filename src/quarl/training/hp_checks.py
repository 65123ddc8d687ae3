"""``--hp`` overrides checked before Stable-Baselines3 sees any: each names a constructor
argument of the algorithm (or a key quarl handles itself), of the type SB3 declares for it,
within its range; a ``net_arch`` is priced against the machine's memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from quarl.core.errors import QuarlError
from quarl.core.limits import check_layer_sizes
from quarl.core.literals import parse_literal
from quarl.training.hyperparams import OWN_KEYS, TRAINERS, Hyperparams

_SET_BY_QUARL = {
    "seed": "use --seed", "verbose": "quarl sets it (use -v)", "device": "quarl trains on the CPU",
    "tensorboard_log": "use --tensorboard", "action_noise": "use noise_type and noise_std",
    "rollout_buffer_class": "a class is not a --hp value", "replay_buffer_class": "a class is not a --hp value",
}
"""Constructor arguments quarl passes itself (a second value was SB3's TypeError) or that
take an object no literal can be."""
_OWN_TYPES: dict[str, object] = {"n_envs": int, "n_timesteps": int, "frame_stack": int, "noise_std": float,
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


def check_overrides(algo: str, overrides: Hyperparams) -> None:
    """Every override names a constructor argument of the SB3 algorithm (or a key quarl
    handles) that quarl does not set itself, of the type SB3 declares for it (a whole number
    where it wants an int, one of its policy names for ``policy``...), within its range:
    one line otherwise, before SB3 sees any."""
    import inspect

    cls = TRAINERS[algo].algo_class()
    params = inspect.signature(cls).parameters
    allowed = sorted(({p for p in params if not p.startswith("_")} - {"self", "policy", "env"} - set(_SET_BY_QUARL))
                     | set(OWN_KEYS))
    for key, value in overrides.items():
        if key in _SET_BY_QUARL:
            raise QuarlError(f"--hp {key}: not settable ({_SET_BY_QUARL[key]}); allowed: {', '.join(allowed)}")
        if key not in allowed:
            raise QuarlError(f"--hp {key}: not a {algo} hyperparameter; allowed: {', '.join(allowed)}")
        if key == "policy":
            check_policy_name(algo, value, "--hp policy")
            continue
        default = params[key].default if key in params else None
        annotation = _OWN_TYPES.get(key) if key in OWN_KEYS else params[key].annotation
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

