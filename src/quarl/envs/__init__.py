"""One ``make_env`` for every env quarl runs (evaluation, training, ActorQ), through a
registry of env families (:mod:`quarl.envs.families`): ``gymnasium`` (classic control, Box2D, MuJoCo), ``atari`` (ALE
ids, registered on first use), ``minatar`` (MinAtar's 10x10 games, ``MinAtar/Breakout-v1``,
channel-first float frames), ``dm_control`` (the DeepMind Control Suite through
shimmy, observations flattened to float32) and ``pybullet`` (the paper's third family: ``HalfCheetahBulletEnv-v0``,
``Walker2DBulletEnv-v0``... from pybullet-envs-gymnasium). A new family is one
:func:`~quarl.envs.families.register_env_family`.

An :class:`EnvSpec` says how a policy's env was built (RL Zoo ``config.yml``: env
wrappers, frame stacking, env kwargs) so that evaluation rebuilds the same observations.
Old ids that gymnasium no longer makes (MuJoCo ``-v2``/``-v3`` needed mujoco-py,
``LunarLander-v2`` became ``-v3``) are mapped to current ones, with a log note.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import gymnasium as gym
from pydantic import JsonValue
from typing_extensions import TypedDict  # pydantic validates it on Python 3.11 (recovery.json's env)

from quarl.core.errors import QuarlError
from quarl.envs import wrappers as env_wrappers
from quarl.envs.families import env_family, identity, is_atari

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

_noted: set[str] = set()


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


_GYM_PACKAGES: list[str] = []
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
TRUST_OPTION = "--trust-gym-packages"
"""The option that lets a run folder's ``args.yml`` (or a sidecar) name modules to import."""
_trusted = False


def trust_gym_packages(trusted: bool = True) -> None:
    """Allow (or forbid again) importing the ``gym_packages`` a file names
    (``--trust-gym-packages``); modules named by the user are always imported."""
    global _trusted
    _trusted = trusted


def _module_name(name: object, where: str) -> str:
    """``name`` if it is a dotted identifier naming no ``__main__`` module, else one line."""
    if not isinstance(name, str) or not MODULE_NAME.fullmatch(name):
        raise QuarlError(f"{where} {name!r} is not a module name: allowed a dotted identifier (e.g. my_envs or "
                         "my_pkg.envs)")
    if "__main__" in name.split("."):
        raise QuarlError(f"{where} {name!r} is a program's __main__ module, never imported: allowed a module that "
                         "registers envs (e.g. my_envs or my_pkg.envs)")
    return name


def import_gym_packages(names: Sequence[str] | str, where: str = "--gym-packages") -> None:
    """Import the modules that register custom envs with gymnasium, as rl_zoo3's
    ``--gym-packages`` does: installed modules, or modules in the current folder (which
    ``python -m rl_zoo3.train`` finds, the folder being on its path); remembered
    (:func:`gym_packages`) so evaluation workers import them too. ``names`` are module
    names, never paths, and never a ``__main__`` module."""
    import importlib
    import os
    import sys

    for name in [names] if isinstance(names, str) else list(names):
        _module_name(name, where)
        cwd = os.getcwd()
        added = cwd not in sys.path and "" not in sys.path
        if added:  # after the installed modules: the current folder never shadows them
            sys.path.append(cwd)
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, or the module's own error while registering
            raise QuarlError(f"{where} {name!r} cannot be imported: {exc.__class__.__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''} (modules are looked for among the "
                             f"installed ones and in the current folder, {cwd})") from None
        finally:
            if added and cwd in sys.path:
                sys.path.remove(cwd)
        if name not in _GYM_PACKAGES:
            _GYM_PACKAGES.append(name)


def import_named_by_file(names: Sequence[str] | str, where: str, origin: str = "") -> None:
    """The ``gym_packages`` a file names (a run folder's ``args.yml``, a sidecar): imported
    only where no new code runs (the user named them with ``--gym-packages``, or they are
    imported already) or with ``--trust-gym-packages``; otherwise one line saying which
    modules the file asks for (``origin``: what they are to it) and how to allow them.
    Importing a module a downloaded file names is running code from that file."""
    import sys

    wanted = [_module_name(name, where) for name in ([names] if isinstance(names, str) else list(names))]
    missing = [name for name in wanted if name not in _GYM_PACKAGES and name not in sys.modules]
    if missing and not _trusted:
        raise QuarlError(f"{where} asks to import {', '.join(missing)} (code, not imported unasked): pass "
                         f"--gym-packages {','.join(missing)}{', ' + origin + ',' if origin else ''} or {TRUST_OPTION} "
                         "if you trust it")
    import_gym_packages(wanted, where)


def gym_packages() -> tuple[str, ...]:
    """Modules :func:`import_gym_packages` imported in this process, in order."""
    return tuple(_GYM_PACKAGES)


