"""Seeded, batched evaluation of a policy: greedy, or sampling with common random numbers.

Episode ``i`` is reset with seed ``seed + i`` whatever the precision and whatever the
number of envs, so every precision meets the same initial states and the same command
gives the same numbers twice. ``n_envs`` envs run side by side; the policy acts on each
env's observation alone (batch 1, as deployed), so the returns do not depend on
``n_envs`` and fp32 returns equal Stable-Baselines3's ``predict`` on the same seeds.

An episode is a whole game. Where the agent's episodes are parts of it (Atari: a lost life
ends the agent's episode, rewards are clipped), the env is reset between lives as the RL
Zoo's player resets it (FIRE, a new frame stack) and the return is the game's score, kept
inside the wrappers (:class:`quarl.envs.GameScore`); lengths count the agent's steps.

A policy with ``stochastic`` set samples its actions (:func:`acting` sets it, as
``rl_zoo3.enjoy --stochastic`` would); the noise of each env's step is a function of its
episode's seed and the step alone, so fp32 and a quantized copy playing one seed share it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, GameScore, game_score, make_env, restart_game
from quarl.policies.base import Policy

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """Returns and lengths per episode (index = episode = seed offset)."""

    returns: np.ndarray
    lengths: np.ndarray
    wall_time_s: float
    observations: np.ndarray | None = field(default=None, repr=False)
    """A sample of preprocessed observations met on the way (for calibration)."""
    endings: list[str] | None = field(default=None, repr=False)
    """Per episode, a digest of how it ended (:func:`ending`): equal digests mark replays of
    one game, which a verdict must not count as independent episodes."""

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    @property
    def steps(self) -> int:
        return int(np.sum(self.lengths))

    @property
    def steps_per_s(self) -> float:
        return self.steps / max(self.wall_time_s, 1e-9)


def ending(observation: object, length: int, ret: float) -> str:
    """A digest of an episode's last observation, length and return (16 hex digits, the
    same in every process). A deterministic policy on an env whose resets converge (Atari v4
    without sticky actions: a few no-ops, then the same game) replays whole games under
    other seeds; such replays end alike, distinct games almost never do."""
    digest = hashlib.blake2b(np.ascontiguousarray(observation).tobytes(), digest_size=8)
    digest.update(f"{length}:{ret!r}".encode())
    return digest.hexdigest()


def evaluate(
    policy: Policy,
    env_spec: EnvSpec,
    episodes: int = 20,
    seed: int = 0,
    n_envs: int = 32,
    max_steps: int | None = None,
    keep_observations: int = 0,
    keep_every: int = 4,
    on_episode: Callable[[int, float], None] | None = None,
    envs: Sequence[gym.Env] | None = None,
) -> EvalResult:
    """Run ``episodes`` deterministic episodes; see the module docstring for seeding.

    ``max_steps`` truncates an episode (beyond the env's own time limit);
    ``keep_observations`` keeps up to that many preprocessed observations (every env's,
    every ``keep_every`` steps), for calibrating static int8 or activation quantization.
    ``envs``: envs of ``env_spec`` to play on (kept open; their number is ``n_envs``), for a
    caller that evaluates again and again (ActorQ's evaluator). :func:`quarl.evaluation.parallel.evaluate`
    splits the episodes over worker processes, with every episode's numbers unchanged."""
    _check_counts(episodes, max_steps)
    owned = envs is None
    envs = (list(envs[:episodes]) if envs is not None
            else [make_env(env_spec) for _ in range(max(1, min(n_envs, episodes)))])
    n_envs = len(envs)
    policy.check_env(envs[0])
    games = [game_score(env) for env in envs]
    # Python lists: the loop below runs once per env step, where numpy scalars cost more
    # than the arithmetic (the sums are the same doubles)
    returns, lengths, endings = [0.0] * episodes, [0] * episodes, [""] * episodes
    kept = _Sample(keep_observations, keep_every)
    slot_episode = list(range(n_envs))
    next_episode = n_envs
    obs = _first_observations(envs, games, seed)
    active = list(range(n_envs))
    # the envs this call made step beneath their pass-through wrappers, the time limit kept here
    steppers, limits = zip(*[_stepper(env) if owned and game is None else (env.step, -1)
                             for env, game in zip(envs, games, strict=True)], strict=True)
    cut_at = max_steps if max_steps is not None else -1
    start = time.perf_counter()
    step = 0
    try:
        while active:
            x = policy.preprocess(np.stack([obs[i] for i in active]))
            kept.offer(step, x)
            actions = _actions(policy, x, [(seed + slot_episode[i], lengths[slot_episode[i]]) for i in active]
                               if policy.stochastic else None)
            step += 1
            still = []
            for j, i in enumerate(active):
                ep = slot_episode[i]
                o, r, term, trunc, _ = steppers[i](actions[j])
                game = games[i]
                length = lengths[ep] = lengths[ep] + 1
                if length == limits[i]:
                    trunc = True  # the env's TimeLimit, stepped beneath
                cut = length == cut_at
                if game is None:
                    returns[ep] += float(r)
                else:
                    returns[ep] = float(game.score)
                    if (term or trunc) and not game.over and not cut:
                        o, _ = envs[i].reset()  # a life lost: the game goes on
                        term = trunc = False
                if term or trunc or cut:
                    endings[ep] = ending(o, length, returns[ep])
                    if on_episode is not None:
                        on_episode(ep, returns[ep])
                    if next_episode == episodes:
                        continue
                    o = _next_episode(envs[i], game, seed + next_episode)
                    slot_episode[i], next_episode = next_episode, next_episode + 1
                obs[i] = o
                still.append(i)
            active = still
    finally:
        for env in envs if owned else ():
            env.close()
    wall = time.perf_counter() - start
    return EvalResult(np.array(returns), np.array(lengths, dtype=np.int64), wall, kept.array(), endings)


def _check_counts(episodes: int, max_steps: int | None) -> None:
    if episodes < 1:
        raise QuarlError(f"episodes={episodes} must be at least 1")
    if max_steps is not None and max_steps < 1:
        raise QuarlError(f"max_steps={max_steps} must be at least 1 (or None: the env's own time limit)")


def _first_observations(envs: Sequence[gym.Env], games: Sequence[object | None], seed: int) -> list[np.ndarray]:
    """Env i reset with seed ``seed + i``, a game first restarted (envs handed in may stop mid-game)."""
    for env, game in zip(envs, games, strict=True):
        if game is not None:
            restart_game(env)
    return [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]


def _next_episode(env: gym.Env, game: GameScore | None, seed: int) -> np.ndarray:
    """The first observation of the episode reset with ``seed`` (a game cut mid-way first
    restarted: the seeded reset must start a new one)."""
    if game is not None and not game.over:
        restart_game(env)
    return env.reset(seed=seed)[0]


class _Sample:
    """Up to ``limit`` preprocessed observations, every env's, every ``every`` steps."""

    def __init__(self, limit: int, every: int) -> None:
        self.limit, self.every, self.n = limit, every, 0
        self.parts: list[np.ndarray] = []

    def offer(self, step: int, x: np.ndarray) -> None:
        if self.n < self.limit and step % self.every == 0:
            self.parts.append(x[: self.limit - self.n].copy())
            self.n += len(self.parts[-1])

    def array(self) -> np.ndarray | None:
        return np.concatenate(self.parts) if self.parts else None


def _actions(policy: Policy, x: np.ndarray, noise_keys: list[tuple[int, int]] | None) -> np.ndarray:
    """Each env's action as a deployed policy computes it alone: a plain batched matmul rounds
    differently from a batch of one, and a chaotic episode (MuJoCo) amplifies that into
    another return; ``act_rows`` keeps every n_envs on SB3's own numbers. A sampling policy
    draws each env's noise from its ``(episode seed, step)`` key alone (common random numbers)."""
    return policy.act_rows(x) if noise_keys is None else policy.sample_rows(x, noise_keys)


PASS_THROUGH = (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)
"""Wrappers that change nothing once an env is reset and stepped once: checks only."""


def _stepper(env: gym.Env) -> tuple[Callable[[object], tuple], int]:
    """``env``'s step function and its time limit (-1: none kept outside). An env that is
    ``TimeLimit`` over pass-through wrappers (:data:`PASS_THROUGH`: what ``gym.make`` adds)
    over the env itself is stepped at the env itself, the time limit counted by the caller:
    the same transitions without three Python calls per step. Any other env as it is."""
    if type(env) is not gym.wrappers.TimeLimit:
        return env.step, -1
    inner = env.env
    while type(inner) in PASS_THROUGH:
        inner = inner.env  # type: ignore[attr-defined]
    if isinstance(inner, gym.Wrapper) or env._max_episode_steps is None:
        return env.step, -1
    return inner.step, int(env._max_episode_steps)


STOCHASTIC_FAMILIES = ("atari", "minatar")
"""Env families the RL Zoo's player evaluates stochastically by default (``rl_zoo3.enjoy``:
deterministic "except for Atari games"; MinAtar's games are Atari's)."""


def acting(policy: Policy, env_spec: EnvSpec, stochastic: bool | None = None) -> Policy:
    """``policy`` acting greedily or sampling (:func:`quarl.policies.base.sample_actions`):
    ``stochastic`` True / False, or None for the RL Zoo's default (stochastic on Atari and
    MinAtar where the head can sample, greedy elsewhere). A head that cannot sample, asked
    to, is refused in one line."""
    import dataclasses

    from quarl.envs import env_family
    from quarl.policies.base import stochastic_support

    reason = stochastic_support(policy)
    if stochastic is None and policy.meta.get("acting") in ("sampled", "greedy"):  # an export: as it was judged
        stochastic = policy.meta["acting"] == "sampled" and reason is None
    if stochastic is None:
        stochastic = env_family(env_spec.env_id).name in STOCHASTIC_FAMILIES and reason is None
    from quarl.policies.base import DETERMINISTIC_ALGOS

    if stochastic and policy.algo in DETERMINISTIC_ALGOS:  # their predict ignores deterministic: it plays greedily
        log.info("%s samples nothing (SB3's predict ignores deterministic=False for it): playing greedily", policy.algo)
        stochastic = False
    if stochastic and reason is not None:
        raise QuarlError(reason)
    return dataclasses.replace(policy, stochastic=bool(stochastic), meta=policy.meta.copy())


def protocol(policy: Policy, env_spec: EnvSpec, stochastic: bool | None = None, sticky_actions: float | None = None,
             where_supported: bool = False) -> tuple[EnvSpec, Policy]:
    """The env spec and policy of an evaluation protocol: ``sticky_actions`` (see
    :func:`quarl.envs.with_sticky_actions`; with ``where_supported``, envs without sticky
    actions play as they are instead of refusing, as a study of mixed agents needs) and
    the policy :func:`acting` as ``stochastic`` says."""
    from quarl.envs import env_family, with_sticky_actions

    if sticky_actions is not None and not (where_supported and env_family(env_spec.env_id).sticky is None):
        env_spec = with_sticky_actions(env_spec, sticky_actions)
    return env_spec, acting(policy, env_spec, stochastic)
