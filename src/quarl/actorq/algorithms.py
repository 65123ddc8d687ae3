"""ActorQ's algorithms as registry entries: what the coordinator, the actors, the loaders and
the CLI need to know about one, in one place.

An entry gives its learner, its replay (or unroll queue) and rate limiter, how its actors
act (explore around the greedy action and return n-step transitions, or sample their own
policy and return whole unrolls), which action spaces it takes, what its policy network
ends in, and its options: a frozen dataclass of the fields only it reads, each with a
default and a docstring (its ``--help`` line), and their checks (:mod:`quarl.actorq.options`).
The run config (:class:`quarl.actorq.config.ActorQConfig`) holds the shared fields and the
chosen entry's options; ``quarl actorq run`` gets one option per field from here. The
coordinator loop (:func:`quarl.actorq.system.run_actorq`) asks the entry and never the
algorithm's name; adding an algorithm is one module with its options, a learner and one
:func:`register_algorithm` call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from quarl.actorq.options import AlgorithmOptions, D4PGOptions, DQNOptions, IMPALAOptions, ReplayOptions, UnrollOptions
from quarl.core.errors import QuarlError
from quarl.core.registry import Registry

if TYPE_CHECKING:  # the config imports this module; the rest is built on demand
    import numpy as np
    import torch
    from torch.optim.optimizer import StateDict

    from quarl.actorq.config import ActorQConfig
    from quarl.actorq.replay import Limiter, Store

Metrics: TypeAlias = "dict[str, float | np.ndarray]"
"""What a learner step reports: numbers by name (losses, impala's mismatch); with
prioritized replay also ``priority``, each sampled row's new priority."""
LearnerState: TypeAlias = "dict[str, dict[str, torch.Tensor] | StateDict | int]"
"""A learner's checkpoint: its networks' state dicts, its optimizers' (torch's
``Optimizer.state_dict()``) and its step count, by name (``torch.load(weights_only=True)``
reads it back)."""


class Learner(Protocol):
    """What the coordinator calls on a learner (see :mod:`quarl.actorq.learners`)."""

    steps: int

    def step(self, batch: Any, /) -> Metrics:
        """One update from a sample of the replay (a ``Batch``) or of the queue (an ``Unroll``)."""
        ...

    def weights(self) -> dict[str, np.ndarray]:
        """The policy network's state as named arrays (what actors load)."""
        ...

    def policy_network(self) -> Any: ...

    def state_dict(self) -> LearnerState: ...

    def load_state_dict(self, state: LearnerState) -> None:
        """Back to a :meth:`state_dict` read from a checkpoint (a part of the wrong kind
        raises TypeError, a missing one KeyError)."""
        ...


ACTIONS = ("discrete", "continuous", "either")


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    """One line for the help: what it learns and from what."""
    actions: str
    """``discrete``, ``continuous`` or ``either``."""
    make_learner: Callable[[ActorQConfig, int, int, bool], Learner]
    """(config, observation size, actions or action dimensions, discrete) -> the learner."""
    make_replay: Callable[[ActorQConfig], Store]
    """config -> the replay (or unroll queue) the actors fill and the learner samples."""
    make_limiter: Callable[[ActorQConfig, Any], Limiter]
    """(config, replay) -> the rate limiter between inserts and samples."""
    options: type[AlgorithmOptions]
    """Its options (the fields only it reads, and their checks): :class:`ReplayOptions` or a
    subclass for actors returning n-step transitions, :class:`UnrollOptions` or a subclass
    with ``unrolls``."""
    unrolls: bool = False
    """Actors sample their own policy and return whole unrolls (learned from once, on-policy
    corrections), instead of exploring around the greedy action with n-step transitions."""
    tanh_for_continuous: bool = True
    """The policy network ends in tanh on continuous actions (actions in [-1, 1], mapped onto
    the env's bounds)."""
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


ALGORITHMS: Registry[Algorithm] = Registry("--algo")
"""Every ActorQ algorithm, in registration order (``--algo``'s help lists them so)."""


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    """Add an algorithm (``--algo NAME``); returns it."""
    if algorithm.actions not in ACTIONS:
        raise ValueError(f"actions {algorithm.actions!r}: allowed {', '.join(ACTIONS)}")
    family = UnrollOptions if algorithm.unrolls else ReplayOptions  # what its actors read
    if not issubclass(algorithm.options, family):
        raise ValueError(f"{algorithm.name}'s options {algorithm.options.__name__} must extend {family.__name__}")
    return ALGORITHMS.register(algorithm.name, algorithm)


ENTRY_MODULES: tuple[str, ...] = ("quarl.actorq.ppo",)
"""Modules that register an algorithm of their own when imported, each light (its options
and its registration; its learner module is imported when a learner is built), so the CLI
lists their options without loading torch. Imported the first time the registry is read."""


def _load_entry_modules() -> None:
    import importlib

    for module in ENTRY_MODULES:
        importlib.import_module(module)


def get_algorithm(name: str) -> Algorithm:
    _load_entry_modules()
    return ALGORITHMS.lookup(name)


def find_algorithm(name: str) -> Algorithm | None:
    """The entry of ``name``, or None (a run of an algorithm no longer registered)."""
    _load_entry_modules()
    return ALGORITHMS.get(name)


def algorithm_names() -> tuple[str, ...]:
    """Every ``--algo``, in registration order."""
    _load_entry_modules()
    return tuple(ALGORITHMS)


def make_learner(config: ActorQConfig, obs_dim: int, act_dim: int, discrete: bool = True) -> Learner:
    """The learner of ``config.algo`` (its registry entry) on ``config.learner_device``."""
    return get_algorithm(config.algo).make_learner(config, obs_dim, act_dim, discrete)


def algorithms_help() -> str:
    """``name: summary`` of every algorithm."""
    _load_entry_modules()
    return "; ".join(ALGORITHMS.listing(lambda a: a.summary))


def option_owners() -> dict[str, list[str]]:
    """Every option field of every entry -> the algorithms that take it, in registration order."""
    _load_entry_modules()
    owners: dict[str, list[str]] = {}
    for algorithm in ALGORITHMS.values():
        for f in fields(algorithm.options):
            owners.setdefault(f.name, []).append(algorithm.name)
    return owners


# ------------------------------------------------------------------ the built-in entries


def _replay(config: ActorQConfig) -> Store:
    from quarl.actorq.replay import PrioritizedReplay, Replay

    o = ReplayOptions.of(config)
    if o.replay == "prioritized":
        return PrioritizedReplay(o.replay_size, config.seed, o.priority_exponent, o.importance_exponent)
    return Replay(o.replay_size, config.seed)


def _rate_limiter(config: ActorQConfig, replay: Any) -> Limiter:
    from quarl.actorq.replay import RateLimiter

    o = ReplayOptions.of(config)
    # slack of at least one actor chunk plus one batch either way, so neither side starves
    limiter = RateLimiter.from_tolerance(o.samples_per_insert, o.min_replay, o.samples_per_insert_tolerance)
    limiter.error_buffer = max(limiter.error_buffer, (config.chunk_steps * o.samples_per_insert + config.batch_size))
    return limiter


def unroll_queue(config: ActorQConfig) -> Store:
    """The queue of unrolls (each learned from once; room for a few batches per actor)."""
    from quarl.actorq.replay import UnrollQueue

    return UnrollQueue(max(4 * config.batch_size, 2 * config.actors * config.chunk_steps), config.seed)


def queue_limiter(config: ActorQConfig, queue: Any) -> Limiter:
    """The learner takes a batch of unrolls once the queue holds one."""
    from quarl.actorq.replay import QueueLimiter

    return QueueLimiter(queue, config.batch_size)


def _dqn_learner(config: ActorQConfig, obs_dim: int, act_dim: int, discrete: bool) -> Learner:
    from quarl.actorq.learners import DQNLearner

    return DQNLearner(config, obs_dim, act_dim, config.learner_device)


def _d4pg_learner(config: ActorQConfig, obs_dim: int, act_dim: int, discrete: bool) -> Learner:
    from quarl.actorq.learners import D4PGLearner

    return D4PGLearner(config, obs_dim, act_dim, config.learner_device)


def _impala_learner(config: ActorQConfig, obs_dim: int, act_dim: int, discrete: bool) -> Learner:
    from quarl.actorq.learners import IMPALALearner

    return IMPALALearner(config, obs_dim, act_dim, config.learner_device, discrete)


register_algorithm(Algorithm("dqn", "double DQN on n-step returns (discrete actions)", "discrete", _dqn_learner,
                             _replay, _rate_limiter, DQNOptions, other="d4pg"))
register_algorithm(Algorithm("d4pg", "distributional DDPG (continuous actions)", "continuous", _d4pg_learner,
                             _replay, _rate_limiter, D4PGOptions, other="dqn"))
register_algorithm(Algorithm("impala", "an actor-critic on the actors' unrolls with V-trace (either kind of "
                             "action)", "either", _impala_learner, unroll_queue, queue_limiter, IMPALAOptions,
                             unrolls=True))
