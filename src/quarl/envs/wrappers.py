"""The env wrappers an RL Zoo config may name in ``env_wrapper``, built through an
allow-list: a class path maps to a quarl name, a builder and the keyword arguments it
accepts. Nothing is imported by name from the config and nothing is evaluated.

A wrapper in an :class:`~quarl.envs.EnvSpec` is its name (no arguments) or
``(name, ((key, value), ...))``, so specs stay hashable and JSON-friendly. Evaluation
builds them exactly as training did, as the RL Zoo's player does: an Atari agent still sees a
lost life as the end of its episode (and FIRE starts the next life), while evaluation plays
on to the end of the game and scores it inside the wrappers (raw rewards, the game's score;
:class:`quarl.envs.GameScore`).

Adding a kind is one :data:`KINDS` entry (``KINDS.register(name, WrapperKind(...))``) (and its test in
``tests/test_env_wrappers.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from quarl.core.errors import QuarlError
from quarl.core.registry import Registry

Wrapper = str | tuple[str, tuple[tuple[str, Any], ...]]


@dataclass(frozen=True)
class WrapperKind:
    build: Callable[..., gym.Env]
    """(env, **kwargs) -> wrapped env; imports its package when called."""
    kwargs: tuple[str, ...]
    """The keyword arguments a config may pass."""
    paths: tuple[str, ...]
    """Class paths that name it in RL Zoo configs."""
    scores_games: bool = False
    """The agent's episode may be part of a game (a life): evaluation plays whole games and
    takes the game's score from inside the wrappers, as the RL Zoo's ``Monitor`` does."""


def _time_feature(env: gym.Env, **kw: Any) -> gym.Env:
    from sb3_contrib.common.wrappers import TimeFeatureWrapper

    return TimeFeatureWrapper(env, **kw)


def _atari(env: gym.Env, **kw: Any) -> gym.Env:
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    return AtariWrapper(env, **kw)


def _zoo(name: str) -> Callable[..., gym.Env]:
    def build(env: gym.Env, **kw: Any) -> gym.Env:
        from rl_zoo3 import wrappers

        return getattr(wrappers, name)(env, **kw)

    return build


def _time_limit(env: gym.Env, **kw: Any) -> gym.Env:
    return gym.wrappers.TimeLimit(env, **kw)


def _grayscale(env: gym.Env, **kw: Any) -> gym.Env:
    return gym.wrappers.GrayscaleObservation(env, **kw)


def _minigrid_flat(env: gym.Env, **kw: Any) -> gym.Env:
    try:
        from minigrid.wrappers import FlatObsWrapper
    except ImportError:
        raise QuarlError("env wrapper minigrid.wrappers.FlatObsWrapper needs the minigrid package: "
                         "pip install minigrid") from None
    return FlatObsWrapper(env, **kw)


KINDS: Registry[WrapperKind] = Registry("env wrapper", {
    "time_feature": WrapperKind(_time_feature, ("max_steps", "test_mode"), (
        "sb3_contrib.common.wrappers.TimeFeatureWrapper", "rl_zoo3.wrappers.TimeFeatureWrapper",
        "utils.wrappers.TimeFeatureWrapper")),
    "atari": WrapperKind(_atari, ("noop_max", "frame_skip", "screen_size", "terminal_on_life_loss", "clip_reward",
                                  "action_repeat_probability"),
                         ("stable_baselines3.common.atari_wrappers.AtariWrapper",), scores_games=True),
    "frame_skip": WrapperKind(_zoo("FrameSkip"), ("skip",), ("rl_zoo3.wrappers.FrameSkip", "utils.wrappers.FrameSkip")),
    "history": WrapperKind(_zoo("HistoryWrapper"), ("horizon",),
                           ("rl_zoo3.wrappers.HistoryWrapper", "utils.wrappers.HistoryWrapper")),
    "history_obs_dict": WrapperKind(_zoo("HistoryWrapperObsDict"), ("horizon",),
                                    ("rl_zoo3.wrappers.HistoryWrapperObsDict", "utils.wrappers.HistoryWrapperObsDict")),
    "time_limit": WrapperKind(_time_limit, ("max_episode_steps",), (
        "gymnasium.wrappers.time_limit.TimeLimit", "gymnasium.wrappers.TimeLimit", "gym.wrappers.time_limit.TimeLimit",
        "gym.wrappers.TimeLimit")),
    "resize_observation": WrapperKind(_zoo("YAMLCompatResizeObservation"), ("shape",),
                                      ("rl_zoo3.wrappers.YAMLCompatResizeObservation",)),
    "grayscale": WrapperKind(_grayscale, ("keep_dim",), (
        "gymnasium.wrappers.transform_observation.GrayscaleObservation", "gymnasium.wrappers.GrayscaleObservation")),
    "delayed_reward": WrapperKind(_zoo("DelayedRewardWrapper"), ("delay",), ("rl_zoo3.wrappers.DelayedRewardWrapper",)),
    "mask_velocity": WrapperKind(_zoo("MaskVelocityWrapper"), (), ("rl_zoo3.wrappers.MaskVelocityWrapper",)),
    "truncated_on_success": WrapperKind(_zoo("TruncatedOnSuccessWrapper"), ("reward_offset", "n_successes"),
                                        ("rl_zoo3.wrappers.TruncatedOnSuccessWrapper",)),
    "action_noise": WrapperKind(_zoo("ActionNoiseWrapper"), ("noise_std",), ("rl_zoo3.wrappers.ActionNoiseWrapper",)),
    "action_smoothing": WrapperKind(_zoo("ActionSmoothingWrapper"), ("smoothing_coef",),
                                    ("rl_zoo3.wrappers.ActionSmoothingWrapper",)),
    "minigrid_flat_obs": WrapperKind(_minigrid_flat, ("max_words_in_mission",), ("minigrid.wrappers.FlatObsWrapper",)),
})
"""Every wrapper kind by quarl's name (a kind's entry is its builder, arguments and class paths)."""

_REFUSED = {
    "ae.wrapper.AutoencoderWrapper": "it needs a trained autoencoder from the aae-train-donkeycar project",
}


def name_and_kwargs(wrapper: Wrapper) -> tuple[str, dict[str, Any]]:
    if isinstance(wrapper, str):
        return wrapper, {}
    return wrapper[0], dict(wrapper[1])


def canonical(wrapper: Any) -> Wrapper:
    """A spec entry checked against the allow-list: its name alone when it has no
    arguments, else (name, sorted argument pairs)."""
    if isinstance(wrapper, (list, tuple)) and len(wrapper) == 2 and isinstance(wrapper[0], str):
        name, kwargs = wrapper[0], dict(wrapper[1] or ())
    elif isinstance(wrapper, str):
        name, kwargs = wrapper, {}
    else:
        raise QuarlError(f"env wrapper {wrapper!r} is not a name or a (name, arguments) pair")
    allowed_kwargs = KINDS.lookup(name).kwargs
    bad = sorted(set(kwargs) - set(allowed_kwargs))
    if bad:
        allowed = ", ".join(allowed_kwargs) or "none"
        raise QuarlError(f"env wrapper {name} does not take {bad[0]!r}: allowed {allowed}")
    return name if not kwargs else (name, tuple(sorted((k, _plain(v)) for k, v in kwargs.items())))


def _plain(value: Any) -> Any:
    return tuple(_plain(v) for v in value) if isinstance(value, (list, tuple)) else value


def from_zoo(entry: object) -> tuple[Wrapper, ...]:
    """Wrappers from a zoo config's ``env_wrapper``: a class path, a list of them, or a
    list of ``{class path: {argument: value}}``."""
    if entry is None:
        return ()
    items = entry if isinstance(entry, list) else [entry]
    out = []
    for item in items:
        if isinstance(item, dict):
            if len(item) != 1:
                raise QuarlError(f"env_wrapper entry {item!r} must name one wrapper")
            path, kwargs = next(iter(item.items()))
        else:
            path, kwargs = str(item), None
        if path in _REFUSED:
            raise QuarlError(f"env wrapper {path} is not supported: {_REFUSED[path]}")
        by_path = {path: name for name, kind in KINDS.items() for path in kind.paths}
        if path not in by_path:
            raise QuarlError(f"env wrapper {path!r} is not supported: allowed {', '.join(sorted(by_path))}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise QuarlError(f"env wrapper {path} arguments {kwargs!r} must be a mapping")
        out.append(canonical((by_path[path], kwargs or {})))
    return tuple(out)


def apply(env: gym.Env, wrappers: tuple[Wrapper, ...]) -> gym.Env:
    """``env`` wrapped in order, as training built it."""
    for wrapper in wrappers:
        name, kwargs = name_and_kwargs(wrapper)
        kind = KINDS[name]
        if name == "resize_observation" and "shape" in kwargs:
            kwargs["shape"] = list(kwargs["shape"])
        try:
            env = kind.build(env, **kwargs)
        except (TypeError, ValueError, AssertionError) as exc:
            raise QuarlError(f"env wrapper {name} with {kwargs} does not fit this env: {exc}") from None
    return env


def scores_games(wrappers: tuple[Wrapper, ...]) -> bool:
    """Whether an episode of these wrappers' agent may end before the game does."""
    return any(KINDS[name_and_kwargs(w)[0]].scores_games for w in wrappers)


def has(wrappers: tuple[Wrapper, ...], name: str) -> bool:
    return any(name_and_kwargs(w)[0] == name for w in wrappers)
