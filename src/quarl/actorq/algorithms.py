"""ActorQ's algorithms as registry entries: what the coordinator, the actors and the
loaders need to know about one, in one place.

An entry gives its learner, its replay (or unroll queue) and rate limiter, how its actors
act (explore around the greedy action and return n-step transitions, or sample their own
policy and return whole unrolls), which action spaces it takes, what its policy network
ends in, and its own validation of the config. The coordinator loop
(:func:`quarl.actorq.system.run_actorq`) asks the entry and never the algorithm's name;
adding an algorithm is one module with a learner and one :func:`register_algorithm` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from quarl.core.errors import QuarlError

if TYPE_CHECKING:  # the config imports this module to validate; the rest is built on demand
    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.replay import Limiter, Store


class Learner(Protocol):
    """What the coordinator calls on a learner (see :mod:`quarl.actorq.learners`)."""

    steps: int

    def step(self, batch: Any, /) -> dict[str, Any]:
        """One update from a sample of the replay (a ``Batch``) or of the queue (an ``Unroll``)."""
        ...

    def weights(self) -> dict[str, Any]: ...

    def policy_network(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


ACTIONS = ("discrete", "continuous", "either")


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    """One line for the help: what it learns and from what."""
    actions: str
    """``discrete``, ``continuous`` or ``either``."""
    make_learner: Callable[["ActorQConfig", int, int, bool], Learner]
    """(config, observation size, actions or action dimensions, discrete) -> the learner."""
    make_replay: Callable[["ActorQConfig"], "Store"]
    """config -> the replay (or unroll queue) the actors fill and the learner samples."""
    make_limiter: Callable[["ActorQConfig", Any], "Limiter"]
    """(config, replay) -> the rate limiter between inserts and samples."""
    unrolls: bool = False
    """Actors sample their own policy and return whole unrolls (learned from once, on-policy
    corrections), instead of exploring around the greedy action with n-step transitions."""
    tanh_for_continuous: bool = True
    """The policy network ends in tanh on continuous actions (actions in [-1, 1], mapped onto
    the env's bounds)."""
    validate: Callable[["ActorQConfig"], None] = lambda config: None
    """Checks of the options only this algorithm reads (one line each)."""
    other: str = ""
    """The algorithm to suggest when the env's actions do not fit."""

    def check_actions(self, discrete: bool, env_id: str, space: Any) -> None:
        if self.actions == "discrete" and not discrete:
            raise QuarlError(f"{self.name} needs discrete actions but {env_id} has {space}"
                             + (f": use --algo {self.other}" if self.other else ""))
        if self.actions == "continuous" and discrete:
            raise QuarlError(f"{self.name} needs continuous actions but {env_id} has {space}"
                             + (f": use --algo {self.other}" if self.other else ""))

    def policy_head(self, discrete: bool) -> str:
        """The core :class:`~quarl.policies.base.Policy` head of its policy network."""
        return "argmax" if discrete else "unscale"


ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    """Add an algorithm (``--algo NAME``); returns it."""
    if algorithm.actions not in ACTIONS:
        raise ValueError(f"actions {algorithm.actions!r}: allowed {', '.join(ACTIONS)}")
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


MODULES: dict[str, tuple[str, str]] = {
    "ppo": ("quarl.actorq.ppo", "PPO's clipped surrogate on the actors' unrolls, their quantized policy as the old "
                                "one (either kind of action)"),
}
"""Algorithms that live in a module of their own: ``--algo NAME`` -> (the module, which
registers it when imported, and its one-line summary for the help). The module is imported
only when the algorithm is asked for, so ``quarl --help`` stays light."""


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS and name in MODULES:
        import importlib

        importlib.import_module(MODULES[name][0])
    if name not in ALGORITHMS:
        raise QuarlError(f"unknown --algo {name!r}: allowed {', '.join(algorithm_names())}")
    return ALGORITHMS[name]


def algorithm_names() -> tuple[str, ...]:
    """Every ``--algo``, in registration order (those of :data:`MODULES` too)."""
    return tuple(dict.fromkeys([*ALGORITHMS, *MODULES]))


def make_learner(config: "ActorQConfig", obs_dim: int, act_dim: int, discrete: bool = True) -> Learner:
    """The learner of ``config.algo`` (its registry entry) on ``config.learner_device``."""
    return get_algorithm(config.algo).make_learner(config, obs_dim, act_dim, discrete)


def algorithms_help() -> str:
    """``name: summary`` of every algorithm, without importing the modules of :data:`MODULES`."""
    summaries = {**{name: summary for name, (_, summary) in MODULES.items()},
                 **{a.name: a.summary for a in ALGORITHMS.values()}}
    return "; ".join(f"{name}: {summaries[name]}" for name in algorithm_names())


# ------------------------------------------------------------------ the built-in entries


def _replay(config: "ActorQConfig") -> "Store":
    from quarl.actorq.replay import PrioritizedReplay, Replay

    if config.replay == "prioritized":
        return PrioritizedReplay(config.replay_size, config.seed, config.priority_exponent, config.importance_exponent)
    return Replay(config.replay_size, config.seed)


def _rate_limiter(config: "ActorQConfig", replay: Any) -> "Limiter":
    from quarl.actorq.replay import RateLimiter

    # slack of at least one actor chunk plus one batch either way, so neither side starves
    limiter = RateLimiter.from_tolerance(config.samples_per_insert, config.min_replay, config.samples_per_insert_tolerance)
    limiter.error_buffer = max(limiter.error_buffer, (config.chunk_steps * config.samples_per_insert + config.batch_size))
    return limiter


def _unroll_queue(config: "ActorQConfig") -> "Store":
    from quarl.actorq.replay import UnrollQueue

    # each unroll learned from once; room for a few batches per actor
    return UnrollQueue(max(4 * config.batch_size, 2 * config.actors * config.chunk_steps), config.seed)


def _queue_limiter(config: "ActorQConfig", queue: Any) -> "Limiter":
    from quarl.actorq.replay import QueueLimiter

    return QueueLimiter(queue, config.batch_size)


def _dqn_learner(config: "ActorQConfig", obs_dim: int, act_dim: int, discrete: bool) -> Learner:
    from quarl.actorq.learners import DQNLearner

    return DQNLearner(config, obs_dim, act_dim, config.learner_device)


def _d4pg_learner(config: "ActorQConfig", obs_dim: int, act_dim: int, discrete: bool) -> Learner:
    from quarl.actorq.learners import D4PGLearner

    return D4PGLearner(config, obs_dim, act_dim, config.learner_device)


def _impala_learner(config: "ActorQConfig", obs_dim: int, act_dim: int, discrete: bool) -> Learner:
    from quarl.actorq.learners import IMPALALearner

    return IMPALALearner(config, obs_dim, act_dim, config.learner_device, discrete)


def validate_unrolls(config: "ActorQConfig") -> None:
    """Checks every unroll algorithm shares: unrolls that tile an actor's chunk, a Gaussian
    sigma for continuous actions, and a queue, not a prioritized replay."""
    if config.unroll_length < 1 or config.chunk_steps % config.unroll_length:
        raise QuarlError(f"--unroll-length {config.unroll_length} must divide the actors' chunk of "
                         f"{config.chunk_steps} steps (e.g. 10, 20, 25, 50)")
    if not 0 < config.policy_sigma <= 2:
        raise QuarlError(f"policy_sigma={config.policy_sigma} must be in (0, 2]")
    if config.replay != "uniform":
        raise QuarlError(f"--replay prioritized is for dqn and d4pg: {config.algo} learns from a queue of unrolls")


def _validate_impala(config: "ActorQConfig") -> None:
    validate_unrolls(config)
    if not 0 < config.c_bar <= config.rho_bar:
        raise QuarlError(f"--c-bar {config.c_bar} and --rho-bar {config.rho_bar} must satisfy 0 < c-bar <= rho-bar")
    if config.entropy_cost < 0 or config.baseline_cost <= 0:
        raise QuarlError(f"--entropy-cost {config.entropy_cost} must be >= 0 and baseline_cost="
                         f"{config.baseline_cost} > 0")


register_algorithm(Algorithm("dqn", "double DQN on n-step returns (discrete actions)", "discrete", _dqn_learner,
                             _replay, _rate_limiter, other="d4pg"))
register_algorithm(Algorithm("d4pg", "distributional DDPG (continuous actions)", "continuous", _d4pg_learner,
                             _replay, _rate_limiter, other="dqn"))
register_algorithm(Algorithm("impala", "an actor-critic on the actors' unrolls with V-trace (either kind of "
                             "action)", "either", _impala_learner, _unroll_queue, _queue_limiter, unrolls=True,
                             validate=_validate_impala))
