"""Where the actors, the broadcaster and the evaluator live: the :class:`Fleet` protocol
the coordinator (:mod:`quarl.actorq.system`) drives, and the pieces both fleets share
(in this process: :mod:`~quarl.actorq.local_fleet`; on Ray: :mod:`~quarl.actorq.ray_fleet`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from quarl.actorq.acting import ActorResult, EnvInfo, make_network
from quarl.actorq.config import ActorQConfig
from quarl.envs import EnvSpec, make_env
from quarl.evaluation.episodes import evaluate


@dataclass
class ActorFailure:
    index: int
    error: str


class Fleet(Protocol):
    """Where the actors, the broadcaster and the evaluator live."""

    node: str
    """Where the driver (learner, broadcaster, evaluator) runs."""

    def publish(self, version: int, weights: dict[str, np.ndarray]) -> None: ...
    def submit(self, index: int, steps: int) -> None: ...
    def ready(self, timeout_s: float) -> list[ActorResult | ActorFailure]: ...
    def restart(self, index: int) -> None: ...
    def evaluator_idle(self) -> bool:
        """Whether :meth:`evaluate` would start now (one evaluation runs at a time)."""
        ...

    def evaluate(self, version: int, weights: dict[str, np.ndarray], at_s: float) -> None:
        """Start evaluating ``weights`` (taken at ``at_s``); ignored while the evaluator is busy."""
        ...

    def evaluations(self) -> list[tuple[int, float, float]]: ...
    def broadcast_stats(self) -> dict[str, float]: ...
    def evaluator_busy_s(self) -> float | None: ...
    def close(self) -> None: ...


class Evaluator:
    """Runs the learner's fp32 policy without exploration on its own env, through the
    core's :func:`quarl.evaluation.episodes.evaluate` (the policy, action head and seeding ptq uses)."""

    def __init__(self, config: ActorQConfig, info: EnvInfo) -> None:
        torch.set_num_threads(1)
        self.config, self.info = config, info
        self.network = make_network(config, info).eval()
        self.policy = info.policy(self.network)  # acts through the network loaded in place
        self.spec = EnvSpec(config.env_id)
        self.envs = [make_env(self.spec)]
        self.calls = 0
        self.busy_s = 0.0
        """Seconds spent evaluating (CPU the scaling model accounts for)."""

    def evaluate(self, weights: dict[str, np.ndarray]) -> float:
        started = time.perf_counter()
        self.network.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
        # episode i of evaluation k resets with seed + 1,000,000 + 1000 k + i: apart from the actors' seeds
        result = evaluate(self.policy, self.spec, episodes=self.config.eval_episodes,
                          seed=self.config.seed + 1_000_000 + self.calls * 1000, envs=self.envs)
        self.calls += 1
        self.busy_s += time.perf_counter() - started
        return result.mean

    def busy(self) -> float:
        return self.busy_s
