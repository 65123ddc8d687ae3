"""One ``make_env`` for gymnasium ids: classic control, Box2D, MuJoCo and Atari (ALE).

An :class:`EnvSpec` says how a policy's env was built (RL Zoo ``config.yml``: env
wrappers, frame stacking, env kwargs) so that evaluation rebuilds the same observations.
Old ids that gymnasium no longer makes (MuJoCo ``-v2``/``-v3`` needed mujoco-py,
``LunarLander-v2`` became ``-v3``) are mapped to current ones, with a log note.
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from quarl import env_wrappers
from quarl.errors import QuarlError

log = logging.getLogger(__name__)

_MUJOCO = (
    "Ant HalfCheetah Hopper Humanoid HumanoidStandup InvertedDoublePendulum InvertedPendulum "
    "Pusher Reacher Swimmer Walker2d"
).split()
_RENAMED = {
    "LunarLander-v2": "LunarLander-v3",
    "LunarLanderContinuous-v2": "LunarLanderContinuous-v3",
    "BipedalWalker-v2": "BipedalWalker-v3",
    "BipedalWalkerHardcore-v2": "BipedalWalkerHardcore-v3",
    "CarRacing-v0": "CarRacing-v3",
    "CarRacing-v1": "CarRacing-v3",
    "CarRacing-v2": "CarRacing-v3",
    "Pendulum-v0": "Pendulum-v1",
}

WRAPPERS = tuple(env_wrappers.KINDS)
"""Env wrappers quarl applies by name (from a zoo config's ``env_wrapper``)."""

_registered_ale = False
_noted: set[str] = set()


def _register_ale() -> None:
    global _registered_ale
    if not _registered_ale:
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:  # pragma: no cover - ale-py is a dependency
            pass
        _registered_ale = True


def current_env_id(env_id: str) -> str:
    """The id gymnasium makes today for ``env_id`` (zoo ids from older gym versions)."""
    if env_id in _RENAMED:
        new = _RENAMED[env_id]
    else:
        m = re.fullmatch(r"(\w+)-v([23])", env_id)
        new = f"{m.group(1)}-v4" if m and m.group(1) in _MUJOCO else env_id
    if new != env_id and env_id not in _noted:
        _noted.add(env_id)
        log.warning("note: env %s is run as %s (the old id needs a gym release that is gone)", env_id, new)
    return new


def is_atari(env_id: str) -> bool:
    return "NoFrameskip" in env_id or env_id.startswith("ALE/")


def _register_dm_control() -> None:
    try:
        import shimmy

        gym.register_envs(shimmy)
    except ImportError:  # pragma: no cover - shimmy[dm-control] is a dependency
        pass


def check_env_id(env_id: str) -> str:
    """Return the id to make, or raise a one-line error naming ``env_id``."""
    if is_atari(env_id):
        _register_ale()
    if env_id.startswith("dm_control/") and env_id not in gym.registry:
        _register_dm_control()
    new = current_env_id(env_id)
    if new not in gym.registry:
        close = difflib.get_close_matches(new, list(gym.registry), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise QuarlError(f"unknown env id {env_id!r}: not a registered gymnasium id{hint}")
    return new


def wrapper_names(spec: object) -> tuple[env_wrappers.Wrapper, ...]:
    """Wrappers (with their arguments) from a zoo ``env_wrapper`` entry."""
    return env_wrappers.from_zoo(spec)


@dataclass(frozen=True)
class EnvSpec:
    """How to build the env a policy acts in."""

    env_id: str
    env_kwargs: dict = field(default_factory=dict)
    wrappers: tuple[env_wrappers.Wrapper, ...] = ()
    """Names from :data:`WRAPPERS` (or (name, arguments) pairs), applied in order."""
    frame_stack: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "wrappers", tuple(env_wrappers.canonical(w) for w in self.wrappers))
        if self.frame_stack < 1:
            raise QuarlError(f"frame_stack={self.frame_stack} must be at least 1")


def make_env(spec: EnvSpec) -> gym.Env:
    """Build one env (no vectorization; :mod:`quarl.evaluation` batches them)."""
    env_id = check_env_id(spec.env_id)
    kwargs = dict(spec.env_kwargs)
    atari = env_wrappers.has(spec.wrappers, "atari")
    if atari and env_id.startswith("ALE/"):
        kwargs.setdefault("frameskip", 1)  # AtariWrapper skips frames itself
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        raise QuarlError(f"env {env_id!r} needs a package that is missing: {exc}") from None
    except TypeError as exc:
        raise QuarlError(f"env {env_id!r} rejects env kwargs {kwargs}: {exc}") from None
    env = env_wrappers.apply(env, spec.wrappers)  # Atari: whole games, unclipped scores
    if isinstance(env.observation_space, gym.spaces.Dict):  # DeepMind Control Suite: flat float32 vector
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.TransformObservation(
            env, lambda o: o.astype(np.float32), gym.spaces.Box(-np.inf, np.inf, env.observation_space.shape, np.float32)
        )
    if spec.frame_stack > 1:
        env = _stack_frames(env, spec.frame_stack)
    return env


def _stack_frames(env: gym.Env, n: int) -> gym.Env:
    """Stack like SB3's VecFrameStack (zero padding, oldest first), channel-first for
    images (as VecTransposeImage hands them to the CNN), concatenated for vectors."""
    shape = env.observation_space.shape
    if len(shape) == 3 and shape[-1] == 1:  # (H, W, 1) frames -> (n, H, W)
        env = gym.wrappers.ReshapeObservation(env, shape[:2])
        return gym.wrappers.FrameStackObservation(env, n, padding_type="zero")
    if len(shape) == 1:
        env = gym.wrappers.FrameStackObservation(env, n, padding_type="zero")
        return gym.wrappers.FlattenObservation(env)
    raise QuarlError(f"frame stacking of observations shaped {shape} is not supported (only (H, W, 1) and vectors)")


def env_spec_for_policy(env_id: str, obs_shape: tuple[int, ...]) -> EnvSpec:
    """A guess for a bare checkpoint: Atari ids get the standard Atari wrappers and as
    many stacked frames as the policy's input has channels."""
    if is_atari(env_id) and len(obs_shape) == 3:
        return EnvSpec(env_id, wrappers=("atari",), frame_stack=int(obs_shape[0]))
    return EnvSpec(env_id)