def check_env_id(env_id: str) -> str:
    """Return the id to make, or raise a one-line error naming ``env_id``."""
    env_family(env_id).register()
    new = current_env_id(env_id)
    if new not in gym.registry:
        close = difflib.get_close_matches(new, list(gym.registry), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise QuarlError(f"unknown env id {env_id!r}: not a registered gymnasium id{hint}")
    return new


def with_sticky_actions(spec: EnvSpec, probability: float) -> EnvSpec:
    """``spec`` whose env repeats the agent's previous action with ``probability`` at each
    step (ALE's ``repeat_action_probability``: 0.25 in Machado et al. 2018 and ALE v5;
    MinAtar's ``sticky_action_prob``, 0.1 by default), so a deterministic agent's seeds are
    different games. Part of the env kwargs, so of every stored result's key."""
    import math

    family = env_family(spec.env_id)
    if family.sticky is None:
        raise QuarlError(f"--sticky-actions is for Atari and MinAtar envs; {spec.env_id} ({family.name}) has none")
    if not (isinstance(probability, (int, float)) and math.isfinite(probability) and 0.0 <= probability < 1.0):
        raise QuarlError(f"--sticky-actions {probability!r} must be a probability in [0, 1)")
    return EnvSpec(spec.env_id, {**spec.env_kwargs, family.sticky: float(probability)}, spec.wrappers,
                   spec.frame_stack)


def sticky_probability(spec: EnvSpec) -> float | None:
    """The sticky-action probability ``spec`` sets (None: the env's own default)."""
    family = env_family(spec.env_id)
    value = spec.env_kwargs.get(family.sticky) if family.sticky else None
    return float(value) if value is not None else None


def wrapper_names(spec: object) -> tuple[env_wrappers.Wrapper, ...]:
    """Wrappers (with their arguments) from a zoo ``env_wrapper`` entry."""
    return env_wrappers.from_zoo(spec)


MAX_FRAME_STACK = 64
"""More stacked frames than any RL Zoo config uses (4): a config's frame_stack never decides
how much memory an observation takes."""


class EnvJson(TypedDict):
    """An :class:`EnvSpec` as JSON (:meth:`EnvSpec.to_json`), as stored keys and export sidecars hold it."""

    env_id: str
    env_kwargs: dict[str, JsonValue]
    wrappers: list[str | list[JsonValue]]
    """A name, or ``[name, [[argument, value], ...]]``."""
    frame_stack: int


@dataclass(frozen=True)
class EnvSpec:
    """How to build the env a policy acts in."""

    env_id: str
    env_kwargs: dict = field(default_factory=dict)
    wrappers: tuple[env_wrappers.Wrapper, ...] = ()
    """Names from :data:`quarl.envs.wrappers.KINDS` (or (name, arguments) pairs), applied in order."""
    frame_stack: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "wrappers", tuple(env_wrappers.canonical(w) for w in self.wrappers))
        if isinstance(self.frame_stack, bool) or not isinstance(self.frame_stack, int) or \
                not 1 <= self.frame_stack <= MAX_FRAME_STACK:
            raise QuarlError(f"frame_stack={self.frame_stack!r} must be a whole number in 1..{MAX_FRAME_STACK}")

    def to_json(self, default: Callable[[object], object] | None = None) -> EnvJson:
        """The fields as JSON reads them back (tuples as lists); env kwargs JSON cannot hold raise
        ``TypeError`` unless ``default`` converts them (``str``: for a key that tells envs apart)."""
        as_json: EnvJson = json.loads(json.dumps(dataclasses.asdict(self), default=default))
        return as_json


class GameScore(gym.Wrapper):
    """Sits on the bare env, inside every zoo wrapper (where the RL Zoo's ``Monitor`` sits),
    and keeps the game's own score and length: raw rewards, summed over every life. An
    Atari agent's episode ends at each lost life (``EpisodicLifeEnv``) with clipped
    rewards; the game, and its score, go on until the emulator says it is over."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.score = 0.0
        self.length = 0
        self.over = True

    def reset(self, **kwargs):
        self.score, self.length, self.over = 0.0, 0, False
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        self.length += 1
        self.over = bool(terminated or truncated)
        return obs, reward, terminated, truncated, info


def game_score(env: gym.Env) -> GameScore | None:
    """The :class:`GameScore` inside ``env`` (None: an episode is the whole game)."""
    while True:
        if isinstance(env, GameScore):
            return env
        if not hasattr(env, "env"):
            return None
        env = env.env


def restart_game(env: gym.Env) -> None:
    """Make the next ``reset`` start a new game even though this one is not over: SB3's
    ``EpisodicLifeEnv`` otherwise continues the game (one no-op step) and ignores the seed."""
    while True:
        if hasattr(env, "was_real_done"):
            env.was_real_done = True
        if not hasattr(env, "env"):
            return
        env = env.env


def make_env(spec: EnvSpec, training: bool = False, stack_frames: bool = True,
             on_made: Callable[[gym.Env], gym.Env] = identity) -> gym.Env:
    """Build one env (no vectorization; :mod:`quarl.evaluation.episodes` batches them) through its
    family, with the zoo's wrappers as training used them. Unless ``training``, wrappers
    whose agent episodes are parts of a game (Atari's lives) get a :class:`GameScore`
    inside them, from which evaluation takes whole games' scores, as the RL Zoo's player
    reports them. ``stack_frames=False`` leaves frame stacking to the caller (SB3's
    VecFrameStack). ``on_made`` wraps the bare env before the zoo's wrappers (training's
    Monitor, so it logs the game's own episodes and scores, as the RL Zoo does)."""
    env_id = check_env_id(spec.env_id)
    family = env_family(spec.env_id)
    kwargs = family.make_kwargs(env_id, dict(spec.env_kwargs), spec.wrappers)
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        raise QuarlError(f"env {env_id!r} needs a package that is missing: {exc}") from None
    except TypeError as exc:
        raise QuarlError(f"env {env_id!r} rejects env kwargs {kwargs}: {exc}") from None
    env = on_made(family.on_made(env))
    if not training and env_wrappers.scores_games(spec.wrappers):
        env = GameScore(env)
    env = family.adapt(env_wrappers.apply(env, spec.wrappers))
    if stack_frames and spec.frame_stack > 1:
        env = _stack_frames(env, spec.frame_stack)
    return env


def _stack_frames(env: gym.Env, n: int) -> gym.Env:
    """Stack like SB3's VecFrameStack (zero padding, oldest first), channel-first for
    images (as VecTransposeImage hands them to the CNN), concatenated for vectors."""
    shape = env.observation_space.shape or ()
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
