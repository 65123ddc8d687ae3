"""The env families :func:`quarl.envs.make_env` builds through: a registry asked newest first,
and the built-in families with what each takes (``gymnasium``: classic control, Box2D,
MuJoCo; ``atari``: ALE ids registered on first use; ``minatar``: channel-first float frames,
each episode a function of its seed; ``dm_control``: shimmy, observations flattened to
float32; ``pybullet``: pybullet-envs-gymnasium, its C code's prints kept off stdout). A new
family is one :func:`register_env_family`."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from quarl.core.errors import QuarlError
from quarl.core.registry import Registry
from quarl.envs import wrappers as env_wrappers


def identity(env: gym.Env) -> gym.Env:
    """The env as it is (a family that adapts nothing)."""
    return env


@dataclass(frozen=True)
class EnvFamily:
    """A family of env ids and what it takes to make them: evaluation, training and ActorQ
    all build envs through :func:`make_env`, which asks the first family that claims an id.
    Adding a family (a simulator, a suite) is one :func:`register_env_family` call."""

    name: str
    claims: Callable[[str], bool]
    """Whether an env id belongs to this family."""
    register: Callable[[], None] = lambda: None
    """Makes the family's ids known to gymnasium (called before an id is checked; once is enough)."""
    make_kwargs: Callable[[str, dict, tuple], dict] = lambda env_id, kwargs, wrappers: kwargs
    """``(id, env kwargs, wrappers) -> kwargs for gym.make``."""
    adapt: Callable[[gym.Env], gym.Env] = identity
    """Turns the made env (after the zoo's wrappers) into what a policy reads: a Box observation."""
    on_made: Callable[[gym.Env], gym.Env] = identity
    """Wraps the bare env first, inside every other wrapper (PyBullet's quiet first reset)."""
    sticky: str | None = None
    """The env kwarg that sets the probability of repeating the previous action (sticky
    actions, Machado et al. 2018), where the family has one."""


ENV_FAMILIES: Registry[EnvFamily] = Registry("env family", newest_first=True)
"""Asked in order, newest registered first; ``gymnasium`` (any registered id) is last."""


def register_env_family(family: EnvFamily) -> EnvFamily:
    """Add a family, asked before those registered earlier; returns it."""
    return ENV_FAMILIES.register(family.name, family)


def env_family(env_id: str) -> EnvFamily:
    """The first family that claims ``env_id`` (``gymnasium`` claims every id)."""
    return next(f for f in ENV_FAMILIES.values() if f.claims(env_id))


def is_atari(env_id: str) -> bool:
    return "NoFrameskip" in env_id or env_id.startswith("ALE/")


@functools.cache
def _register_ale() -> None:
    try:
        import ale_py

        gym.register_envs(ale_py)
    except ImportError:  # pragma: no cover - ale-py is a dependency
        pass


@functools.cache
def _register_dm_control() -> None:
    try:
        import shimmy

        gym.register_envs(shimmy)
    except ImportError:  # pragma: no cover - shimmy[dm-control] is a dependency
        pass


def _atari_kwargs(env_id: str, kwargs: dict, wrappers: tuple) -> dict:
    if env_wrappers.has(wrappers, "atari") and env_id.startswith("ALE/"):
        return {"frameskip": 1, **kwargs}  # AtariWrapper skips frames itself
    return kwargs


def _flat_float32(env: gym.Env) -> gym.Env:
    """The DeepMind Control Suite's dict of arrays as one float32 vector."""
    if not isinstance(env.observation_space, gym.spaces.Dict):
        return env
    env = gym.wrappers.FlattenObservation(env)
    return gym.wrappers.TransformObservation(
        env, lambda o: o.astype(np.float32), gym.spaces.Box(-np.inf, np.inf, env.observation_space.shape, np.float32)
    )


@functools.cache
def _register_minatar() -> None:
    try:
        from minatar.gym import register_envs
    except ImportError:  # pragma: no cover - minatar is a dependency
        return
    if "MinAtar/Breakout-v1" not in gym.registry:
        register_envs()


class _ForgetLastAction(gym.Wrapper):
    """MinAtar keeps its last action across resets, and its sticky actions (p = 0.1) repeat
    it, so the first action of an episode could be the previous episode's last: an episode
    then depended on the one played before it on that env, and a MinAtar return on how many
    envs played side by side (measured: episode 5 of a DQN Breakout agent scored 4 after
    episodes 0-4 on one env, 2 on a fresh one). Each reset forgets it, as a new env does."""

    def reset(self, **kwargs):
        game = getattr(self.env.unwrapped, "game", None)
        if game is not None and hasattr(game, "last_action"):
            game.last_action = 0
        return self.env.reset(**kwargs)


def _minatar_frames(env: gym.Env) -> gym.Env:
    """MinAtar's (10, 10, C) boolean frames as channel-first float32 in [0, 1], the layout
    SB3's CNN policies read (a float Box: SB3 neither transposes nor rescales it); every
    episode a function of its seed alone (:class:`_ForgetLastAction`)."""
    env = _ForgetLastAction(env)
    h, w, c = env.observation_space.shape or (10, 10, 0)
    space = gym.spaces.Box(0.0, 1.0, (c, h, w), np.float32)
    return gym.wrappers.TransformObservation(env, lambda o: np.ascontiguousarray(o.transpose(2, 0, 1), np.float32),
                                             space)


def is_pybullet(env_id: str) -> bool:
    return "BulletEnv-" in env_id


@functools.cache
def _register_pybullet() -> None:
    """pybullet-envs-gymnasium registers the ids on import (its banner goes to stderr, kept quiet)."""
    with _quiet_fd(1), _quiet_fd(2):
        try:
            import pybullet  # noqa: F401  (its build-time banner is printed on this first import)
            import pybullet_envs_gymnasium  # noqa: F401
        except ImportError as exc:  # pragma: no cover - a dependency
            raise QuarlError(f"PyBullet envs need pybullet and pybullet-envs-gymnasium ({exc})") from None


@contextlib.contextmanager
def _quiet_fd(fd: int):
    """Send what C code writes to ``fd`` to /dev/null meanwhile (pybullet prints from C)."""
    import os
    import sys

    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        stream.flush()
        _libc_flush()  # C stdio buffers what it printed: out now, while fd still goes nowhere
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def _libc_flush() -> None:
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - no C library to ask
        pass


class _QuietConnect(gym.Wrapper):
    """A PyBullet env connects to its physics server on its first reset, and pybullet's C
    code prints ``argv[0]=`` to stdout then: into a table or a CSV piped from quarl. That
    reset runs with stdout silenced."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._connected = False

    def reset(self, **kwargs):
        if self._connected:
            return self.env.reset(**kwargs)
        with _quiet_fd(1):
            out = self.env.reset(**kwargs)
        self._connected = True
        return out


register_env_family(EnvFamily("gymnasium", lambda env_id: True))  # classic control, Box2D, MuJoCo: gymnasium's own
register_env_family(EnvFamily("atari", is_atari, _register_ale, _atari_kwargs, sticky="repeat_action_probability"))
register_env_family(EnvFamily("minatar", lambda env_id: env_id.startswith("MinAtar/"), _register_minatar,
                              adapt=_minatar_frames, sticky="sticky_action_prob"))
register_env_family(EnvFamily("dm_control", lambda env_id: env_id.startswith("dm_control/"), _register_dm_control,
                              adapt=_flat_float32))
register_env_family(EnvFamily("pybullet", is_pybullet, _register_pybullet, on_made=_QuietConnect))
